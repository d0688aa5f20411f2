/* app: the dashboard's shell — hash routing between the views
 * (#/ overview, #/jobs/ID job page, #/plan[?job=ID] plan page,
 * #/generate[?job=ID] a serve job's prompt page), the
 * polling helper every view uses, and the token dialog's buttons.
 * Each view is PW.views.NAME(root, params) and returns a function that
 * stops it (its timers, charts) when the route changes. */
"use strict";
var PW = window.PW || (window.PW = {});

/* Run fn now and again after each completion: fn returns the delay in ms
 * before the next run, or false to stop (undefined: the default ms).
 * Returns the function that stops it. Hidden tabs poll 5x slower. */
PW.poll = function (fn, ms) {
  var stopped = false, timer = null;
  async function tick() {
    if (stopped) return;
    var next;
    try { next = await fn(); } catch (e) { console.error(e); }
    if (stopped || next === false) return;
    var delay = typeof next === "number" ? next : ms;
    if (document.hidden) delay *= 5;
    timer = setTimeout(tick, delay);
  }
  tick();
  return function () { stopped = true; clearTimeout(timer); };
};

(function () {
  var root = document.getElementById("view");
  var dispose = null;

  function parse(hash) {
    var h = (hash || "").replace(/^#/, "") || "/";
    var q = h.indexOf("?"), path = q < 0 ? h : h.slice(0, q), params = {};
    if (q >= 0) {
      h.slice(q + 1).split("&").forEach(function (kv) {
        if (!kv) return;
        var i = kv.indexOf("=");
        params[decodeURIComponent(i < 0 ? kv : kv.slice(0, i))] = i < 0 ? "" : decodeURIComponent(kv.slice(i + 1));
      });
    }
    var m;
    if ((m = /^\/jobs\/(\d+)\/?$/.exec(path))) { params.id = m[1]; return {view: "job", nav: "overview", params: params}; }
    if (/^\/plan\/?$/.test(path)) return {view: "plan", nav: "plan", params: params};
    if (/^\/generate\/?$/.test(path)) return {view: "generate", nav: "generate", params: params};
    return {view: "overview", nav: "overview", params: params};
  }

  function route() {
    if (dispose) { try { dispose(); } catch (e) { console.error(e); } }
    dispose = null;
    var r = parse(location.hash);
    document.querySelectorAll("[data-nav]").forEach(function (a) {
      a.classList.toggle("active", a.getAttribute("data-nav") === r.nav);
    });
    document.title = (r.view === "plan" ? "Plan" : r.view === "generate" ? "Generate" :
                      r.view === "job" ? "Job " + r.params.id : "Overview") + " \u00b7 pipewright";
    PW.dom.clear(root);
    root.setAttribute("data-view", r.view);
    dispose = PW.views[r.view](root, r.params) || null;
    window.scrollTo(0, 0);
  }

  /* token dialog: the form's buttons set returnValue through method=dialog */
  var forget = document.getElementById("token-forget");
  if (forget) {
    forget.hidden = !PW.api.token();
    forget.addEventListener("click", function () {
      PW.api.setToken("");
      route();
    });
  }

  window.addEventListener("hashchange", route);
  route();
})();
