/* jobcharts: the job page's training curves — loss, learning rate,
 * gradient norm, tokens/s and step time (charts.js) — and other jobs
 * overlaid on them by step.
 *
 * PW.jobcharts(id, overlay) returns {el, load(), destroy()}: el is the
 * section to place, load() fetches the job's new rows
 * (GET /v1/jobs/{id}/metrics?since=N) and redraws, destroy() stops
 * everything. overlay is the hash's "1,2" (#/jobs/3?overlay=1,2): the
 * overlay input rewrites it (history.replaceState, so the view is not
 * made again) so a view can be shared. Each overlaid job's rows are
 * fetched once; only those still live are polled again. */
"use strict";
var PW = window.PW || (window.PW = {});

PW.jobcharts = function (id, overlay) {
  var d = PW.dom, h = d.h;
  var TERMINAL = {succeeded: 1, failed: 1, cancelled: 1};
  var MAX_OVERLAY = 8;
  /* the charts' own colours and more: with jobs overlaid, job k of the
   * list takes PALETTE[k] on every chart */
  var PALETTE = ["#d9480f", "#2b8a3e", "#5f3dc4", "#2a6fdb", "#495057", "#c2255c", "#e67700", "#0b7285", "#862e9c"];
  /* key: the metrics row's field; smooth: the default weight (none for the
   * schedule-driven lr; none for step time either: a slow step is what
   * one looks for there) */
  /* also: a second series of held-out points (the metrics rows' field;
   * train.eval_every), in its own colour for the page's job */
  var CHARTS = [
    {key: "loss", el: "chart-loss", title: "training loss", color: "#d9480f", smooth: 0.6,
     also: {key: "eval_loss", label: "eval", color: "#0b7285"}},
    {key: "lr", el: "chart-lr", title: "learning rate", color: "#2b8a3e", smooth: 0},
    {key: "grad_norm", el: "chart-grad-norm", title: "gradient norm", color: "#5f3dc4", smooth: 0.6},
    {key: "tokens_per_s", el: "chart-throughput", title: "tokens per second", color: "#2a6fdb", smooth: 0.6},
    {key: "step_time", el: "chart-step-time", title: "step time (s)", color: "#495057", smooth: 0}
  ];

  /* one per job drawn: {id, name, state, rows: {step: row}, next, done, error} */
  var own = {id: +id, name: "", rows: {}, next: 0}, others = [];
  var charts = {}, stopped = false, stopPoll = function () {};

  var input = h("input", {type: "text", id: "overlay-input", placeholder: "job ids, e.g. 1, 2", size: 16,
                          "aria-label": "jobs to overlay (ids, comma separated)",
                          on: {keydown: function (ev) { if (ev.key === "Enter") apply(input.value); }}});
  var pick = h("select", {id: "overlay-pick", "aria-label": "add a recent job", on: {
    focus: recent,
    change: function () {
      if (pick.value) apply(input.value + (input.value.trim() ? ", " : "") + pick.value);
      pick.value = "";
    }}}, h("option", {value: ""}, "add a recent job\u2026"));
  var note = h("span", {class: "muted small", id: "overlay-note"});
  var boxes = CHARTS.map(function (c) { return h("div", {id: c.el}); });
  var el = h("section", {class: "card", id: "charts-card"},
    h("div", {class: "card-head"}, h("h2", null, "Training curves"),
      h("label", {class: "inline small"}, "Overlay jobs ", input),
      pick,
      h("button", {type: "button", id: "overlay-apply", on: {click: function () { apply(input.value); }}}, "Overlay"),
      note),
    h("div", {class: "chart-main"}, boxes[0]),
    h("div", {class: "chart-grid"}, boxes.slice(1)));
  CHARTS.forEach(function (c, i) {
    charts[c.key] = PW.charts.metric(boxes[i], {key: c.key, title: c.title, smooth: c.smooth,
                                                empty: "no steps yet"});
  });

  function label(j) { return "job " + j.id + (j.name ? " " + j.name : ""); }

  function redraw() {
    var jobs = [own].concat(others.filter(function (o) { return !o.error; }));
    var steps = jobs.map(function (j) {
      return Object.keys(j.rows).map(Number).sort(function (a, b) { return a - b; });
    });
    CHARTS.forEach(function (c) {
      /* alone, each chart its own colour; overlaid, each job one colour on every chart */
      var series = [];
      jobs.forEach(function (j, k) {
        var color = jobs.length === 1 ? c.color : PALETTE[k % PALETTE.length];
        series.push({job: j.id, label: label(j), color: color, xs: steps[k],
                     ys: steps[k].map(function (s) { return j.rows[s][c.key]; })});
        if (!c.also) return;
        var at = steps[k].filter(function (s) { return d.isNum(j.rows[s][c.also.key]); });
        if (at.length) series.push({job: j.id, label: label(j) + " " + c.also.label, points: true,
                                    color: jobs.length === 1 ? c.also.color : color, xs: at,
                                    ys: at.map(function (s) { return j.rows[s][c.also.key]; })});
      });
      charts[c.key].set(series);
    });
  }

  /* New rows of one job; true when there were any. */
  async function rowsOf(j) {
    var res = await PW.api.get("/v1/jobs/" + j.id + "/metrics?since=" + j.next);
    var rows = res.metrics || [];
    rows.forEach(function (m) {
      j.rows[m.step] = m;
      if (m.step + 1 > j.next) j.next = m.step + 1;
    });
    return rows.length > 0;
  }

  /* The recent jobs for the picker, fetched when it is opened. */
  var listed = false;
  async function recent() {
    if (listed) return;
    listed = true;
    try {
      var res = await PW.api.get("/v1/jobs?limit=20");
      (res.jobs || []).forEach(function (j) {
        if (j.id !== own.id) pick.appendChild(h("option", {value: j.id}, "job " + j.id + " " + (j.name || "")));
      });
    } catch (e) { listed = false; }
  }

  function parse(text) {
    var ids = [];
    String(text || "").split(/[\s,]+/).forEach(function (t) {
      if (/^\d+$/.test(t) && +t !== own.id && ids.indexOf(+t) < 0) ids.push(+t);
    });
    return ids.slice(0, MAX_OVERLAY);
  }

  /* Overlay these jobs: keep what is loaded of those already shown, fetch
   * the new ones, put them in the URL. */
  function apply(text) {
    var ids = parse(text);
    input.value = ids.join(", ");
    var hash = "#/jobs/" + own.id + (ids.length ? "?overlay=" + ids.join(",") : "");
    if (location.hash !== hash) history.replaceState(null, "", hash);
    others = ids.map(function (oid) {
      var had = others.filter(function (o) { return o.id === oid; })[0];
      return had || {id: oid, name: "", state: "", rows: {}, next: 0, done: false, error: ""};
    });
    stopPoll();
    redraw();
    if (others.length) stopPoll = PW.poll(pollOthers, 2000);
    else note.textContent = "";
  }

  /* One round over the overlaid jobs not yet done: their state and new
   * rows; a finished job is fetched once more after it ends, then left. */
  async function pollOthers() {
    if (stopped) return false;
    var live = others.filter(function (o) { return !o.done; });
    var changed = false;
    await Promise.all(live.map(async function (o) {
      try {
        var j = await PW.api.get("/v1/jobs/" + o.id);
        if (o.name !== (j.name || "") || o.error) changed = true;
        o.name = j.name || "";
        o.state = j.state;
        o.error = "";
        if (await rowsOf(o)) changed = true;
        if (TERMINAL[j.state]) o.done = true;
      } catch (e) {
        o.error = "job " + o.id + ": " + e.toString();
        o.done = e.status === 404;
        changed = true;
      }
    }));
    if (stopped) return false;
    var bad = others.filter(function (o) { return o.error; }).map(function (o) { return o.error; });
    note.textContent = bad.length ? "Not overlaid: " + bad.join("; ") : "";
    if (changed) redraw();
    return others.every(function (o) { return o.done; }) ? false : 2000;
  }

  if (overlay) apply(overlay);

  return {
    el: el,
    /* the page's job: its name (for the legends) and new rows */
    load: async function (name) {
      var fresh = await rowsOf(own);
      if (fresh || own.name !== (name || "")) {
        own.name = name || "";
        redraw();
      }
    },
    destroy: function () {
      stopped = true;
      stopPoll();
      CHARTS.forEach(function (c) { charts[c.key].destroy(); });
    }
  };
};
