// Small SVG charts built with the DOM (no libraries). Every label goes through textContent,
// so names from the daemon can never inject markup.
const SVG_NS = "http://www.w3.org/2000/svg";

export function svgEl(name, attrs = {}, text) {
  const el = document.createElementNS(SVG_NS, name);
  for (const [key, value] of Object.entries(attrs)) el.setAttribute(key, String(value));
  if (text !== undefined) el.textContent = text;
  return el;
}

function emptyNote(container, message) {
  const note = document.createElement("div");
  note.className = "empty";
  note.textContent = message;
  container.replaceChildren(note);
}

// A nice round upper bound for an axis: 1, 2, 5 x 10^n.
export function niceMax(value) {
  if (!(value > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 5, 10]) if (value <= step * power) return step * power;
  return 10 * power;
}

// Vertical bars: entries = [{label, value, className?}]. Draws value labels above bars.
export function barChart(container, entries, { width = 320, height = 120, emptyText = "no data yet" } = {}) {
  const total = entries.reduce((sum, e) => sum + e.value, 0);
  if (entries.length === 0 || total === 0) return emptyNote(container, emptyText);
  const pad = { top: 14, bottom: 16, left: 4, right: 4 };
  const svg = svgEl("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "data-bars": entries.length });
  const plotH = height - pad.top - pad.bottom;
  const slot = (width - pad.left - pad.right) / entries.length;
  const barW = Math.max(4, Math.min(40, slot * 0.7));
  const top = Math.max(...entries.map((e) => e.value));
  entries.forEach((entry, i) => {
    const h = top > 0 ? (entry.value / top) * plotH : 0;
    const x = pad.left + i * slot + (slot - barW) / 2;
    const y = pad.top + plotH - h;
    const bar = svgEl("rect", { x, y, width: barW, height: Math.max(h, 1), class: `bar ${entry.className || ""}`.trim() });
    bar.appendChild(svgEl("title", {}, `${entry.label}: ${entry.value} (${((100 * entry.value) / total).toFixed(0)}%)`));
    svg.appendChild(bar);
    svg.appendChild(svgEl("text", { x: x + barW / 2, y: y - 3, "text-anchor": "middle" }, String(entry.value)));
    svg.appendChild(svgEl("text", { x: x + barW / 2, y: height - 4, "text-anchor": "middle" }, entry.label));
  });
  container.replaceChildren(svg);
}

// A time series: points = [[t_s, value], ...]; x axis in seconds before `nowS`.
export function lineChart(container, points, { width = 640, height = 180, nowS, emptyText = "no samples yet" } = {}) {
  if (!points || points.length < 2) return emptyNote(container, emptyText);
  const pad = { top: 10, bottom: 18, left: 34, right: 8 };
  const t0 = points[0][0];
  const t1 = nowS ?? points[points.length - 1][0];
  const span = Math.max(t1 - t0, 1);
  const yMax = niceMax(Math.max(...points.map((p) => p[1])));
  const plotW = width - pad.left - pad.right;
  const plotH = height - pad.top - pad.bottom;
  const x = (t) => pad.left + ((t - t0) / span) * plotW;
  const y = (v) => pad.top + plotH - (v / yMax) * plotH;
  const svg = svgEl("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "data-points": points.length });
  for (const frac of [0, 0.5, 1]) {
    const v = yMax * frac;
    svg.appendChild(svgEl("line", { x1: pad.left, x2: width - pad.right, y1: y(v), y2: y(v), class: "axis" }));
    svg.appendChild(svgEl("text", { x: pad.left - 4, y: y(v) + 3, "text-anchor": "end" }, formatCount(v)));
  }
  const coords = points.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`);
  const base = `${x(points[points.length - 1][0]).toFixed(1)},${y(0)} ${x(t0).toFixed(1)},${y(0)}`;
  svg.appendChild(svgEl("polygon", { points: `${coords.join(" ")} ${base}`, class: "area" }));
  svg.appendChild(svgEl("polyline", { points: coords.join(" "), class: "line" }));
  svg.appendChild(svgEl("text", { x: pad.left, y: height - 4 }, `-${formatDuration(span)}`));
  svg.appendChild(svgEl("text", { x: width - pad.right, y: height - 4, "text-anchor": "end" }, "now"));
  container.replaceChildren(svg);
}

// Tiny inline bars for per-position acceptance rates in [0, 1].
export function sparkBars(rates, { width = 90, height = 18 } = {}) {
  const svg = svgEl("svg", { viewBox: `0 0 ${width} ${height}`, width, height, "data-bars": rates.length });
  const slot = width / Math.max(rates.length, 1);
  rates.forEach((rate, i) => {
    const h = Math.max(1, Math.min(1, rate) * height);
    const bar = svgEl("rect", { x: i * slot + 0.5, y: height - h, width: Math.max(slot - 1, 1), height: h, class: "bar" });
    bar.appendChild(svgEl("title", {}, `position ${i + 1}: ${(100 * rate).toFixed(0)}%`));
    svg.appendChild(bar);
  });
  return svg;
}

export function formatCount(v) {
  return Number.isInteger(v) ? String(v) : v.toFixed(1);
}

export function formatDuration(seconds) {
  if (seconds < 90) return `${Math.round(seconds)}s`;
  if (seconds < 5400) return `${Math.round(seconds / 60)}m`;
  return `${(seconds / 3600).toFixed(1)}h`;
}
