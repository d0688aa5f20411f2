/* dom: the dashboard's only way to build markup, and its number/time
 * formatting.
 *
 * Everything on the page is made with h() / s(), which set text through
 * text nodes and attributes through setAttribute: data from the API (job
 * names, error messages, layer names) is never parsed as HTML, so a job
 * named "<script>..." shows as those characters. Nothing in the dashboard
 * uses innerHTML. */
"use strict";
var PW = window.PW || (window.PW = {});

PW.dom = (function () {
  var SVG_NS = "http://www.w3.org/2000/svg";

  function append(el, child) {
    if (child === null || child === undefined || child === false) return;
    if (Array.isArray(child)) {
      child.forEach(function (c) { append(el, c); });
    } else if (child instanceof Node) {
      el.appendChild(child);
    } else {
      el.appendChild(document.createTextNode(String(child)));
    }
  }

  function setAttrs(el, attrs) {
    if (!attrs) return;
    Object.keys(attrs).forEach(function (k) {
      var v = attrs[k];
      if (v === null || v === undefined || v === false) return;
      if (k === "on") {
        Object.keys(v).forEach(function (ev) { el.addEventListener(ev, v[ev]); });
      } else if (k === "data") {
        Object.keys(v).forEach(function (d) {
          if (v[d] !== null && v[d] !== undefined) el.setAttribute("data-" + d, String(v[d]));
        });
      } else if (k === "text") {
        el.textContent = String(v);
      } else if (k === "value" && "value" in el) {
        el.value = String(v);
      } else if (k === "checked" || k === "disabled" || k === "selected") {
        el[k] = !!v;
      } else {
        el.setAttribute(k, v === true ? "" : String(v));
      }
    });
  }

  /* h("td", {class: "num"}, "12", child, [more]) */
  function h(tag, attrs) {
    var el = document.createElement(tag);
    setAttrs(el, attrs);
    for (var i = 2; i < arguments.length; i++) append(el, arguments[i]);
    return el;
  }

  /* The same for SVG elements. */
  function s(tag, attrs) {
    var el = document.createElementNS(SVG_NS, tag);
    setAttrs(el, attrs);
    for (var i = 2; i < arguments.length; i++) append(el, arguments[i]);
    return el;
  }

  function clear(el) {
    while (el.firstChild) el.removeChild(el.firstChild);
    return el;
  }

  /* Replace el's children with the given ones. */
  function fill(el) {
    clear(el);
    for (var i = 1; i < arguments.length; i++) append(el, arguments[i]);
    return el;
  }

  function isNum(x) { return typeof x === "number" && isFinite(x); }

  /* ---- formatting ------------------------------------------------------ */

  var DASH = "\u2014";

  function num(x, digits) {
    if (!isNum(x)) return DASH;
    if (digits === undefined) digits = 3;
    if (Math.abs(x) >= 1e6) return x.toExponential(2);
    return String(Number(x.toPrecision(Math.max(digits, 1)))); /* 0.0003, 5.316, 1e-7 */
  }

  function int(x) {
    if (!isNum(x)) return DASH;
    return Math.round(x).toLocaleString("en-US");
  }

  /* 12300 -> "12.3k" */
  function si(x) {
    if (!isNum(x)) return DASH;
    var a = Math.abs(x), units = [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
    for (var i = 0; i < units.length; i++) {
      if (a >= units[i][0]) return (x / units[i][0]).toFixed(a / units[i][0] >= 100 ? 0 : 1) + units[i][1];
    }
    if (a === 0) return "0";
    return a >= 100 ? x.toFixed(0) : a >= 10 ? x.toFixed(1) : x.toFixed(2);
  }

  function pct(x) {
    if (!isNum(x)) return DASH;
    return (100 * x).toFixed(1) + "%";
  }

  function bytes(x) {
    if (!isNum(x)) return DASH;
    var u = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0;
    while (Math.abs(x) >= 1024 && i < u.length - 1) { x /= 1024; i++; }
    return (i === 0 ? x.toFixed(0) : x.toFixed(1)) + " " + u[i];
  }

  /* A time interval in seconds, for simulated and measured action times:
   * "850 µs", "12.4 ms", "3.20 s". */
  function secs(x) {
    if (!isNum(x)) return DASH;
    var a = Math.abs(x);
    if (a === 0) return "0";
    if (a < 1e-3) return Number((x * 1e6).toPrecision(3)) + " \u00b5s";
    if (a < 1) return Number((x * 1e3).toPrecision(3)) + " ms";
    return x.toFixed(a < 10 ? 2 : 1) + " s";
  }

  /* A human duration in seconds: "45s", "3m 12s", "2h 05m". */
  function dur(x) {
    if (!isNum(x) || x < 0) return DASH;
    if (x < 10) return x.toFixed(1) + "s";
    x = Math.round(x);
    var h = Math.floor(x / 3600), m = Math.floor((x % 3600) / 60), sec = x % 60;
    if (h > 0) return h + "h " + (m < 10 ? "0" : "") + m + "m";
    if (m > 0) return m + "m " + (sec < 10 ? "0" : "") + sec + "s";
    return sec + "s";
  }

  function ago(epoch, now) {
    if (!isNum(epoch)) return DASH;
    var d = (now || Date.now() / 1000) - epoch;
    if (d < 1) return "just now";
    return dur(d) + " ago";
  }

  function clock(epoch) {
    if (!isNum(epoch)) return DASH;
    var d = new Date(epoch * 1000), p = function (n) { return (n < 10 ? "0" : "") + n; };
    return d.getFullYear() + "-" + p(d.getMonth() + 1) + "-" + p(d.getDate()) + " " +
      p(d.getHours()) + ":" + p(d.getMinutes()) + ":" + p(d.getSeconds());
  }

  /* A state badge: <span class="badge state-running">running</span> */
  function badge(state) {
    var st = String(state || "unknown");
    return h("span", {class: "badge state-" + st.replace(/[^a-z_-]/gi, ""), data: {state: st}}, st);
  }

  /* A progress bar for done/total. */
  function progress(done, total) {
    var frac = isNum(done) && isNum(total) && total > 0 ? Math.min(1, Math.max(0, done / total)) : 0;
    var bar = h("span", {class: "bar"});
    bar.style.width = (100 * frac).toFixed(1) + "%";
    return h("span", {class: "progress", title: (isNum(done) ? done : 0) + " / " + (isNum(total) ? total : "?")},
      h("span", {class: "track"}, bar),
      h("span", {class: "label"}, (isNum(done) ? done : 0) + "/" + (isNum(total) ? total : "?")));
  }

  return {h: h, s: s, clear: clear, fill: fill, isNum: isNum, DASH: DASH, num: num, int: int, si: si,
          pct: pct, bytes: bytes, secs: secs, dur: dur, ago: ago, clock: clock, badge: badge,
          progress: progress};
})();
