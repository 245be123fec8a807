// Draws every <figure data-chart> with uPlot (served from node_modules by Django's static files).
// A figure's numbers come from its <script type="application/json"> block, or from a same-origin
// URL in data-src answering as GET /api/v1/series does: {unit, times: [ISO 8601], series: [{name,
// label?, values}]}. Colours come from the page's CSS variables, so charts follow light and dark;
// they are drawn again when the scheme or the width changes.
(function () {
  "use strict";
  const dark = window.matchMedia("(prefers-color-scheme: dark)");

  function cssVar(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  }

  function format(unit, value) {
    if (value === null || value === undefined) return "—";
    if (unit === "ratio") return (100 * value).toFixed(value < 0.1 && value > 0 ? 1 : 0) + " %";
    if (unit === "seconds") return value < 1 ? (1000 * value).toFixed(0) + " ms" : value.toFixed(2) + " s";
    if (Math.abs(value) >= 1e6) return (value / 1e6).toFixed(1) + " M";
    if (Math.abs(value) >= 1e4) return (value / 1e3).toFixed(0) + " k";
    return Number.isInteger(value) ? String(value) : value.toFixed(2);
  }

  function options(figure, data, width) {
    const muted = cssVar("--muted"), line = cssVar("--line");
    const axis = { stroke: muted, grid: { stroke: line, width: 1 }, ticks: { stroke: line, width: 1 } };
    const y = { ...axis, size: 64, values: (u, ticks) => ticks.map((v) => format(data.unit, v)) };
    return {
      width: width,
      height: 220,
      scales: { x: { time: true }, y: data.unit === "ratio" ? { range: [0, 1] } : { range: (u, lo, hi) => [0, hi > 0 ? hi * 1.1 : 1] } },
      axes: [axis, y],
      legend: { live: true },
      cursor: { drag: { x: false, y: false } },
      series: [
        { value: "{YYYY}-{MM}-{DD} {HH}:{mm}" },
        ...data.series.map((s, i) => ({
          label: s.label || s.name,
          stroke: cssVar("--series-" + ((i % 8) + 1)),
          width: 2,
          points: { show: data.times.length < 40 },
          value: (u, v) => format(data.unit, v),
        })),
      ],
    };
  }

  function draw(figure, data) {
    const target = figure.querySelector(".chart-canvas");
    if (figure._plot) figure._plot.destroy();
    target.textContent = "";
    if (!data.series.length) {
      target.textContent = "Nothing in this window.";
      target.classList.add("empty");
      figure.dataset.drawn = "empty";
      return;
    }
    const times = data.times.map((t) => (typeof t === "number" ? t : Date.parse(t) / 1000));
    const aligned = [times, ...data.series.map((s) => s.values)];
    figure._plot = new uPlot(options(figure, data, target.clientWidth || 600), aligned, target);
    figure.dataset.drawn = "true";
  }

  function load(figure) {
    if (figure._data) return Promise.resolve(figure._data);
    const block = figure.querySelector('script[type="application/json"]');
    const got = block
      ? Promise.resolve(JSON.parse(block.textContent))
      : fetch(figure.dataset.src, { headers: { Accept: "application/json" } }).then((r) => r.json());
    return got.then((data) => (figure._data = data));
  }

  function drawAll() {
    document.querySelectorAll("figure[data-chart]").forEach((figure) => load(figure).then((data) => draw(figure, data)));
  }

  let resizing;
  window.addEventListener("resize", () => {
    clearTimeout(resizing);
    resizing = setTimeout(drawAll, 150);
  });
  dark.addEventListener("change", drawAll);
  document.addEventListener("htmx:afterSettle", drawAll);
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", drawAll);
  else drawAll();
})();
