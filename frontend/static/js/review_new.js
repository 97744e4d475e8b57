// The new-campaign form: runs picked by search, which of their samples become items (a judge scores a
// pool first for the reward-vs-judge rule), the questions (a small builder per kind, rubrics for
// ratings), gold rows from a dataset, the annotators and the reviewers. The server validates everything
// in one request; each error it names comes back next to its field. `?runs=<id>,<id>` pre-selects runs.

import { $, api, ApiError, el, splitList } from "./api.js";
import { listAll } from "./assets.js";
import { clearFieldErrors, placeFieldErrors, showErrorSummary } from "./form_errors.js";

const SEARCH_DELAY_MS = 250;
const RUN_RESULTS = 10;
const COMPONENT_SAMPLE_LIMIT = 200;
const DISAGREEMENT_RULES = new Set(["component_disagreement", "reward_vs_component"]);
const SINGLE_ONLY_RULES = new Set(["near_boundary", "reward_vs_judge", "alerts", "one_per_group"]);
const POOL_POLL_MS = 1000;
const KIND_NAMES = {
  rating: "Rating", pass_fail: "Pass / fail", pairwise: "Which is better", tags: "Tags", comment: "Comment",
  steps: "First wrong step",
};
const RULE_HELP = {
  random: "A random sample of each step.",
  lowest_reward: "The samples the reward scored lowest: where the policy fails, or the reward is wrong.",
  highest_reward: "The samples the reward scored highest: is the reward being gamed?",
  component_disagreement: "Samples whose reward components (two or more, chosen below) disagree most.",
  reward_vs_component: "Samples whose reward differs most from one component (e.g. the verifier).",
  near_boundary: "Samples whose reward is closest to the boundary below: where the reward was least sure.",
  reward_vs_judge: "Samples whose reward a judge (another registered reward) disputes most.",
  alerts: "Samples of the steps the runs' alerts point to (KL blow-up, entropy collapse, …).",
  one_per_group: "One response from each of k prompt groups per step: k different prompts.",
};

const state = {
  runs: new Map(), // id -> run (as the runs API lists it), in the order chosen
  questions: [], // editor state: {kind, key, keyEdited, label, required, help, min, max, labels, options}
  questionsTouched: false, // untouched defaults follow the campaign kind
  searchTimer: null,
  searchGeneration: 0,
  componentsGeneration: 0,
  judgeRun: null, // the pool judge run of the reward-vs-judge rule, once started
  poolTimer: null,
};

// --- questions ------------------------------------------------------------------------------

function newQuestion(kind, label) {
  return {
    kind, key: "", keyEdited: false, label, required: kind !== "tags" && kind !== "comment", help: "",
    min: "1", max: "5", labels: "", rubric: "", options: "", unit: "sentence",
  };
}

function defaultQuestions(kind) {
  if (kind === "pair") return [newQuestion("pairwise", "Which response is better?")];
  return [newQuestion("rating", "Overall quality"), newQuestion("pass_fail", "Is the answer correct?")];
}

const DEFAULT_LABELS = {
  rating: "Overall quality", pass_fail: "Is the answer correct?", pairwise: "Which response is better?",
  tags: "Problems", comment: "Anything else?", steps: "Where does the response first go wrong?",
};

function slug(text) {
  const cleaned = text.toLowerCase().replace(/[^a-z0-9]+/g, "_").replace(/^[^a-z]+|_+$/g, "");
  return cleaned.slice(0, 40).replace(/_+$/, "");
}

// Keys follow the labels until typed by hand; they stay unique, as the server requires.
function refreshKeys() {
  const taken = new Set(state.questions.filter((q) => q.keyEdited).map((q) => q.key));
  state.questions.forEach((question, i) => {
    if (question.keyEdited) return;
    const base = slug(question.label) || `${question.kind}_${i + 1}`;
    let key = base;
    for (let n = 2; taken.has(key); n += 1) key = `${base.slice(0, 36)}_${n}`;
    question.key = key;
    taken.add(key);
    const input = document.querySelector(`.q-editor[data-index="${i}"] input[data-field="key"]`);
    if (input) input.value = key;
  });
}

function integerOrText(text) {
  const trimmed = String(text).trim();
  return /^-?\d+$/.test(trimmed) ? Number(trimmed) : trimmed;
}

function questionSpec(question) {
  const spec = { key: question.key, kind: question.kind, label: question.label, required: question.required };
  if (question.help.trim()) spec.help = question.help;
  if (question.kind === "rating") {
    spec.min = integerOrText(question.min);
    spec.max = integerOrText(question.max);
    if (question.labels.trim()) spec.labels = splitList(question.labels);
    // One line per point, lowest first (a line may be empty: that point has no description).
    if (question.rubric.trim()) spec.rubric = question.rubric.replace(/\n+$/, "").split("\n");
  }
  if (question.kind === "tags") spec.options = splitList(question.options);
  if (question.kind === "steps") spec.unit = question.unit;
  return spec;
}

function editorField(question, index, field, label, attrs = {}, tag = "input") {
  const input = el(tag, {
    ...(tag === "input" ? { type: "text", value: question[field] } : {}),
    "data-field": field, id: `q${index}-${field}`, ...attrs,
    onchange: (event) => { question[field] = event.target.value; state.questionsTouched = true; },
    oninput: (event) => {
      question[field] = event.target.value;
      state.questionsTouched = true;
      if (field === "key") question.keyEdited = true;
      if (field === "label") refreshKeys();
    },
  });
  if (tag === "textarea") input.value = question[field];
  if (tag === "select") input.value = question[field];
  return el("div", { class: "rf-field", "data-loc": `questions[${index}].${field}` },
    el("label", { for: input.id }, label), input, el("div", { class: "field-error", hidden: true }));
}

function questionEditor(question, index) {
  const kindFields = [];
  if (question.kind === "rating") {
    kindFields.push(
      editorField(question, index, "min", "Lowest", { inputmode: "numeric", class: "short" }),
      editorField(question, index, "max", "Highest", { inputmode: "numeric", class: "short" }),
      editorField(question, index, "labels", "Point labels (optional, comma-separated, lowest first)",
        { placeholder: "awful, poor, ok, good, great" }),
      editorField(question, index, "rubric", "Rubric (optional, markdown: one line per point, lowest first)",
        { rows: 3, placeholder: "Wrong or off topic.\nRight but hard to follow.\n…" }, "textarea"),
    );
  } else if (question.kind === "steps") {
    kindFields.push(editorField(question, index, "unit", "Mark", {}, "select"));
    const select = kindFields[0].querySelector("select");
    select.append(el("option", { value: "sentence" }, "a sentence (the response cut into steps)"),
      el("option", { value: "token" }, "a token range (where the rollout has a per-token view)"));
    select.value = question.unit;
  } else if (question.kind === "tags") {
    kindFields.push(editorField(question, index, "options", "Tags (comma-separated)",
      { placeholder: "rude, wrong format, rambling" }));
  }
  const required = el("input", {
    type: "checkbox", checked: question.required, "data-field": "required",
    onchange: (event) => { question.required = event.target.checked; state.questionsTouched = true; },
  });
  const last = state.questions.length - 1;
  return el("fieldset", { class: "q-editor", "data-index": index, "data-kind": question.kind, "data-loc": `questions[${index}]` },
    el("legend", {}, `${index + 1}. ${KIND_NAMES[question.kind]}`),
    el("div", { class: "q-editor-actions" },
      el("button", { type: "button", class: "secondary small", disabled: index === 0, "aria-label": `Move question ${index + 1} up`,
        onclick: () => moveQuestion(index, -1) }, "↑"),
      el("button", { type: "button", class: "secondary small", disabled: index === last, "aria-label": `Move question ${index + 1} down`,
        onclick: () => moveQuestion(index, 1) }, "↓"),
      el("button", { type: "button", class: "secondary small q-remove", onclick: () => removeQuestion(index) }, "Remove")),
    el("div", { class: "field-error", hidden: true }),
    el("div", { class: "q-editor-grid" },
      editorField(question, index, "label", "Question", { class: "q-label-input" }),
      editorField(question, index, "key", "Key (in exports)", { class: "code" }),
      ...kindFields,
      editorField(question, index, "help", "Instructions for annotators (optional, markdown)", { rows: 2 }, "textarea"),
      el("div", { class: "rf-field", "data-loc": `questions[${index}].required` },
        el("label", { class: "check" }, required, " Required"), el("div", { class: "field-error", hidden: true }))),
  );
}

function renderQuestions() {
  refreshKeys();
  $("question-editors").replaceChildren(...state.questions.map(questionEditor));
  const pairwise = $("question-add").querySelector('option[value="pairwise"]');
  pairwise.disabled = campaignKind() !== "pair";
  const steps = $("question-add").querySelector('option[value="steps"]');
  steps.disabled = campaignKind() !== "single" || state.questions.some((q) => q.kind === "steps");
  renderGoldQuestions();
}

function addQuestion(kind) {
  state.questions.push(newQuestion(kind, DEFAULT_LABELS[kind]));
  state.questionsTouched = true;
  renderQuestions();
  const input = document.querySelector(`.q-editor[data-index="${state.questions.length - 1}"] .q-label-input`);
  input.focus();
  input.select();
}

function removeQuestion(index) {
  state.questions.splice(index, 1);
  state.questionsTouched = true;
  renderQuestions();
}

function moveQuestion(index, by) {
  const [question] = state.questions.splice(index, 1);
  state.questions.splice(index + by, 0, question);
  state.questionsTouched = true;
  renderQuestions();
}

// --- the campaign kind ----------------------------------------------------------------------

function campaignKind() {
  return document.querySelector('input[name="kind"]:checked').value;
}

function kindChanged() {
  const kind = campaignKind();
  if (!state.questionsTouched) state.questions = defaultQuestions(kind);
  else if (kind === "single") state.questions = state.questions.filter((q) => q.kind !== "pairwise");
  else {
    state.questions = state.questions.filter((q) => q.kind !== "steps");
    if (!state.questions.some((q) => q.kind === "pairwise")) {
      state.questions.unshift(newQuestion("pairwise", DEFAULT_LABELS.pairwise));
    }
  }
  $("k-label").textContent = kind === "pair" ? "Pairs per step" : "Items per run and step";
  for (const option of $("c-rule").options) option.disabled = kind === "pair" && SINGLE_ONLY_RULES.has(option.value);
  if ($("c-rule").selectedOptions[0].disabled) $("c-rule").value = "random";
  $("gold-fields-label").textContent = kind === "pair" ? "Chosen and rejected columns" : "Response column";
  $("gold-fields").value = kind === "pair" ? "chosen, rejected" : "response";
  $("gold-question-field").hidden = kind === "pair";
  renderQuestions();
  sourceChanged();
}

// --- runs -----------------------------------------------------------------------------------

function runLabel(run) {
  return run.name || String(run.id).slice(0, 8);
}

function renderChosenRuns() {
  $("chosen-runs").replaceChildren(...[...state.runs.values()].map((run) => el("span", {
    class: "run-chip", "data-run-id": run.id,
  },
  el("span", {}, runLabel(run)),
  el("span", { class: "muted small" }, ` ${run.experiment_name || ""} · steps ≤ ${run.last_step ?? "—"}`),
  el("button", { type: "button", class: "chip-remove", "aria-label": `Remove ${runLabel(run)}`,
    onclick: () => { state.runs.delete(run.id); runsChanged(); } }, "×"))));
}

function chooseRun(run) {
  state.runs.set(String(run.id), run);
  $("run-search").value = "";
  $("run-results").hidden = true;
  runsChanged();
  $("run-search").focus();
}

function runsChanged() {
  renderChosenRuns();
  sourceChanged();
  loadComponents();
}

async function searchRuns() {
  const generation = ++state.searchGeneration;
  const results = $("run-results");
  try {
    const page = await api("/api/runs/", {
      params: { search: $("run-search").value.trim(), limit: RUN_RESULTS, ordering: "-created_at" },
    });
    if (generation !== state.searchGeneration) return;
    const offered = page.results.filter((run) => !state.runs.has(String(run.id)));
    results.replaceChildren(...(offered.length ? offered.map((run) => el("li", {},
      el("button", { type: "button", class: "run-result", "data-run-id": run.id, onclick: () => chooseRun(run) },
        el("strong", {}, runLabel(run)),
        el("span", { class: "muted small" }, `${run.experiment_name} · ${run.state} · step ${run.last_step ?? "—"}`))))
      : [el("li", { class: "muted" }, "No other runs match.")]));
    results.hidden = false;
  } catch (error) {
    results.replaceChildren(el("li", { class: "error" }, `Could not search runs: ${error.message}`));
    results.hidden = false;
  }
}

function wireRunSearch() {
  const input = $("run-search");
  input.addEventListener("input", () => {
    clearTimeout(state.searchTimer);
    state.searchTimer = setTimeout(searchRuns, SEARCH_DELAY_MS);
  });
  input.addEventListener("focus", searchRuns);
  input.addEventListener("keydown", (event) => {
    if (event.key === "ArrowDown") {
      const first = $("run-results").querySelector("button");
      if (first) { event.preventDefault(); first.focus(); }
    } else if (event.key === "Escape") {
      $("run-results").hidden = true;
    }
  });
  $("run-results").addEventListener("keydown", (event) => {
    const buttons = [...$("run-results").querySelectorAll("button")];
    const at = buttons.indexOf(document.activeElement);
    if (event.key === "ArrowDown" && at < buttons.length - 1) { event.preventDefault(); buttons[at + 1].focus(); }
    if (event.key === "ArrowUp") { event.preventDefault(); (at > 0 ? buttons[at - 1] : input).focus(); }
    if (event.key === "Escape") { $("run-results").hidden = true; input.focus(); }
  });
  document.addEventListener("click", (event) => {
    if (!event.target.closest(".run-picker")) $("run-results").hidden = true;
  });
}

async function preselectRuns() {
  const ids = (new URLSearchParams(window.location.search).get("runs") || "").split(",").filter(Boolean);
  for (const id of ids) {
    try {
      const run = await api(`/api/runs/${encodeURIComponent(id)}/`);
      state.runs.set(String(run.id), run);
    } catch {
      // An unknown id in the link: simply not chosen.
    }
  }
  if (ids.length) runsChanged();
}

// Component names are read from the chosen runs' samples: they are what the disagreement rules score.
async function loadComponents() {
  const generation = ++state.componentsGeneration;
  const box = $("component-options");
  const chosenBefore = new Set(chosenComponents());
  if (!state.runs.size) {
    box.replaceChildren(el("span", { class: "muted" }, "Choose runs to see their components."));
    return;
  }
  const names = new Set();
  await Promise.all([...state.runs.keys()].map(async (id) => {
    try {
      const page = await api(`/api/runs/${id}/samples/`, { params: { limit: COMPONENT_SAMPLE_LIMIT } });
      for (const sample of page.results) Object.keys(sample.components || {}).forEach((name) => names.add(name));
    } catch {
      // The run's components stay unknown; the server still checks the rule.
    }
  }));
  if (generation !== state.componentsGeneration) return;
  box.replaceChildren(...(names.size ? [...names].sort().map((name) => el("label", { class: "check" },
    el("input", { type: "checkbox", name: "component", value: name, checked: chosenBefore.has(name) }), ` ${name}`))
    : [el("span", { class: "muted" }, "These runs' samples have no reward components.")]));
}

function chosenComponents() {
  return [...document.querySelectorAll('input[name="component"]:checked')].map((input) => input.value);
}

function sourceChanged() {
  const rule = $("c-rule").value;
  $("components-field").hidden = !DISAGREEMENT_RULES.has(rule);
  $("boundary-field").hidden = rule !== "near_boundary";
  $("judge-pool-field").hidden = rule !== "reward_vs_judge";
  $("rule-help").textContent = RULE_HELP[rule] || "";
  $("pair-steps-field").hidden = !(campaignKind() === "pair" && state.runs.size === 2);
}

// --- the judge's pool (reward_vs_judge) -----------------------------------------------------

function poolShown(judge) {
  state.judgeRun = judge;
  const text = judge.state === "done" ? `Scored ${judge.scored} rollouts (judge run #${judge.id}).`
    : judge.state === "failed" ? `The judge failed: ${judge.error}`
      : `Scoring… ${judge.scored} of ${judge.total} (judge run #${judge.id}, ${judge.state})`;
  $("pool-status").textContent = text;
  $("pool-status").dataset.state = judge.state;
  if (judge.state === "queued" || judge.state === "running") {
    state.poolTimer = setTimeout(async () => {
      try {
        poolShown(await api(`/api/review/judge-runs/${judge.id}/`));
      } catch (error) {
        $("pool-status").textContent = `Could not read the judge run: ${error.message}`;
      }
    }, POOL_POLL_MS);
  }
}

async function scorePool() {
  clearTimeout(state.poolTimer);
  const source = { runs: [...state.runs.keys()], ...stepsSource() };
  try {
    poolShown(await api("/api/review/judge-runs/", {
      method: "POST", body: { reward: Number($("pool-reward").value), source },
    }));
  } catch (error) {
    const text = error instanceof ApiError && error.errors.length ? error.errors.map((e) => e.msg).join("; ") : error.message;
    $("pool-status").textContent = `Could not start the judge: ${text}`;
  }
}

// --- gold ----------------------------------------------------------------------------------

function renderGoldQuestions() {
  const select = $("gold-question");
  const before = select.value;
  const answerable = state.questions.filter((q) => q.kind === "pass_fail" || q.kind === "rating");
  select.replaceChildren(...answerable.map((q) => el("option", { value: q.key }, q.label)));
  if (answerable.some((q) => q.key === before)) select.value = before;
}

function goldSpec() {
  const dataset = $("gold-dataset").value;
  if (!dataset) return null;
  const spec = { dataset: Number(dataset), share: Number($("gold-share").value) };
  if (campaignKind() === "pair") {
    const [chosen, rejected] = splitList($("gold-fields").value);
    spec.chosen_field = chosen || "chosen";
    spec.rejected_field = rejected || "rejected";
  } else {
    if ($("gold-question").value) spec.question = $("gold-question").value;
    spec.response_field = $("gold-fields").value.trim();
  }
  return spec;
}

function goldPolicy() {
  return {
    min_items: integerOrText($("gp-min-items").value),
    min_accuracy: Number($("gp-min-accuracy").value),
    weighting: $("gp-weighting").value,
  };
}

// --- annotators, reviewers, and the registry's rewards and datasets ---------------------------

async function loadPeople(role, box, name) {
  try {
    const people = await api(`/api/review/${role}s/`);
    box.replaceChildren(...(people.length ? people.map((user) => el("label", { class: "check" },
      el("input", { type: "checkbox", name, value: user.username }), ` ${user.username}`))
      : [el("span", { class: "muted" }, `No user has the ${role} role yet: an admin gives it.`)]));
  } catch (error) {
    box.replaceChildren(el("span", { class: "error" }, `Could not load ${role}s: ${error.message}`));
  }
}

async function loadRegistry() {
  try {
    const [rewards, datasets] = await Promise.all([listAll("/api/rewards/"), listAll("/api/datasets/")]);
    $("pool-reward").replaceChildren(...rewards.map((r) => el("option", { value: r.id }, `${r.name} (${r.kind})`)));
    $("gold-dataset").append(...datasets.map((d) => el("option", { value: d.id }, `${d.name} (${d.row_count} rows)`)));
  } catch (error) {
    $("pool-status").textContent = `Could not load the registry: ${error.message}`;
  }
}

// --- the request ----------------------------------------------------------------------------

function stepsSource() {
  const mode = document.querySelector('input[name="steps-mode"]:checked').value;
  if (mode === "list") return { steps: $("steps-list").value.split(/[\s,]+/).filter(Boolean).map(integerOrText) };
  if (mode === "range") return { step_range: [integerOrText($("step-first").value), integerOrText($("step-last").value)] };
  return {};
}

function campaignBody() {
  const kind = campaignKind();
  const rule = $("c-rule").value;
  const source = {
    runs: [...state.runs.keys()], rule, k: integerOrText($("c-k").value), seed: integerOrText($("c-seed").value),
    ...stepsSource(),
  };
  if (DISAGREEMENT_RULES.has(rule)) source.components = chosenComponents();
  if (kind === "pair" && state.runs.size === 2) source.pair_steps = $("c-pair-steps").value;
  if (rule === "near_boundary") source.boundary = Number($("c-boundary").value);
  if (rule === "reward_vs_judge") source.judge_run = state.judgeRun ? state.judgeRun.id : null;
  if (rule === "alerts") { // the alerts give the steps
    delete source.steps;
    delete source.step_range;
  }
  return {
    name: $("c-name").value,
    description: $("c-description").value,
    instructions: $("c-instructions").value,
    kind,
    questions: state.questions.map(questionSpec),
    source,
    blind: $("c-blind").checked,
    overlap: integerOrText($("c-overlap").value),
    lock_ttl_s: integerOrText($("c-lock-ttl").value),
    annotators: [...document.querySelectorAll('input[name="annotator"]:checked')].map((input) => input.value),
    reviewers: [...document.querySelectorAll('input[name="reviewer"]:checked')].map((input) => input.value),
    review_rating_spread: integerOrText($("c-spread").value),
    show_suggestions: $("c-suggestions").checked,
    gold: goldSpec(),
    gold_policy: goldPolicy(),
  };
}

// --- errors ---------------------------------------------------------------------------------

function clearErrors() {
  clearFieldErrors($("campaign-form"));
  $("error-summary").hidden = true;
  $("form-failure").hidden = true;
}

// An element whose data-loc lists a loc owns that loc's errors (and those of its parts it has no element for).
function errorTarget(loc) {
  const owner = document.querySelector(`#campaign-form [data-loc~="${CSS.escape(loc)}"]`);
  return owner ? { node: owner.querySelector(":scope > .field-error"), owner } : null;
}

function showErrors(errors) {
  clearErrors();
  const unplaced = placeFieldErrors(errors, errorTarget);
  showErrorSummary($("error-summary"), unplaced, { heading: "Please fix:" });
  const first = document.querySelector("#campaign-form .has-error") || (unplaced.length ? $("error-summary") : null);
  if (first) {
    first.scrollIntoView({ block: "center" });
    const input = first.querySelector("input, select, textarea");
    if (input) input.focus({ preventScroll: true });
  }
}

async function submit(event) {
  event.preventDefault();
  const button = $("create-button");
  button.disabled = true;
  $("form-status").textContent = "Creating the campaign and sampling its items…";
  try {
    const campaign = await api("/api/review/campaigns/", { method: "POST", body: campaignBody() });
    window.location.href = `/review/campaigns/${campaign.id}/`;
  } catch (error) {
    button.disabled = false;
    if (error instanceof ApiError && error.errors.length) {
      showErrors(error.errors);
      $("form-status").textContent = `${error.errors.length} problem${error.errors.length === 1 ? "" : "s"} to fix`;
    } else {
      clearErrors();
      $("form-status").textContent = "";
      $("form-failure").textContent = `Could not create the campaign: ${error.message}`;
      $("form-failure").hidden = false;
    }
  }
}

// --- wiring ---------------------------------------------------------------------------------

document.querySelectorAll('input[name="kind"]').forEach((input) => input.addEventListener("change", kindChanged));
$("c-rule").addEventListener("change", sourceChanged);
$("question-add").addEventListener("change", (event) => {
  if (event.target.value) addQuestion(event.target.value);
  event.target.value = "";
});
// Typing into a step field picks its mode: nobody types steps they do not mean to use.
$("steps-list").addEventListener("input", () => { document.querySelector('input[name="steps-mode"][value="list"]').checked = true; });
for (const id of ["step-first", "step-last"]) {
  $(id).addEventListener("input", () => { document.querySelector('input[name="steps-mode"][value="range"]').checked = true; });
}
$("campaign-form").addEventListener("submit", submit);
$("pool-button").addEventListener("click", scorePool);
wireRunSearch();
state.questions = defaultQuestions(campaignKind());
renderQuestions();
sourceChanged();
await Promise.all([
  loadPeople("annotator", $("annotator-options"), "annotator"),
  loadPeople("reviewer", $("reviewer-options"), "reviewer"),
  loadRegistry(),
  preselectRuns(),
]);
$("c-name").focus();
document.body.dataset.ready = "true"; // tests wait for this
