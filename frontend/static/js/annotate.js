// The annotator's work page: one item at a time, answered from the keyboard (press "?" for the keys).
// Submitting claims the next item in the same request, so the next item shows at once. The page shows
// only what the API's annotator view of an item holds: in a blind campaign no reward, run or step.

import { $, api, ApiError, el, errorText, pageData } from "./api.js";

const WAIT_RETRY_MS = 10000;
const MAX_SECONDS = 24 * 3600;
const PAIRWISE_CHOICES = [
  { value: "A", key: "a", label: "A is better" },
  { value: "B", key: "b", label: "B is better" },
  { value: "tie", key: "t", label: "Tie" },
  { value: "both_bad", key: "x", label: "Both bad" },
];
const MAX_TAG_KEYS = 9;

const campaign = pageData("campaign-data");

const state = {
  questions: campaign.questions,
  item: null, // the item shown, as the API's annotator view gives it
  answers: {}, // question key -> answer, pairwise as shown
  current: 0, // index of the focused question: the one digits and arrows act on
  shownAt: 0,
  busy: false,
  waitTimer: null,
};

// --- keys of a question's answers ---------------------------------------------------------------

// Digits are the rating itself on scales within 0–9 (a 1–5 scale: "4" rates 4); on other scales of up
// to nine points they count the points from the lowest. Longer scales use ←/→ only.
function ratingValueForDigit(question, digit) {
  if (question.min >= 0 && question.max <= 9) return digit >= question.min && digit <= question.max ? digit : null;
  const points = question.max - question.min + 1;
  return points <= 9 && digit >= 1 && digit <= points ? question.min + digit - 1 : null;
}

function ratingKeyForValue(question, value) {
  if (question.min >= 0 && question.max <= 9) return String(value);
  const points = question.max - question.min + 1;
  return points <= 9 ? String(value - question.min + 1) : null;
}

function keysHint(question) {
  switch (question.kind) {
    case "rating": {
      const low = ratingKeyForValue(question, question.min);
      const high = ratingKeyForValue(question, question.max);
      return low === null ? "←/→" : `${low}–${high} or ←/→`;
    }
    case "pass_fail": return "P / F";
    case "pairwise": return "A / B / T / X";
    case "tags": return `1–${Math.min(question.options.length, MAX_TAG_KEYS)} toggle (when focused)`;
    default: return "C or / to write · Esc to leave";
  }
}

// --- answers ------------------------------------------------------------------------------------

function answered(question) {
  const value = state.answers[question.key];
  if (question.kind === "tags") return Array.isArray(value) && value.length > 0;
  if (question.kind === "comment") return typeof value === "string" && value.trim() !== "";
  return value !== undefined && value !== null;
}

function answerBody() {
  const body = {};
  for (const question of state.questions) {
    const value = state.answers[question.key];
    if (question.kind === "tags") body[question.key] = Array.isArray(value) ? value : []; // [] = none apply
    else if (question.kind === "comment") {
      if (typeof value === "string" && value.trim()) body[question.key] = value.trim();
    } else if (value !== undefined && value !== null) body[question.key] = value;
  }
  return body;
}

function blockOf(question) {
  return document.querySelector(`#questions .question[data-key="${CSS.escape(question.key)}"]`);
}

function showSelection(question) {
  const block = blockOf(question);
  const value = state.answers[question.key];
  for (const button of block.querySelectorAll("button.choice")) {
    const choice = JSON.parse(button.dataset.value);
    const on = question.kind === "tags" ? Array.isArray(value) && value.includes(choice) : value === choice;
    button.setAttribute("aria-pressed", on ? "true" : "false");
  }
  block.classList.toggle("answered", answered(question));
  if (answered(question) || question.kind === "tags") clearMissing(question);
}

function setAnswer(question, value) {
  state.answers[question.key] = value;
  showSelection(question);
  focusQuestion(state.questions.indexOf(question));
}

function toggleTag(question, option) {
  const chosen = Array.isArray(state.answers[question.key]) ? [...state.answers[question.key]] : [];
  const at = chosen.indexOf(option);
  if (at === -1) chosen.push(option);
  else chosen.splice(at, 1);
  setAnswer(question, question.options.filter((tag) => chosen.includes(tag)));
}

function stepRating(question, by) {
  const value = state.answers[question.key];
  const next = value === undefined || value === null ? (by > 0 ? question.min : question.max) : value + by;
  setAnswer(question, Math.min(question.max, Math.max(question.min, next)));
}

// --- questions ----------------------------------------------------------------------------------

function choiceButton(question, value, key, label) {
  return el("button", {
    type: "button", class: "choice", tabindex: "-1", "data-value": JSON.stringify(value), "aria-pressed": "false",
    onclick: () => (question.kind === "tags" ? toggleTag(question, value) : setAnswer(question, value)),
  }, key ? el("kbd", {}, key.toUpperCase()) : null, el("span", {}, label));
}

function choices(question) {
  switch (question.kind) {
    case "rating": {
      const points = [];
      for (let value = question.min; value <= question.max; value += 1) {
        const label = question.labels && question.labels.length ? `${value} ${question.labels[value - question.min]}` : String(value);
        points.push(choiceButton(question, value, ratingKeyForValue(question, value), label));
      }
      return el("div", { class: "choices rating", role: "group", "aria-label": question.label }, points);
    }
    case "pass_fail":
      return el("div", { class: "choices", role: "group", "aria-label": question.label },
        choiceButton(question, true, "p", "Pass"), choiceButton(question, false, "f", "Fail"));
    case "pairwise":
      return el("div", { class: "choices", role: "group", "aria-label": question.label },
        PAIRWISE_CHOICES.map((choice) => choiceButton(question, choice.value, choice.key, choice.label)));
    case "tags":
      return el("div", { class: "choices tags", role: "group", "aria-label": question.label },
        question.options.map((option, i) => choiceButton(question, option, i < MAX_TAG_KEYS ? String(i + 1) : null, option)));
    default:
      return el("textarea", {
        class: "comment", rows: 3, "data-key": question.key, "aria-label": question.label, maxlength: 10000,
        oninput: (event) => { state.answers[question.key] = event.target.value; showSelection(question); },
      });
  }
}

function questionBlock(question, index) {
  const labelId = `q-${index}-label`;
  const block = el("section", {
    class: "question", tabindex: "0", "data-key": question.key, "data-kind": question.kind, "data-index": index,
    "aria-labelledby": labelId,
  },
  el("div", { class: "q-head" },
    el("span", { class: "q-label", id: labelId }, question.label),
    el("span", { class: question.required ? "q-required" : "q-optional" }, question.required ? "required" : "optional"),
    el("span", { class: "q-keys" }, keysHint(question))),
  question.help ? el("div", { class: "q-help muted small prewrap" }, question.help) : null,
  choices(question),
  el("div", { class: "field-error", hidden: true }));
  block.addEventListener("focusin", () => markCurrent(index));
  return block;
}

function renderQuestions() {
  $("questions").replaceChildren(...state.questions.map(questionBlock));
  for (const question of state.questions) {
    const textarea = question.kind === "comment" ? blockOf(question).querySelector("textarea") : null;
    if (textarea) textarea.value = state.answers[question.key] || "";
    showSelection(question);
  }
}

function markCurrent(index) {
  state.current = index;
  document.querySelectorAll("#questions .question").forEach((block, i) => block.classList.toggle("current", i === index));
}

function focusQuestion(index) {
  const blocks = document.querySelectorAll("#questions .question");
  if (!blocks.length) return;
  const clamped = Math.min(blocks.length - 1, Math.max(0, index));
  markCurrent(clamped);
  blocks[clamped].focus({ preventScroll: true });
  blocks[clamped].scrollIntoView({ block: "nearest" });
}

function questionHasFocus() {
  return Boolean(document.activeElement && document.activeElement.closest("#questions .question"));
}

// A key for a question kind acts on the focused question when it is of that kind, else on the first one.
function targetQuestion(kinds) {
  const current = state.questions[state.current];
  if (current && kinds.includes(current.kind)) return current;
  return state.questions.find((question) => kinds.includes(question.kind)) || null;
}

function focusComment() {
  const question = targetQuestion(["comment"]);
  if (!question) return;
  markCurrent(state.questions.indexOf(question));
  blockOf(question).querySelector("textarea").focus();
}

function clearMissing(question) {
  const block = blockOf(question);
  block.classList.remove("missing");
  const error = block.querySelector(":scope > .field-error");
  error.hidden = true;
  error.textContent = "";
  if (!document.querySelector("#questions .question.missing")) $("missing").hidden = true;
}

function showQuestionErrors(byKey) {
  let first = null;
  for (const question of state.questions) {
    const messages = byKey.get(question.key);
    if (!messages) continue;
    const block = blockOf(question);
    block.classList.add("missing");
    const error = block.querySelector(":scope > .field-error");
    error.textContent = messages.join(" ");
    error.hidden = false;
    first = first ?? state.questions.indexOf(question);
  }
  if (first !== null) focusQuestion(first);
}

// --- the item -----------------------------------------------------------------------------------

function sampleFacts(sample) {
  // Only in campaigns that are not blind: the API leaves `sample` out of blind items.
  if (!sample) return null;
  const reward = sample.reward === null || sample.reward === undefined ? "—" : String(sample.reward);
  return el("div", { class: "small muted sample-facts" }, `${sample.run_name} · step ${sample.step} · reward ${reward}`);
}

function renderResponses(item) {
  const pair = item.responses.length > 1;
  $("responses").className = `responses ${pair ? "pair" : "single"}`;
  $("responses").replaceChildren(...item.responses.map((response) => el("section", {
    class: "card response", "data-label": response.label,
  },
  el("h2", { class: "first" }, pair ? `Response ${response.label}` : "Response"),
  el("pre", { class: "item-text" }, response.text),
  sampleFacts(response.sample))));
}

function showItem(payload) {
  clearTimeout(state.waitTimer);
  const { item } = payload;
  state.item = item;
  state.questions = payload.campaign.questions;
  state.answers = item.my_answers ? { ...item.my_answers } : {};
  showInstructions(payload.campaign.instructions);
  $("prompt").textContent = item.prompt;
  $("reference-box").hidden = item.reference === null || item.reference === undefined || item.reference === "";
  $("reference").textContent = item.reference || "";
  renderResponses(item);
  renderQuestions();
  $("missing").hidden = true;
  $("done-box").hidden = true;
  $("item-box").hidden = false;
  $("item-box").dataset.itemId = String(item.id);
  setProgress(payload.progress);
  state.shownAt = Date.now();
  tick();
  window.scrollTo(0, 0);
  focusQuestion(0);
}

function showInstructions(text) {
  $("instructions").hidden = !text;
  $("instructions-text").textContent = text || "";
}

function showEmpty(progress, message = null) {
  clearTimeout(state.waitTimer);
  state.item = null;
  $("item-box").hidden = true;
  delete $("item-box").dataset.itemId;
  $("done-box").hidden = false;
  if (progress) setProgress(progress);
  const waiting = progress && !progress.done ? progress.remaining : 0;
  $("done-box").dataset.state = message ? "closed" : waiting ? "waiting" : "done";
  if (message) {
    $("done-title").textContent = "Nothing to do here";
    $("done-text").textContent = message;
  } else if (waiting) {
    $("done-title").textContent = "Waiting for other annotators";
    $("done-text").textContent = `${waiting} item${waiting === 1 ? " is" : "s are"} being judged by others right now. `
      + "Press R to check again (the page also checks every few seconds).";
    state.waitTimer = setTimeout(() => { if (!state.item) loadNext(); }, WAIT_RETRY_MS);
  } else {
    $("done-title").textContent = "All done";
    $("done-text").textContent = progress
      ? `You judged ${progress.judged} item${progress.judged === 1 ? "" : "s"} of this campaign. Thank you!`
      : "Nothing is left for you in this campaign.";
  }
  $("back-to-queue").focus();
}

function setProgress(progress) {
  const total = progress.judged + progress.remaining;
  $("progress-bar").max = total || 1;
  $("progress-bar").value = progress.judged;
  $("progress-text").textContent = `${progress.judged} of ${total} judged`
    + (progress.skipped ? ` · ${progress.skipped} skipped` : "");
}

function elapsedSeconds() {
  return Math.min(MAX_SECONDS, (Date.now() - state.shownAt) / 1000);
}

function tick() {
  if (!state.item) return;
  const seconds = Math.floor((Date.now() - state.shownAt) / 1000);
  $("timer").textContent = `${Math.floor(seconds / 60)}:${String(seconds % 60).padStart(2, "0")}`;
}

// While a request is out, keys that send one are ignored (no double submits); tests wait on data-busy.
function setBusy(on) {
  state.busy = on;
  $("annotate-app").dataset.busy = on ? "true" : "false";
  $("submit-button").disabled = on;
  $("skip-button").disabled = on;
}

function setStatus(text, kind = "") {
  $("work-status").textContent = text;
  $("work-status").className = `alert ${kind}`;
  $("work-status").hidden = !text;
}

// --- requests -----------------------------------------------------------------------------------

async function myProgress() {
  const queue = await api("/api/review/queue/");
  const mine = queue.find((entry) => entry.id === campaign.id);
  return mine ? mine.progress : null;
}

function notActiveMessage(campaignState) {
  return campaignState === "closed" ? "This campaign is closed: it takes no more judgements."
    : "This campaign has not started yet: its researcher activates it.";
}

async function loadNext() {
  clearTimeout(state.waitTimer);
  if (state.busy) return;
  setBusy(true);
  try {
    const payload = await api(`/api/review/campaigns/${campaign.id}/next/`, { method: "POST" });
    if (payload) showItem(payload);
    else showEmpty(await myProgress());
  } catch (error) {
    if (error instanceof ApiError && error.status === 409 && error.body && error.body.state) {
      showEmpty(null, notActiveMessage(error.body.state));
    } else {
      setStatus(`Could not load the next item: ${error.message}. Press R to try again.`, "critical");
    }
  } finally {
    setBusy(false);
  }
}

function afterAnswer(result) {
  if (result.next) showItem(result.next);
  else showEmpty(result.progress);
}

function requestFailed(error, what) {
  if (error instanceof ApiError && error.status === 400 && error.errors.length) {
    const byKey = new Map();
    const other = [];
    for (const problem of error.errors) {
      const key = String(problem.loc || "").replace(/^answers\./, "");
      if (state.questions.some((q) => q.key === key)) byKey.set(key, [...(byKey.get(key) || []), problem.msg]);
      else other.push(errorText(problem));
    }
    showQuestionErrors(byKey);
    if (other.length) setStatus(other.join(" "), "critical");
    return;
  }
  if (error instanceof ApiError && error.status === 409) {
    const closed = error.body && error.body.state && error.body.state !== "active";
    setStatus(closed ? notActiveMessage(error.body.state) : `${error.message}. Press R for your next item.`, "critical");
    return;
  }
  setStatus(`Could not ${what}: ${error.message}`, "critical");
}

async function submit() {
  if (state.busy || !state.item) return;
  const missing = state.questions.filter((question) => question.required && !answered(question));
  if (missing.length) {
    showQuestionErrors(new Map(missing.map((question) => [question.key, ["Required: answer this first."]])));
    $("missing").textContent = `Answer first: ${missing.map((question) => question.label).join(", ")}`;
    $("missing").hidden = false;
    return;
  }
  setBusy(true);
  try {
    const result = await api(`/api/review/items/${state.item.id}/judgement/`, {
      method: "POST", body: { answers: answerBody(), seconds: elapsedSeconds(), claim_next: true },
    });
    setStatus("");
    afterAnswer(result);
  } catch (error) {
    requestFailed(error, "submit");
  } finally {
    setBusy(false);
  }
}

async function skip() {
  if (state.busy || !state.item) return;
  setBusy(true);
  try {
    const result = await api(`/api/review/items/${state.item.id}/skip/`, { method: "POST", body: { claim_next: true } });
    setStatus("Skipped: it comes back after your other items.");
    afterAnswer(result);
  } catch (error) {
    requestFailed(error, "skip");
  } finally {
    setBusy(false);
  }
}

// --- keys ---------------------------------------------------------------------------------------

function toggleHelp() {
  const dialog = $("help-dialog");
  if (dialog.open) dialog.close();
  else dialog.showModal();
}

function onTypingKey(event) {
  if (event.key === "Escape") {
    event.preventDefault();
    focusQuestion(state.current);
  } else if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
    event.preventDefault();
    submit();
  }
}

function onItemKey(event, key) {
  const current = state.questions[state.current];
  if (/^[0-9]$/.test(key)) {
    // Tags take digits only while focused; otherwise digits rate (the focused rating, else the first).
    if (current && current.kind === "tags") {
      const option = key === "0" ? undefined : current.options[Number(key) - 1];
      if (option !== undefined) toggleTag(current, option);
    } else {
      const question = targetQuestion(["rating"]);
      const value = question ? ratingValueForDigit(question, Number(key)) : null;
      if (value !== null) setAnswer(question, value);
    }
    return true;
  }
  if ((key === "arrowleft" || key === "arrowright") && current && current.kind === "rating") {
    stepRating(current, key === "arrowright" ? 1 : -1);
    return true;
  }
  const pairwise = PAIRWISE_CHOICES.find((choice) => choice.key === key);
  if (pairwise) {
    const question = targetQuestion(["pairwise"]);
    if (question) setAnswer(question, pairwise.value);
    return Boolean(question);
  }
  if (key === "p" || key === "f") {
    const question = targetQuestion(["pass_fail"]);
    if (question) setAnswer(question, key === "p");
    return Boolean(question);
  }
  switch (key) {
    case "j": focusQuestion(questionHasFocus() ? state.current + 1 : state.current); return true;
    case "k": focusQuestion(questionHasFocus() ? state.current - 1 : state.current); return true;
    case "c": case "/": focusComment(); return true;
    case "s": if (!event.repeat) skip(); return true;
    case "enter": if (!event.repeat) submit(); return true;
    default: return false;
  }
}

function onKey(event) {
  const dialog = $("help-dialog");
  if (dialog.open) {
    if (event.key === "?") { event.preventDefault(); dialog.close(); }
    return; // the dialog closes itself on Escape
  }
  if (event.target.matches("textarea, input, select")) {
    onTypingKey(event);
    return;
  }
  if (event.altKey || event.ctrlKey || event.metaKey) {
    if (event.key === "Enter") { event.preventDefault(); submit(); }
    return;
  }
  // Links and buttons outside the questions keep their own Enter and Space (Tab reaches them; the done
  // state focuses the link back to the queue).
  const ownKey = event.key === "Enter" || event.key === " ";
  if (ownKey && event.target.closest("a, button") && !event.target.closest("#questions")) return;
  if (event.key === "?") {
    event.preventDefault();
    toggleHelp();
    return;
  }
  const key = event.key.toLowerCase();
  if (!state.item) {
    if (key === "r") { event.preventDefault(); loadNext(); }
    return;
  }
  if (onItemKey(event, key)) event.preventDefault();
}

document.addEventListener("keydown", onKey);
$("help-dialog").addEventListener("close", () => {
  if (state.item) focusQuestion(state.current);
});
$("help-button").addEventListener("click", toggleHelp);
$("submit-button").addEventListener("click", submit);
$("skip-button").addEventListener("click", skip);
setInterval(tick, 1000);

showInstructions(campaign.instructions);
if (campaign.state === "active") await loadNext();
else showEmpty(null, notActiveMessage(campaign.state));
document.body.dataset.ready = "true"; // tests wait for this
