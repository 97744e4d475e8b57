// A multi-turn episode turn by turn: the model's turns (trained, unless played for another seat in self-play)
// and the environment's answers (masked), each with its reward when one is given. Used where an episode is read outside the run page: an
// environment's "Try it" and a review campaign's items.

import { el, formatNumber } from "./api.js";

export function trajectoryList(turns, text = (value) => el("pre", { class: "item-text" }, value)) {
  return el("ol", { class: "trajectory" }, turns.map((turn) => el("li", { class: `turn turn-${turn.role}`, "data-role": turn.role },
    el("div", { class: "turn-head" },
      turn.role !== "assistant" ? "environment" : turn.trained === false ? "model, for another seat (not trained)" : "model",
      turn.reward !== null && turn.reward !== undefined ? el("span", { class: "muted" }, ` · reward ${formatNumber(turn.reward)}`) : null),
    text(turn.text))));
}
