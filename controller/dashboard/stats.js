// Renders one /api/stats payload (schema: docs/dashboard.md) into the page.
import { barChart, formatDuration, lineChart, sparkBars } from "./charts.js";

export const TASKS = ["math", "code", "chat"];

const METHOD_LABELS = {
  "step-times": "measured from step times",
  "tpot-vs-no-spec-pool": "measured: TPOT vs no-spec pool",
  "cost-model-estimate": "estimate from the cost model",
};

const $ = (id) => document.getElementById(id);

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

export function fmtSeconds(s) {
  if (s === null || s === undefined) return "–";
  if (s < 0.001) return `${(s * 1e6).toFixed(0)} µs`;
  if (s < 1) return `${(s * 1000).toFixed(1)} ms`;
  return `${s.toFixed(2)} s`;
}

const fmtNum = (v, digits = 2) => (v === null || v === undefined ? "–" : Number(v).toFixed(digits));

function metric(label, value, className = "") {
  const box = el("div", `metric ${className}`.trim());
  box.append(el("div", "label", label));
  const valueEl = el("div", "value");
  if (value instanceof Node) valueEl.append(value);
  else valueEl.textContent = value;
  box.append(valueEl);
  return box;
}

function speedupValue(speedup) {
  const frag = document.createDocumentFragment();
  const value = speedup && speedup.value !== null && speedup.value !== undefined ? speedup.value : null;
  frag.append(el("span", "speedup-number", value === null ? "–" : `${value.toFixed(2)}×`));
  frag.append(" ");
  let kind = "none";
  if (value !== null) kind = speedup.is_estimate ? "estimate" : "measured";
  frag.append(el("span", `badge ${kind}`, kind === "none" ? "no data" : kind));
  return frag;
}

function kEntries(chosen) {
  return Object.entries(chosen || {})
    .map(([k, count]) => ({ k: Number(k), count }))
    .sort((a, b) => a.k - b.k)
    .map(({ k, count }) => ({ label: k === 0 ? "off" : `k=${k}`, value: count, className: k === 0 ? "off" : "" }));
}

function taskCard(task, data, nowS) {
  const card = el("article", `card ${task}`);
  card.id = `task-${task}`;
  const title = el("h3");
  title.append(el("span", "swatch"), task);
  card.append(title);
  const speedup = data.speedup || {};
  const grid = el("div", "metrics");
  grid.append(
    metric("speedup vs no spec", speedupValue(speedup), "speedup"),
    metric("requests", String(data.requests ?? 0), "requests"),
    metric("accept length", fmtNum(data.accept_length_mean), "accept-length"),
    metric("TPOT p50", fmtSeconds(data.tpot_p50_s), "tpot-p50"),
    metric("TPOT p95", fmtSeconds(data.tpot_p95_s), "tpot-p95"),
    metric("classifier conf.", fmtNum(data.classified_confidence_mean), "confidence"),
  );
  card.append(grid);
  const method = el("p", "explain speedup-method");
  const how = speedup.method ? `Speedup ${METHOD_LABELS[speedup.method] || speedup.method}` : "No speedup yet";
  method.textContent = speedup.explanation ? `${how}: ${speedup.explanation}.` : `${how}.`;
  card.append(method);
  card.append(el("div", "chart-title", "chosen k (requests)"));
  const chart = el("div", "chart k-chart");
  barChart(chart, kEntries(data.spec_tokens_chosen), { emptyText: "no requests yet" });
  card.append(chart);
  card.append(el("div", "chart-title", "k over time (each finished request: the mean k its steps ran)"));
  const history = el("div", "chart k-history");
  lineChart(history, data.k_history || [], { width: 320, height: 100, nowS, emptyText: "fewer than two requests yet" });
  card.append(history);
  const reason = el("p", "explain k-reason");
  reason.textContent = data.k_reason ? `Why k now: ${data.k_reason}` : "Why k now: no request finished yet.";
  card.append(reason);
  return card;
}

function poolRow(pool) {
  const row = document.createElement("tr");
  row.dataset.pool = pool.name;
  const cells = [
    pool.name,
    pool.kind,
    null,
    String(pool.inflight ?? "–"),
    `${pool.running ?? "–"} / ${pool.waiting ?? "–"}`,
    pool.spec_tokens === null || pool.spec_tokens === undefined ? "per request" : pool.spec_tokens === 0 ? "0 (off)" : String(pool.spec_tokens),
    String(pool.block_size ?? "–"),
    fmtNum(pool.accept_length_mean),
    null,
    fmtSeconds(pool.tpot_p50_s),
    String(pool.requests ?? 0),
    String(pool.errors ?? 0),
  ];
  cells.forEach((text, i) => {
    const td = document.createElement("td");
    if (i === 2) {
      td.className = `health ${pool.healthy ? "up" : "down"}`;
      td.textContent = pool.healthy ? "● up" : "● down";
    } else if (i === 8) {
      const rates = pool.accept_rate_per_position || [];
      if (rates.length) td.append(sparkBars(rates));
      else td.textContent = "–";
    } else {
      td.textContent = text;
    }
    row.append(td);
  });
  return row;
}

export function renderStats(stats) {
  $("policy-version").textContent = stats.policy ? `v${stats.policy.version}` : "–";
  $("policy-kind").textContent = stats.policy ? stats.policy.kind : "";
  $("uptime").textContent = formatDuration(stats.uptime_s || 0);
  $("concurrency-now").textContent = String(stats.concurrency ? stats.concurrency.current : "–");
  $("classifier-p50").textContent = fmtSeconds(stats.classifier ? stats.classifier.latency_p50_s : null);
  const tasks = stats.tasks || {};
  $("tasks").replaceChildren(...TASKS.map((task) => taskCard(task, tasks[task] || {}, stats.time_s)));
  $("pools").tBodies[0].replaceChildren(...(stats.backends || []).map(poolRow));
  const history = stats.concurrency ? stats.concurrency.history : [];
  lineChart($("concurrency-chart"), history, { nowS: stats.time_s });
}
