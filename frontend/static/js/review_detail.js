// A campaign for its researcher: state and actions, progress per annotator, agreement per question,
// the judgements next to the rewards (sortable, disagreements only), and export / register as dataset.
// While the campaign is active the figures refresh themselves.

import { $, api, ApiError, el, formatDuration, formatNumber, pageData } from "./api.js";

const RESULTS_PAGE = 25;
const REFRESH_MS = 5000;
const CLOSE_CONFIRM_MS = 4000;
const PAIRWISE_NAMES = { A: "A", B: "B", tie: "tie", both_bad: "both bad" };
const EXPORT_NAMES = {
  trl: "TRL preference pairs (JSONL)", openai: "OpenAI preference pairs (JSONL)",
  ratings_jsonl: "Ratings (JSONL)", ratings_csv: "Ratings (CSV)",
};

const base = pageData("campaign-data");
const url = `/api/review/campaigns/${base.id}/`;

const state = {
  campaign: null,
  results: { ordering: "position", disagrees: false, offset: 0 },
  refreshTimer: null,
  closeArmedUntil: 0,
};

// Agreement statistics with four decimals: enough to tell 0.8235 from 0.8444 at a glance.
function stat(value) {
  return value === null || value === undefined ? "—" : value.toFixed(4);
}

function percent(value) {
  return value === null || value === undefined ? "—" : `${Math.round(value * 100)}%`;
}

function showError(text) {
  $("campaign-error").textContent = text;
  $("campaign-error").hidden = !text;
}

// --- the campaign: header, about, progress ------------------------------------------------------

function stateBadge(campaignState) {
  return el("span", { class: `badge state-${campaignState}`, "data-state": campaignState }, campaignState);
}

function questionLine(question) {
  const details = [];
  if (question.kind === "rating") {
    details.push(`${question.min}–${question.max}`);
    if (question.labels && question.labels.length) details.push(question.labels.join(" / "));
  }
  if (question.kind === "tags") details.push(question.options.join(", "));
  return el("li", {}, el("strong", {}, question.label), " ",
    el("span", { class: "muted" }, [question.kind, question.required ? "required" : "optional", ...details].join(" · "),
      " · key ", el("code", {}, question.key)));
}

function sourceLine(source) {
  const steps = source.steps ? `steps ${source.steps.join(", ")}` : source.step_range
    ? `steps ${source.step_range[0]}–${source.step_range[1]}` : "every step";
  const parts = [`rule ${source.rule}`, `k ${source.k}`, steps, `seed ${source.seed}`];
  if (source.components && source.components.length) parts.push(`components ${source.components.join(", ")}`);
  if (source.pair_steps) parts.push(`pairs at ${source.pair_steps === "same" ? "the same step" : "each run's latest step"}`);
  return el("span", {}, ...source.runs.flatMap((id, i) => [i ? ", " : "", el("a", { href: `/runs/${id}/` }, `run ${id.slice(0, 8)}`)]),
    ` · ${parts.join(" · ")}`);
}

function renderAbout(campaign) {
  const facts = [
    ["Items", `${campaign.item_count} ${campaign.kind === "pair" ? "pairs of responses" : "responses"}`],
    ["Annotators", campaign.annotators.join(", ") || "none assigned"],
    ["Per item", `${campaign.overlap} annotator${campaign.overlap === 1 ? "" : "s"}`],
    ["Blind", campaign.blind ? "yes: annotators see no rewards, runs or steps" : "no: annotators see rewards and runs"],
    ["Source", sourceLine(campaign.source)],
    ["Created", `${new Date(campaign.created_at).toLocaleString()}${campaign.created_by ? ` by ${campaign.created_by}` : ""}`],
  ];
  const parts = [
    campaign.description ? el("p", {}, campaign.description) : null,
    el("dl", { class: "facts" }, ...facts.flatMap(([term, value]) => [el("dt", {}, term), el("dd", {}, value)])),
    el("h3", {}, "Questions"), el("ol", { class: "question-list" }, campaign.questions.map(questionLine)),
    campaign.instructions ? el("details", {}, el("summary", {}, "Instructions for annotators"),
      el("p", { class: "prewrap" }, campaign.instructions)) : null,
  ];
  $("about").replaceChildren(...parts.filter(Boolean));
}

function renderProgress(campaign) {
  const progress = campaign.progress;
  const rows = progress.per_annotator.map((entry) => el("tr", { "data-annotator": entry.annotator },
    el("td", {}, entry.annotator),
    el("td", { class: "num judged" }, `${entry.judged} of ${progress.items}`),
    el("td", { class: "num" }, formatDuration(entry.seconds)),
    el("td", {}, entry.holding ? "working on an item" : "")));
  $("progress-box").replaceChildren(
    el("div", { class: "row" },
      el("progress", { max: progress.judgements_needed || 1, value: progress.judgements, id: "campaign-progress" }),
      el("span", { id: "progress-summary" },
        `${progress.judgements} of ${progress.judgements_needed} judgements · ${progress.items_complete} of ${progress.items} items done`
        + (progress.items_locked ? ` · ${progress.items_locked} being judged now` : ""))),
    rows.length ? el("table", { class: "data compact", id: "annotator-progress" },
      el("thead", {}, el("tr", {}, el("th", {}, "Annotator"), el("th", { class: "num" }, "Judged"),
        el("th", { class: "num" }, "Time spent"), el("th", {}, "Now"))),
      el("tbody", {}, rows)) : el("p", { class: "muted" }, "No annotators assigned."),
  );
}

function renderHeader(campaign) {
  document.title = `${campaign.name} · Review · Posttrain`;
  $("campaign-title").textContent = campaign.name;
  $("campaign-state").replaceChildren(stateBadge(campaign.state));
  $("activate-button").hidden = campaign.state !== "draft";
  $("close-button").hidden = campaign.state === "closed";
}

async function loadCampaign() {
  state.campaign = await api(url);
  renderHeader(state.campaign);
  renderAbout(state.campaign);
  renderProgress(state.campaign);
}

async function transition(action) {
  showError("");
  try {
    await api(`${url}${action}/`, { method: "POST" });
    await refreshAll();
  } catch (error) {
    showError(`Could not ${action} the campaign: ${error.message}`);
  }
}

// Closing cannot be undone: the button asks to be pressed a second time.
function closePressed() {
  const button = $("close-button");
  if (Date.now() < state.closeArmedUntil) {
    state.closeArmedUntil = 0;
    button.textContent = "Close campaign";
    transition("close");
    return;
  }
  state.closeArmedUntil = Date.now() + CLOSE_CONFIRM_MS;
  button.textContent = "Press again to close (annotators stop)";
  setTimeout(() => {
    if (Date.now() >= state.closeArmedUntil) button.textContent = "Close campaign";
  }, CLOSE_CONFIRM_MS);
}

// --- agreement --------------------------------------------------------------------------------

function pairwiseKappas(entry) {
  if (!entry.pairwise_kappa || entry.pairwise_kappa.length < 2) return null;
  return el("div", { class: "small muted" }, entry.pairwise_kappa.map((pair) =>
    `${pair.annotators.join("–")}: ${stat(pair.kappa)} (${pair.items})`).join(" · "));
}

function agreementRow(label, kind, metric, entry, attrs) {
  return el("tr", attrs,
    el("td", {}, label),
    el("td", {}, kind),
    el("td", { class: "small" }, metric),
    el("td", { class: "num items" }, entry.items ?? "—"),
    el("td", { class: "num alpha" }, stat(entry.alpha)),
    el("td", { class: "num kappa" }, stat(entry.kappa), pairwiseKappas(entry)));
}

function renderAgreement(agreement) {
  const rows = [];
  for (const question of agreement.questions) {
    const metric = question.kappa_weighting ? `${question.metric}; κ ${question.kappa_weighting}-weighted` : question.metric;
    if (question.per_tag) {
      rows.push(el("tr", { class: "group-row", "data-question": question.key },
        el("td", { colspan: 6 }, question.label, " ", el("span", { class: "muted small" }, `(tags, ${metric})`))));
      for (const [tag, entry] of Object.entries(question.per_tag)) {
        rows.push(agreementRow(el("span", { class: "indent" }, tag), "tag", "picked or not", entry,
          { "data-question": question.key, "data-tag": tag }));
      }
    } else {
      rows.push(agreementRow(question.label, question.kind, metric, question, { "data-question": question.key }));
    }
  }
  $("agreement-box").replaceChildren(
    el("p", { class: "small-print" }, `${agreement.judgements} judgements by ${agreement.annotators.length} annotator`
      + `${agreement.annotators.length === 1 ? "" : "s"}${agreement.annotators.length ? `: ${agreement.annotators.join(", ")}` : ""}.`),
    rows.length ? el("table", { class: "data", id: "agreement-table" },
      el("thead", {}, el("tr", {}, el("th", {}, "Question"), el("th", {}, "Kind"), el("th", {}, "Metric"),
        el("th", { class: "num", title: "Items with two or more answers" }, "Items"),
        el("th", { class: "num" }, "Krippendorff's α"), el("th", { class: "num" }, "Cohen's κ"))),
      el("tbody", {}, rows)) : el("p", { class: "muted" }, "No question here measures agreement (comments only)."));
  renderAnnotatorStats(agreement);
}

function questionStat(question, entry) {
  if (!entry) return "—";
  const parts = [];
  if (question.kind === "pass_fail") parts.push(`pass ${percent(entry.pass_rate)}`);
  if (question.kind === "rating") parts.push(`mean ${formatNumber(entry.mean)}`);
  if (question.kind === "pairwise") {
    parts.push(Object.entries(entry.choices).map(([choice, n]) => `${PAIRWISE_NAMES[choice]} ${n}`).join(", "));
  }
  if (question.kind === "tags") {
    parts.push(Object.entries(entry.tag_rates).map(([tag, rate]) => `${tag} ${percent(rate)}`).join(", "));
  }
  if (question.kind === "comment") parts.push(`${entry.answered} comment${entry.answered === 1 ? "" : "s"}`);
  if (entry.agreement_with_majority && entry.agreement_with_majority.items) {
    parts.push(`agrees with the others ${percent(entry.agreement_with_majority.rate)} (${entry.agreement_with_majority.items})`);
  }
  if (entry.mean_abs_diff_from_others && entry.mean_abs_diff_from_others.items) {
    parts.push(`off the others by ${formatNumber(entry.mean_abs_diff_from_others.value)}`);
  }
  return parts.join(" · ");
}

function renderAnnotatorStats(agreement) {
  const questions = state.campaign.questions;
  if (!agreement.annotator_stats.length) {
    $("annotator-stats-box").replaceChildren(el("p", { class: "muted" }, "No judgements yet."));
    return;
  }
  $("annotator-stats-box").replaceChildren(el("div", { class: "scroll-x" }, el("table", { class: "data", id: "annotator-stats" },
    el("thead", {}, el("tr", {}, el("th", {}, "Annotator"), el("th", { class: "num" }, "Items"),
      el("th", { class: "num" }, "Seconds per item"), ...questions.map((q) => el("th", {}, q.label)))),
    el("tbody", {}, agreement.annotator_stats.map((row) => el("tr", { "data-annotator": row.annotator },
      el("td", {}, row.annotator), el("td", { class: "num" }, row.items_judged),
      el("td", { class: "num" }, formatNumber(row.mean_seconds)),
      ...questions.map((q) => el("td", { class: "small" }, questionStat(q, row.questions[q.key])))))))));
}

async function loadAgreement() {
  renderAgreement(await api(`${url}agreement/`));
}

// --- results ----------------------------------------------------------------------------------

function answerText(question, value) {
  if (value === undefined || value === null) return null;
  if (question.kind === "pass_fail") return value ? "pass" : "fail";
  if (question.kind === "pairwise") return PAIRWISE_NAMES[value] || String(value);
  if (question.kind === "tags") return value.length ? value.join(", ") : "none";
  if (question.kind === "rating" && question.labels && question.labels.length) {
    return `${value} (${question.labels[value - question.min]})`;
  }
  return String(value);
}

function judgementLine(judgement) {
  const answers = state.campaign.questions
    .map((q) => [q, answerText(q, judgement.answers[q.key])])
    .filter(([, text]) => text !== null)
    .map(([q, text]) => el("span", { class: "answer", "data-key": q.key },
      el("span", { class: "muted" }, `${q.label}: `), q.kind === "comment" ? el("q", {}, text) : text));
  return el("li", { "data-annotator": judgement.annotator },
    el("strong", {}, judgement.annotator), " ", ...answers.flatMap((node, i) => (i ? [" · ", node] : [node])));
}

function sampleCell(sample) {
  return el("td", { class: "sample-cell" },
    el("pre", { class: "code clamp-text" }, sample.response),
    el("div", { class: "small muted" }, `reward ${formatNumber(sample.reward)} · `,
      el("a", { href: `/runs/${sample.run}/` }, sample.run_name), ` · step ${sample.step} #${sample.index}`));
}

function humansCell(row) {
  const questions = state.campaign.questions;
  const parts = [];
  for (const question of questions) {
    const summary = row.summary[question.key];
    if (!summary || !summary.n) continue;
    if (question.kind === "pass_fail") parts.push(`${question.label}: pass ${percent(summary.pass_rate)}`);
    if (question.kind === "rating") parts.push(`${question.label}: mean ${formatNumber(summary.mean)}`);
    if (question.kind === "pairwise") parts.push(`${question.label}: ${summary.majority ? PAIRWISE_NAMES[summary.majority] : "split"}`);
  }
  if (!row.samples.B && row.human_score !== null && row.human_score !== undefined) {
    parts.push(`score ${formatNumber(row.human_score)} (0..1)`);
  }
  return el("td", { class: "small humans" }, parts.map((text) => el("div", {}, text)));
}

function rewardCell(row) {
  if (row.samples.B) {
    return el("td", { class: "small reward-verdict" }, row.reward_preferred ? `reward prefers ${row.reward_preferred}` : "—");
  }
  return el("td", { class: "small reward-verdict", title: "The reward's standing among the campaign's items, 0..1" },
    `standing ${formatNumber(row.reward_rank)}`);
}

function resultRow(row) {
  const pair = Boolean(row.samples.B);
  return el("tr", { "data-item": row.item, class: row.disagrees ? "disagrees" : null },
    el("td", { class: "num" }, row.position + 1),
    el("td", {}, el("pre", { class: "code clamp-text prompt" }, row.prompt)),
    sampleCell(row.samples.A),
    pair ? sampleCell(row.samples.B) : null,
    el("td", { class: "judgements" }, row.judgements.length
      ? el("ul", { class: "judgement-list" }, row.judgements.map(judgementLine))
      : el("span", { class: "muted" }, `none yet (${row.judgement_count})`)),
    humansCell(row),
    rewardCell(row),
    el("td", {}, row.disagrees ? el("span", { class: "badge flag", title: `disagreement ${formatNumber(row.disagreement)}` }, "disagrees")
      : el("span", { class: "muted small" }, row.disagreement === null ? "—" : formatNumber(row.disagreement))));
}

async function loadResults() {
  const { ordering, disagrees, offset } = state.results;
  const page = await api(`${url}results/`, {
    params: { ordering, disagrees: disagrees ? "true" : undefined, limit: RESULTS_PAGE, offset },
  });
  const pair = state.campaign.kind === "pair";
  const head = el("tr", {}, el("th", { class: "num" }, "#"), el("th", {}, "Prompt"),
    el("th", {}, pair ? "Response A" : "Response"), pair ? el("th", {}, "Response B") : null,
    el("th", {}, "Judgements"), el("th", {}, "Humans"), el("th", {}, "Reward"), el("th", {}, "Disagrees?"));
  $("results-box").replaceChildren(page.results.length
    ? el("div", { class: "scroll-x" }, el("table", { class: "data results", id: "results-table" },
      el("thead", {}, head), el("tbody", {}, page.results.map(resultRow))))
    : el("p", { class: "muted" }, disagrees ? "The humans agree with the reward on every judged item." : "No items."));
  $("results-info").textContent = `${page.count} item${page.count === 1 ? "" : "s"}`;
  $("results-pager").hidden = page.count <= RESULTS_PAGE;
  $("results-page").textContent = `${page.results.length ? offset + 1 : 0}–${offset + page.results.length} of ${page.count}`;
  $("results-prev").disabled = offset === 0;
  $("results-next").disabled = offset + RESULTS_PAGE >= page.count;
}

function wireResults() {
  $("only-disagreements").addEventListener("change", (event) => {
    state.results = { ...state.results, disagrees: event.target.checked, offset: 0 };
    loadResults().catch((error) => showError(`Could not load the results: ${error.message}`));
  });
  $("results-ordering").addEventListener("change", (event) => {
    state.results = { ...state.results, ordering: event.target.value, offset: 0 };
    loadResults().catch((error) => showError(`Could not load the results: ${error.message}`));
  });
  const goTo = (offset) => {
    state.results.offset = Math.max(0, offset);
    loadResults().catch((error) => showError(`Could not load the results: ${error.message}`));
  };
  $("results-prev").addEventListener("click", () => goTo(state.results.offset - RESULTS_PAGE));
  $("results-next").addEventListener("click", () => goTo(state.results.offset + RESULTS_PAGE));
}

// --- export -----------------------------------------------------------------------------------

function exportFormats(kind) {
  return kind === "pair" ? ["trl", "openai", "ratings_jsonl", "ratings_csv"] : ["ratings_jsonl", "ratings_csv"];
}

function renderExport(campaign) {
  const formats = exportFormats(campaign.kind);
  $("export-links").replaceChildren(...formats.map((format) => el("a", {
    class: "button secondary", href: `${url}export/?format=${format}`, download: "", "data-format": format,
  }, `Download ${EXPORT_NAMES[format]}`)));
  // openai nests the prompt in messages: a download only (the registry keeps trl's same pairs).
  $("register-format").replaceChildren(...formats.filter((f) => f !== "openai")
    .map((format) => el("option", { value: format }, EXPORT_NAMES[format])));
  updateRegisterName();
}

function updateRegisterName() {
  $("register-name").placeholder = `${state.campaign.name} (${$("register-format").value})`;
}

async function register(event) {
  event.preventDefault();
  const button = $("register-button");
  button.disabled = true;
  $("register-result").replaceChildren(el("span", { class: "muted" }, "Registering…"));
  try {
    const dataset = await api(`${url}export/register/`, {
      method: "POST", body: { format: $("register-format").value, name: $("register-name").value.trim() },
    });
    $("register-result").replaceChildren(el("div", { class: "alert success", id: "registered-dataset" },
      `Dataset “${dataset.name}”: ${dataset.row_count ?? "?"} rows, in the registry as dataset #${dataset.id}. `,
      el("a", { href: "/registry/" }, "Open the registry")));
  } catch (error) {
    const text = error instanceof ApiError && error.errors.length
      ? error.errors.map((e) => e.msg).join("; ") : error.message;
    $("register-result").replaceChildren(el("div", { class: "alert critical" }, `Could not register: ${text}`));
  } finally {
    button.disabled = false;
  }
}

// --- refresh ----------------------------------------------------------------------------------

async function refreshAll() {
  await loadCampaign();
  await Promise.all([loadAgreement(), loadResults()]);
}

function scheduleRefresh() {
  clearTimeout(state.refreshTimer);
  if (state.campaign && state.campaign.state === "active") {
    state.refreshTimer = setTimeout(async () => {
      if (!document.hidden) {
        try {
          await refreshAll();
        } catch {
          // A failed refresh keeps the figures shown; the next one tries again.
        }
      }
      scheduleRefresh();
    }, REFRESH_MS);
  }
}

$("activate-button").addEventListener("click", () => transition("activate").then(scheduleRefresh));
$("close-button").addEventListener("click", closePressed);
$("register-form").addEventListener("submit", register);
$("register-format").addEventListener("change", updateRegisterName);
wireResults();
try {
  await refreshAll();
  renderExport(state.campaign);
} catch (error) {
  showError(`Could not load the campaign: ${error.message}`);
}
scheduleRefresh();
document.body.dataset.ready = "true"; // tests wait for this
