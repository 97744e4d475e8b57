// A campaign for its owner: state and actions, progress per annotator, agreement per question before and
// after adjudication, each annotator's gold check, judges (run one, its agreement with the humans and the
// items it gets wrong, register it as a reward), the judgements next to the rewards with each item's
// label (mark an item as gold there), and export / register as dataset. While the campaign is active the
// figures refresh themselves.

import { $, api, ApiError, el, formatDuration, formatNumber, pageData } from "./api.js";
import { listAll } from "./assets.js";
import { answerText } from "./question_form.js";

const RESULTS_PAGE = 25;
const REFRESH_MS = 5000;
const CLOSE_CONFIRM_MS = 4000;
const PAIRWISE_NAMES = { A: "A", B: "B", tie: "tie", both_bad: "both bad" };
const GRADED = new Set(["pass_fail", "rating", "pairwise", "steps"]);
const JUDGE_POLL_MS = 1500;
const EXPORT_NAMES = {
  trl: "TRL preference pairs (JSONL)", openai: "OpenAI preference pairs (JSONL)",
  prm: "Step labels, PRM800K style (JSONL)", ratings_jsonl: "Ratings (JSONL)", ratings_csv: "Ratings (CSV)",
};

const base = pageData("campaign-data");
const url = `/api/review/campaigns/${base.id}/`;

const state = {
  campaign: null,
  results: { ordering: "position", disagrees: false, offset: 0 },
  refreshTimer: null,
  closeArmedUntil: 0,
  judgeTimer: null,
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
  const policy = campaign.gold_policy || {};
  const gold = campaign.gold_spec
    ? `${Math.round(campaign.gold_spec.share * 100)}% from dataset #${campaign.gold_spec.dataset} (${campaign.progress.gold_items} items in all)`
    : `${campaign.progress.gold_items} item${campaign.progress.gold_items === 1 ? "" : "s"} marked by you`;
  const facts = [
    ["Items", `${campaign.item_count} ${campaign.kind === "pair" ? "pairs of responses" : "responses"}`],
    ["Annotators", campaign.annotators.join(", ") || "none assigned"],
    ["Per item", `${campaign.overlap} annotator${campaign.overlap === 1 ? "" : "s"}`],
    ["Reviewers", campaign.reviewers.join(", ") || "none assigned"],
    ["Blind", campaign.blind ? "yes: annotators see no rewards, runs or steps" : "no: annotators see rewards and runs"],
    ["Judge's suggestions", campaign.show_suggestions ? "shown to annotators" : "hidden (annotators judge blind)"],
    ["Gold", gold],
    ["Gold policy", `after ${policy.min_items} gold answers, set aside below ${percent(policy.min_accuracy)}; `
      + (policy.weighting === "accuracy" ? "weigh by accuracy" : "others weigh the same")],
    ["Source", sourceLine(campaign.source)],
    ["Created", `${new Date(campaign.created_at).toLocaleString()}${campaign.created_by ? ` by ${campaign.created_by}` : ""}`],
  ];
  const guidelines = campaign.instructions_html ? el("div", { class: "markdown" }) : null;
  if (guidelines) guidelines.innerHTML = campaign.instructions_html; // rendered by the server, raw HTML off
  const parts = [
    campaign.description ? el("p", {}, campaign.description) : null,
    el("dl", { class: "facts" }, ...facts.flatMap(([term, value]) => [el("dt", {}, term), el("dd", {}, value)])),
    el("h3", {}, "Questions"), el("ol", { class: "question-list" }, campaign.questions.map(questionLine)),
    guidelines ? el("details", {}, el("summary", {}, "Guidelines for annotators"), guidelines) : null,
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
    el("p", { id: "review-summary", class: "small" },
      `${progress.review_pending} waiting for a reviewer · ${progress.review_decided} decided · ${progress.gold_items} gold`),
    rows.length ? el("table", { class: "data compact", id: "annotator-progress" },
      el("thead", {}, el("tr", {}, el("th", {}, "Annotator"), el("th", { class: "num" }, "Judged"),
        el("th", { class: "num" }, "Time spent"), el("th", {}, "Now"))),
      el("tbody", {}, rows)) : el("p", { class: "muted" }, "No annotators assigned."),
  );
}

// A large campaign is built on a worker (building, then draft or failed); files its rule could not read are gaps.
function buildNote(campaign) {
  if (campaign.state === "building") return el("span", { class: "muted" }, " Its items are being drawn on a worker: reload in a moment.");
  if (campaign.state === "failed") return el("span", { class: "error" }, ` ${campaign.build_error}`);
  const gaps = campaign.gaps || [];
  return gaps.length ? el("span", { class: "muted" }, ` Drawn without ${gaps.length} unreadable rollout file(s): ${gaps[0].reason}`) : null;
}

function renderHeader(campaign) {
  document.title = `${campaign.name} · Review · Posttrain`;
  $("campaign-title").textContent = campaign.name;
  $("campaign-state").replaceChildren(...[stateBadge(campaign.state), buildNote(campaign)].filter(Boolean));
  $("activate-button").hidden = campaign.state !== "draft";
  $("close-button").hidden = campaign.state === "closed";
}

async function loadCampaign() {
  state.campaign = await api(url);
  $("show-suggestions").checked = state.campaign.show_suggestions;
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

function agreementRow(label, kind, metric, entry, after, attrs) {
  return el("tr", attrs,
    el("td", {}, label),
    el("td", {}, kind),
    el("td", { class: "small" }, metric),
    el("td", { class: "num items" }, entry.items ?? "—"),
    el("td", { class: "num alpha" }, stat(entry.alpha)),
    el("td", { class: "num kappa" }, stat(entry.kappa), pairwiseKappas(entry)),
    el("td", { class: "num alpha-after" }, after ? stat(after.alpha) : "—"),
    el("td", { class: "num kappa-after" }, after ? stat(after.kappa) : "—"));
}

function renderAgreement(agreement) {
  const rows = [];
  const afterByKey = new Map(agreement.after_adjudication.questions.map((q) => [q.key, q]));
  for (const question of agreement.questions) {
    const metric = question.kappa_weighting ? `${question.metric}; κ ${question.kappa_weighting}-weighted` : question.metric;
    const after = afterByKey.get(question.key);
    if (question.per_tag) {
      rows.push(el("tr", { class: "group-row", "data-question": question.key },
        el("td", { colspan: 8 }, question.label, " ", el("span", { class: "muted small" }, `(tags, ${metric})`))));
      for (const [tag, entry] of Object.entries(question.per_tag)) {
        rows.push(agreementRow(el("span", { class: "indent" }, tag), "tag", "picked or not", entry,
          after ? after.per_tag[tag] : null, { "data-question": question.key, "data-tag": tag }));
      }
    } else {
      rows.push(agreementRow(question.label, question.kind, metric, question, after, { "data-question": question.key }));
    }
  }
  $("agreement-box").replaceChildren(
    el("p", { class: "small-print" }, `${agreement.judgements} judgements by ${agreement.annotators.length} annotator`
      + `${agreement.annotators.length === 1 ? "" : "s"}${agreement.annotators.length ? `: ${agreement.annotators.join(", ")}` : ""}.`),
    rows.length ? el("table", { class: "data", id: "agreement-table" },
      el("thead", {}, el("tr", {}, el("th", {}, "Question"), el("th", {}, "Kind"), el("th", {}, "Metric"),
        el("th", { class: "num", title: "Items with two or more answers" }, "Items"),
        el("th", { class: "num" }, "Krippendorff's α"), el("th", { class: "num" }, "Cohen's κ"),
        el("th", { class: "num", title: "Each decided item's answers replaced by the reviewer's decision" }, "α after review"),
        el("th", { class: "num" }, "κ after review"))),
      el("tbody", {}, rows)) : el("p", { class: "muted" }, "No question here measures agreement (comments only)."),
    el("p", { class: "small-print" }, `Adjudication: ${agreement.adjudication.pending} item${agreement.adjudication.pending === 1 ? "" : "s"} `
      + `waiting for a reviewer, ${agreement.adjudication.decided} decided.`));
  renderAnnotatorStats(agreement);
  renderGold(agreement.gold);
}

function renderGold(gold) {
  if (!gold.annotators.length) {
    $("gold-box").replaceChildren(el("p", { class: "muted" }, gold.items ? "No judgements yet." : "No gold items."));
    return;
  }
  $("gold-box").replaceChildren(el("table", { class: "data compact", id: "gold-table" },
    el("thead", {}, el("tr", {}, el("th", {}, "Annotator"), el("th", { class: "num" }, "Gold answers"),
      el("th", { class: "num" }, "Correct"), el("th", { class: "num" }, "Accuracy"), el("th", { class: "num" }, "Weight"),
      el("th", {}, ""))),
    el("tbody", {}, gold.annotators.map((row) => el("tr", {
      "data-annotator": row.annotator, class: row.set_aside ? "set-aside" : null,
    },
    el("td", {}, row.annotator), el("td", { class: "num answered" }, row.answered), el("td", { class: "num" }, row.correct),
    el("td", { class: "num accuracy" }, percent(row.accuracy)), el("td", { class: "num weight" }, formatNumber(row.weight)),
    el("td", { class: "small" }, row.set_aside ? "set aside" : row.counted ? "" : `not counted yet (< ${gold.policy.min_items})`))))));
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
  const where = sample.run
    ? [el("a", { href: `/runs/${sample.run}/` }, sample.run_name), ` · step ${sample.step} #${sample.index}`]
    : ["a gold dataset row"];
  return el("td", { class: "sample-cell" },
    el("pre", { class: "code clamp-text" }, sample.response),
    el("div", { class: "small muted" }, `reward ${formatNumber(sample.reward)} · `, ...where));
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

const LABEL_SOURCES = { gold: "gold", decision: "decided", annotators: "vote" };

function labelsCell(row) {
  const questions = state.campaign.questions.filter((q) => GRADED.has(q.kind));
  const badges = [];
  if (row.gold) badges.push(el("span", { class: "badge gold", title: `gold (${row.gold_source})` }, "gold"));
  if (row.review_state === "pending") badges.push(el("span", { class: "badge pending" }, "awaiting review"));
  if (row.review_state === "decided") badges.push(el("span", { class: "badge decided" }, `decided by ${row.decided_by}`));
  const lines = questions.filter((q) => row.labels[q.key]).map((q) => el("div", { "data-label": q.key },
    `${q.label}: `, el("strong", {}, answerText(q, row.labels[q.key].value) ?? formatNumber(row.labels[q.key].value)),
    el("span", { class: "muted" }, ` (${LABEL_SOURCES[row.labels[q.key].source]})`)));
  if (row.judge && Object.keys(row.judge.answers).length) {
    lines.push(el("div", { class: "muted", "data-judge": row.judge.run }, `judge ${row.judge.reward}: `,
      questions.filter((q) => row.judge.answers[q.key] !== undefined).map((q) => answerText(q, row.judge.answers[q.key])).join(", ")));
  }
  const edit = el("button", { type: "button", class: "secondary small gold-edit", onclick: () => openGoldEditor(row, cell) },
    row.gold ? "Edit gold" : "Mark gold");
  const cell = el("td", { class: "small labels" }, badges, lines, edit);
  return cell;
}

function goldInput(question, value) {
  const attrs = { "data-key": question.key, "aria-label": question.label };
  if (question.kind === "pass_fail") {
    return el("select", attrs, el("option", { value: "" }, "—"), el("option", { value: "true", selected: value === true }, "pass"),
      el("option", { value: "false", selected: value === false }, "fail"));
  }
  if (question.kind === "pairwise") {
    return el("select", attrs, el("option", { value: "" }, "—"),
      ...question.choices.map((c) => el("option", { value: c, selected: value === c }, PAIRWISE_NAMES[c])));
  }
  if (question.kind === "steps") {
    const first = value && value.first_wrong !== undefined ? value.first_wrong : undefined;
    return el("input", { ...attrs, type: "text", size: 6, placeholder: "step # or none",
      value: first === undefined ? "" : first === null ? "none" : String(first + 1) });
  }
  return el("input", { ...attrs, type: "number", min: question.min, max: question.max, value: value ?? "", class: "short" });
}

function goldAnswer(question, input) {
  const text = input.value.trim();
  if (!text) return undefined;
  if (question.kind === "pass_fail") return text === "true";
  if (question.kind === "pairwise") return text;
  if (question.kind === "steps") return { first_wrong: text.toLowerCase() === "none" ? null : Number(text) - 1 };
  return Number(text);
}

function openGoldEditor(row, cell) {
  const questions = state.campaign.questions.filter((q) => GRADED.has(q.kind));
  const known = row.gold || Object.fromEntries(Object.entries(row.labels).map(([k, label]) => [k, label.value]));
  const inputs = questions.map((q) => [q, goldInput(q, q.kind === "rating" && known[q.key] !== undefined ? Math.round(known[q.key]) : known[q.key])]);
  const status = el("span", { class: "small", "aria-live": "polite" });
  const send = async (method) => {
    const answers = Object.fromEntries(inputs.map(([q, input]) => [q.key, goldAnswer(q, input)]).filter(([, v]) => v !== undefined));
    try {
      await api(`${url}items/${row.item}/gold/`, method === "DELETE" ? { method } : { method, body: { answers } });
      await refreshAll();
    } catch (error) {
      status.textContent = error instanceof ApiError && error.errors.length ? error.errors.map((e) => e.msg).join("; ") : error.message;
    }
  };
  cell.replaceChildren(el("div", { class: "gold-editor" },
    inputs.map(([q, input]) => el("label", {}, q.label, el("br"), input)),
    el("button", { type: "button", class: "small gold-save", onclick: () => send("PUT") }, "Save gold"),
    row.gold && row.gold_source === "owner"
      ? el("button", { type: "button", class: "secondary small", onclick: () => send("DELETE") }, "Unmark") : null,
    status));
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
    labelsCell(row),
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
    el("th", {}, "Judgements"), el("th", {}, "Humans"), el("th", {}, "Label"), el("th", {}, "Reward"), el("th", {}, "Disagrees?"));
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

function exportFormats(campaign) {
  if (campaign.kind === "pair") return ["trl", "openai", "ratings_jsonl", "ratings_csv"];
  const steps = campaign.questions.some((q) => q.kind === "steps");
  return [...(steps ? ["prm"] : []), "ratings_jsonl", "ratings_csv"];
}

function renderExport(campaign) {
  const formats = exportFormats(campaign);
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

// --- judges -----------------------------------------------------------------------------------

function judgeError(text) {
  $("judge-error").textContent = text;
  $("judge-error").hidden = !text;
}

function judgeRunLine(run) {
  const progress = run.state === "done" || run.state === "failed" ? "" : ` · ${run.scored} of ${run.total} scored`;
  return el("li", { "data-judge-run": run.id, "data-state": run.state },
    el("strong", {}, run.reward_name), ` #${run.id} · `, el("span", { class: `badge state-${run.state}` }, run.state), progress,
    run.failed_samples ? ` · ${run.failed_samples} it could not score` : "",
    run.error ? el("div", { class: "error small" }, run.error) : null);
}

function rateText(rates) {
  if (!rates) return "—";
  if (rates.A) return ["A", "B"].map((side) => `${side}: TPR ${stat(rates[side].tpr)}, FPR ${stat(rates[side].fpr)}`).join(" · ");
  return `TPR ${stat(rates.tpr)} · FPR ${stat(rates.fpr)}`;
}

function renderJudgeAgreement(agreement, run) {
  if (!agreement) {
    $("judge-agreement-box").replaceChildren();
    return;
  }
  const questions = Object.fromEntries(state.campaign.questions.map((q) => [q.key, q]));
  const rows = agreement.questions.map((q) => el("tr", { "data-question": q.key },
    el("td", {}, q.label), el("td", { class: "num items" }, q.items), el("td", { class: "num kappa" }, stat(q.kappa)),
    el("td", { class: "num" }, percent(q.agreement)), el("td", { class: "small rates" }, rateText(q.rates)),
    el("td", { class: "num wrong-count" }, q.wrong.length)));
  const wrong = agreement.questions.flatMap((q) => q.wrong.map((w) => el("li", { "data-item": w.item },
    `#${w.position + 1} ${w.prompt.slice(0, 80)} — ${q.label}: humans `, el("strong", {}, answerText(questions[q.key], w.human)),
    ", judge ", el("strong", {}, answerText(questions[q.key], w.judge)))));
  const name = el("input", { id: "register-judge-name", type: "text", maxlength: 200, size: 30, value: `${run.reward_name} (validated)` });
  const result = el("div", { id: "register-judge-result", "aria-live": "polite" });
  const register = async (event) => {
    event.preventDefault();
    try {
      const reward = await api(`/api/review/judge-runs/${run.id}/register/`, { method: "POST", body: { name: name.value.trim() } });
      result.replaceChildren(el("div", { class: "alert success" }, `Registered as reward “${reward.name}” (#${reward.id}). `,
        el("a", { href: "/launch/" }, "Launch a run with it")));
    } catch (error) {
      const text = error instanceof ApiError && error.errors.length ? error.errors.map((e) => e.msg).join("; ") : error.message;
      result.replaceChildren(el("div", { class: "alert critical" }, `Could not register: ${text}`));
    }
  };
  $("judge-agreement-box").replaceChildren(
    el("h3", {}, `${run.reward_name} against the humans (judge run #${run.id})`),
    rows.length ? el("table", { class: "data", id: "judge-agreement" },
      el("thead", {}, el("tr", {}, el("th", {}, "Question"), el("th", { class: "num" }, "Items"), el("th", { class: "num" }, "Cohen's κ"),
        el("th", { class: "num" }, "Agree"), el("th", {}, "Rates (humans as truth)"), el("th", { class: "num" }, "Wrong"))),
      el("tbody", {}, rows)) : el("p", { class: "muted" }, "No item has both a human label and a judge's answer yet."),
    wrong.length ? el("details", {}, el("summary", {}, `Items it gets wrong (${wrong.length})`), el("ul", { id: "judge-wrong" }, wrong)) : null,
    el("form", { class: "toolbar", id: "register-judge-form", onsubmit: register },
      el("div", {}, el("label", { for: "register-judge-name" }, "Register as a reward named"), name),
      el("button", { type: "submit", id: "register-judge-button" }, "Register as reward")),
    result);
}

async function loadJudges() {
  clearTimeout(state.judgeTimer);
  const runs = await api(`${url}judges/`);
  $("judge-runs-box").replaceChildren(runs.length ? el("ul", { id: "judge-runs" }, runs.map(judgeRunLine))
    : el("p", { class: "muted" }, "No judge has run on this campaign."));
  const latest = runs.find((run) => run.state === "done");
  renderJudgeAgreement(latest ? await api(`/api/review/judge-runs/${latest.id}/agreement/`) : null, latest);
  if (runs.some((run) => run.state === "queued" || run.state === "running")) {
    state.judgeTimer = setTimeout(() => loadJudges().catch((error) => judgeError(error.message)), JUDGE_POLL_MS);
  }
}

async function runJudge(event) {
  event.preventDefault();
  judgeError("");
  try {
    await api(`${url}judges/`, {
      method: "POST", body: { reward: Number($("judge-reward").value), threshold: Number($("judge-threshold").value) },
    });
    await loadJudges();
  } catch (error) {
    judgeError(`Could not run the judge: ${error instanceof ApiError && error.errors.length ? error.errors.map((e) => e.msg).join("; ") : error.message}`);
  }
}

async function toggleSuggestions(event) {
  try {
    await api(url, { method: "PATCH", body: { show_suggestions: event.target.checked } });
    await loadCampaign();
  } catch (error) {
    judgeError(`Could not change the setting: ${error.message}`);
  }
}

async function loadRewards() {
  const rewards = await listAll("/api/rewards/");
  $("judge-reward").replaceChildren(...rewards.map((r) => el("option", { value: r.id }, `${r.name} (${r.kind})`)));
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
$("judge-form").addEventListener("submit", runJudge);
$("show-suggestions").addEventListener("change", toggleSuggestions);
wireResults();
try {
  await refreshAll();
  renderExport(state.campaign);
  await Promise.all([loadRewards(), loadJudges()]);
} catch (error) {
  showError(`Could not load the campaign: ${error.message}`);
}
scheduleRefresh();
document.body.dataset.ready = "true"; // tests wait for this
