/* overview: the landing page — workers with their health and jobs with
 * their state and progress, refreshed every few seconds.
 * Data: GET /v1/workers, GET /v1/jobs?limit&state. */
"use strict";
var PW = window.PW || (window.PW = {});
PW.views = PW.views || {};

PW.views.overview = function (root) {
  var d = PW.dom, h = d.h;
  var limit = 50, stateFilter = "";

  var banner = h("div", {class: "banner error", hidden: true, role: "alert"});
  var summary = h("div", {class: "summary"});
  var workersBody = h("tbody");
  var jobsBody = h("tbody");
  var jobsFoot = h("div", {class: "table-foot"});
  var updated = h("span", {class: "muted small", id: "overview-updated"});

  var filter = h("select", {id: "job-state-filter", "aria-label": "filter jobs by state", on: {change: function () {
    stateFilter = filter.value;
    refresh();
  }}}, ["", "queued", "planning", "dispatching", "running", "succeeded", "failed", "cancelled"].map(function (s) {
    return h("option", {value: s}, s || "all states");
  }));

  d.fill(root,
    h("div", {class: "page-head"}, h("h1", null, "Overview"), updated),
    banner, summary,
    h("section", {class: "card"},
      h("div", {class: "card-head"}, h("h2", null, "Workers")),
      h("div", {class: "table-wrap"},
        h("table", {class: "grid", id: "workers-table"},
          h("thead", null, h("tr", null,
            h("th", null, "name"), h("th", null, "address"), h("th", null, "state"),
            h("th", {class: "num"}, "heartbeat"), h("th", null, "current job"),
            h("th", {class: "num"}, "threads"), h("th", null, "BLAS kernel"),
            h("th", {class: "num", title: "one-core sgemm measured at the worker's start"}, "sgemm"),
            h("th", null, "software"))),
          workersBody))),
    h("section", {class: "card"},
      h("div", {class: "card-head"}, h("h2", null, "Jobs"), filter,
        h("a", {href: "#/plan", class: "button"}, "Plan / submit a job")),
      h("div", {class: "table-wrap"},
        h("table", {class: "grid", id: "jobs-table"},
          h("thead", null, h("tr", null,
            h("th", {class: "num"}, "id"), h("th", null, "name"), h("th", null, "state"),
            h("th", null, "model"), h("th", null, "mesh"), h("th", null, "schedule"),
            h("th", null, "progress"), h("th", {class: "num"}, "loss"), h("th", {class: "num"}, "tokens/s"),
            h("th", null, "started"), h("th", {class: "num"}, "duration"))),
          jobsBody)),
      jobsFoot));

  function workerRow(w) {
    var job = w.job ? h("a", {href: "#/jobs/" + encodeURIComponent(w.job)}, "job " + w.job) : h("span", {class: "muted"}, "idle");
    var age = w.heartbeat_age;
    return h("tr", {data: {worker: w.name}},
      h("td", {class: "strong"}, w.name),
      h("td", {class: "mono"}, w.addr || d.DASH),
      h("td", null, d.badge(w.state)),
      h("td", {class: "num" + (d.isNum(age) && age > 5 ? " warn" : "")}, d.isNum(age) ? d.dur(age) + " ago" : d.DASH),
      h("td", {class: "worker-job"}, job, w.job && d.isNum(w.rank) && w.rank >= 0 ? h("span", {class: "muted"}, " rank " + w.rank) : null,
        w.job && w.coordinate ? h("span", {class: "muted small worker-coord"}, " \u00b7 " + PW.mesh.label(w.coordinate)) : null),
      h("td", {class: "num"}, (d.isNum(w.threads) ? w.threads : d.DASH) + (d.isNum(w.cores) ? " / " + w.cores + " cores" : "")),
      kernelCell(w),
      h("td", {class: "num worker-gemm"}, d.isNum(w.gemm_gflops) ? d.int(w.gemm_gflops) + " GF/s" : d.DASH),
      h("td", {class: "muted small"}, w.software || ""));
  }

  // The OpenBLAS kernel, "(forced)" when OPENBLAS_CORETYPE chose it, and
  // the coordinator's warnings (a forced kernel slower than the CPU allows).
  function kernelCell(w) {
    var warns = Array.isArray(w.warnings) ? w.warnings : [];
    return h("td", {class: "worker-kernel" + (warns.length ? " warn" : "")},
      (w.blas_core || d.DASH) + (w.blas_forced ? " (forced)" : ""),
      warns.map(function (t) { return h("div", {class: "worker-warning small", role: "note"}, t); }));
  }

  function meshText(m) {
    if (!m) return d.DASH;
    var t = "pp " + m.pp + " \u00d7 dp " + m.dp + (m.tp > 1 ? " \u00d7 tp " + m.tp : "");
    if (m.virtual_stages > 1) t += " \u00d7 v " + m.virtual_stages;
    return t;
  }

  /* Why a job waits or failed, under its state. */
  function reason(j) {
    var t = j.state === "failed" ? j.error : j.state === "queued" || j.state === "planning" ? j.status : "";
    return t ? h("div", {class: "muted small job-reason", title: t}, t) : null;
  }

  function jobRow(j, now) {
    var p = j.progress || {};
    var started = j.started, fin = j.finished;
    var duration = d.isNum(started) ? (d.isNum(fin) ? fin : now) - started : null;
    return h("tr", {data: {job: j.id, state: j.state}},
      h("td", {class: "num"}, j.id),
      h("td", {class: "name"}, h("a", {href: "#/jobs/" + encodeURIComponent(j.id), class: "job-name"}, j.name || "(unnamed)")),
      h("td", null, d.badge(j.state), reason(j)),
      h("td", null, j.model || d.DASH),
      h("td", {class: "nowrap"}, meshText(j.mesh)),
      h("td", {class: "nowrap"}, (j.schedule || d.DASH) + (j.microbatches ? " \u00b7 " + j.microbatches + " mb" : "")),
      h("td", null, d.progress(p.step, p.total)),
      h("td", {class: "num"}, d.num(j.loss, 4)),
      h("td", {class: "num"}, d.si(j.tokens_per_s)),
      h("td", {class: "nowrap", title: d.clock(started)}, d.isNum(started) ? d.ago(started, now) : d.DASH),
      h("td", {class: "num"}, duration === null ? d.DASH : d.dur(duration)));
  }

  async function refresh() {
    var now = Date.now() / 1000;
    try {
      var q = "/v1/jobs?limit=" + limit + (stateFilter ? "&state=" + encodeURIComponent(stateFilter) : "");
      var res = await Promise.all([PW.api.get("/v1/workers"), PW.api.get(q)]);
      var workers = res[0].workers || [], jobs = res[1];
      banner.hidden = true;

      d.fill(workersBody, workers.length ? workers.map(workerRow)
        : h("tr", null, h("td", {colspan: 9, class: "empty"}, "No workers connected. Start one with pipewright-worker --coordinator HOST:PORT.")));
      d.fill(jobsBody, (jobs.jobs || []).length ? jobs.jobs.map(function (j) { return jobRow(j, now); })
        : h("tr", null, h("td", {colspan: 11, class: "empty"}, stateFilter ? "No " + stateFilter + " jobs." : "No jobs yet.")));

      var shown = (jobs.jobs || []).length, total = d.isNum(jobs.total) ? jobs.total : shown;
      d.fill(jobsFoot, h("span", {class: "muted small"}, "showing " + shown + " of " + total),
        shown < total ? h("button", {type: "button", on: {click: function () { limit += 50; refresh(); }}}, "show more") : null);

      var count = function (arr, key, val) { return arr.filter(function (x) { return x[key] === val; }).length; };
      d.fill(summary,
        stat("workers", workers.length, count(workers, "state", "idle") + " idle \u00b7 " + count(workers, "state", "busy") +
             " busy" + (count(workers, "state", "lost") ? " \u00b7 " + count(workers, "state", "lost") + " lost" : "")),
        stat("jobs", total, stateFilter ? stateFilter : "all states"),
        stat("running", count(jobs.jobs || [], "state", "running"), "of those shown"),
        stat("queued", count(jobs.jobs || [], "state", "queued"), "of those shown"));
      updated.textContent = "updated " + d.clock(now).slice(11);
    } catch (e) {
      banner.hidden = false;
      banner.textContent = "Could not load: " + e.toString();
    }
  }

  function stat(name, value, sub) {
    return h("div", {class: "stat"}, h("div", {class: "stat-value"}, String(value)),
      h("div", {class: "stat-name"}, name), h("div", {class: "stat-sub muted small"}, sub));
  }

  return PW.poll(refresh, 2000);
};
