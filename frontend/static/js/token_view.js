// The sample dialog's per-token view: each response token with the rollout engine's and the trainer's
// log-prob, their difference, the entropy it was drawn with and its advantage, shaded where the two
// policies disagree; a slider over the same prompt's responses at every step. GET
// /api/runs/<id>/sample-tokens/ reads them from the step's rollout file and sends them as base64 float16.
import { api, el, formatNumber } from "./api.js";

// |rollout - trainer| log-prob at which a token is shaded fully, and from which it counts as disagreeing.
const FULL_SHADE = 1.0;
const DISAGREE = 0.1;
const FIELDS = ["rollout_logprob", "trainer_logprob", "entropy", "advantage"];

function halfToFloat(bits) {
  const sign = bits & 0x8000 ? -1 : 1;
  const exponent = (bits >> 10) & 0x1f;
  const fraction = bits & 0x3ff;
  if (exponent === 0) return sign * 2 ** -14 * (fraction / 1024);
  if (exponent === 0x1f) return fraction ? NaN : sign * Infinity;
  return sign * 2 ** (exponent - 15) * (1 + fraction / 1024);
}

export function unpackF16(packed) {
  if (typeof packed !== "string") return null;
  const bytes = Uint8Array.from(atob(packed), (c) => c.charCodeAt(0));
  const view = new DataView(bytes.buffer);
  return Array.from({ length: bytes.length / 2 }, (_, i) => halfToFloat(view.getUint16(2 * i, true)));
}

function fmt(value) {
  return value === null || value === undefined || Number.isNaN(value) ? "—" : formatNumber(value);
}

function tokenRows(view) {
  const arrays = Object.fromEntries(FIELDS.map((name) => [name, unpackF16(view[name])]));
  return (view.text || []).map((text, i) => {
    const row = { text };
    for (const name of FIELDS) row[name] = arrays[name] ? arrays[name][i] : null;
    const known = row.rollout_logprob !== null && row.trainer_logprob !== null;
    row.diff = known ? row.trainer_logprob - row.rollout_logprob : null;
    return row;
  });
}

function versionsOf(view) {
  return (view.versions || []).flatMap(([version, count]) => Array(count).fill(version));
}

function tokenSpan(row, i, version) {
  const gap = row.diff === null || Number.isNaN(row.diff) ? 0 : Math.abs(row.diff);
  const shade = Math.min(1, gap / FULL_SHADE);
  const title = [`token ${i}`, `rollout log-prob ${fmt(row.rollout_logprob)}`, `trainer log-prob ${fmt(row.trainer_logprob)}`,
    `difference ${fmt(row.diff)}`, `entropy ${fmt(row.entropy)}`, `advantage ${fmt(row.advantage)}`,
    version === undefined ? null : `policy version ${version}`].filter(Boolean).join("\n");
  return el("span", {
    class: gap >= DISAGREE ? "tok disagree" : "tok", title, "data-token": i,
    style: shade > 0 ? `background: rgba(214, 39, 40, ${(0.15 + 0.6 * shade).toFixed(2)})` : null,
  }, row.text.replace(/\n/g, "↵\n"));
}

function tokenTable(rows, versions) {
  return el("details", { class: "token-table" }, el("summary", {}, "Every token"),
    el("table", { class: "data compact" },
      el("thead", {}, el("tr", {}, ["#", "token", "rollout", "trainer", "difference", "entropy", "advantage", "version"].map((h) => el("th", {}, h)))),
      el("tbody", {}, rows.map((row, i) => el("tr", { class: Math.abs(row.diff ?? 0) >= DISAGREE ? "disagree" : null },
        el("td", { class: "num" }, i), el("td", {}, el("code", {}, JSON.stringify(row.text))),
        ...[row.rollout_logprob, row.trainer_logprob, row.diff, row.entropy, row.advantage].map((v) => el("td", { class: "num" }, fmt(v))),
        el("td", { class: "num" }, versions[i] ?? "—"))))));
}

function renderView(body, view) {
  const rows = tokenRows(view);
  const versions = versionsOf(view);
  if (!rows.length) {
    body.replaceChildren(el("p", { class: "muted" }, "This sample carries no per-token data."));
    return;
  }
  const disagreeing = rows.filter((row) => Math.abs(row.diff ?? 0) >= DISAGREE).length;
  const missing = FIELDS.filter((name) => !view[name]);
  body.replaceChildren(
    el("p", { class: "muted token-summary" },
      (view.truncated && view.truncated.token_text ? `The first ${rows.length} of ${view.truncated.token_text} tokens` : `${rows.length} tokens`) +
        `; ${disagreeing} where the trainer's log-prob differs from the rollout's by ${DISAGREE} or more.`,
      missing.length ? ` Not recorded this step: ${missing.map((n) => n.replace("_", " ")).join(", ")}.` : null),
    el("pre", { class: "code token-text" }, rows.map((row, i) => tokenSpan(row, i, versions[i]))),
    tokenTable(rows, versions),
  );
}

// The section for the sample at (step, index): its tokens, and the slider over the same prompt's responses.
export async function tokenViewSection(container, runId, step, index) {
  const title = el("span", { class: "token-position" });
  const slider = el("input", { type: "range", min: 0, max: 0, value: 0, id: "token-step-slider", "aria-label": "response to the same prompt, by step" });
  const body = el("div", { class: "token-body" }, el("p", { class: "muted" }, "Loading…"));
  container.replaceChildren(el("h3", {}, "Per token"), el("div", { class: "row token-slider" }, slider, title), body);
  let refs = [];
  let shown = 0;

  async function show(ref) {
    const view = await api(`/api/runs/${runId}/sample-tokens/`, { params: { step: ref.step, index: ref.index } });
    if (ref !== refs[shown] && refs.length) return; // the slider moved on meanwhile
    title.textContent = `step ${view.step} · sample ${view.index}` + (refs.length ? ` (${shown + 1} of ${refs.length} responses to this prompt)` : "");
    renderView(body, view.tokens || {});
    return view;
  }

  try {
    const first = await show({ step, index });
    refs = first.same_prompt;
    shown = Math.max(0, refs.findIndex((r) => r.step === step && r.index === index));
    slider.max = String(Math.max(0, refs.length - 1));
    slider.value = String(shown);
    slider.disabled = refs.length < 2;
    title.textContent = `step ${step} · sample ${index} (${shown + 1} of ${refs.length} responses to this prompt)`;
    slider.addEventListener("input", () => {
      shown = Number(slider.value);
      show(refs[shown]).catch((error) => body.replaceChildren(el("p", { class: "error" }, String(error.message || error))));
    });
  } catch (error) {
    body.replaceChildren(el("p", { class: "error" }, String(error.message || error)));
  }
}
