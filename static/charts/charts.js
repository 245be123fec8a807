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

  // `tenths`: a rate to a tenth of a point, as the tables under a what-if's charts give it (its
  // answers differ by a point or less); axes keep whole points.
  function format(unit, value, tenths) {
    if (value === null || value === undefined) return "—";
    if (value === 0) return "0";
    if (unit === "ratio") return (100 * value).toFixed(tenths || (value < 0.1 && value > 0) ? 1 : 0) + " %";
    if (unit === "seconds") return value < 1 ? (1000 * value).toFixed(0) + " ms" : value.toFixed(2) + " s";
    if (Math.abs(value) >= 1e6) return (value / 1e6).toFixed(1) + " M";
    if (Math.abs(value) >= 1e4) return (value / 1e3).toFixed(0) + " k";
    return Number.isInteger(value) ? String(value) : value.toFixed(2);
  }

  // Times in UTC, as the tables under the charts and the page's window are: a day's tick of a long
  // window shows its date alone, so that seven of them fit side by side.
  function utc(seconds, long) {
    const iso = new Date(seconds * 1000).toISOString();
    if (!long) return iso.slice(11, 16);
    return seconds % 86400 === 0 ? iso.slice(5, 10) : iso.slice(5, 10) + " " + iso.slice(11, 16);
  }

  // Values with no neighbour (nothing measured on either side) are drawn as dots: a line needs two.
  function isolated(values) {
    const found = [];
    values.forEach((v, i) => {
      if (v !== null && (i === 0 || values[i - 1] === null) && (i === values.length - 1 || values[i + 1] === null)) found.push(i);
    });
    return found;
  }

  // Whole steps for counts: an axis of blocks or tokens never reads 0.25.
  const WHOLE = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6, 2e6, 5e6, 1e7];

  function options(figure, data, times, width) {
    const muted = cssVar("--muted"), line = cssVar("--line");
    const axis = { stroke: muted, grid: { stroke: line, width: 1 }, ticks: { stroke: line, width: 1 } };
    const y = { ...axis, size: 64, values: (u, ticks) => ticks.map((v) => format(data.unit, v)) };
    if (data.unit === "count" || data.unit === "tokens" || data.unit === "requests") y.incrs = WHOLE;
    const long = times.length > 1 && times[times.length - 1] - times[0] > 2 * 86400;
    const x = { ...axis, space: 60, values: (u, ticks) => ticks.map((t) => utc(t, long)) };
    return {
      width: width,
      height: 220,
      tzDate: (ts) => uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"),
      scales: { x: { time: true }, y: data.unit === "ratio" ? { range: [0, 1] } : { range: (u, lo, hi) => [0, hi > 0 ? hi * 1.1 : 1] } },
      axes: [x, y],
      legend: { live: true },
      cursor: { drag: { x: false, y: false } },
      plugins: data.markers && data.markers.length ? [markers(figure, data), atRest(data)] : [atRest(data)],
      series: [
        { label: "UTC", value: (u, t) => (t == null ? "—" : new Date(t * 1000).toISOString().slice(0, 16).replace("T", " ")) },
        ...data.series.map((s, i) => ({
          label: s.label || s.name,
          stroke: cssVar(s.reference ? "--muted" : "--series-" + ((i % 8) + 1)),
          width: s.reference ? 1.5 : 2,
          // A reference (a level the page states, such as the rate before a change): dashed, no dots.
          dash: s.reference ? [6 * devicePixelRatio, 4 * devicePixelRatio] : undefined,
          points: s.reference ? { show: false } : data.times.length < 40 ? { show: true } : { show: true, size: 6, filter: () => isolated(s.values) },
          value: (u, v) => format(data.unit, v),
        })),
      ],
    };
  }

  // With the cursor off a chart, its legend reads the values at rest rather than dashes, so a
  // glance gives the figures: data.rest (an index: a what-if's today), else the marked category
  // (bars), else the latest index where a series has a value.
  function atRest(data) {
    let rest = Number.isInteger(data.rest) ? data.rest : data.marked && data.marked.length ? data.marked[0] : null;
    const length = data.kind === "bars" ? data.categories.length : data.kind === "xy" ? data.xs.length : data.times.length;
    for (let i = length - 1; rest === null && i >= 0; i--) {
      if (data.series.some((s) => s.values[i] !== null && s.values[i] !== undefined)) rest = i;
    }
    const show = (u) => {
      if (u.legend.idx == null && rest !== null) u.setLegend({ idx: rest }, false);
    };
    return { hooks: { setLegend: [show] } };
  }

  // A version's marker: a dashed vertical line at the moment it went live, and over it a link (a
  // keyboard stop with the version's name) that opens the version's panel, by htmx where the page has it.
  // A marker of kind "change" (a regression's change point) is a solid line in the page's colour for
  // bad news, its link named by its own label.
  // Markers are made anew whenever the chart is drawn (a resize, the scheme, a swap): the one that held
  // the keyboard's focus takes it back, else a redraw between a Tab and an Enter would eat the Enter.
  function markers(figure, data) {
    const found = (data.markers || []).map((m) => ({ ...m, t: Date.parse(m.at) / 1000 }));
    function place(u) {
      const focused = focusedMarker(figure) || figure._refocus;
      figure._refocus = null;
      u.over.querySelectorAll("a.chart-marker").forEach((a) => a.remove());
      found.forEach((m) => {
        const a = document.createElement("a");
        a.className = m.kind === "change" ? "chart-marker change" : "chart-marker";
        a.href = m.href;
        a.title = m.label;
        a.setAttribute("aria-label", m.kind === "change" ? m.label : "Version " + m.label);
        a.dataset.version = m.id;
        a.style.left = u.valToPos(m.t, "x") + "px";
        a.addEventListener("click", (event) => openVersion(event, a));
        u.over.append(a);
        if (focused === a.dataset.version) a.focus();
      });
    }
    function line(u) {
      const ctx = u.ctx;
      ctx.save();
      ctx.lineWidth = 2 * devicePixelRatio;
      found.forEach((m) => {
        const change = m.kind === "change";
        ctx.strokeStyle = cssVar(change ? "--bad" : "--muted"); // apart from the series, which take the accent first
        ctx.setLineDash(change ? [] : [5 * devicePixelRatio, 4 * devicePixelRatio]);
        const x = Math.round(u.valToPos(m.t, "x", true));
        ctx.beginPath();
        ctx.moveTo(x, u.bbox.top);
        ctx.lineTo(x, u.bbox.top + u.bbox.height);
        ctx.stroke();
      });
      ctx.restore();
    }
    return { hooks: { draw: [line], ready: [place], setSize: [place] } };
  }

  // The version of the marker in this figure that has the keyboard's focus, if one has.
  function focusedMarker(figure) {
    const active = document.activeElement;
    return active && active.matches("a.chart-marker") && figure.contains(active) ? active.dataset.version : null;
  }

  function openVersion(event, link) {
    const panel = document.getElementById("version-panel");
    if (!window.htmx || !panel) return; // the link's own page load, with the version in its URL
    event.preventDefault();
    window.htmx.ajax("GET", link.href, { target: "#version-panel", swap: "outerHTML" }).then(() => {
      history.pushState({}, "", link.href);
      document.getElementById("version-panel").scrollIntoView({ block: "start" });
    });
  }

  // A sparkline (data-chart="spark", in a table cell): the line alone, 0 to 100 %, no axes or legend;
  // its numbers are in a table of their own.
  function sparkOptions(data, width) {
    return {
      width: width,
      height: 34,
      scales: { x: { time: true }, y: { range: [0, 1] } },
      axes: [{ show: false }, { show: false }],
      legend: { show: false },
      cursor: { show: false },
      series: [{}, ...data.series.map((s) => ({ stroke: cssVar("--series-1"), width: 1.5, points: { show: true, size: 4, filter: () => isolated(s.values) } }))],
    };
  }

  // Bars per category (data.kind "bars": a template's versions, oldest left), the series side by
  // side in each; an axis through zero, since a change can gain reuse as well as lose it.
  function barOptions(data, width) {
    const muted = cssVar("--muted"), line = cssVar("--line");
    const axis = { stroke: muted, grid: { stroke: line, width: 1 }, ticks: { stroke: line, width: 1 } };
    const names = data.categories;
    const count = data.series.length;
    return {
      width: width,
      height: data.x_label ? 240 : 200,
      scales: {
        x: { time: false, range: () => [-0.5, names.length - 0.5] },
        y: { range: (u, lo, hi) => [Math.min(0, lo * 1.15), Math.max(0, hi * 1.15) || 1] },
      },
      axes: [
        { ...axis, grid: { show: false }, splits: () => names.map((_, i) => i), values: () => names, font: "12px ui-monospace, monospace", label: data.x_label, labelSize: data.x_label ? 24 : 0 },
        { ...axis, size: 64, values: (u, ticks) => ticks.map((v) => format(data.unit, v)), label: data.y_label, labelSize: data.y_label ? 24 : 0 },
      ],
      legend: { live: true },
      cursor: { drag: { x: false, y: false }, points: { show: false } },
      plugins: [atRest(data)],
      series: [
        { label: data.x_label || "Version", value: (u, i) => (i == null ? "—" : names[Math.round(i)]) },
        ...data.series.map((s, i) => ({
          label: s.label || s.name,
          stroke: cssVar("--series-" + ((i % 8) + 1)),
          fill: cssVar("--series-" + ((i % 8) + 1)),
          width: 0,
          fillTo: 0,
          points: { show: false },
          paths: uPlot.paths.bars({ size: [0.7 / count, 48], align: count === 1 ? 0 : i === 0 ? -1 : 1, disp: marked(data, i) }),
          value: (u, v) => format(data.unit, v, true),
        })),
      ],
    };
  }

  // Numbers against numbers (data.kind "xy": a what-if's capacity curve): x on a log scale when
  // data.log says so (its base), each series drawn as its style says: a line, dots alone, or one
  // larger dot (a mark such as today's); a reference is a dashed level, as on the time charts.
  function xyOptions(data, width) {
    const muted = cssVar("--muted"), line = cssVar("--line");
    const axis = { stroke: muted, grid: { stroke: line, width: 1 }, ticks: { stroke: line, width: 1 } };
    const x = (v) => (v == null ? "—" : (data.x_unit === "factor" ? +v.toFixed(2) + "×" : format(data.x_unit, v)));
    return {
      width: width,
      height: 280,
      scales: {
        x: data.log ? { time: false, distr: 3, log: data.log } : { time: false },
        // A curve's differences are a few points: its rates to the nearest tenths around them.
        y: data.unit === "ratio" ? { range: (u, lo, hi) => [Math.max(0, Math.floor((lo - 0.02) * 10) / 10), Math.min(1, Math.ceil((hi + 0.02) * 10) / 10)] } : { range: (u, lo, hi) => [0, hi > 0 ? hi * 1.1 : 1] },
      },
      axes: [
        { ...axis, label: data.x_label, labelSize: 24, values: (u, ticks) => ticks.map(x) },
        { ...axis, label: data.y_label, labelSize: 24, size: 56, values: (u, ticks) => ticks.map((v) => format(data.unit, v)) },
      ],
      legend: { live: true },
      cursor: { drag: { x: false, y: false } },
      plugins: [atRest(data)],
      series: [
        { label: data.x_label ? data.x_label.split(",")[0] : "x", value: (u, v) => x(v) },
        ...data.series.map((s, i) => {
          const colour = cssVar(s.reference ? "--muted" : "--series-" + ((i % 8) + 1));
          const found = { label: s.label || s.name, stroke: colour, width: 2, spanGaps: true, value: (u, v) => format(data.unit, v, true) };
          if (s.reference) return { ...found, width: 1.5, dash: [6 * devicePixelRatio, 4 * devicePixelRatio], points: { show: false } };
          if (s.style === "points" || s.style === "mark") {
            const size = s.style === "mark" ? 14 : 8;
            return { ...found, paths: () => null, points: { show: true, size: size, width: 2, fill: colour, stroke: s.style === "mark" ? cssVar("--fg") : colour } };
          }
          return { ...found, points: { show: false } };
        }),
      ],
    };
  }

  // The categories data.marked names (today's, say) in another colour than the rest of their series.
  function marked(data, i) {
    if (!data.marked || !data.marked.length) return undefined;
    const colour = cssVar("--series-" + ((i % 8) + 1)), mark = cssVar("--series-2");
    const fills = data.categories.map((_, at) => (data.marked.includes(at) ? mark : colour));
    return { fill: { unit: 3, values: () => fills } };
  }

  function draw(figure, data) {
    const target = figure.querySelector(".chart-canvas");
    const spark = figure.dataset.chart === "spark";
    figure._refocus = focusedMarker(figure); // the new plot's markers come a microtask later
    if (figure._plot) figure._plot.destroy();
    target.textContent = "";
    if (!data.series.length) {
      target.textContent = spark ? "—" : "Nothing in this window.";
      target.classList.add("empty");
      figure.dataset.drawn = "empty";
      return;
    }
    const width = target.clientWidth || (spark ? 120 : 600);
    if (data.kind === "xy") {
      figure._plot = new uPlot(xyOptions(data, width), [data.xs, ...data.series.map((s) => s.values)], target);
      figure.dataset.drawn = "true";
      return;
    }
    if (data.kind === "bars") {
      const aligned = [data.categories.map((_, i) => i), ...data.series.map((s) => s.values)];
      figure._plot = new uPlot(barOptions(data, width), aligned, target);
      figure.dataset.drawn = "true";
      return;
    }
    const times = data.times.map((t) => (typeof t === "number" ? t : Date.parse(t) / 1000));
    const aligned = [times, ...data.series.map((s) => s.values)];
    figure._plot = new uPlot(spark ? sparkOptions(data, width) : options(figure, data, times, width), aligned, target);
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
    drawIn(document);
  }

  function drawIn(root) {
    const figures = [...root.querySelectorAll("figure[data-chart]")];
    if (root.matches && root.matches("figure[data-chart]")) figures.push(root);
    figures.forEach((figure) => load(figure).then((data) => draw(figure, data)));
  }

  let resizing;
  window.addEventListener("resize", () => {
    clearTimeout(resizing);
    resizing = setTimeout(drawAll, 150);
  });
  dark.addEventListener("change", drawAll);
  // Only the charts an htmx swap brought: redrawing the others would remake their version markers
  // under a keyboard's focus (a fragment settling late took the focus from a marker about to be opened).
  document.addEventListener("htmx:afterSettle", (event) => drawIn(event.target));
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", drawAll);
  else drawAll();
})();
