/* generate: the serving page (#/generate[?job=ID]) — pick a serve job (a
 * running job whose status is "serving", docs/serving.md), type a prompt,
 * watch the tokens arrive (POST /v1/jobs/ID/generate with stream: true,
 * read as server-sent events), and see each request's latency: time to
 * first token and tokens per second after it, measured here, in the
 * browser, next to the coordinator's own figures from the "done" event.
 *
 * Tokens below 256 of a text job are bytes, shown through a streaming
 * UTF-8 decoder; any other job's tokens show as ids. Everything shown is
 * set as text (dom.js): a prompt or an output holding "<script>" shows
 * those characters. */
"use strict";
var PW = window.PW || (window.PW = {});
PW.views = PW.views || {};

PW.views.generate = function (root, params) {
  var d = PW.dom, h = d.h;
  var stopped = false, ctrl = null, history = [];

  var pick = h("select", {id: "gen-job", "aria-label": "serve job"}, h("option", {value: ""}, "pick a serve job\u2026"));
  var prompt = h("textarea", {id: "gen-prompt", rows: 4, spellcheck: "false", "aria-label": "prompt"});
  var maxTok = h("input", {id: "gen-max", type: "number", min: 1, value: 32, "aria-label": "max tokens"});
  var temp = h("input", {id: "gen-temp", type: "number", min: 0, step: 0.1, value: 0, "aria-label": "temperature"});
  var seed = h("input", {id: "gen-seed", type: "number", min: 0, value: 1, "aria-label": "seed"});
  var errBox = h("div", {class: "banner error", id: "gen-error", hidden: true, role: "alert"});
  var out = h("pre", {class: "gen-out mono", id: "gen-out", "aria-live": "polite"});
  var stats = h("p", {class: "muted small", id: "gen-stats"});
  var goBtn = h("button", {type: "button", class: "primary", id: "gen-go", on: {click: go}}, "Generate");
  var stopBtn = h("button", {type: "button", id: "gen-stop", disabled: true, on: {click: function () {
    if (ctrl) ctrl.abort();
  }}}, "Stop");
  var histBody = h("tbody", {id: "gen-history"});

  root.appendChild(h("div", {class: "page-head"}, h("h1", null, "Generate"),
    h("p", {class: "muted"}, "Text from a serve job: the tokens stream in as the pipeline samples them.")));
  root.appendChild(errBox);
  root.appendChild(h("div", {class: "card"},
    h("div", {class: "actions"}, pick, h("label", null, "max tokens ", maxTok), h("label", null, "temperature ", temp),
      h("label", null, "seed ", seed)),
    prompt, h("div", {class: "actions"}, goBtn, stopBtn), out, stats));
  root.appendChild(h("div", {class: "card"}, h("h2", null, "Requests"),
    h("div", {class: "table-wrap"}, h("table", null,
      h("thead", null, h("tr", null, ["job", "prompt", "tokens", "time to first token", "tokens/s", "total"].map(
        function (t) { return h("th", null, t); }))), histBody))));

  function showError(e) {
    errBox.hidden = !e;
    errBox.textContent = e ? String(e) : "";
  }

  async function loadJobs() {
    try {
      var r = await PW.api.get("/v1/jobs?limit=200");
      if (stopped) return;
      (r.jobs || []).forEach(function (j) {
        if (j.state !== "running" || j.status !== "serving") return;
        var o = h("option", {value: String(j.id)}, "#" + j.id + " " + (j.name || ""));
        pick.appendChild(o);
      });
      if (params.job) pick.value = params.job;
    } catch (e) { showError(e); }
  }

  function row(rec) {
    histBody.insertBefore(h("tr", null, h("td", null, "#" + rec.job), h("td", {class: "mono"}, rec.prompt.slice(0, 60)),
      h("td", null, d.int(rec.n)), h("td", null, rec.ttft === null ? d.DASH : (rec.ttft * 1e3).toFixed(1) + " ms"),
      h("td", null, rec.rate === null ? d.DASH : rec.rate.toFixed(1)), h("td", null, (rec.total * 1e3).toFixed(0) + " ms")),
    histBody.firstChild);
  }

  async function go() {
    var id = pick.value;
    showError(null);
    if (!id) return showError("pick a serve job first");
    if (!prompt.value) return showError("type a prompt");
    var body = {prompt: prompt.value, max_tokens: Number(maxTok.value), temperature: Number(temp.value),
                seed: Number(seed.value), stream: true};
    var hdr = {"Content-Type": "application/json"};
    if (PW.api.token()) hdr.Authorization = "Bearer " + PW.api.token();
    out.textContent = "";
    stats.textContent = "";
    goBtn.disabled = true;
    stopBtn.disabled = false;
    ctrl = new AbortController();
    var t0 = performance.now(), tFirst = null, tLast = null, n = 0, ids = [], dec = new TextDecoder("utf-8");
    var server = null; /* the coordinator's own figures, from the done event */
    try {
      var resp = await fetch("/v1/jobs/" + encodeURIComponent(id) + "/generate",
                             {method: "POST", headers: hdr, body: JSON.stringify(body), signal: ctrl.signal});
      if (!resp.ok) {
        var e = await resp.json().catch(function () { return {}; });
        throw new PW.api.Error(resp.status, e.error && e.error.code, e.error && e.error.message, e.error && e.error.path);
      }
      var reader = resp.body.getReader(), buf = "", text = new TextDecoder("utf-8");
      for (;;) {
        var chunk = await reader.read();
        if (chunk.done || stopped) break;
        buf += text.decode(chunk.value, {stream: true});
        var k;
        while ((k = buf.indexOf("\n\n")) >= 0) {
          var block = buf.slice(0, k), ev = null, data = null;
          buf = buf.slice(k + 2);
          block.split("\n").forEach(function (line) {
            if (line.indexOf("event: ") === 0) ev = line.slice(7);
            else if (line.indexOf("data: ") === 0) data = JSON.parse(line.slice(6));
          });
          if (!data) continue;
          if (ev === "error") throw new PW.api.Error(409, data.error.code, data.error.message, data.error.path);
          if (ev === "done") {
            server = data.results && data.results[0];
            continue;
          }
          var now = performance.now();
          if (tFirst === null) tFirst = now;
          tLast = now;
          n++;
          ids.push(data.token);
          out.textContent += data.token < 256 ? dec.decode(new Uint8Array([data.token]), {stream: true})
                                              : (ids.length > 1 ? " " : "") + data.token;
        }
      }
    } catch (e) {
      if (e.name !== "AbortError") showError(e);
    }
    var total = (performance.now() - t0) / 1e3;
    /* tokens that came in one read share a time: no rate from them here */
    var rec = {job: id, prompt: prompt.value, n: n, ttft: tFirst === null ? null : (tFirst - t0) / 1e3,
               rate: n > 1 && tLast > tFirst ? (n - 1) / ((tLast - tFirst) / 1e3) : null, total: total};
    var ms = function (s) { return s === null ? "\u2014" : (s * 1e3).toFixed(1) + " ms"; };
    var rate = function (x) { return x === null ? "\u2014" : x.toFixed(1); };
    stats.textContent = n + " tokens; time to first token " + ms(rec.ttft) + "; " + rate(rec.rate) + " tokens/s after it" +
      (server ? " (coordinator: " + ms(server.time_to_first_token) + ", " + rate(server.tokens_per_s) + " tokens/s)" : "");
    history.push(rec);
    if (!stopped) row(rec);
    goBtn.disabled = false;
    stopBtn.disabled = true;
    ctrl = null;
  }

  loadJobs();
  return function () {
    stopped = true;
    if (ctrl) ctrl.abort();
  };
};
