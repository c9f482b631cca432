// loadgen's report.html: draws each chart described in the page's "loadgen-charts" JSON with
// uPlot (inlined above). Hover shows the values under the cursor in the legend; a click on a
// legend entry hides or shows that series; dragging across a chart zooms into that range and a
// double click zooms back out. The uPlot instances are kept in window.loadgenCharts.
(function () {
  "use strict";
  var PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                 "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31"];
  var OBJECTIVE = "#d62728";

  function fmt(v) {
    if (v === null || v === undefined || !isFinite(v)) return "-";
    var a = Math.abs(v);
    if (a >= 1000) return v.toLocaleString("en-US", {maximumFractionDigits: 1});
    if (a >= 100) return v.toFixed(1);
    if (a >= 1) return v.toFixed(2);
    return v.toPrecision(3);
  }

  function fromZero(u, min, max) {
    return [0, max > 0 ? max * 1.08 : 1];
  }

  function build(spec, el) {
    var series = [{label: spec.x.label, value: function (u, v) { return fmt(v); }}];
    var colour = 0;
    spec.series.forEach(function (s) {
      var stroke = s.objective ? OBJECTIVE : PALETTE[colour++ % PALETTE.length];
      series.push({
        label: s.label,
        stroke: stroke,
        width: s.objective ? 1.2 : 1.6,
        dash: s.dash ? [6, 4] : undefined,
        scale: s.axis === 1 ? "y2" : "y",
        spanGaps: true,
        points: {show: !!spec.points && !s.objective, size: 6},
        value: function (u, v) { return v === null || v === undefined ? "-" : fmt(v) + (s.unit ? " " + s.unit : ""); }
      });
    });
    var axes = [
      {label: spec.x.label, values: function (u, ticks) { return ticks.map(fmt); }},
      {label: spec.y.label, scale: "y", values: function (u, ticks) { return ticks.map(fmt); }, size: 60}
    ];
    var scales = {x: {time: false}, y: {range: fromZero}};
    if (spec.y2) {
      axes.push({label: spec.y2.label, scale: "y2", side: 1, grid: {show: false},
                 values: function (u, ticks) { return ticks.map(fmt); }, size: 60});
      scales.y2 = {range: fromZero};
    }
    var opts = {
      width: Math.max(320, el.clientWidth || 900),
      height: 340,
      series: series,
      axes: axes,
      scales: scales,
      cursor: {drag: {x: true, y: false, setScale: true}, points: {size: 7}},
      legend: {live: true}
    };
    return new uPlot(opts, spec.data, el);
  }

  var specs = JSON.parse(document.getElementById("loadgen-charts").textContent);
  var charts = {};
  specs.forEach(function (spec) {
    var el = document.getElementById(spec.id);
    if (el) charts[spec.id] = build(spec, el);
  });
  window.loadgenCharts = charts;
  window.addEventListener("resize", function () {
    Object.keys(charts).forEach(function (id) {
      var el = document.getElementById(id);
      charts[id].setSize({width: Math.max(320, el.clientWidth || 900), height: 340});
    });
  });
})();
