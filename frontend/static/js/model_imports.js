// GGUF imports as the registry page shows them: an import followed until its worker is done (converted in the
// sandbox, or failed with the reason), and an imported model's provenance in the models list.

import { api, el } from "./api.js";
import { formatBytes } from "./assets.js";

const IMPORT_POLL_MS = 1500;

// One line per state: what the worker is doing, the error it failed with, or what was made.
export function importStatus(record) {
  if (record.state === "failed") {
    return el("p", { class: "error", "data-import": record.id, "data-state": record.state },
      `Importing ${record.source_name} failed: ${record.error}`);
  }
  if (record.state === "done") {
    const check = record.model?.provenance?.check;
    return el("p", { class: "alert success", "data-import": record.id, "data-state": record.state },
      `Imported “${record.model.name}” from ${record.source_name}.`,
      check ? el("span", { class: "muted" }, ` Asked “${check.prompt}”, it answered “${check.text}”.`) : null);
  }
  const doing = record.state === "queued" ? "waiting for the user-code worker" : "converting in the sandbox";
  return el("p", { class: "muted", "data-import": record.id, "data-state": record.state },
    `${record.source_name} (${formatBytes(record.size_bytes)}): ${doing}…`);
}

// Polls the import until it ends; `onDone(model)` once its model is registered.
export async function followImport(record, box, onDone) {
  box.hidden = false;
  box.replaceChildren(importStatus(record));
  while (record.state === "queued" || record.state === "running") {
    await new Promise((resolve) => setTimeout(resolve, IMPORT_POLL_MS));
    record = await api(record.url);
    box.replaceChildren(importStatus(record));
  }
  if (record.state === "done") onDone(record.model);
}

// The models list's source cell of an imported model: the GGUF's quantization, and on hover where it came from.
export function ggufSource(provenance) {
  const p = provenance || {};
  // The commonest type first (the database keeps no order of an object's keys).
  const types = Object.entries(p.quantization || {}).sort((a, b) => b[1] - a[1]).map(([type]) => type).join(", ");
  const details = [
    `${p.source_file} (sha256 ${p.sha256})`,
    `${p.architecture}, GGUF v${p.gguf_version}, ${types}`,
    `converted to ${p.dtype}${p.converted_with?.transformers ? ` with transformers ${p.converted_with.transformers}` : ""}`,
    p.check ? `asked “${p.check.prompt}”: “${p.check.text}”` : null,
    p.vllm_check?.text !== undefined ? `vLLM: “${p.vllm_check.text}”` : null,
  ].filter(Boolean).join("\n");
  return el("span", { class: "gguf-source", title: details },
    `GGUF import (${types || "?"})`,
    el("div", { class: "muted small" }, `${p.source_file || ""} → ${p.dtype || "?"}`));
}
