"""Tool use on the demo's arithmetic: before answering, the model may call a calculator.

A turn is either a call — an expression such as ``37+48`` — answered with ``=85`` as the next
observation, or an answer — a bare number — which ends the episode: reward 1 when it equals the
row's label. Each call costs ``call_cost``; more than ``max_calls`` calls, or a turn that is
neither, ends the episode with reward 0. Standard library only: it runs in the environment sandbox.

    environment: {path: rl_engine/environments/calculator.py, name: Calculator, max_turns: 3,
                  options: {call_cost: 0.05, max_calls: 2}}
"""

from __future__ import annotations

import operator
import re

_CALL = re.compile(r"^\s*(-?\d{1,12})\s*([-+*])\s*(-?\d{1,12})\s*=?\s*$")
_ANSWER = re.compile(r"^\s*(-?\d+)\s*$")
_OPERATORS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


class Calculator:
    def __init__(self, call_cost: float = 0.05, max_calls: int = 2):
        self.call_cost = call_cost
        self.max_calls = max_calls

    def reset(self, prompt: str, label: str | None, metadata: dict) -> str | None:
        self.label = (label or "").strip()
        self.calls = 0
        return None  # the prompt itself ("37+48=") is the whole task

    def step(self, action: str) -> tuple[str | None, float, bool, dict]:
        answer = _ANSWER.match(action)
        if answer:
            correct = answer.group(1) == self.label
            return None, 1.0 if correct else 0.0, True, {"calls": self.calls, "correct": float(correct)}
        call = _CALL.match(action)
        if call is None or self.calls >= self.max_calls:
            return None, 0.0, True, {"calls": self.calls, "correct": 0.0, "invalid": 1.0}
        self.calls += 1
        left, op, right = int(call.group(1)), call.group(2), int(call.group(3))
        return f"={_OPERATORS[op](left, right)}", -self.call_cost, False, {"calls": self.calls}
