// The annotator's work page: one item at a time, answered from the keyboard (press "?" for the keys, "G"
// for the guidelines). Submitting claims the next item in the same request, so the next item shows at
// once. The page shows only what the API's annotator view of an item holds: in a blind campaign no
// reward, run or step; nothing marks a gold item.

import { $, api, ApiError, el, errorText, pageData, toggleDialog } from "./api.js";
import { guidelinesBody, QuestionForm } from "./question_form.js";
import { trajectoryList } from "./trajectory.js";

const WAIT_RETRY_MS = 10000;
const MAX_SECONDS = 24 * 3600;

const campaign = pageData("campaign-data");
const form = new QuestionForm({ form: $("questions"), missing: $("missing") });

const state = {
  item: null, // the item shown, as the API's annotator view gives it
  shownAt: 0,
  busy: false,
  waitTimer: null,
};

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
  (response.turns || []).length ? trajectoryList(response.turns) : form.responseBody(response),
  sampleFacts(response.sample))));
}

function showGuidelines(current) {
  $("guidelines-body").replaceChildren(...guidelinesBody(current));
  const short = $("guidelines-side");
  short.hidden = !current.instructions_html;
  $("guidelines-side-text").innerHTML = current.instructions_html || ""; // rendered by the server, raw HTML off
}

function showItem(payload) {
  clearTimeout(state.waitTimer);
  const { item } = payload;
  state.item = item;
  const steps = item.responses.length === 1 ? item.responses[0].steps : null;
  form.load(payload.campaign.questions, item.my_answers, { steps, suggestion: item.suggestion });
  showGuidelines(payload.campaign);
  $("prompt").textContent = item.prompt;
  $("reference-box").hidden = item.reference === null || item.reference === undefined || item.reference === "";
  $("reference").textContent = item.reference || "";
  renderResponses(item);
  $("missing").hidden = true;
  $("done-box").hidden = true;
  $("item-box").hidden = false;
  $("item-box").dataset.itemId = String(item.id);
  setProgress(payload.progress);
  state.shownAt = Date.now();
  tick();
  window.scrollTo(0, 0);
  form.focusQuestion(0);
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
      const key = String(problem.loc || "").replace(/^answers\./, "").split(".")[0];
      if (form.questions.some((q) => q.key === key)) byKey.set(key, [...(byKey.get(key) || []), problem.msg]);
      else other.push(errorText(problem));
    }
    form.showErrors(byKey);
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
  if (!form.checkAnswered(form.missingRequired())) return;
  setBusy(true);
  try {
    const result = await api(`/api/review/items/${state.item.id}/judgement/`, {
      method: "POST", body: { answers: form.answerBody(), seconds: elapsedSeconds(), claim_next: true },
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

function onTypingKey(event) {
  if (event.key === "Escape") {
    event.preventDefault();
    form.focusQuestion(form.current);
  } else if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
    event.preventDefault();
    submit();
  }
}

function onItemKey(event, key) {
  if (form.handleKey(event, key)) return true;
  switch (key) {
    case "s": if (!event.repeat) skip(); return true;
    case "enter": if (!event.repeat) submit(); return true;
    default: return false;
  }
}

function onKey(event) {
  const open = [$("help-dialog"), $("guidelines-dialog")].find((dialog) => dialog.open);
  if (open) {
    if (event.key === "?" || event.key.toLowerCase() === "g") { event.preventDefault(); open.close(); }
    return; // a dialog closes itself on Escape
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
    toggleDialog($("help-dialog"));
    return;
  }
  const key = event.key.toLowerCase();
  if (key === "g") {
    event.preventDefault();
    toggleDialog($("guidelines-dialog"));
    return;
  }
  if (!state.item) {
    if (key === "r") { event.preventDefault(); loadNext(); }
    return;
  }
  if (onItemKey(event, key)) event.preventDefault();
}

document.addEventListener("keydown", onKey);
for (const id of ["help-dialog", "guidelines-dialog"]) {
  $(id).addEventListener("close", () => {
    if (state.item) form.focusQuestion(form.current);
  });
}
$("help-button").addEventListener("click", () => toggleDialog($("help-dialog")));
$("guidelines-button").addEventListener("click", () => toggleDialog($("guidelines-dialog")));
$("submit-button").addEventListener("click", submit);
$("skip-button").addEventListener("click", skip);
setInterval(tick, 1000);

showGuidelines(campaign);
if (campaign.state === "active") await loadNext();
else showEmpty(null, notActiveMessage(campaign.state));
document.body.dataset.ready = "true"; // tests wait for this
