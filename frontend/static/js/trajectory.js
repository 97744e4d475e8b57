// A multi-turn episode turn by turn: the model's turns (trained, unless played for another seat in self-play), its
// tool calls, and the environment's answers (masked; a tool's result when the environment ran one), each with its
// reward when one is given. Used on the run page, in an environment's "Try it" and in a review campaign's items.

import { el, formatNumber } from "./api.js";

// The tag format verifiers episodes use (rl_engine/environments/adapters/verifiers_tasksets.py).
const TOOL_CALL = /<tool_call>/g;
const TOOL_RESPONSE = "<tool_response>";

export function turnLabel(turn) {
  const text = turn.text || "";
  if (turn.role !== "assistant") return text.includes(TOOL_RESPONSE) ? "tool result" : "environment";
  const who = turn.trained === false ? "model, for another seat (not trained)" : "model";
  const calls = (text.match(TOOL_CALL) || []).length;
  return calls ? `${who} · ${calls} tool call${calls > 1 ? "s" : ""}` : who;
}

export function trajectoryList(turns, text = (value) => el("pre", { class: "item-text" }, value)) {
  return el("ol", { class: "trajectory" }, turns.map((turn) => el("li", { class: `turn turn-${turn.role}`, "data-role": turn.role },
    el("div", { class: "turn-head" },
      turnLabel(turn),
      turn.reward !== null && turn.reward !== undefined ? el("span", { class: "muted" }, ` · reward ${formatNumber(turn.reward)}`) : null),
    text(turn.text))));
}
