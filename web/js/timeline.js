/* timeline: the pipeline Gantt chart — one lane per rank, one block per
 * F/I/W/B action, coloured by kind, labelled with microbatch and stage,
 * time to scale, idle time visible as the hatched lane behind the blocks.
 *
 * Drawn as SVG by hand (not with the charting library): every action is
 * one <g class="act" data-kind="F" data-mb="3" data-stage="1"> so it can be
 * hovered (a <title> gives its times) and counted by tests; every lane is
 * one <g class="lane" data-lane="rank">.
 *
 * Inputs are normalised to lanes = [{rank, actions: [{kind, mb, stage,
 * start, end, fused}]}] with times in seconds from the step's start:
 *   fromMeasured(): GET /v1/jobs/{id}/timeline's "ranks" (objects, or the
 *                   store's [kind, mb, stage, start, end] rows);
 *   fromSim():      the simulator's "timeline" ([[{"action": "F0@s0", start,
 *                   end, fused?}], ...]) as POST /v1/plans returns it; a
 *                   "DP" entry (dp > 1: the gradient exchange at the step's
 *                   end) is a block of kind D. */
"use strict";
var PW = window.PW || (window.PW = {});

PW.timeline = (function () {
  var d = PW.dom;
  var KINDS = {F: "forward", B: "backward", I: "backward (input grad)", W: "backward (weight grad)",
               D: "data-parallel exchange", T: "tensor-parallel all-reduce"};
  /* collectives: not the schedule's actions (the bubble leaves them out) */
  var COLL = {D: 1, T: 1};

  function act(kind, mb, stage, start, end, fused) {
    /* the store may keep the kind as a letter or as 0..3 (schedule.h) */
    if (typeof kind === "number") kind = "FBIW".charAt(kind) || "?";
    return {kind: String(kind).toUpperCase().charAt(0), mb: +mb, stage: +stage, start: +start, end: +end,
            fused: !!fused};
  }

  function rebase(lanes) {
    var t0 = Infinity;
    lanes.forEach(function (l) { l.actions.forEach(function (a) { if (a.start < t0) t0 = a.start; }); });
    if (!isFinite(t0)) t0 = 0;
    lanes.forEach(function (l) {
      l.actions.forEach(function (a) { a.start -= t0; a.end -= t0; });
      l.actions.sort(function (x, y) { return x.start - y.start; });
    });
    lanes.sort(function (x, y) { return x.rank - y.rank; });
    return lanes;
  }

  function fromMeasured(ranks) {
    return rebase((ranks || []).map(function (r, i) {
      var rank = d.isNum(r.rank) ? r.rank : i;
      return {rank: rank, actions: (r.actions || []).map(function (a) {
        if (Array.isArray(a)) return act(a[0], a[1], a[2], a[3], a[4], false);
        return act(a.kind, a.mb, a.stage, a.start, a.end, a.fused);
      })};
    }));
  }

  var ACTION_RE = /^([FBIW])(\d+)@s(\d+)$/;

  function fromSim(timeline) {
    return rebase((timeline || []).map(function (lane, r) {
      var acts = [];
      (lane || []).forEach(function (e) {
        var m = ACTION_RE.exec(String(e.action || ""));
        if (m) acts.push(act(m[1], m[2], m[3], e.start, e.end, e.fused));
        else if (e.action === "DP") acts.push(act("D", 0, -1, e.start, e.end, false)); /* the step's dp exchange */
      });
      return {rank: r, actions: acts};
    }));
  }

  /* makespan, per-rank busy/idle, bubble ratio = idle / (ranks * makespan),
   * as the simulator defines it, over the schedule's actions; end: the
   * step with its collectives (a dp exchange after the last action), and
   * per rank their seconds (tp, dp). Overlapping actions (fused pairs)
   * count once. */
  function stats(lanes) {
    var makespan = 0, end = 0;
    lanes.forEach(function (l) {
      l.actions.forEach(function (a) {
        if (!COLL[a.kind] && a.end > makespan) makespan = a.end;
        if (a.end > end) end = a.end;
      });
    });
    var idleSum = 0;
    var per = lanes.map(function (l) {
      var busy = 0, reach = 0, tp = 0, dp = 0;
      l.actions.forEach(function (a) {
        if (COLL[a.kind]) {
          if (a.kind === "T") tp += a.end - a.start;
          else dp += a.end - a.start;
          return;
        }
        var s = Math.max(a.start, reach);
        if (a.end > s) busy += a.end - s;
        if (a.end > reach) reach = a.end;
      });
      var idle = Math.max(0, makespan - busy);
      idleSum += idle;
      return {rank: l.rank, busy: busy, idle: idle, tp: tp, dp: dp};
    });
    var bubble = makespan > 0 && lanes.length ? idleSum / (lanes.length * makespan) : 0;
    return {makespan: makespan, end: Math.max(end, makespan), ranks: per, bubble: bubble};
  }

  /* A "nice" tick step for a span split into about n parts. */
  function tickStep(span, n) {
    if (!(span > 0)) return 1;
    var raw = span / n, p = Math.pow(10, Math.floor(Math.log10(raw))), f = raw / p;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * p;
  }

  function label(a, w) {
    if (a.kind === "D") return w >= 24 ? "dp" : null;
    var full = a.kind + a.mb + "\u00b7s" + a.stage, mid = a.kind + a.mb, per = 7.2;
    if (w >= full.length * per + 6) return full;
    if (w >= mid.length * per + 5) return mid;
    if (w >= String(a.mb).length * per + 3) return String(a.mb);
    return null;
  }

  /* Draw lanes into container (replacing its content). opts: {width,
   * scale (seconds for the full width; default the makespan), id,
   * regions: [{name, ranks: [rank, ...]}] to label and group the lanes of
   * a regions model by region, mesh: {pp, dp, tp} to label lanes by
   * coordinate and draw a tensor-parallel group's members (one stage's
   * ranks) as one block of lanes, close together and bracketed}. Returns
   * the stats. */
  function render(container, lanes, opts) {
    opts = opts || {};
    var st = stats(lanes);
    var W = Math.max(320, opts.width || container.clientWidth || 800);
    var tp = opts.mesh && opts.mesh.tp > 1 ? opts.mesh.tp : 1;
    var left = opts.regions ? 96 : tp > 1 ? 112 : 62, right = 64, top = 24, laneH = 30, gap = 8, bottom = 6;
    /* a tp group's members: 2 px apart; groups and pipeline ranks: gap */
    var group = function (r) { return tp > 1 ? Math.floor(r / tp) : r; };
    var ys = [], yy = top;
    lanes.forEach(function (l, i) {
      if (i) yy += laneH + (group(l.rank) === group(lanes[i - 1].rank) ? 2 : gap);
      ys.push(yy);
    });
    var H = (lanes.length ? yy + laneH : top) + bottom;
    var span = opts.scale > 0 ? opts.scale : st.end > 0 ? st.end : 1;
    var plotW = W - left - right;
    var x = function (t) { return left + (t / span) * plotW; };
    var uid = opts.id || "tl";

    var svg = d.s("svg", {class: "timeline-svg", width: W, height: H, viewBox: "0 0 " + W + " " + H,
                          role: "img", "aria-label": (opts.title || "pipeline timeline") + ": " + lanes.length + " ranks"});
    svg.appendChild(d.s("defs", null,
      d.s("pattern", {id: uid + "-idle", width: 6, height: 6, patternUnits: "userSpaceOnUse",
                      patternTransform: "rotate(45)"},
          d.s("rect", {width: 6, height: 6, class: "idle-bg"}),
          d.s("line", {x1: 0, y1: 0, x2: 0, y2: 6, class: "idle-hatch"}))));

    /* time axis */
    var step = tickStep(span, Math.max(2, Math.floor(plotW / 90)));
    var axis = d.s("g", {class: "axis"});
    for (var t = 0; t <= span * 1.0001; t += step) {
      var xt = x(t);
      axis.appendChild(d.s("line", {x1: xt, x2: xt, y1: top - 4, y2: H - bottom, class: "grid"}));
      axis.appendChild(d.s("text", {x: xt, y: top - 8, class: "tick", "text-anchor": t === 0 ? "start" : "middle"},
                           d.secs(t)));
    }
    svg.appendChild(axis);

    var regionOf = {};
    (opts.regions || []).forEach(function (rg, k) {
      rg.ranks.forEach(function (r) { regionOf[r] = {name: rg.name, k: k}; });
    });
    lanes.forEach(function (l, i) {
      var y = ys[i], rg = regionOf[l.rank], c = tp > 1 ? PW.mesh.coord(l.rank, opts.mesh) : null;
      var g = d.s("g", {class: "lane" + (rg ? " region-" + (rg.k % 4) : ""),
                        data: {lane: l.rank, region: rg && rg.name, tpgroup: c && group(l.rank)}});
      g.appendChild(d.s("text", {x: left - 8, y: y + laneH / 2 + 4, class: "lane-label", "text-anchor": "end"},
                        rg ? rg.name + " r" + l.rank : c ? PW.mesh.label(c) : "rank " + l.rank));
      if (rg) g.appendChild(d.s("rect", {x: 1, y: y, width: 3, height: laneH, class: "region-bar"}));
      if (c) g.appendChild(d.s("rect", {x: 1, y: y - (c.tp_rank ? 2 : 0), width: 3, height: laneH + (c.tp_rank ? 2 : 0),
                                        class: "tp-bar"}));
      g.appendChild(d.s("rect", {x: left, y: y, width: x(st.end) - left, height: laneH,
                                 fill: "url(#" + uid + "-idle)", class: "lane-bg"}));
      l.actions.forEach(function (a) {
        var x0 = x(a.start), w = Math.max(1, x(a.end) - x0);
        if (a.kind === "T") { /* inside an F or B block: a strip along the lane's foot */
          g.appendChild(d.s("g", {class: "act coll k-T", data: {kind: "T"}},
            d.s("title", null, KINDS.T + "\n" + d.secs(a.start) + " \u2192 " + d.secs(a.end) + " (" +
                d.secs(a.end - a.start) + ")"),
            d.s("rect", {x: x0, y: y + laneH - 6, width: w, height: 5})));
          return;
        }
        var dp = a.kind === "D", name = dp ? "DP" : a.kind + a.mb + "@s" + a.stage;
        var ga = d.s("g", {class: "act k-" + a.kind + (a.fused ? " fused" : ""),
                           data: dp ? {kind: a.kind} : {kind: a.kind, mb: a.mb, stage: a.stage}},
          d.s("title", null, name + " \u2014 " + (KINDS[a.kind] || a.kind) + (dp ? " at the step's end" : ", microbatch " +
              a.mb + ", stage " + a.stage) + (a.fused ? " (fused)" : "") + "\n" + d.secs(a.start) + " \u2192 " + d.secs(a.end) +
              " (" + d.secs(a.end - a.start) + ")"),
          d.s("rect", {x: x0, y: y + 1, width: w, height: laneH - 2, rx: 2}));
        var lb = label(a, w);
        if (lb) ga.appendChild(d.s("text", {x: x0 + w / 2, y: y + laneH / 2 + 4, "text-anchor": "middle"}, lb));
        g.appendChild(ga);
      });
      var r = st.ranks[i];
      g.appendChild(d.s("text", {x: W - right + 8, y: y + laneH / 2 + 4, class: "lane-idle"},
                        "idle " + d.pct(st.makespan > 0 ? r.idle / st.makespan : 0),
                        r.tp > 0 || r.dp > 0 ? d.s("title", null, (r.tp > 0 ? "tensor-parallel all-reduces " +
                          d.secs(r.tp) : "") + (r.tp > 0 && r.dp > 0 ? ", " : "") +
                          (r.dp > 0 ? "data-parallel exchange " + d.secs(r.dp) : "")) : null));
      if (r.tp > 0 || r.dp > 0) g.setAttribute("data-coll", (r.tp > 0 ? "tp " + d.secs(r.tp) : "") +
                                               (r.tp > 0 && r.dp > 0 ? ", " : "") + (r.dp > 0 ? "dp " + d.secs(r.dp) : ""));
      svg.appendChild(g);
    });

    d.fill(container, svg);
    container.setAttribute("data-lanes", String(lanes.length));
    container.setAttribute("data-bubble", st.bubble.toFixed(4));
    return st;
  }

  function legend() {
    return d.h("div", {class: "legend"},
      Object.keys(KINDS).map(function (k) {
        return d.h("span", {class: "legend-item"}, d.h("span", {class: "swatch k-" + k}), k + " " + KINDS[k]);
      }),
      d.h("span", {class: "legend-item"}, d.h("span", {class: "swatch idle"}), "idle"));
  }

  return {fromMeasured: fromMeasured, fromSim: fromSim, stats: stats, render: render, legend: legend};
})();
