// Registry assets (models, datasets, rewards) as the launch and registry pages show them.

import { api, formatNumber } from "./api.js";

// Every row of a paginated list endpoint (LimitOffsetPagination: follows `next` to the end).
export async function listAll(path, params = {}) {
  const rows = [];
  let page = await api(path, { params: { limit: 200, ...params } });
  rows.push(...page.results);
  while (page.next) {
    page = await api(page.next);
    rows.push(...page.results);
  }
  return rows;
}

export function formatBytes(bytes) {
  if (bytes === null || bytes === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${unit ? value.toFixed(1) : value} ${units[unit]}`;
}

export function formatParameters(count) {
  if (count === null || count === undefined) return "—";
  if (count >= 1e9) return `${formatNumber(count / 1e9)}B`;
  if (count >= 1e6) return `${formatNumber(count / 1e6)}M`;
  if (count >= 1e3) return `${formatNumber(count / 1e3)}K`;
  return String(count);
}

export function formatWhen(iso) {
  if (!iso) return "—";
  return new Date(iso).toLocaleString(undefined, { dateStyle: "medium", timeStyle: "short" });
}

// "regex /\d+/", "python reward.py:compute_score", "http https://rm/score" ...
export function rewardSummary(reward) {
  const spec = reward.spec || {};
  const detail = {
    regex: () => spec.pattern,
    length_penalty: () => `over ${spec.max_chars} chars × ${spec.coef}`,
    python: () => [String(spec.path || "").split("/").pop(), spec.function].filter(Boolean).join(":"),
    http: () => spec.url,
    reward_model: () => spec.path,
  }[spec.type];
  return [spec.type || reward.kind, detail ? detail() : ""].filter(Boolean).join(" ");
}

export function modelLabel(model) {
  const facts = [model.architecture, model.parameter_count ? `${formatParameters(model.parameter_count)} params` : ""];
  return [model.name, facts.filter(Boolean).join(", ")].filter(Boolean).join(" — ");
}

export function datasetLabel(dataset) {
  return `${dataset.name} — ${formatNumber(dataset.row_count)} rows, ${dataset.format}`;
}
