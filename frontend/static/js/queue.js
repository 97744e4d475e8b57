// The /queue/ page: GET /api/queue/ refreshed every few seconds while the tab is visible (the runs
// list's live mechanism). docs/ARCHITECTURE.md, "The scheduler".
import { $, api, el, stateBadge } from "./api.js";

const REFRESH_MS = 2000;
const METRICS_REFRESH_MS = 30000; // the reconcile samples the cluster every 15 s
let timer = null;
let metricsTimer = null;

const amount = (value, key) => `${value} ${key}${value === 1 ? "" : "s"}`;
const needs = (r) => [amount(r.CPU, "CPU"), ...(r.GPU ? [amount(r.GPU, "GPU")] : [])].join(", ");
// A run of a project the user does not read comes without id or owner: its place and size, not its name.
const runLink = (run) => (run.hidden
  ? el("span", { class: "muted" }, run.name)
  : el("a", { href: `/runs/${run.id}/` }, run.name || run.id.slice(0, 8)));
const when = (iso) => (iso ? new Date(iso).toLocaleTimeString() : "—");

function fill(table, empty, rows) {
  $(table).querySelector("tbody").replaceChildren(...rows);
  if (empty) $(empty).hidden = rows.length > 0;
}

function render(queue) {
  fill("waiting-table", "waiting-empty", queue.waiting.map((run) => el("tr", { "data-run-id": run.id },
    el("td", { class: "num queue-position" }, run.queue_position ?? "held"),
    el("td", {}, runLink(run), " ", stateBadge(run.state)),
    el("td", {}, run.owner || "—"),
    el("td", {}, run.priority),
    el("td", {}, needs(run.resources)),
    el("td", { class: "queue-reason" }, run.reason),
    el("td", {}, when(run.estimated_start)))));
  fill("running-table", "running-empty", queue.running.map((run) => el("tr", { "data-run-id": run.id },
    el("td", {}, runLink(run)),
    el("td", {}, stateBadge(run.state)),
    el("td", {}, run.owner || "—"),
    el("td", {}, run.priority),
    el("td", {}, needs(run.grant)),
    el("td", { class: "num" }, `${run.last_step ?? 0} / ${run.total_steps ?? "?"}`,
      run.attempt ? ` (attempt ${run.attempt + 1}${run.lost_steps ? `, ${run.lost_steps} steps lost` : ""})` : ""))));
  fill("nodes-table", null, queue.cluster.nodes.map((node) => el("tr", {},
    el("td", {}, `${node.node_id.slice(0, 12)}${node.head ? " (head)" : ""}`),
    el("td", {}, node.address),
    el("td", { class: "num" }, `${node.free.CPU} / ${node.total.CPU}`),
    el("td", { class: "num" }, `${node.free.GPU} / ${node.total.GPU}`))));
  $("cluster-as-of").textContent = queue.cluster.as_of
    ? `Free after the scheduler's grants, as it read the cluster ${Math.round(queue.cluster.age_s)} s ago (${when(queue.cluster.as_of)}).`
    : "The scheduler has not looked at the cluster yet.";
}

const percent = (value) => (value == null ? "—" : `${Math.round(value * 100)}%`);
const seconds = (value) => (value == null ? "—" : `${Math.round(value)} s`);

function layout(title, yTitle, extra = {}, empty = "") {
  return {
    annotations: empty ? [{ text: empty, showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5,
      font: { color: "#5b6676" } }] : [],
    title: { text: title, font: { size: 14 } },
    margin: { l: 55, r: 15, t: 40, b: 60 },
    height: 300,
    yaxis: { title: { text: yTitle }, automargin: true, rangemode: "tozero" },
    legend: { orientation: "h", yanchor: "top", y: -0.2 },
    ...extra,
  };
}

function draw(id, traces, chartLayout) {
  if (typeof Plotly === "undefined") return; // the deferred plotly.js is not there yet: the next refresh draws
  Plotly.react($(id), traces, chartLayout, { responsive: true, displaylogo: false });
}

function shareTraces(rows) {
  const names = rows.map((row) => row.name);
  return [
    { type: "bar", name: "share of usage", x: names, y: rows.map((row) => row.share * 100) },
    { type: "bar", name: "share of weights", x: names, y: rows.map((row) => row.weight_share * 100) },
  ];
}

function renderMetrics(m) {
  const u = m.utilisation;
  const series = u.series;
  const at = series.at.map((iso) => new Date(iso));
  const lines = [];
  for (const key of ["CPU", "GPU"]) {
    if (u[`granted_${key}`] == null) continue;
    lines.push({ name: `${key}s granted`, x: at, y: series[`granted_${key}`].map((v) => v * 100), mode: "lines" });
    lines.push({ name: `${key}s used (Ray)`, x: at, y: series[`used_${key}`].map((v) => v * 100), mode: "lines",
      line: { dash: "dot" } });
  }
  draw("chart-utilisation", lines, layout("Utilisation of the cluster", "% of capacity", { xaxis: { type: "date" } },
    at.length ? "" : "no sample of the cluster in this window"));
  const priorities = Object.keys(m.queue_wait);
  draw("chart-waits", [
    { type: "bar", name: "p50", x: priorities, y: priorities.map((p) => m.queue_wait[p].p50_s) },
    { type: "bar", name: "p95", x: priorities, y: priorities.map((p) => m.queue_wait[p].p95_s) },
  ], layout("Queue wait by priority", "seconds", {}, priorities.length ? "" : "no run was admitted in this window"));
  draw("chart-user-shares", shareTraces(m.shares.users), layout("Users: usage against weight", "%", {},
    m.shares.users.length ? "" : "no usage yet"));
  draw("chart-team-shares", shareTraces(m.shares.teams), layout("Teams: usage against weight", "%", {},
    m.shares.teams.length ? "" : "no team (a group with a quota) has used the cluster"));
  draw("chart-project-shares", shareTraces(m.shares.projects), layout("Projects: usage against weight", "%", {},
    m.shares.projects.length ? "" : "no project of yours with a quota has used the cluster"));
  const first = m.admission_to_first_step;
  $("metrics-summary").textContent = [
    `CPUs granted ${percent(u.granted_CPU)}, used ${percent(u.used_CPU)}`,
    ...(u.granted_GPU != null ? [`GPUs granted ${percent(u.granted_GPU)}, used ${percent(u.used_GPU)}`] : []),
    `admission to first step p50 ${seconds(first.p50_s)}, p95 ${seconds(first.p95_s)} (${first.count} runs)`,
    `${m.preemptions.count} preemptions, ${m.preemptions.forced} stopped at the deadline, ${m.preemptions.lost_steps} steps lost`,
  ].join(" · ");
}

async function loadMetrics() {
  clearTimeout(metricsTimer);
  if (!document.hidden) {
    try {
      renderMetrics(await api(`/api/queue/stats/?window_s=${$("metrics-window").value}`));
    } catch (error) {
      $("metrics-summary").textContent = `Could not load the metrics: ${error.message}`;
    }
  }
  metricsTimer = setTimeout(loadMetrics, METRICS_REFRESH_MS);
}

async function load() {
  clearTimeout(timer);
  if (!document.hidden) {
    try {
      render(await api("/api/queue/"));
      $("queue-error").hidden = true;
      $("queue-status").textContent = "● live";
    } catch (error) {
      $("queue-error").textContent = `Could not load the queue: ${error.message}`;
      $("queue-error").hidden = false;
    }
  }
  timer = setTimeout(load, REFRESH_MS);
}

document.addEventListener("visibilitychange", () => { if (!document.hidden) { load(); loadMetrics(); } });
$("metrics-window").addEventListener("change", loadMetrics);
load();
window.addEventListener("load", loadMetrics); // after the deferred plotly.js
