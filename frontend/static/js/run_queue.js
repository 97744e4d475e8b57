// The run page's place in the scheduler's queue: while the run waits, its position and the reason it
// waits (GET /api/runs/<id>/ every few seconds); hidden once it runs. docs/ARCHITECTURE.md, "The scheduler".
import { api, pageData } from "./api.js";

const run = pageData("run-data");
const WAITING = new Set(["queued", "preempted"]);
const POLL_MS = 3000;

function show(current) {
  const node = document.getElementById("run-queue");
  const waiting = WAITING.has(current.state) && current.queue_position;
  node.hidden = !waiting;
  if (waiting) {
    node.textContent = `#${current.queue_position} in the queue: ${current.queue_reason}`;
  }
  return WAITING.has(current.state) || current.state === "preempting";
}

async function poll() {
  try {
    if (!show(await api(`/api/runs/${run.id}/`))) return; // admitted or ended: nothing more to show
  } catch { /* the next poll tries again */ }
  setTimeout(poll, POLL_MS);
}

if (WAITING.has(run.state) || run.state === "preempting") setTimeout(poll, POLL_MS);
