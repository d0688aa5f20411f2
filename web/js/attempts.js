/* attempts: the job page's table of attempts — one row per run of the job
 * (GET /v1/jobs/{id}'s "attempts", oldest first): its state, the workers
 * by rank, the step and source it resumed from, why it ended, when it
 * started and ended. A job that loses a worker goes back to the queue and
 * runs again, so this is where a person sees what happened to each try.
 * Every value is set as text (dom.js), never parsed as HTML. */
"use strict";
var PW = window.PW || (window.PW = {});

PW.attempts = (function () {
  var d = PW.dom, h = d.h;

  /* "step 12 · snapshot", "step 0 · start", or a dash when not recorded. */
  function resumed(a) {
    if (!d.isNum(a.start_step)) return d.DASH;
    return "step " + a.start_step + (a.resumed_from ? " \u00b7 " + a.resumed_from : "");
  }

  function row(a) {
    var workers = (a.workers || []).map(function (w) { return w === null ? "?" : w; });
    return h("tr", {data: {attempt: a.attempt, run: a.run, state: a.state}},
      h("td", {class: "num"}, a.attempt),
      h("td", null, d.badge(a.state), h("span", {class: "muted small"}, " run " + a.run)),
      h("td", {class: "attempt-workers"}, workers.length ? workers.join(", ") : d.DASH),
      h("td", {class: "nowrap attempt-resumed"}, resumed(a)),
      h("td", {class: "msg attempt-reason"}, a.reason || d.DASH),
      h("td", {class: "nowrap mono small"}, d.clock(a.started), h("br"),
        d.isNum(a.finished) ? d.clock(a.finished) : "open"));
  }

  /* The table's head; its body is filled by render. */
  function table(body) {
    return h("div", {class: "table-wrap"}, h("table", {class: "grid", id: "attempts-table"},
      h("thead", null, h("tr", null, h("th", {class: "num"}, "attempt"), h("th", null, "state"),
        h("th", null, "workers (by rank)"), h("th", null, "resumed from"), h("th", null, "reason"),
        h("th", null, "started / ended"))),
      body));
  }

  function render(body, attempts) {
    attempts = attempts || [];
    d.fill(body, attempts.length ? attempts.map(row)
      : h("tr", null, h("td", {colspan: 6, class: "empty"}, "No run yet.")));
  }

  return {table: table, render: render};
})();
