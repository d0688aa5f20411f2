/* charts: line charts over training steps, drawn by the vendored uPlot
 * (web/vendor/, see deploy/vendor-web.sh).
 *
 * PW.charts.metric(container, opts) returns {set(series), destroy()}:
 * series is [{job, label, color, xs, ys, points}], the page's own job first
 * and overlaid jobs after it, x = step. A series with points: true is a
 * job's second series (the held-out loss beside the training loss): its
 * points are marked and joined by a dashed line, never smoothed. Each chart has a hover readout (uPlot's
 * cursor; our legend shows the step and every job's value there, or the
 * last values), a smoothing slider (TensorBoard's debiased exponential
 * moving average; the raw curve stays faint behind the smoothed one) and a
 * log-scale toggle, disabled with a note while a value is <= 0. Both
 * settings persist per chart in localStorage. null values (a diverged
 * step) are gaps, never 0.
 *
 * What tests (and curious users) can read without poking into the canvas,
 * on the container: data-points (the own job's rows), data-series (jobs
 * drawn, not counting points series), data-eval-points (the points of the
 * own job's points series), data-smoothing (the weight), data-log ("1" when the y axis is
 * logarithmic), data-last (the own job's last plotted, smoothed value);
 * on the legend: data-step (the step under the cursor, "" for the last).
 * When uPlot failed to load, the chart degrades to a one-line summary. */
"use strict";
var PW = window.PW || (window.PW = {});

PW.charts = (function () {
  var d = PW.dom, h = d.h;

  /* TensorBoard's smoothing: an EMA started at 0 and divided by
   * (1 - w^n), so the first points are not pulled towards 0; a null
   * or non-finite point stays a gap and does not move the average. */
  function smooth(ys, w) {
    if (!(w > 0)) return ys.slice();
    var last = 0, n = 0;
    return ys.map(function (y) {
      if (!d.isNum(y)) return null;
      last = last * w + (1 - w) * y;
      n++;
      return last / (1 - Math.pow(w, n));
    });
  }

  /* Axis and legend numbers: 12.3k for big ones, 0.0003 for small ones,
   * 1.0e+30 for a diverged job's. */
  function fmt(v) {
    if (!d.isNum(v)) return d.DASH;
    var a = Math.abs(v);
    return a >= 1e15 ? v.toExponential(1) : a >= 1000 ? d.si(v) : d.num(v, 3);
  }

  /* "rgb"/"#rrggbb" at alpha a, for the faint raw curve. */
  function faint(color, a) {
    var m = /^#([0-9a-f]{2})([0-9a-f]{2})([0-9a-f]{2})$/i.exec(color);
    if (!m) return color;
    return "rgba(" + parseInt(m[1], 16) + "," + parseInt(m[2], 16) + "," + parseInt(m[3], 16) + "," + a + ")";
  }

  /* The y axis as wide as its longest label (a diverged run's 1.0e+30). */
  function axisWidth(u, vals) {
    var n = (vals || []).reduce(function (m, v) { return Math.max(m, String(v).length); }, 0);
    return Math.max(44, 16 + 7 * n);
  }

  function load(key, defaults) {
    var v = {smooth: defaults.smooth, log: false};
    try {
      var s = JSON.parse(localStorage.getItem("pipewright.chart." + key) || "null");
      if (s && d.isNum(s.smooth) && s.smooth >= 0 && s.smooth <= 0.99) v.smooth = s.smooth;
      if (s && typeof s.log === "boolean") v.log = s.log;
    } catch (e) { /* storage disabled or bad JSON: the defaults */ }
    return v;
  }

  function save(key, v) {
    try { localStorage.setItem("pipewright.chart." + key, JSON.stringify(v)); } catch (e) { /* disabled */ }
  }

  /* Every series' points on one x array (the union of their steps), a
   * null where a series has no row. */
  function align(list) {
    var seen = {}, xs = [];
    list.forEach(function (s) {
      s.xs.forEach(function (x) { if (!seen[x]) { seen[x] = 1; xs.push(x); } });
    });
    xs.sort(function (a, b) { return a - b; });
    var at = {};
    xs.forEach(function (x, i) { at[x] = i; });
    return {xs: xs, of: function (s, ys) {
      var out = new Array(xs.length).fill(null);
      s.xs.forEach(function (x, i) { out[at[x]] = d.isNum(ys[i]) ? ys[i] : null; });
      return out;
    }};
  }

  function metric(container, opts) {
    var key = opts.key, height = opts.height || 200;
    var cfg = load(key, {smooth: opts.smooth || 0});
    var plot = null, shape = "", list = [], drawn = null;

    var slider = h("input", {type: "range", min: 0, max: 0.99, step: 0.01, class: "chart-smooth",
                             "aria-label": opts.title + " smoothing", value: cfg.smooth,
                             on: {input: function () { cfg.smooth = +slider.value; save(key, cfg); draw(); }}});
    var sval = h("output", {class: "chart-smooth-value mono"});
    var logBox = h("input", {type: "checkbox", class: "chart-log", checked: cfg.log,
                             on: {change: function () { cfg.log = logBox.checked; save(key, cfg); draw(); }}});
    var note = h("span", {class: "chart-note muted small"});
    var box = h("div", {class: "chart-canvas"});
    var empty = h("div", {class: "chart-empty"}, opts.empty || "no steps yet");
    var legend = h("div", {class: "chart-legend small", data: {step: ""}});
    container.classList.add("chart");
    container.setAttribute("data-points", "0");
    container.setAttribute("data-series", "0");
    d.fill(container,
      h("div", {class: "chart-head"},
        h("span", {class: "chart-title"}, opts.title),
        h("label", {class: "inline small", title: "exponential moving average weight (0: none)"},
          "smoothing ", slider, " ", sval),
        h("label", {class: "inline small"}, logBox, " log"),
        note),
      box, empty, legend);

    function width() { return Math.max(200, box.clientWidth || container.clientWidth || 400); }

    /* The legend: the step, then a line per job (swatch, "job N name",
     * value; the raw value beside the smoothed one while smoothing). */
    function showLegend(idx) {
      if (!drawn) return;
      var last = idx === null || idx === undefined;
      legend.setAttribute("data-step", last ? "" : String(drawn.xs[idx]));
      d.fill(legend,
        h("span", {class: "chart-legend-step mono"}, last ? "last" : "step " + drawn.xs[idx]),
        list.map(function (s, k) {
          var sm = drawn.smoothed[k], raw = drawn.raw[k], i = idx;
          if (last) for (i = sm.length - 1; i > 0 && sm[i] === null; i--) { /* the last plotted point */ }
          var v = fmt(sm[i]) + (cfg.smooth > 0 && !s.points && d.isNum(raw[i]) ? " (" + fmt(raw[i]) + ")" : "");
          var sw = h("span", {class: "chart-swatch"});
          sw.style.background = s.color;
          return h("span", {class: "chart-legend-item", data: {job: s.job, points: s.points ? "1" : ""}}, sw,
            h("span", {class: "chart-legend-label"}, s.label), " ", h("span", {class: "chart-legend-value mono"}, v));
        }));
    }

    function make(data, logOn) {
      var series = [{label: "step"}];
      list.forEach(function (s) {
        if (s.points) {
          series.push({label: s.label, stroke: s.color, width: 1, dash: [4, 4], spanGaps: true,
                       points: {show: true, size: 6, fill: s.color}});
          return;
        }
        if (cfg.smooth > 0) series.push({label: s.label + " (raw)", stroke: faint(s.color, 0.25), width: 1,
                                         points: {show: false}});
        series.push({label: s.label, stroke: s.color, width: 1.5, points: {show: false}});
      });
      return new window.uPlot({
        width: width(),
        height: height,
        cursor: {drag: {x: true, y: false}},
        legend: {show: false},
        scales: {x: {time: false}, y: logOn ? {distr: 3, log: 10} : {auto: true}},
        axes: [
          {label: "step", labelSize: 18, size: 36, stroke: "#555", grid: {stroke: "#eee"}, ticks: {stroke: "#ddd"}},
          {size: axisWidth, stroke: "#555", grid: {stroke: "#eee"}, ticks: {stroke: "#ddd"},
           values: function (u, vals) { return vals.map(fmt); }}
        ],
        series: series,
        hooks: {setCursor: [function (u) { showLegend(u.cursor.idx); }]}
      }, data, box);
    }

    /* Smooth, align and plot; the plot is made again only when its shape
     * (jobs, smoothing on or off, log) changes. */
    function draw() {
      sval.textContent = cfg.smooth.toFixed(2);
      container.setAttribute("data-smoothing", String(cfg.smooth));
      var nonPos = list.some(function (s) { return s.ys.some(function (y) { return d.isNum(y) && y <= 0; }); });
      logBox.disabled = nonPos;
      note.textContent = nonPos ? "log scale needs values > 0" : "";
      var logOn = cfg.log && !nonPos;
      container.setAttribute("data-log", logOn ? "1" : "0");
      var own = list[0], any = list.some(function (s) { return s.xs.length > 0; });
      var ownPts = list.filter(function (s) { return s.points && own && s.job === own.job; })[0];
      container.setAttribute("data-points", String(own ? own.xs.length : 0));
      container.setAttribute("data-series", String(list.filter(function (s) { return !s.points; }).length));
      container.setAttribute("data-eval-points", String(ownPts ? ownPts.xs.length : 0));
      empty.hidden = any; /* an overlaid job may have steps before this one does */
      if (!any) return;
      var al = align(list);
      drawn = {xs: al.xs, raw: [], smoothed: []};
      var data = [al.xs];
      list.forEach(function (s) {
        var raw = al.of(s, s.ys), sm = s.points ? raw : al.of(s, smooth(s.ys, cfg.smooth));
        drawn.raw.push(raw);
        drawn.smoothed.push(sm);
        if (cfg.smooth > 0 && !s.points) data.push(raw);
        data.push(sm);
      });
      var lastOwn = drawn.smoothed[0].filter(d.isNum);
      container.setAttribute("data-last", lastOwn.length ? String(lastOwn[lastOwn.length - 1]) : "");
      var sh = list.map(function (s) { return s.job + ":" + s.label + ":" + s.color; }).join("|") +
               (cfg.smooth > 0 ? "|s" : "") + (logOn ? "|log" : "");
      if (typeof window.uPlot !== "function") {
        d.fill(box, h("p", {class: "muted"}, opts.title + ": last " + fmt(lastOwn[lastOwn.length - 1]) +
          " (chart library not loaded)"));
        showLegend(null);
        return;
      }
      if (plot && sh === shape) plot.setData(data);
      else {
        if (plot) plot.destroy();
        plot = make(data, logOn);
        shape = sh;
      }
      showLegend(plot.cursor.idx);
    }

    var ro = typeof ResizeObserver === "function" ? new ResizeObserver(function () {
      if (plot) plot.setSize({width: width(), height: height});
    }) : null;
    if (ro) ro.observe(box);
    draw();

    return {
      set: function (series) {
        list = series.filter(function (s) { return s && s.xs; });
        draw();
      },
      destroy: function () {
        if (ro) ro.disconnect();
        if (plot) plot.destroy();
        plot = null;
      }
    };
  }

  return {metric: metric, smooth: smooth};
})();
