// Draws every figure shipped in the page's "plotly-figures" JSON into the element it names.
(function () {
  "use strict";
  function draw() {
    var source = document.getElementById("plotly-figures");
    if (!source || !window.Plotly) { return; }
    JSON.parse(source.textContent).forEach(function (chart) {
      var target = document.getElementById(chart.id);
      if (!target) { return; }
      window.Plotly.newPlot(target, chart.figure.data, chart.figure.layout, { responsive: true, displaylogo: false })
        .then(function () { target.setAttribute("data-rendered", "true"); });
    });
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", draw);
  } else {
    draw();
  }
})();
