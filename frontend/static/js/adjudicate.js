// The reviewer's adjudication page: one item whose annotators disagree at a time, with every judgement
// and the judge's answer when one ran; the reviewer's answers become the item's label. Responses show in
// stored order (A is the item's first response), the order the judgements' pairwise answers are in.
// Deciding claims the next item in the same request. Keyboard first, with the annotators' keys.

import { $, api, ApiError, el, errorText, pageData, toggleDialog } from "./api.js";
import { answerText, guidelinesBody, QuestionForm } from "./question_form.js";

const campaign = pageData("campaign-data");
const GRADED = new Set(["pass_fail", "rating", "pairwise", "steps"]);
const form = new QuestionForm({ form: $("questions"), missing: $("missing") });
const state = { item: null, busy: false };

function setStatus(text, kind = "") {
  $("work-status").textContent = text;
  $("work-status").className = `alert ${kind}`;
  $("work-status").hidden = !text;
}

function setBusy(on) {
  state.busy = on;
  $("adjudicate-app").dataset.busy = on ? "true" : "false";
  $("submit-button").disabled = on;
}

function setQueue(queue) {
  $("queue-text").textContent = `${queue.pending} waiting · ${queue.decided} decided`;
}

function judgementsTable(item, questions) {
  const rows = item.judgements.map((judgement) => el("tr", { "data-annotator": judgement.annotator },
    el("th", {}, judgement.annotator),
    questions.map((q) => el("td", { class: item.disputed.includes(q.key) ? "disputed" : null },
      answerText(q, judgement.answers[q.key]) ?? "—"))));
  if (item.judge) {
    rows.push(el("tr", { class: "judge-row" }, el("th", {}, `judge: ${item.judge.reward}`),
      questions.map((q) => el("td", {}, answerText(q, item.judge.answers[q.key]) ?? "—"))));
  }
  return el("table", { class: "data compact", id: "judgements-table" },
    el("thead", {}, el("tr", {}, el("th", {}, "Annotator"),
      questions.map((q) => el("th", { class: item.disputed.includes(q.key) ? "disputed" : null, "data-key": q.key },
        q.label, item.disputed.includes(q.key) ? " (disputed)" : "")))),
    el("tbody", {}, rows));
}

function showItem(payload) {
  const { item } = payload;
  state.item = item;
  // Only the graded questions decide an item; the disputed ones must be answered.
  const questions = payload.campaign.questions.filter((q) => GRADED.has(q.kind))
    .map((q) => ({ ...q, required: item.disputed.includes(q.key) }));
  const steps = item.responses.length === 1 ? item.responses[0].steps : null;
  form.load(questions, { ...item.agreed, ...(item.decision || {}) }, { steps });
  $("guidelines-body").replaceChildren(...guidelinesBody(payload.campaign));
  $("prompt").textContent = item.prompt;
  $("reference-box").hidden = !item.reference;
  $("reference").textContent = item.reference || "";
  const pair = item.responses.length > 1;
  $("responses").className = `responses ${pair ? "pair" : "single"}`;
  $("responses").replaceChildren(...item.responses.map((response) => el("section", {
    class: "card response", "data-label": response.label,
  }, el("h2", { class: "first" }, pair ? `Response ${response.label}` : "Response"), form.responseBody(response))));
  $("judgements-box").replaceChildren(judgementsTable(item, payload.campaign.questions));
  setQueue(payload.queue);
  $("done-box").hidden = true;
  $("item-box").hidden = false;
  $("item-box").dataset.itemId = String(item.id);
  const firstDisputed = questions.findIndex((q) => q.required);
  form.focusQuestion(Math.max(0, firstDisputed));
}

function showEmpty(queue = null, message = "") {
  state.item = null;
  $("item-box").hidden = true;
  delete $("item-box").dataset.itemId;
  $("done-box").hidden = false;
  if (queue) setQueue(queue);
  const othersHold = queue && queue.pending > 0;
  $("done-box").dataset.state = othersHold ? "waiting" : "done";
  $("done-title").textContent = othersHold ? "Other reviewers hold the rest" : "Nothing waiting";
  $("done-text").textContent = message || (othersHold
    ? `${queue.pending} item${queue.pending === 1 ? " is" : "s are"} with other reviewers. Press R to check again.`
    : "Every item whose annotators disagree has a decision. New ones appear as annotators finish items.");
  $("back-to-queue").focus();
}

async function myQueue() {
  const entries = await api("/api/review/adjudication/");
  return entries.find((entry) => entry.id === campaign.id) || null;
}

async function loadNext() {
  if (state.busy) return;
  setBusy(true);
  try {
    const payload = await api(`/api/review/campaigns/${campaign.id}/adjudicate/next/`, { method: "POST" });
    if (payload) showItem(payload);
    else showEmpty(await myQueue());
  } catch (error) {
    const draft = error instanceof ApiError && error.status === 409 && error.body && error.body.state === "draft";
    if (draft) showEmpty(null, "This campaign has not started yet: nothing to adjudicate.");
    else setStatus(`Could not load the next item: ${error.message}. Press R to try again.`, "critical");
  } finally {
    setBusy(false);
  }
}

async function decide() {
  if (state.busy || !state.item) return;
  if (!form.checkAnswered(form.missingRequired())) return;
  setBusy(true);
  try {
    const result = await api(`/api/review/items/${state.item.id}/decision/`, {
      method: "POST", body: { answers: form.answerBody(), claim_next: true },
    });
    setStatus("");
    if (result.next) showItem(result.next);
    else showEmpty(result.queue);
  } catch (error) {
    if (error instanceof ApiError && error.status === 400 && error.errors.length) {
      const byKey = new Map();
      for (const problem of error.errors) {
        const key = String(problem.loc || "").replace(/^answers\./, "").split(".")[0];
        byKey.set(key, [...(byKey.get(key) || []), problem.msg]);
      }
      form.showErrors(byKey);
      const unplaced = error.errors.filter((p) => !form.questions.some((q) => String(p.loc).includes(q.key)));
      if (unplaced.length) setStatus(unplaced.map(errorText).join(" "), "critical");
    } else {
      setStatus(`Could not decide: ${error.message}. Press R for your next item.`, "critical");
    }
  } finally {
    setBusy(false);
  }
}

document.addEventListener("keydown", (event) => {
  const open = [$("help-dialog"), $("guidelines-dialog")].find((dialog) => dialog.open);
  if (open) {
    if (event.key === "?" || event.key.toLowerCase() === "g") { event.preventDefault(); open.close(); }
    return;
  }
  if (event.target.matches("textarea, input, select") || event.altKey || event.ctrlKey || event.metaKey) return;
  const ownKey = event.key === "Enter" || event.key === " ";
  if (ownKey && event.target.closest("a, button") && !event.target.closest("#questions")) return;
  const key = event.key.toLowerCase();
  if (event.key === "?" || key === "g") {
    event.preventDefault();
    toggleDialog(event.key === "?" ? $("help-dialog") : $("guidelines-dialog"));
  } else if (!state.item) {
    if (key === "r") { event.preventDefault(); loadNext(); }
  } else if (key === "enter") {
    event.preventDefault();
    if (!event.repeat) decide();
  } else if (form.handleKey(event, key)) {
    event.preventDefault();
  }
});
for (const id of ["help-dialog", "guidelines-dialog"]) {
  $(id).addEventListener("close", () => { if (state.item) form.focusQuestion(form.current); });
}
$("help-button").addEventListener("click", () => toggleDialog($("help-dialog")));
$("guidelines-button").addEventListener("click", () => toggleDialog($("guidelines-dialog")));
$("submit-button").addEventListener("click", decide);

$("guidelines-body").replaceChildren(...guidelinesBody(campaign));
await loadNext();
document.body.dataset.ready = "true"; // tests wait for this
