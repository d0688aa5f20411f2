/* plan: the dry-run page — paste a job spec (or pick an example or an
 * existing job's), compare every schedule side by side (POST
 * /v1/plans?compare=1: bubble, peak activations, makespan), then look at one
 * schedule in detail (POST /v1/plans?schedule=NAME with the mesh's virtual
 * stages set as the comparison ran it): partition, per-rank analytics, the
 * model-free bubble at unit costs (GET /v1/schedules/NAME/analytics), the
 * simulated timeline and the text grid. The spec can be submitted from
 * here (POST /v1/jobs).
 *
 * Custom schedules: the plan's per-rank action lists ("plan".ranks, one
 * line per rank) can be exported (downloaded as the spec's
 * schedule.custom object, and put in the editor), edited or loaded from a
 * file (that JSON object, or a CSV of one row per rank), and checked: the
 * spec goes to POST /v1/plans with its schedule replaced by
 * {"microbatches", "custom": {"ranks"}}, and the verdict is the
 * simulator's — the bubble and makespan, or the error naming the deadlock
 * or the missing action. */
"use strict";
var PW = window.PW || (window.PW = {});
PW.views = PW.views || {};

PW.EXAMPLE_SPECS = [
  {label: "gpt, 8 layers, pp 4, 8 microbatches", spec: {
    name: "gpt-pp4-example",
    model: {template: "gpt", vocab_size: 256, seq_len: 64, d_model: 64, n_layers: 8, n_heads: 4, tie_embeddings: false},
    mesh: {pp: 4, dp: 1, virtual_stages: 1},
    schedule: {name: "1f1b", microbatches: 8},
    partition: {mode: "even"},
    train: {steps: 100, batch_size: 16, seed: 1, grad_clip: 1.0, checkpoint_every: 50,
            optimizer: {name: "adamw", lr: 3e-3, min_lr: 3e-4, warmup_steps: 10, betas: [0.9, 0.95], eps: 1e-8,
                        weight_decay: 0.1}},
    data: {kind: "text", path: "examples/data/corpus.txt", sampler: "sequential"}}},
  {label: "gpt-tiny, pp 2, 4 microbatches", spec: {
    name: "gpt-tiny",
    model: {template: "gpt", vocab_size: 256, seq_len: 64, d_model: 64, n_layers: 4, n_heads: 4, tie_embeddings: false},
    mesh: {pp: 2, dp: 1, virtual_stages: 1},
    schedule: {name: "1f1b", microbatches: 4},
    partition: {mode: "even"},
    train: {steps: 300, batch_size: 16, seed: 1, grad_clip: 1.0, checkpoint_every: 100,
            optimizer: {name: "adamw", lr: 3e-3, min_lr: 3e-4, warmup_steps: 20, betas: [0.9, 0.95], eps: 1e-8,
                        weight_decay: 0.1}},
    data: {kind: "text", path: "examples/data/corpus.txt", sampler: "random"}}}
];

PW.views.plan = function (root, params) {
  var d = PW.dom, h = d.h;
  var stopped = false, lastSpec = null, rows = [], chosen = null, current = null;
  /* each compare or pick bumps it; an answer to an older request is dropped
   * (the page's first example and the user's own spec can be in flight at once) */
  var asked = 0;

  var pick = h("select", {id: "plan-pick", "aria-label": "pick a spec", on: {change: onPick}},
    h("option", {value: ""}, "pick a spec\u2026"),
    h("optgroup", {label: "examples"}, PW.EXAMPLE_SPECS.map(function (e, i) {
      return h("option", {value: "ex:" + i}, e.label);
    })));
  var jobsGroup = h("optgroup", {label: "jobs"});
  pick.appendChild(jobsGroup);

  var text = h("textarea", {id: "plan-spec", spellcheck: "false", rows: 22, "aria-label": "job spec (JSON)"});
  var errBox = h("div", {class: "banner error", id: "plan-error", hidden: true, role: "alert"});
  var msg = h("span", {class: "muted small", id: "plan-msg"});
  var compareBtn = h("button", {type: "button", id: "plan-compare", class: "primary", on: {click: compare}},
                     "Compare schedules");
  var submitBtn = h("button", {type: "button", id: "plan-submit", on: {click: submit}}, "Submit as job");
  var cmpBody = h("tbody");
  var cmpHead = h("p", {class: "muted small", id: "plan-compare-note"});
  var detail = h("div", {id: "plan-detail"});

  var customText = h("textarea", {id: "plan-custom", spellcheck: "false", rows: 6, wrap: "off",
                                  placeholder: "one line per rank, e.g.\nF0@s0 F1@s0 B0@s0 B1@s0\nF0@s1 B0@s1 F1@s1 B1@s1",
                                  "aria-label": "custom schedule: one line of actions per rank"});
  var customFile = h("input", {type: "file", id: "plan-custom-file", accept: ".json,.csv,.txt,application/json,text/csv",
                               "aria-label": "load a custom schedule file", on: {change: onCustomFile}});
  var checkBtn = h("button", {type: "button", id: "plan-custom-check", class: "primary", on: {click: checkCustom}},
                   "Check");
  var exportBtn = h("button", {type: "button", id: "plan-custom-export", on: {click: exportCustom},
                               title: "download the shown plan's action lists as schedule.custom"}, "Export current");
  var verdict = h("div", {id: "plan-custom-verdict", class: "verdict", role: "status", hidden: true});

  d.fill(root,
    h("div", {class: "page-head"}, h("h1", null, "Plan"),
      h("p", {class: "muted"}, "Dry-run a job spec: the partition, every schedule's simulated bubble, memory and " +
        "makespan under the FLOP cost model, and the per-rank schedule. Nothing runs.")),
    errBox,
    h("div", {class: "plan-layout"},
      h("section", {class: "card spec-card"},
        h("div", {class: "card-head"}, h("h2", null, "Job spec"), pick),
        text,
        h("div", {class: "actions"}, compareBtn, submitBtn, msg)),
      h("section", {class: "card"},
        h("div", {class: "card-head"}, h("h2", null, "Schedules side by side")),
        cmpHead,
        h("div", {class: "table-wrap"}, h("table", {class: "grid", id: "plan-compare-table"},
          h("thead", null, h("tr", null,
            h("th", null, "schedule"), h("th", {class: "num"}, "V"), h("th", {class: "num"}, "stages"),
            h("th", {class: "num"}, "makespan"), h("th", null, "bubble"),
            h("th", {class: "num"}, "peak act."), h("th", {class: "num"}, "pending W"),
            h("th", {class: "num"}, "actions"))),
          cmpBody)))),
    h("section", {class: "card", id: "plan-custom-card"},
      h("div", {class: "card-head"}, h("h2", null, "Custom schedule"),
        h("label", {class: "inline small"}, "load ", customFile)),
      h("p", {class: "muted small"}, "One line per pipeline rank, its actions in order as the plan prints them (F3@s1, " +
        "B, I, W; a fused pair F5@s0+B2@s3). Check plans the spec above with this schedule; the simulator proves " +
        "it or names what is wrong."),
      customText,
      h("div", {class: "actions"}, checkBtn, exportBtn, verdict)),
    detail);

  function showError(e) {
    errBox.hidden = !e;
    errBox.textContent = e ? (e instanceof SyntaxError ? "The spec is not valid JSON: " + e.message : e.toString()) : "";
  }

  function parseSpec() {
    return JSON.parse(text.value);
  }

  async function onPick() {
    var v = pick.value;
    if (!v) return;
    showError(null);
    try {
      if (v.indexOf("ex:") === 0) {
        text.value = JSON.stringify(PW.EXAMPLE_SPECS[+v.slice(3)].spec, null, 2);
      } else if (v.indexOf("job:") === 0) {
        var j = await PW.api.get("/v1/jobs/" + encodeURIComponent(v.slice(4)));
        text.value = JSON.stringify(j.spec || {}, null, 2);
      }
      compare();
    } catch (e) {
      showError(e);
    }
  }

  async function loadJobs() {
    try {
      var res = await PW.api.get("/v1/jobs?limit=30");
      d.fill(jobsGroup, (res.jobs || []).map(function (j) {
        return h("option", {value: "job:" + j.id}, "#" + j.id + " " + (j.name || "") + " (" + j.state + ")");
      }));
    } catch (e) { /* the examples still work */ }
  }

  function bar(v, best) {
    var b = h("span", {class: "bar"});
    b.style.width = d.isNum(v) ? (100 * Math.min(1, v)).toFixed(1) + "%" : "0";
    return h("span", {class: "bubble-cell" + (best ? " best" : "")}, h("span", {class: "track"}, b),
             h("span", {class: "label"}, d.pct(v)));
  }

  function minOf(key) {
    var m = Infinity;
    rows.forEach(function (r) { if (r.ok && d.isNum(r[key]) && r[key] < m) m = r[key]; });
    return m;
  }

  function renderRows() {
    var bestB = minOf("bubble_ratio"), bestM = minOf("makespan"), bestA = minOf("peak_activations");
    var near = function (a, b) { return Math.abs(a - b) <= 1e-9 * Math.max(1, Math.abs(b)); };
    d.fill(cmpBody, rows.map(function (r) {
      var tr;
      if (!r.ok) {
        tr = h("tr", {class: "not-ok", data: {schedule: r.schedule}},
          h("td", {class: "strong nowrap"}, r.schedule), h("td", {class: "num"}, r.virtual_stages),
          h("td", {colspan: 6, class: "muted small"}, "cannot run: " + (r.error || "unknown reason")));
      } else {
        tr = h("tr", {data: {schedule: r.schedule}, class: chosen === r.schedule ? "chosen" : null},
          h("td", {class: "nowrap"}, h("button", {type: "button", class: "linklike", title: "show this schedule's plan",
            on: {click: function () { show(r); }}}, r.schedule)),
          h("td", {class: "num"}, r.virtual_stages), h("td", {class: "num"}, r.stages),
          h("td", {class: "num" + (near(r.makespan, bestM) ? " best" : "")}, d.secs(r.makespan)),
          h("td", null, bar(r.bubble_ratio, near(r.bubble_ratio, bestB))),
          h("td", {class: "num" + (r.peak_activations === bestA ? " best" : "")}, r.peak_activations),
          h("td", {class: "num"}, r.peak_pending_w), h("td", {class: "num"}, r.actions));
      }
      return tr;
    }));
  }

  async function compare() {
    showError(null);
    var spec;
    try { spec = parseSpec(); } catch (e) { showError(e); return; }
    compareBtn.disabled = true;
    msg.textContent = "planning\u2026";
    var mine = ++asked;
    try {
      var res = await PW.api.post("/v1/plans?compare=1", spec);
      if (stopped || mine !== asked) return;
      lastSpec = spec;
      rows = res.rows || [];
      var okRows = rows.filter(function (r) { return r.ok; }).length;
      cmpHead.textContent = "Job \u201c" + (res.job || spec.name || "") + "\u201d: " + okRows + " of " + rows.length +
        " schedules can run it (pp " + ((spec.mesh && spec.mesh.pp) || "?") + ", " +
        ((spec.schedule && spec.schedule.microbatches) || "?") + " microbatches). Best values in green; click a schedule for its per-rank plan.";
      var own = rows.filter(function (r) { return r.ok && spec.schedule && r.schedule === spec.schedule.name; })[0] ||
                rows.filter(function (r) { return r.ok; })[0];
      chosen = own ? own.schedule : null;
      renderRows();
      msg.textContent = "";
      if (own) await show(own);
      else d.clear(detail);
    } catch (e) {
      msg.textContent = "";
      showError(e);
    } finally {
      compareBtn.disabled = false;
    }
  }

  async function show(row) {
    if (!lastSpec) return;
    chosen = row.schedule;
    renderRows();
    var spec = JSON.parse(JSON.stringify(lastSpec));
    spec.mesh = spec.mesh || {};
    spec.mesh.virtual_stages = row.virtual_stages;
    spec.schedule = spec.schedule || {};
    var own = row.schedule === "regions"; /* a regions model: its regions' own schedules */
    if (!own) spec.schedule.name = row.schedule;
    var mine = ++asked;
    try {
      var p = await PW.api.post(own ? "/v1/plans" : "/v1/plans?schedule=" + encodeURIComponent(row.schedule), spec);
      if (stopped || mine !== asked) return;
      renderDetail(p);
    } catch (e) {
      d.fill(detail, h("section", {class: "card"}, h("p", {class: "banner error"}, "Could not plan " + row.schedule + ": " +
        e.toString())));
    }
  }

  /* a collective's bytes per step and time on the link model; nothing without one */
  function comm(what, bytes, secs) {
    return bytes > 0 ? h("div", {class: "plan-" + what}, what + " " + d.bytes(bytes) + " \u00b7 " + d.secs(secs)) : null;
  }

  function renderDetail(p) {
    current = p;
    var an = p.analytics || {}, part = p.partition || {};
    var unit = h("span", {class: "muted small", id: "plan-unit-bubble"});
    var tl = h("div", {class: "timeline", id: "plan-timeline"});
    var grid = h("pre", {class: "code grid-text"}, p.grid || "");
    d.fill(detail, h("section", {class: "card", data: {schedule: p.schedule}},
      h("div", {class: "card-head"}, h("h2", null, "Schedule " + p.schedule),
        h("span", {class: "muted"}, "pp " + (p.mesh && p.mesh.pp) + " \u00b7 " + p.stages + " stages \u00b7 " +
          p.microbatches + " microbatches of " + p.microbatch_size + " sequences \u00b7 makespan " + d.secs(an.makespan) +
          (d.isNum(an.step_makespan) ? " (" + d.secs(an.step_makespan) + " with the dp exchange)" : "") +
          " \u00b7 bubble " + d.pct(an.bubble_ratio)), unit),
      regionGraph(p), PW.timeline.legend(), tl,
      h("div", {class: "cols"},
        h("div", null, h("h3", null, "Per rank"),
          h("table", {class: "grid", id: "plan-ranks"},
            h("thead", null, h("tr", null, h("th", {class: "num"}, "rank"), h("th", null, "stages"),
              h("th", {class: "num"}, "busy"), h("th", {class: "num"}, "idle"), h("th", {class: "num"}, "peak act."),
              h("th", {class: "num"}, "pending W"), h("th", {class: "num"}, "actions"),
              h("th", {class: "num", title: "bytes sent per step in the data-parallel exchange (replica 0's), the " +
                "tensor-parallel all-reduces and the in-memory snapshots (per step: over train.snapshot_every), and " +
                "their time on the link model"}, "sent / step"))),
            h("tbody", null, (an.ranks || []).map(function (r) {
              var stages = (part.stages || []).filter(function (s) { return s.rank === r.rank; })
                .map(function (s) { return "s" + s.stage; }).join(" ");
              return h("tr", null, h("td", {class: "num"}, r.rank), h("td", null, stages),
                h("td", {class: "num"}, d.secs(r.busy)), h("td", {class: "num"}, d.secs(r.idle)),
                h("td", {class: "num"}, r.peak_activations), h("td", {class: "num"}, r.peak_pending_w),
                h("td", {class: "num"}, r.actions),
                h("td", {class: "num"}, comm("dp", r.dp_bytes_per_step, r.dp_seconds_per_step),
                  comm("tp", r.tp_bytes_per_step, r.tp_seconds_per_step),
                  comm("snap", r.snapshot_bytes_per_step, r.snapshot_seconds_per_step),
                  r.dp_bytes_per_step > 0 || r.tp_bytes_per_step > 0 || r.snapshot_bytes_per_step > 0 ? null : d.DASH));
            }))),
          p.snapshots && p.snapshots.note ? h("p", {class: "note", id: "plan-snapshot-note"}, p.snapshots.note) : null),
        h("div", null, h("h3", null, "Partition"),
          h("table", {class: "grid", id: "plan-partition"},
            h("thead", null, h("tr", null, h("th", {class: "num"}, "stage"), h("th", {class: "num"}, "rank"),
              h("th", null, "layers"), h("th", {class: "num"}, "params"), h("th", {class: "num"}, "act. out"))),
            h("tbody", null, (part.stages || []).map(function (s) {
              return h("tr", null, h("td", {class: "num"}, s.stage), h("td", {class: "num"}, s.rank),
                h("td", {class: "layers"}, (s.layers || []).join(", ")), h("td", {class: "num"}, d.int(s.params)),
                h("td", {class: "num"}, d.bytes(s.output_bytes)));
            }))))),
      h("details", null, h("summary", null, "action grid (text)"), grid)));
    PW.timeline.render(tl, PW.timeline.fromSim(an.timeline || []),
                       {id: "tlplan", title: "planned " + p.schedule, regions: regionRanks(p)});
    unitBubble(p, unit);
  }

  /* A regions model's regions with the ranks their stages run on, or
   * undefined. */
  function regionRanks(p) {
    var rows = p.regions && p.regions.regions;
    if (!rows) return undefined;
    return rows.map(function (r) {
      var ranks = [];
      for (var s = r.stages[0]; s < r.stages[1]; s++)
        if (ranks.indexOf(p.stage_to_rank[s]) < 0) ranks.push(p.stage_to_rank[s]);
      return {name: r.name, ranks: ranks};
    });
  }

  /* The region graph: each region (its schedule and ranks) and the regions
   * feeding it; serial against concurrent from the simulator. */
  function regionGraph(p) {
    var R = p.regions, ranks = regionRanks(p);
    if (!R || !R.regions) return null;
    var span = function (rs) { return rs.length > 1 ? rs[0] + "\u2013" + rs[rs.length - 1] : String(rs[0]); };
    return h("div", {class: "region-graph", id: "plan-regions"},
      h("h3", null, "Regions"),
      h("div", {class: "region-boxes"}, R.regions.map(function (r, k) {
        return h("div", {class: "region-box region-" + (k % 4), data: {region: r.name}},
          h("strong", null, r.name), h("div", null, r.schedule + " \u00b7 ranks " + span(ranks[k].ranks)),
          r.from && r.from.length ? h("div", {class: "region-from"}, "\u2190 " + r.from.join(" + ") +
                                      (r.fusion ? " (" + r.fusion + ")" : "")) : h("div", {class: "region-from"}, "data"));
      })),
      h("p", {class: "note"}, "Simulated step: concurrent " + d.secs(R.concurrent.makespan) + " on " +
        R.concurrent.ranks + " ranks, serial (one region after another) " + d.secs(R.serial.makespan) + " on " +
        R.serial.ranks + " ranks \u2014 " + R.speedup.toFixed(2) + "\u00d7"));
  }

  /* The schedule's bubble without the model (unit costs), beside the
   * model's: how much of it the schedule alone explains. */
  async function unitBubble(p, el) {
    if (!p.plan || p.plan.name === "custom" || !p.mesh) return;
    try {
      var a = await PW.api.get("/v1/schedules/" + encodeURIComponent(p.schedule) + "/analytics?pp=" +
        encodeURIComponent(p.mesh.pp) + "&m=" + encodeURIComponent(p.microbatches) + "&v=" +
        encodeURIComponent(p.plan.virtual_stages));
      if (stopped || current !== p) return;
      el.textContent = "without the model (unit costs): bubble " + d.pct(a.bubble_ratio) +
        (a.closed_form ? " = " + a.closed_form.formula : "") + ", " + d.num(a.total_steps) + " steps";
    } catch (e) { /* beyond the analytics' bounds: the model's figures stand alone */ }
  }

  /* ---- custom schedules ---------------------------------------------------- */

  function customLines() {
    return customText.value.split("\n").map(function (l) { return l.trim(); }).filter(function (l) { return l; });
  }

  /* The stages the lines name ("@s7": 8): the spec's virtual_stages must
   * give pp x V of them. */
  function stagesOf(lines) {
    var n = 0, re = /@s(\d+)/g, m;
    lines.forEach(function (l) { while ((m = re.exec(l))) n = Math.max(n, +m[1] + 1); });
    return n;
  }

  function showVerdict(ok, text) {
    verdict.hidden = false;
    verdict.className = "verdict " + (ok ? "ok" : "error");
    verdict.setAttribute("data-verdict", ok ? "ok" : "error");
    verdict.textContent = text;
  }

  async function checkCustom() {
    var spec, lines = customLines();
    try { spec = parseSpec(); } catch (e) { showError(e); return; }
    if (!lines.length) { showVerdict(false, "error: no actions: write one line per rank, or export the current plan"); return; }
    spec.mesh = spec.mesh || {};
    var pp = +spec.mesh.pp || lines.length, S = stagesOf(lines);
    if (S > 0 && S % pp === 0) spec.mesh.virtual_stages = S / pp;
    spec.schedule = {microbatches: (spec.schedule && spec.schedule.microbatches) || 1, custom: {ranks: lines}};
    checkBtn.disabled = true;
    verdict.hidden = false;
    verdict.className = "verdict";
    verdict.removeAttribute("data-verdict");
    verdict.textContent = "checking\u2026";
    try {
      var p = await PW.api.post("/v1/plans", spec);
      if (stopped) return;
      var an = p.analytics || {};
      showVerdict(true, "ok: the simulator proves it \u2014 bubble " + d.pct(an.bubble_ratio) + ", makespan " +
        d.secs(an.makespan));
      chosen = null;
      renderRows();
      renderDetail(p);
    } catch (e) {
      showVerdict(false, "error: " + e.toString());
    } finally {
      checkBtn.disabled = false;
    }
  }

  function exportCustom() {
    var ranks = current && current.plan && current.plan.ranks;
    if (!ranks) { showVerdict(false, "error: no plan shown yet: compare the spec first"); return; }
    customText.value = ranks.join("\n");
    var blob = new Blob([JSON.stringify({ranks: ranks}, null, 2) + "\n"], {type: "application/json"});
    var url = URL.createObjectURL(blob), a = document.createElement("a");
    a.href = url;
    a.download = (current.schedule || "schedule").replace(/[^A-Za-z0-9_.-]/g, "_") + "-custom.json";
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(function () { URL.revokeObjectURL(url); }, 10000);
    verdict.hidden = true;
  }

  /* A file: the custom object {"ranks": [...]} (or a spec, or {"custom":
   * {...}} around it), else CSV: one row per rank, an action per cell, in
   * our text or PyTorch's stage-kind-microbatch ("0F3" = F3@s0). */
  function onCustomFile() {
    var f = customFile.files && customFile.files[0];
    if (!f) return;
    var rd = new FileReader();
    rd.onload = function () {
      var text = String(rd.result), lines;
      try {
        var j = JSON.parse(text);
        var c = (j.schedule && j.schedule.custom) || j.custom || j;
        if (!Array.isArray(c.ranks)) throw new Error("no \"ranks\" array");
        lines = c.ranks.map(String);
      } catch (e) {
        if (/^\s*[{\[]/.test(text)) { showVerdict(false, "error: " + f.name + ": " + e.message); return; }
        lines = text.split(/\r?\n/).filter(function (l) { return l.trim(); }).map(function (row) {
          return row.split(",").map(function (cell) {
            var m = /^\s*(\d+)([FBIW])(\d+)\s*$/.exec(cell);
            return m ? m[2] + m[3] + "@s" + m[1] : cell.trim();
          }).filter(function (x) { return x; }).join(" ");
        });
      }
      customText.value = lines.join("\n");
      verdict.hidden = true;
    };
    rd.readAsText(f);
    customFile.value = "";
  }

  async function submit() {
    showError(null);
    var spec;
    try { spec = parseSpec(); } catch (e) { showError(e); return; }
    if (!window.confirm("Submit \u201c" + (spec.name || "unnamed") + "\u201d as a new training job?")) return;
    submitBtn.disabled = true;
    try {
      var res = await PW.api.post("/v1/jobs", spec);
      location.hash = "#/jobs/" + encodeURIComponent(res.id);
    } catch (e) {
      showError(e);
    } finally {
      submitBtn.disabled = false;
    }
  }

  function firstExample() {
    text.value = JSON.stringify(PW.EXAMPLE_SPECS[0].spec, null, 2);
    pick.value = "ex:0";
    compare();
  }

  /* start: the job's spec when #/plan?job=ID, else the first example, set
   * with the page: set when a request returned, it could land on what the
   * user (or a test) had begun to type */
  if (!params.job) firstExample();
  (async function () {
    await loadJobs();
    if (!params.job) return;
    pick.value = "job:" + params.job;
    if (pick.value === "job:" + params.job) { onPick(); return; }
    try {
      var j = await PW.api.get("/v1/jobs/" + encodeURIComponent(params.job));
      text.value = JSON.stringify(j.spec || {}, null, 2);
      compare();
    } catch (e) {
      showError(e);
      if (!text.value) firstExample();
    }
  })();

  return function () { stopped = true; };
};
