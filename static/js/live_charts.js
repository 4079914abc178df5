// The endpoint dashboard's refresh: htmx swaps the live panel every 15 s but keeps the chart
// elements (hx-preserve), so each figure is updated in place with Plotly.react (no redraw from
// scratch, and a user's zoom survives through the figure's uirevision).
(function () {
  "use strict";
  document.addEventListener("htmx:afterSettle", function () {
    var source = document.getElementById("plotly-figures");
    if (!source || !window.Plotly) { return; }
    JSON.parse(source.textContent).forEach(function (chart) {
      var target = document.getElementById(chart.id);
      if (!target) { return; }
      window.Plotly.react(target, chart.figure.data, chart.figure.layout, { responsive: true, displaylogo: false })
        .then(function () { target.setAttribute("data-rendered", "true"); });
    });
  });
})();
