/* charts: line charts over training steps (loss, throughput), drawn by the
 * vendored uPlot (web/vendor/, see deploy/vendor-web.sh).
 *
 * PW.charts.line(container, opts) returns {set(xs, ys), destroy()}. The
 * container carries data-points = the number of points plotted, so tests
 * (and curious users) can read it without poking into the canvas. When
 * uPlot failed to load, the chart degrades to a one-line summary. */
"use strict";
var PW = window.PW || (window.PW = {});

PW.charts = (function () {
  var h = PW.dom.h;

  function line(container, opts) {
    var plot = null, xs = [], ys = [];
    var height = opts.height || 220;
    var box = h("div", {class: "chart-canvas"});
    var empty = h("div", {class: "chart-empty"}, opts.empty || "no data yet");
    container.classList.add("chart");
    container.setAttribute("data-points", "0");
    PW.dom.fill(container, h("div", {class: "chart-title"}, opts.title), box, empty);

    function width() { return Math.max(200, box.clientWidth || container.clientWidth || 400); }

    function make() {
      if (typeof window.uPlot !== "function") return null;
      return new window.uPlot({
        width: width(),
        height: height,
        cursor: {drag: {x: true, y: false}},
        legend: {show: true, live: true},
        scales: {x: {time: false}, y: {auto: true}},
        axes: [
          {label: "step", labelSize: 18, size: 36, stroke: "#555", grid: {stroke: "#eee"}, ticks: {stroke: "#ddd"}},
          {size: 60, stroke: "#555", grid: {stroke: "#eee"}, ticks: {stroke: "#ddd"},
           values: function (u, vals) { return vals.map(function (v) { return PW.dom.si(v); }); }}
        ],
        series: [
          {label: "step"},
          {label: opts.label, stroke: opts.color || "#2a6fdb", width: 1.5,
           fill: opts.fill || null, points: {show: false},
           value: function (u, v) { return v === null || v === undefined ? "\u2014" : PW.dom.num(v, 4); }}
        ]
      }, [xs, ys], box);
    }

    var ro = typeof ResizeObserver === "function" ? new ResizeObserver(function () {
      if (plot) plot.setSize({width: width(), height: height});
    }) : null;
    if (ro) ro.observe(box);

    return {
      set: function (newXs, newYs) {
        xs = newXs.slice();
        ys = newYs.slice();
        container.setAttribute("data-points", String(xs.length));
        empty.hidden = xs.length > 0;
        if (!xs.length) return;
        if (plot) { plot.setData([xs, ys]); return; }
        plot = make();
        if (!plot) {
          PW.dom.fill(box, h("p", {class: "muted"}, opts.label + ": last " + PW.dom.num(ys[ys.length - 1], 4) +
            " at step " + xs[xs.length - 1] + " (chart library not loaded)"));
        }
      },
      destroy: function () {
        if (ro) ro.disconnect();
        if (plot) plot.destroy();
        plot = null;
      }
    };
  }

  return {line: line};
})();
