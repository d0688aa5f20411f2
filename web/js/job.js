/* job: one job's page — spec summary and partition, status, progress and
 * ETA, training curves with other jobs overlaid (jobcharts.js), the
 * pipeline timeline of a sampled step (measured against planned), every
 * attempt (attempts.js), events, cancel, retry and checkpoint download.
 *
 * Data: GET /v1/jobs/{id} (with its spec, ranks and their mesh
 * coordinates (mesh.js), snapshots, restarts, attempts and eta_seconds),
 * POST /v1/jobs/{id}/retry,
 * /metrics?since, /events?since, /timeline?step (and ?format=chrome),
 * /checkpoint, DELETE /v1/jobs/{id}, and POST /v1/plans with the job's spec
 * for the partition table (stage -> rank -> layers, params). Polls while
 * the job is live; stops after the last fetch once it is finished. */
"use strict";
var PW = window.PW || (window.PW = {});
PW.views = PW.views || {};

PW.views.job = function (root, params) {
  var d = PW.dom, h = d.h;
  var id = params.id, base = "/v1/jobs/" + encodeURIComponent(id);
  var TERMINAL = {succeeded: 1, failed: 1, cancelled: 1};

  /* ---- skeleton ---------------------------------------------------------- */
  var title = h("h1", {id: "job-name", class: "job-title"}, "job " + id);
  var state = h("span", {id: "job-state"});
  var statusLine = h("p", {class: "status-line", id: "job-status"});
  var errorBox = h("div", {class: "banner error", id: "job-error", hidden: true});
  var loadErr = h("div", {class: "banner error", hidden: true, role: "alert"});
  /* ranks that share a host's cores (the job's "contention"): why measured bubbles run high */
  var contentionBox = h("div", {class: "banner warn", id: "job-contention", hidden: true, role: "note"});
  /* "schedule": "auto": what the coordinator chose and why (the job's "auto" event) */
  var autoBox = h("div", {class: "banner", id: "job-auto", hidden: true, role: "note"});
  var actionMsg = h("span", {class: "muted small", id: "job-action-msg"});
  var cancelBtn = h("button", {type: "button", class: "danger", id: "job-cancel", hidden: true, on: {click: cancel}},
                    "Cancel job");
  var retryBtn = h("button", {type: "button", id: "job-retry", hidden: true, on: {click: retry}},
                   "Retry from newest state");
  var ckptLink = h("a", {href: base + "/checkpoint", class: "button", id: "job-checkpoint",
                         download: "job-" + id + ".safetensors",
                         on: {click: function (ev) { ev.preventDefault(); dl(base + "/checkpoint", "job-" + id + ".safetensors"); }}},
                   "Download checkpoint");
  var planLink = h("a", {href: "#/plan?job=" + encodeURIComponent(id), class: "button"}, "Compare schedules");

  var progBox = h("div", {class: "progress-big"});
  var facts = h("dl", {class: "facts", id: "job-facts"});
  var meshBox = h("div", {id: "job-mesh-box"});
  var specBox = h("dl", {class: "facts", id: "job-spec"});
  var specRaw = h("pre", {class: "code"});
  var partBody = h("tbody");
  var partNote = h("p", {class: "muted small"});
  var curves = PW.jobcharts(id, params.overlay);
  var eventsBody = h("tbody");
  var attemptsBody = h("tbody");
  var attemptsNote = h("p", {class: "muted small", id: "attempts-note"});

  var stepSel = h("select", {id: "timeline-step", "aria-label": "step", on: {change: function () {
    follow.checked = false;
    loadTimeline(+stepSel.value);
  }}});
  var follow = h("input", {type: "checkbox", id: "timeline-follow", checked: true});
  var traceLink = h("a", {href: "#", id: "timeline-trace", class: "button small", hidden: true}, "Chrome trace (Perfetto)");
  var bubbleBox = h("div", {class: "bubbles", id: "timeline-bubble"});
  var tlNote = h("p", {class: "muted small", id: "timeline-note"});
  var tlMeasured = h("div", {class: "timeline", id: "tl-measured"});
  var tlPlanned = h("div", {class: "timeline", id: "tl-planned"});
  var measuredHead = h("h3", {id: "tl-measured-title"}, "Measured");
  var plannedHead = h("h3", {id: "tl-planned-title"}, "Planned (simulator)");

  d.fill(root,
    h("div", {class: "page-head"},
      h("div", {class: "crumbs"}, h("a", {href: "#/"}, "Overview"), " / job " + id),
      h("div", {class: "title-row"}, title, state),
      statusLine,
      h("div", {class: "actions"}, cancelBtn, retryBtn, ckptLink, planLink, actionMsg)),
    loadErr, errorBox, contentionBox, autoBox,
    h("section", {class: "card"},
      h("div", {class: "card-head"}, h("h2", null, "Progress")),
      progBox, facts),
    h("section", {class: "card", id: "mesh-card"},
      h("div", {class: "card-head"}, h("h2", null, "Mesh"),
        h("span", {class: "muted small"}, "which worker holds each (pipeline rank, replica, tp rank)")),
      meshBox),
    curves.el,
    h("section", {class: "card", id: "timeline-card"},
      h("div", {class: "card-head"}, h("h2", null, "Pipeline timeline"),
        h("label", {class: "inline"}, "step ", stepSel),
        h("label", {class: "inline"}, follow, " follow latest"),
        traceLink),
      bubbleBox, PW.timeline.legend(), tlNote,
      measuredHead, tlMeasured, plannedHead, tlPlanned),
    h("div", {class: "cols"},
      h("section", {class: "card"}, h("div", {class: "card-head"}, h("h2", null, "Spec")), specBox,
        h("details", null, h("summary", null, "full spec (JSON)"), specRaw)),
      h("section", {class: "card"}, h("div", {class: "card-head"}, h("h2", null, "Partition")),
        h("div", {class: "table-wrap"}, h("table", {class: "grid", id: "partition-table"},
          h("thead", null, h("tr", null, h("th", {class: "num"}, "stage"), h("th", {class: "num"}, "rank"),
            h("th", null, "worker"), h("th", null, "layers"), h("th", {class: "num"}, "params"))),
          partBody)), partNote)),
    h("section", {class: "card", id: "attempts-card"}, h("div", {class: "card-head"}, h("h2", null, "Attempts")),
      attemptsNote, PW.attempts.table(attemptsBody)),
    h("section", {class: "card"}, h("div", {class: "card-head"}, h("h2", null, "Events")),
      h("div", {class: "events-wrap"}, h("table", {class: "grid events", id: "events-table"},
        h("thead", null, h("tr", null, h("th", null, "time"), h("th", null, "kind"), h("th", null, "message"))),
        eventsBody))));

  /* ---- state --------------------------------------------------------------- */
  var job = null, lastEvent = 0, finalDone = false;
  var partitionFor = null, tl = {step: null, steps: [], data: null}, stopped = false;

  function dl(path, name) {
    actionMsg.textContent = "";
    PW.api.download(path, name).catch(function (e) {
      actionMsg.textContent = e.status === 404 ? "No checkpoint yet: " + e.message : "Download failed: " + e.toString();
    });
  }

  async function cancel() {
    if (!job || TERMINAL[job.state]) return;
    if (!window.confirm("Cancel job " + id + " (" + (job.name || "") + ")? Its workers stop at once.")) return;
    cancelBtn.disabled = true;
    try {
      await PW.api.del(base);
      actionMsg.textContent = "cancel requested";
    } catch (e) {
      actionMsg.textContent = "Cancel failed: " + e.toString();
    }
    cancelBtn.disabled = false;
  }

  async function retry() {
    if (!job || (job.state !== "failed" && job.state !== "cancelled")) return;
    retryBtn.disabled = true;
    try {
      await PW.api.post(base + "/retry");
      actionMsg.textContent = "queued again: it resumes from its newest state";
      finalDone = false; /* polling stopped at the end: follow the job again */
      stop();
      if (!stopped) stop = PW.poll(refresh, 2000);
    } catch (e) {
      actionMsg.textContent = "Retry failed: " + e.toString();
    }
    retryBtn.disabled = false;
  }

  function fact(name, value, attrs) {
    return [h("dt", null, name), h("dd", attrs || null, value)];
  }

  /* The note on ranks that share cores, as text (the message comes from
   * the workers' hostnames); "why" opens the explanation below it. */
  function renderContention(c) {
    contentionBox.hidden = !c;
    if (!c) return;
    d.fill(contentionBox,
      h("strong", null, "Ranks share CPU cores. "), h("span", {id: "job-contention-msg"}, c.message || ""), ". ",
      h("a", {href: "#", id: "job-contention-why", on: {click: function (ev) {
        ev.preventDefault();
        why.hidden = !why.hidden;
      }}}, "Why the bubble grows"));
    var why = h("p", {class: "small", id: "job-contention-doc", hidden: true},
      "A rank waits for a free core before it computes, and the workers count that wait as idle time, so the " +
      "measured bubble is above the plan's. The timeline below adds the bubble the plan expects on these shared " +
      "cores. Give each rank its own cores (fewer workers per host, or fewer threads) to close the gap. " +
      "The model and its limits: docs/architecture.md, section \u201cRanks that share cores\u201d.");
    contentionBox.appendChild(why);
  }

  function renderJob(j) {
    var p = j.progress || {}, now = Date.now() / 1000;
    document.title = (j.name || "job " + id) + " \u00b7 pipewright";
    title.textContent = j.name || "job " + id;
    title.setAttribute("data-name", j.name || "");
    d.fill(state, d.badge(j.state));
    statusLine.textContent = j.status || "";
    errorBox.hidden = !j.error;
    errorBox.textContent = j.error ? "Error: " + j.error : "";
    cancelBtn.hidden = !!TERMINAL[j.state];
    retryBtn.hidden = j.state !== "failed" && j.state !== "cancelled";
    /* only when there is one: the final model, or a retained step of a run that did not finish */
    ckptLink.hidden = j.state !== "succeeded" && !newestCkpt;
    ckptLink.textContent = j.state === "succeeded" || !newestCkpt ? "Download checkpoint"
      : "Download checkpoint (step " + newestCkpt + ")";
    var shown = contentionBox.querySelector("#job-contention-msg");
    if (!!j.contention !== !contentionBox.hidden || (j.contention && (!shown || shown.textContent !== j.contention.message)))
      renderContention(j.contention); /* redrawn on change only: an open "why" stays open */
    PW.attempts.render(attemptsBody, j.attempts);
    attemptsNote.textContent = "Restarts after a lost worker: " + (d.isNum(j.restarts) ? j.restarts : 0) +
      " of at most " + (d.isNum(j.max_restarts) ? j.max_restarts : d.DASH) + ".";
    var elapsed = d.isNum(j.started) ? (d.isNum(j.finished) ? j.finished : now) - j.started : null;
    d.fill(progBox, d.progress(p.step, p.total),
      h("span", {class: "progress-text"},
        (p.step || 0) + " of " + (p.total || "?") + " steps" +
        (j.state === "running" && d.isNum(j.eta_seconds) ? " \u00b7 ETA " + d.dur(j.eta_seconds) : "")));
    var ranks = (j.ranks || []).map(function (r) {
      return "rank " + r.rank + ": " + (r.worker || "?") + (r.stages && r.stages.length ? " (s" + r.stages.join(",s") + ")" : "") +
        (r.coordinate ? " [" + PW.mesh.label(r.coordinate) + "]" : "");
    }).join(" \u00b7 ");
    d.fill(facts,
      fact("state", j.state), fact("latest loss", d.num(j.loss, 4), {id: "job-loss"}),
      fact("tokens/s", d.si(j.tokens_per_s)),
      fact("created", d.clock(j.created)), fact("started", d.clock(j.started)),
      fact(d.isNum(j.finished) ? "finished" : "elapsed", d.isNum(j.finished) ? d.clock(j.finished) : d.dur(elapsed)),
      fact("duration", d.dur(elapsed)),
      fact("ETA", j.state === "running" ? d.dur(j.eta_seconds) : d.DASH),
      fact("attempt / run", d.isNum(j.run) ? "run " + j.run : d.DASH),
      fact("restarts", (d.isNum(j.restarts) ? j.restarts : 0) + " of " +
           (d.isNum(j.max_restarts) ? j.max_restarts : d.DASH), {id: "job-restarts"}),
      fact("workers", ranks || d.DASH),
      fact("snapshots", snapshotsText(j.snapshots), {id: "job-snapshots"}));
    var mk = JSON.stringify([j.ranks || [], (j.spec || {}).mesh || {}]);
    if (meshBox.getAttribute("data-key") !== mk) {
      meshBox.setAttribute("data-key", mk);
      d.fill(meshBox, PW.mesh.grid(j.ranks, (j.spec || {}).mesh));
    }
  }

  /* the in-memory snapshots the runs take; when off, the job view's note says why */
  function snapshotsText(sn) {
    if (!sn) return d.DASH;
    return sn.every > 0 ? "every " + (sn.every === 1 ? "step" : sn.every + " steps") : sn.note || "off";
  }

  function renderSpec(spec) {
    var m = spec.model || {}, me = spec.mesh || {}, sc = spec.schedule || {}, tr = spec.train || {},
        op = tr.optimizer || {}, da = spec.data || {}, pa = spec.partition || {};
    var model = m.template ? m.template + " \u00b7 d_model " + m.d_model + " \u00b7 " + m.n_layers + " layers" +
      (m.n_heads ? " \u00b7 " + m.n_heads + " heads" : "") + (m.vocab_size ? " \u00b7 vocab " + m.vocab_size : "") +
      (m.seq_len ? " \u00b7 seq " + m.seq_len : "")
      : (m.layers ? m.layers.length + " explicit layers" : d.DASH);
    d.fill(specBox,
      fact("model", model),
      fact("mesh", "pp " + me.pp + " \u00b7 dp " + me.dp + " \u00b7 tp " + (me.tp || 1) + " \u00b7 virtual stages " +
           (me.virtual_stages || 1)),
      fact("schedule", (sc.name || d.DASH) + " \u00b7 " + sc.microbatches + " microbatches"),
      fact("partition", pa.mode || "even"),
      fact("training", tr.steps + " steps \u00b7 batch " + tr.batch_size + " \u00b7 seed " + tr.seed +
           (tr.checkpoint_every ? " \u00b7 checkpoint every " + tr.checkpoint_every : "")),
      fact("optimizer", (op.name || d.DASH) + (d.isNum(op.lr) ? " \u00b7 lr " + d.num(op.lr, 3) : "") +
           (d.isNum(op.min_lr) ? " \u2192 " + d.num(op.min_lr, 3) : "") +
           (d.isNum(op.warmup_steps) ? " \u00b7 warmup " + op.warmup_steps : "") +
           (d.isNum(op.weight_decay) ? " \u00b7 weight decay " + d.num(op.weight_decay, 3) : "")),
      fact("data", (da.kind || "") + (da.path ? " \u00b7 " + da.path : "") + (da.sampler ? " \u00b7 " + da.sampler : "")));
    specRaw.textContent = JSON.stringify(spec, null, 2);
  }

  async function loadPartition(j) {
    var key = JSON.stringify(j.spec) + JSON.stringify(j.ranks || []);
    if (partitionFor === key) return;
    partitionFor = key;
    var workerOf = {}; /* pipeline rank -> its workers (every replica's and tp member's) */
    (j.ranks || []).forEach(function (r) {
      var p = (r.coordinate || PW.mesh.coord(r.rank, (j.spec || {}).mesh)).pipeline_rank;
      workerOf[p] = (workerOf[p] ? workerOf[p] + ", " : "") + (r.worker || "?");
    });
    try {
      var plan = await PW.api.post("/v1/plans", j.spec);
      var st = (plan.partition && plan.partition.stages) || [], total = 0;
      d.fill(partBody, st.map(function (s) {
        total += s.params || 0;
        return h("tr", {data: {stage: s.stage}},
          h("td", {class: "num"}, s.stage), h("td", {class: "num"}, s.rank),
          h("td", null, workerOf[s.rank] || h("span", {class: "muted"}, "not assigned")),
          h("td", {class: "layers"}, (s.layers || []).join(", ")),
          h("td", {class: "num"}, d.int(s.params)));
      }), h("tr", {class: "total"}, h("td", {colspan: 4}, "total"), h("td", {class: "num"}, d.int(total))));
      partNote.textContent = "Partition mode " + ((plan.partition && plan.partition.mode) || "even") + "; " +
        st.length + " stages on " + ((plan.mesh && plan.mesh.pp) || "?") + " pipeline ranks.";
    } catch (e) {
      partitionFor = null;
      d.fill(partBody, h("tr", null, h("td", {colspan: 5, class: "empty"}, "Could not plan: " + e.toString())));
    }
  }

  async function loadEvents() {
    var res = await PW.api.get(base + "/events?since=" + lastEvent);
    (res.events || []).forEach(function (e) {
      if (e.id > lastEvent) lastEvent = e.id;
      var row = h("tr", {data: {kind: e.kind}},
        h("td", {class: "nowrap mono small"}, d.clock(e.time)),
        h("td", null, h("span", {class: "tag kind-" + String(e.kind).replace(/[^a-z_-]/gi, "")}, e.kind)),
        h("td", {class: "msg"}, e.message));
      eventsBody.insertBefore(row, eventsBody.firstChild);
      if (e.kind === "auto") {
        d.fill(autoBox, h("strong", null, "Configuration chosen by the coordinator. "), h("span", null, e.message));
        autoBox.hidden = false;
      }
    });
  }

  /* ---- timeline ------------------------------------------------------------- */

  function setSteps(steps) {
    var cur = stepSel.value;
    var same = steps.length === tl.steps.length && steps.every(function (s, i) { return s === tl.steps[i]; });
    if (same) return;
    tl.steps = steps.slice();
    d.fill(stepSel, steps.length ? steps.map(function (s) { return h("option", {value: s}, "step " + s); })
                                 : h("option", {value: ""}, "none sampled yet"));
    if (cur !== "") stepSel.value = cur;
  }

  async function loadTimeline(step) {
    var q = base + "/timeline" + (d.isNum(step) && step >= 0 ? "?step=" + step : "");
    var res;
    try {
      res = await PW.api.get(q);
    } catch (e) {
      tlNote.textContent = "Timeline unavailable: " + e.toString();
      return;
    }
    setSteps(res.steps || []);
    var measured = PW.timeline.fromMeasured(res.ranks || []);
    var planned = res.planned ? PW.timeline.fromSim(res.planned.timeline || []) : [];
    if (d.isNum(res.step)) stepSel.value = String(res.step);
    var changed = tl.step !== res.step || !tl.data;
    tl.step = res.step;
    tl.data = res;
    if (!changed && tlMeasured.firstChild) return;
    drawTimeline(measured, planned, res);
  }

  /* A regions model's regions over these lanes (every replica's ranks of a
   * region's pipeline ranks), or undefined. */
  function laneRegions(res, lanes) {
    var rg = res.planned && res.planned.regions, pp = res.planned && (res.planned.timeline || []).length;
    if (!rg || !pp) return undefined;
    return rg.map(function (r) {
      return {name: r.name, ranks: lanes.map(function (l) { return l.rank; })
        .filter(function (k) { return r.ranks.indexOf(k % pp) >= 0; })};
    });
  }

  function drawTimeline(measured, planned, res) {
    var ms, ps;
    if (measured.length) {
      var mesh = job && job.spec ? job.spec.mesh : null;
      ms = PW.timeline.render(tlMeasured, measured, {id: "tlm", title: "measured step " + res.step,
                                                     regions: laneRegions(res, measured), mesh: mesh});
      measuredHead.textContent = "Measured \u2014 step " + res.step + " \u00b7 makespan " + d.secs(ms.makespan);
      var chrome = base + "/timeline?step=" + res.step + "&format=chrome";
      traceLink.hidden = false;
      traceLink.setAttribute("href", chrome);
      traceLink.onclick = function (ev) {
        ev.preventDefault();
        dl(chrome, "job-" + id + "-step-" + res.step + "-trace.json");
      };
      tlNote.textContent = "Each lane is one pipeline rank; a block is one action (F forward, B backward, I input " +
        "gradient, W weight gradient) labelled microbatch\u00b7stage; hatched gaps are idle time (the bubble). " +
        "Planned times come from the planner's FLOP cost model, so compare the shapes and bubble ratios rather " +
        "than absolute times." + (mesh && mesh.tp > 1 ? " Lanes bracketed together are one stage's tensor-parallel " +
        "group (its members run the same actions on their shards); the planned timeline has one lane per pipeline " +
        "rank." : "");
    } else {
      d.fill(tlMeasured, h("p", {class: "empty"}, "No step has been sampled yet: workers report action timings " +
        "for sampled steps while the job runs."));
      tlMeasured.setAttribute("data-lanes", "0");
      measuredHead.textContent = "Measured";
      traceLink.hidden = true;
      tlNote.textContent = "";
    }
    if (planned.length) {
      ps = PW.timeline.render(tlPlanned, planned, {id: "tlp", title: "planned", regions: laneRegions(res, planned)});
      plannedHead.textContent = "Planned (simulator, " + ((res.planned && res.planned.schedule) || "") +
        ") \u00b7 makespan " + d.secs(ps.makespan);
    } else {
      d.fill(tlPlanned, h("p", {class: "empty"}, "No plan available."));
    }
    var b = res.bubble || {};
    var mb = d.isNum(b.measured) ? b.measured : ms ? ms.bubble : null;
    var pb = d.isNum(b.planned) ? b.planned : ps ? ps.bubble : null;
    var sb = d.isNum(b.planned_shared) ? b.planned_shared : null;
    d.fill(bubbleBox,
      bubble("measured bubble", mb, "timeline-bubble-measured"),
      bubble("planned bubble", pb, "timeline-bubble-planned"),
      sb !== null ? bubble("planned, shared cores", sb, "timeline-bubble-shared") : null,
      d.isNum(mb) && d.isNum(pb) ? h("div", {class: "bubble-delta muted small"},
        (mb >= pb ? "+" : "") + (100 * (mb - pb)).toFixed(1) + " points vs plan" +
        (sb !== null && d.isNum(mb) ? ", " + (mb >= sb ? "+" : "") + (100 * (mb - sb)).toFixed(1) +
         " vs shared cores" : "")) : null,
      sb !== null && res.contention ? h("p", {class: "bubble-shared-note small", id: "timeline-shared-note"},
        "Ranks share cores (" + res.contention.message + "): the shared-cores bubble is the plan replayed with " +
        "each host's cores taken in turns, a rank waiting for a core counted idle as the workers count it.") : null);
  }

  function bubble(name, v, elId) {
    var bar = h("span", {class: "bar"});
    bar.style.width = d.isNum(v) ? (100 * Math.min(1, v)).toFixed(1) + "%" : "0";
    return h("div", {class: "bubble", id: elId},
      h("div", {class: "bubble-name"}, name),
      h("div", {class: "bubble-value"}, d.pct(v)),
      h("span", {class: "track"}, bar));
  }

  /* ---- polling -------------------------------------------------------------- */

  var newestCkpt = 0; /* the newest retained checkpoint step, 0 when none */
  async function loadCheckpoints() {
    try {
      var c = await PW.api.get(base + "/checkpoints");
      newestCkpt = (c.checkpoints || []).reduce(function (m, x) { return Math.max(m, x.step || 0); }, 0);
    } catch (e) { newestCkpt = 0; }
  }

  var tick = 0;
  async function refresh() {
    if (stopped) return false;
    try {
      var j = await PW.api.get(base);
      job = j;
      if (j.state !== "succeeded" && (tick % 5 === 0 || TERMINAL[j.state])) await loadCheckpoints();
      loadErr.hidden = true;
      renderJob(j);
      if (j.spec && tick === 0) renderSpec(j.spec);
      if (j.spec) loadPartition(j);
      await Promise.all([curves.load(j.name), loadEvents(),
        (tick === 0 || (follow.checked && (tick % 2 === 0 || TERMINAL[j.state]))) ? loadTimeline(-1) : null]);
      tick++;
      if (TERMINAL[j.state]) {
        if (finalDone) return false; /* one full fetch after the end, then stop */
        finalDone = true;
        return 200;
      }
    } catch (e) {
      loadErr.hidden = false;
      loadErr.textContent = (e.status === 404 ? "" : "Could not load job " + id + ": ") + e.toString();
      if (e.status === 404) return false;
    }
    return 2000;
  }

  var stop = PW.poll(refresh, 2000);
  var onResize = function () {
    if (!tl.data) return;
    drawTimeline(PW.timeline.fromMeasured(tl.data.ranks || []),
                 tl.data.planned ? PW.timeline.fromSim(tl.data.planned.timeline || []) : [], tl.data);
  };
  var resizeTimer = null;
  var onWinResize = function () { clearTimeout(resizeTimer); resizeTimer = setTimeout(onResize, 150); };
  window.addEventListener("resize", onWinResize);

  return function () {
    stopped = true;
    stop();
    window.removeEventListener("resize", onWinResize);
    curves.destroy();
  };
};
