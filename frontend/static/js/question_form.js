// A campaign's questions as a keyboard-first form: the annotator's work page (annotate.js) and the
// reviewer's adjudication page (adjudicate.js) both answer with it. It renders each question with its
// instructions and, for ratings, the rubric of the chosen point; marks the first wrong step of a response
// for a steps question (by sentence, or by token where the item has a per-token view); shows a judge's
// suggestion where the campaign shows them; and turns keys into answers (`handleKey`).

import { el } from "./api.js";

export const PAIRWISE_CHOICES = [
  { value: "A", key: "a", label: "A is better" },
  { value: "B", key: "b", label: "B is better" },
  { value: "tie", key: "t", label: "Tie" },
  { value: "both_bad", key: "x", label: "Both bad" },
];
const MAX_NUMBER_KEYS = 9;
const PAIRWISE_NAMES = { A: "A", B: "B", tie: "tie", both_bad: "both bad" };

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

function keysHint(question, steps) {
  switch (question.kind) {
    case "rating": {
      const low = ratingKeyForValue(question, question.min);
      const high = ratingKeyForValue(question, question.max);
      return low === null ? "←/→" : `${low}–${high} or ←/→`;
    }
    case "pass_fail": return "P / F";
    case "pairwise": return "A / B / T / X";
    case "tags": return `1–${Math.min(question.options.length, MAX_NUMBER_KEYS)} toggle (when focused)`;
    case "steps": return steps && steps.unit === "token" ? "←/→ move · Shift+←/→ widen · N none" : "←/→ or 1–9 · N none";
    default: return "C or / to write · Esc to leave";
  }
}

/** An answer in words, for suggestions and for the reviewer's table of judgements. */
export function answerText(question, value) {
  if (value === undefined || value === null) return null;
  if (question.kind === "pass_fail") return value ? "pass" : "fail";
  if (question.kind === "pairwise") return PAIRWISE_NAMES[value] || String(value);
  if (question.kind === "tags") return value.length ? value.join(", ") : "none";
  if (question.kind === "steps") {
    if (value.first_wrong === null || value.first_wrong === undefined) return "no step wrong";
    return value.tokens ? `step ${value.first_wrong + 1} (tokens ${value.tokens[0]}–${value.tokens[1] - 1})`
      : `step ${value.first_wrong + 1} wrong first`;
  }
  if (question.kind === "rating" && !Number.isInteger(value)) return value.toFixed(2); // a weighted mean
  if (question.kind === "rating" && question.labels && question.labels.length) {
    return `${value} (${question.labels[value - question.min]})`;
  }
  return String(value);
}

export class QuestionForm {
  constructor({ form, missing }) {
    this.form = form; // the <form> the questions render into
    this.missingBox = missing; // the summary line of unanswered questions
    this.questions = [];
    this.answers = {};
    this.current = 0;
    this.steps = null; // the response's steps view (one response), when a question labels steps
    this.stepsBody = null; // the element showing the steps in the response card
    this.suggestion = null;
  }

  // --- loading and reading ----------------------------------------------------------------------

  load(questions, answers, { steps = null, suggestion = null } = {}) {
    this.questions = questions;
    this.answers = answers ? structuredClone(answers) : {};
    this.steps = steps;
    this.suggestion = suggestion;
    this.render();
  }

  answered(question) {
    const value = this.answers[question.key];
    if (question.kind === "tags") return Array.isArray(value) && value.length > 0;
    if (question.kind === "comment") return typeof value === "string" && value.trim() !== "";
    return value !== undefined && value !== null;
  }

  missingRequired(keys = null) {
    return this.questions.filter((q) => (keys ? keys.includes(q.key) : q.required) && !this.answered(q));
  }

  answerBody() {
    const body = {};
    for (const question of this.questions) {
      const value = this.answers[question.key];
      if (question.kind === "tags") body[question.key] = Array.isArray(value) ? value : []; // [] = none apply
      else if (question.kind === "comment") {
        if (typeof value === "string" && value.trim()) body[question.key] = value.trim();
      } else if (value !== undefined && value !== null) body[question.key] = value;
    }
    return body;
  }

  // --- rendering --------------------------------------------------------------------------------

  blockOf(question) {
    return this.form.querySelector(`.question[data-key="${CSS.escape(question.key)}"]`);
  }

  choiceButton(question, value, key, label, title = "") {
    return el("button", {
      type: "button", class: "choice", tabindex: "-1", "data-value": JSON.stringify(value), "aria-pressed": "false",
      title,
      onclick: () => (question.kind === "tags" ? this.toggleTag(question, value) : this.setAnswer(question, value)),
    }, key ? el("kbd", {}, key.toUpperCase()) : null, el("span", {}, label));
  }

  choices(question) {
    switch (question.kind) {
      case "rating": {
        const points = [];
        for (let value = question.min; value <= question.max; value += 1) {
          const i = value - question.min;
          const label = question.labels && question.labels.length ? `${value} ${question.labels[i]}` : String(value);
          const rubric = question.rubric && question.rubric[i] ? question.rubric[i] : "";
          points.push(this.choiceButton(question, value, ratingKeyForValue(question, value), label, rubric));
        }
        return el("div", { class: "choices rating", role: "group", "aria-label": question.label }, points);
      }
      case "pass_fail":
        return el("div", { class: "choices", role: "group", "aria-label": question.label },
          this.choiceButton(question, true, "p", "Pass"), this.choiceButton(question, false, "f", "Fail"));
      case "pairwise":
        return el("div", { class: "choices", role: "group", "aria-label": question.label },
          PAIRWISE_CHOICES.map((choice) => this.choiceButton(question, choice.value, choice.key, choice.label)));
      case "tags":
        return el("div", { class: "choices tags", role: "group", "aria-label": question.label },
          question.options.map((option, i) => this.choiceButton(question, option, i < MAX_NUMBER_KEYS ? String(i + 1) : null, option)));
      case "steps":
        return el("div", { class: "choices steps-choice", role: "group", "aria-label": question.label },
          this.choiceButton(question, { first_wrong: null }, "n", "No step is wrong"),
          el("span", { class: "steps-picked small", "aria-live": "polite" }));
      default:
        return el("textarea", {
          class: "comment", rows: 3, "data-key": question.key, "aria-label": question.label, maxlength: 10000,
          oninput: (event) => { this.answers[question.key] = event.target.value; this.showSelection(question); },
        });
    }
  }

  suggestionLine(question) {
    if (!this.suggestion || this.suggestion.answers[question.key] === undefined) return null;
    const scores = this.suggestion.scores.filter((score) => score !== null && score !== undefined)
      .map((score) => score.toFixed(2)).join(" / ");
    return el("div", { class: "suggestion small", "data-suggested": JSON.stringify(this.suggestion.answers[question.key]) },
      `Judge (${this.suggestion.judge}) suggests `, el("strong", {}, answerText(question, this.suggestion.answers[question.key])),
      scores ? ` · score ${scores}` : "", " · ", el("kbd", {}, "Y"), " takes it");
  }

  questionBlock(question, index) {
    const labelId = `q-${index}-label`;
    const help = question.help_html ? el("div", { class: "q-help small markdown" }) : null;
    if (help) help.innerHTML = question.help_html; // rendered by the server with raw HTML off (review/guidelines.py)
    const block = el("section", {
      class: "question", tabindex: "0", "data-key": question.key, "data-kind": question.kind, "data-index": index,
      "aria-labelledby": labelId,
    },
    el("div", { class: "q-head" },
      el("span", { class: "q-label", id: labelId }, question.label),
      el("span", { class: question.required ? "q-required" : "q-optional" }, question.required ? "required" : "optional"),
      el("span", { class: "q-keys" }, keysHint(question, this.steps))),
    help,
    this.choices(question),
    question.kind === "rating" && question.rubric_html && question.rubric_html.some(Boolean)
      ? el("div", { class: "rubric small markdown", "aria-live": "polite" }) : null,
    this.suggestionLine(question),
    el("div", { class: "field-error", hidden: true }));
    block.addEventListener("focusin", () => this.markCurrent(index));
    return block;
  }

  render() {
    this.form.replaceChildren(...this.questions.map((question, i) => this.questionBlock(question, i)));
    for (const question of this.questions) {
      const textarea = question.kind === "comment" ? this.blockOf(question).querySelector("textarea") : null;
      if (textarea) textarea.value = this.answers[question.key] || "";
      this.showSelection(question);
    }
  }

  stepsQuestion() {
    return this.questions.find((question) => question.kind === "steps") || null;
  }

  /** The response card's body: the text, or its steps (or tokens) to mark when a question labels steps. */
  responseBody(response) {
    const question = this.stepsQuestion();
    if (!question || !response.steps) {
      this.stepsBody = null;
      return el("pre", { class: "item-text" }, response.text);
    }
    if (response.steps.unit === "token") {
      this.stepsBody = el("div", { class: "item-text tokens-view", "data-unit": "token" },
        response.steps.tokens.map((piece, i) => el("span", {
          class: "tok", "data-token": i,
          onclick: (event) => this.markTokens(question, event.shiftKey ? "extend" : "at", i),
        }, piece)));
    } else {
      this.stepsBody = el("ol", { class: "steps-view", "data-unit": "sentence" },
        response.steps.texts.map((text, i) => el("li", {
          "data-step": i, onclick: () => this.setAnswer(question, { first_wrong: i }),
        }, text)));
    }
    this.showSelection(question);
    return this.stepsBody;
  }

  showSteps(question) {
    const value = this.answers[question.key];
    const first = value ? value.first_wrong : undefined;
    const picked = this.blockOf(question)?.querySelector(".steps-picked");
    if (picked) {
      picked.textContent = value === undefined || value === null ? "Mark the first wrong step in the response"
        : first === null ? "" : `First wrong: ${answerText(question, value)}`;
    }
    if (!this.stepsBody) return;
    if (this.stepsBody.dataset.unit === "token") {
      const [start, end] = value && value.tokens ? value.tokens : [-1, -1];
      this.stepsBody.querySelectorAll(".tok").forEach((span, i) => span.classList.toggle("marked", i >= start && i < end));
      return;
    }
    this.stepsBody.querySelectorAll("li").forEach((li, i) => {
      li.classList.toggle("wrong-first", first !== null && first !== undefined && i === first);
      li.classList.toggle("after-wrong", first !== null && first !== undefined && i > first);
      li.classList.toggle("ok", value !== undefined && value !== null && (first === null || i < first));
    });
  }

  showSelection(question) {
    const block = this.blockOf(question);
    if (!block) return;
    const value = this.answers[question.key];
    for (const button of block.querySelectorAll("button.choice")) {
      const choice = JSON.parse(button.dataset.value);
      let on;
      if (question.kind === "tags") on = Array.isArray(value) && value.includes(choice);
      else if (question.kind === "steps") on = Boolean(value) && value.first_wrong === null && !value.tokens;
      else on = value === choice;
      button.setAttribute("aria-pressed", on ? "true" : "false");
    }
    const rubric = block.querySelector(".rubric");
    if (rubric) {
      const i = value === undefined || value === null ? -1 : value - question.min;
      rubric.innerHTML = i >= 0 && question.rubric_html[i] ? question.rubric_html[i] : "";
      rubric.hidden = !rubric.innerHTML;
    }
    if (question.kind === "steps") this.showSteps(question);
    block.classList.toggle("answered", this.answered(question));
    if (this.answered(question) || question.kind === "tags") this.clearMissing(question);
  }

  // --- answering --------------------------------------------------------------------------------

  setAnswer(question, value) {
    this.answers[question.key] = value;
    this.showSelection(question);
    this.focusQuestion(this.questions.indexOf(question));
  }

  toggleTag(question, option) {
    const chosen = Array.isArray(this.answers[question.key]) ? [...this.answers[question.key]] : [];
    const at = chosen.indexOf(option);
    if (at === -1) chosen.push(option);
    else chosen.splice(at, 1);
    this.setAnswer(question, question.options.filter((tag) => chosen.includes(tag)));
  }

  stepRating(question, by) {
    const value = this.answers[question.key];
    const next = value === undefined || value === null ? (by > 0 ? question.min : question.max) : value + by;
    this.setAnswer(question, Math.min(question.max, Math.max(question.min, next)));
  }

  moveStep(question, by) {
    const count = this.steps ? this.steps.texts.length : 0;
    if (!count) return;
    const value = this.answers[question.key];
    const at = value && value.first_wrong !== null && value.first_wrong !== undefined ? value.first_wrong : (by > 0 ? -1 : count);
    this.setAnswer(question, { first_wrong: Math.min(count - 1, Math.max(0, at + by)) });
  }

  // "at": a one-token span at i; "extend": the span's end moved to include i; "move"/"widen" by ±1.
  markTokens(question, how, arg) {
    const count = this.steps && this.steps.tokens ? this.steps.tokens.length : 0;
    if (!count) return;
    const value = this.answers[question.key];
    let [start, end] = value && value.tokens ? value.tokens : [-1, -1];
    if (how === "at") [start, end] = [arg, arg + 1];
    else if (how === "extend") {
      if (start < 0) [start, end] = [arg, arg + 1];
      else if (arg < start) start = arg;
      else end = arg + 1;
    } else if (how === "move") {
      const from = start < 0 ? (arg > 0 ? -1 : count) : start;
      start = Math.min(count - 1, Math.max(0, from + arg));
      end = start + 1;
    } else if (how === "widen") {
      if (start < 0) [start, end] = [0, 1];
      else end = Math.min(count, Math.max(start + 1, end + arg));
    }
    this.setAnswer(question, { tokens: [start, end] });
  }

  takeSuggestion() {
    if (!this.suggestion) return false;
    for (const question of this.questions) {
      const value = this.suggestion.answers[question.key];
      if (value !== undefined && !this.answered(question)) {
        this.answers[question.key] = value;
        this.showSelection(question);
      }
    }
    return true;
  }

  // --- focus and errors -------------------------------------------------------------------------

  markCurrent(index) {
    this.current = index;
    this.form.querySelectorAll(".question").forEach((block, i) => block.classList.toggle("current", i === index));
  }

  focusQuestion(index) {
    const blocks = this.form.querySelectorAll(".question");
    if (!blocks.length) return;
    const clamped = Math.min(blocks.length - 1, Math.max(0, index));
    this.markCurrent(clamped);
    blocks[clamped].focus({ preventScroll: true });
    blocks[clamped].scrollIntoView({ block: "nearest" });
  }

  hasFocus() {
    return Boolean(document.activeElement && document.activeElement.closest(".question") && this.form.contains(document.activeElement));
  }

  // A key for a question kind acts on the focused question when it is of that kind, else on the first one.
  targetQuestion(kinds) {
    const current = this.questions[this.current];
    if (current && kinds.includes(current.kind)) return current;
    return this.questions.find((question) => kinds.includes(question.kind)) || null;
  }

  focusComment() {
    const question = this.targetQuestion(["comment"]);
    if (!question) return;
    this.markCurrent(this.questions.indexOf(question));
    this.blockOf(question).querySelector("textarea").focus();
  }

  clearMissing(question) {
    const block = this.blockOf(question);
    block.classList.remove("missing");
    const error = block.querySelector(":scope > .field-error");
    error.hidden = true;
    error.textContent = "";
    if (!this.form.querySelector(".question.missing")) this.missingBox.hidden = true;
  }

  showErrors(byKey) {
    let first = null;
    for (const question of this.questions) {
      const messages = byKey.get(question.key);
      if (!messages) continue;
      const block = this.blockOf(question);
      block.classList.add("missing");
      const error = block.querySelector(":scope > .field-error");
      error.textContent = messages.join(" ");
      error.hidden = false;
      first = first ?? this.questions.indexOf(question);
    }
    if (first !== null) this.focusQuestion(first);
  }

  /** Names the unanswered questions and returns false when some of `questions` are unanswered. */
  checkAnswered(questions) {
    if (!questions.length) return true;
    this.showErrors(new Map(questions.map((question) => [question.key, ["Required: answer this first."]])));
    this.missingBox.textContent = `Answer first: ${questions.map((question) => question.label).join(", ")}`;
    this.missingBox.hidden = false;
    return false;
  }

  // --- keys -------------------------------------------------------------------------------------

  /** Handles a key meant for the questions; true when it did something (the caller prevents the default). */
  handleKey(event, key) {
    const current = this.questions[this.current];
    if (/^[0-9]$/.test(key)) {
      // Tags and steps take digits only while focused; otherwise digits rate (the focused rating, else the first).
      if (current && current.kind === "tags") {
        const option = key === "0" ? undefined : current.options[Number(key) - 1];
        if (option !== undefined) this.toggleTag(current, option);
      } else if (current && current.kind === "steps" && this.steps && this.steps.unit !== "token") {
        const step = Number(key) - 1;
        if (step >= 0 && step < this.steps.texts.length) this.setAnswer(current, { first_wrong: step });
      } else {
        const question = this.targetQuestion(["rating"]);
        const value = question ? ratingValueForDigit(question, Number(key)) : null;
        if (value !== null) this.setAnswer(question, value);
      }
      return true;
    }
    if ((key === "arrowleft" || key === "arrowright") && current) {
      const by = key === "arrowright" ? 1 : -1;
      if (current.kind === "rating") this.stepRating(current, by);
      else if (current.kind === "steps" && this.steps && this.steps.unit === "token") {
        this.markTokens(current, event.shiftKey ? "widen" : "move", by);
      } else if (current.kind === "steps") this.moveStep(current, by);
      else return false;
      return true;
    }
    const pairwise = PAIRWISE_CHOICES.find((choice) => choice.key === key);
    if (pairwise) {
      const question = this.targetQuestion(["pairwise"]);
      if (question) this.setAnswer(question, pairwise.value);
      return Boolean(question);
    }
    if (key === "p" || key === "f") {
      const question = this.targetQuestion(["pass_fail"]);
      if (question) this.setAnswer(question, key === "p");
      return Boolean(question);
    }
    switch (key) {
      case "n": {
        const question = this.targetQuestion(["steps"]);
        if (question) this.setAnswer(question, { first_wrong: null });
        return Boolean(question);
      }
      case "y": return this.takeSuggestion();
      case "j": this.focusQuestion(this.hasFocus() ? this.current + 1 : this.current); return true;
      case "k": this.focusQuestion(this.hasFocus() ? this.current - 1 : this.current); return true;
      case "c": case "/": this.focusComment(); return true;
      default: return false;
    }
  }
}

/** The guidelines dialog's body: the campaign's instructions, then each question's help and rubric. */
export function guidelinesBody(campaign) {
  const parts = [];
  if (campaign.instructions_html) {
    const intro = el("div", { class: "markdown" });
    intro.innerHTML = campaign.instructions_html; // rendered by the server with raw HTML off
    parts.push(intro);
  }
  for (const question of campaign.questions) {
    const rubric = question.kind === "rating" && question.rubric_html && question.rubric_html.some(Boolean);
    if (!question.help_html && !rubric) continue;
    const section = el("section", { class: "guideline", "data-key": question.key }, el("h3", {}, question.label));
    if (question.help_html) {
      const help = el("div", { class: "markdown" });
      help.innerHTML = question.help_html;
      section.append(help);
    }
    if (rubric) {
      section.append(el("table", { class: "data compact rubric-table" }, el("tbody", {},
        question.rubric_html.map((html, i) => {
          const cell = el("td", { class: "markdown" });
          cell.innerHTML = html;
          const value = question.min + i;
          const label = question.labels && question.labels.length ? ` ${question.labels[i]}` : "";
          return el("tr", {}, el("th", {}, `${value}${label}`), cell);
        }))));
    }
    parts.push(section);
  }
  return parts.length ? parts : [el("p", { class: "muted" }, "This campaign has no written guidelines.")];
}
