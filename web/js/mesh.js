/* mesh: a job's 3-axis mesh — which worker holds which (pipeline rank,
 * replica, tp rank) coordinate — and the labels the timeline and the
 * workers table use for it.
 *
 * A rank's coordinate is the API's ("coordinate" in GET /v1/jobs/{id}'s
 * ranks and in GET /v1/workers); coord() computes the same from the rank
 * for lanes that carry only a rank: rank = (replica * pp + pipeline rank)
 * * tp + tp rank (docs/contracts.md). */
"use strict";
var PW = window.PW || (window.PW = {});

PW.mesh = (function () {
  var d = PW.dom, h = d.h;

  function dims(mesh) {
    mesh = mesh || {};
    return {pp: mesh.pp > 0 ? mesh.pp : 1, dp: mesh.dp > 0 ? mesh.dp : 1, tp: mesh.tp > 0 ? mesh.tp : 1};
  }

  function coord(rank, mesh) {
    var m = dims(mesh);
    return {pipeline_rank: Math.floor(rank / m.tp) % m.pp, replica: Math.floor(rank / m.tp / m.pp),
            tp_rank: rank % m.tp};
  }

  /* "pp1 dp0 tp1", as the CLI prints it; "" without a coordinate */
  function label(c) {
    return c ? "pp" + c.pipeline_rank + " dp" + c.replica + " tp" + c.tp_rank : "";
  }

  /* The job page's grid: one table per replica, a row per pipeline rank
   * (with its stages), a column per tp rank; each cell the worker's name
   * and its rank. ranks: the job's "ranks"; an empty list says so. */
  function grid(ranks, mesh) {
    var m = dims(mesh), at = {};
    (ranks || []).forEach(function (r) {
      var c = r.coordinate || coord(r.rank, m);
      at[c.replica + "," + c.pipeline_rank + "," + c.tp_rank] = r;
    });
    if (!(ranks || []).length)
      return h("p", {class: "empty", id: "job-mesh-empty"}, "No run yet: the mesh is placed when the job starts.");
    var tables = [];
    for (var dp = 0; dp < m.dp; dp++) {
      var head = [h("th", null, "pipeline rank")];
      for (var t = 0; t < m.tp; t++) head.push(h("th", null, "tp " + t));
      var rows = [];
      for (var p = 0; p < m.pp; p++) {
        var cells = [], stages = null;
        for (t = 0; t < m.tp; t++) {
          var r = at[dp + "," + p + "," + t];
          if (r && r.stages && !stages) stages = r.stages;
          cells.push(h("td", {class: "mesh-cell", data: {coord: p + "," + dp + "," + t, worker: r && r.worker}},
            r ? [h("span", {class: "strong"}, r.worker || "?"), h("span", {class: "muted small"}, " rank " + r.rank)]
              : h("span", {class: "muted"}, "not assigned")));
        }
        rows.push(h("tr", null, h("th", {scope: "row"}, "pp " + p +
          (stages && stages.length ? " (s" + stages.join(",s") + ")" : "")), cells));
      }
      tables.push(h("div", {class: "mesh-replica", data: {replica: dp}},
        h("h3", null, "replica " + dp + " (dp " + dp + ")"),
        h("table", {class: "grid mesh"}, h("thead", null, h("tr", null, head)), h("tbody", null, rows))));
    }
    return h("div", {class: "mesh-grid", id: "job-mesh", data: {pp: m.pp, dp: m.dp, tp: m.tp}}, tables);
  }

  return {coord: coord, label: label, grid: grid, dims: dims};
})();
