// The /queue/ page: GET /api/queue/ refreshed every few seconds while the tab is visible (the runs
// list's live mechanism). docs/ARCHITECTURE.md, "The scheduler".
import { $, api, el, stateBadge } from "./api.js";

const REFRESH_MS = 2000;
let timer = null;

const amount = (value, key) => `${value} ${key}${value === 1 ? "" : "s"}`;
const needs = (r) => [amount(r.CPU, "CPU"), ...(r.GPU ? [amount(r.GPU, "GPU")] : [])].join(", ");
const runLink = (run) => el("a", { href: `/runs/${run.id}/` }, run.name || run.id.slice(0, 8));
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
    el("td", { class: "num" }, `${run.last_step ?? 0} / ${run.total_steps ?? "?"}`))));
  fill("nodes-table", null, queue.cluster.nodes.map((node) => el("tr", {},
    el("td", {}, `${node.node_id.slice(0, 12)}${node.head ? " (head)" : ""}`),
    el("td", {}, node.address),
    el("td", { class: "num" }, `${node.free.CPU} / ${node.total.CPU}`),
    el("td", { class: "num" }, `${node.free.GPU} / ${node.total.GPU}`))));
  $("cluster-as-of").textContent = queue.cluster.as_of
    ? `As the scheduler last saw the cluster, at ${when(queue.cluster.as_of)}.`
    : "The scheduler has not looked at the cluster yet.";
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

document.addEventListener("visibilitychange", () => { if (!document.hidden) load(); });
load();
