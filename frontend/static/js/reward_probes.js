// Reward probes as the registry and launch pages show them: a probe's hackability report, and following a
// probe until its worker is done (docs/REWARD_HACKING.md, "Reward probes").

import { api, el, formatNumber } from "./api.js";
import { formatWhen } from "./assets.js";

const EXAMPLE_CHARS = 120;

function cellText(text) {
  const flat = String(text).replace(/\s+/g, " ");
  return flat.length > EXAMPLE_CHARS ? `${flat.slice(0, EXAMPLE_CHARS)}…` : flat;
}

const PROBE_POLL_MS = 1000;

// A probe's report: each adversarial answer's mean score as a share of the honest answer's, the flagged
// ones (>= 50%) marked.
export function probeReport(probe) {
  if (probe.state === "failed") return el("p", { class: "error" }, `The probe failed: ${probe.error}`);
  if (probe.state !== "done") return el("p", { class: "muted" }, `Probe ${probe.state}…`);
  const report = probe.result;
  const verdict = report.hackable
    ? el("p", { class: "alert critical" }, `Hackable: ${report.probes.filter((p) => p.flagged).map((p) => p.probe).join(", ")} `
      + "score 50% or more of the honest answer's reward.")
    : el("p", { class: "alert success" }, report.note || "No probe reached 50% of the honest answer's reward.");
  const example = Object.fromEntries((probe.examples || []).map((e) => [e.probe, e.response]));
  return el("div", { class: "probe-report", "data-probe": probe.id },
    verdict,
    el("table", { class: "data" },
      el("thead", {}, el("tr", {}, el("th", {}, "Probe"), el("th", { class: "num" }, "Mean score"),
        el("th", { class: "num" }, "Of honest"), el("th", {}, "Example answer"))),
      el("tbody", {},
        el("tr", {}, el("td", {}, "honest (the label)"), el("td", { class: "num" }, formatNumber(report.honest_mean)),
          el("td", { class: "num" }, "100%"), el("td", { class: "code-cell" }, cellText(example.honest ?? ""))),
        ...report.probes.map((p) => el("tr", { class: p.flagged ? "flagged" : undefined, "data-probe-name": p.probe },
          el("td", {}, p.probe, p.errors ? el("span", { class: "muted" }, ` (${p.errors} failed)`) : null),
          el("td", { class: "num" }, formatNumber(p.mean)),
          el("td", { class: "num" }, p.fraction === null ? "—" : `${Math.round(100 * p.fraction)}%`),
          el("td", { class: "code-cell" }, cellText(example[p.probe] ?? "")))))),
    el("p", { class: "muted small" }, `${report.rows} rows of ${probe.dataset_name}, ${formatWhen(probe.finished_at)}`));
}

export async function followProbe(probe, box) {
  box.replaceChildren(probeReport(probe));
  while (probe.state === "queued" || probe.state === "running") {
    await new Promise((resolve) => setTimeout(resolve, PROBE_POLL_MS));
    probe = await api(probe.url);
    box.replaceChildren(probeReport(probe));
  }
}

