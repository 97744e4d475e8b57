"""Guess the number: the model guesses, the environment answers "higher" or "lower".

The secret comes from the prompt text (a CRC of it), so the samples of one prompt — a GRPO group —
play the same game, and a dataset of any prompts works. The reward is 1 for finding it, minus
``turn_cost`` per wrong guess; a turn that holds no number ends the game with reward 0. Standard
library only: it runs in the environment sandbox.

    environment: {path: rl_engine/environments/guess_number.py, name: GuessNumber, max_turns: 6,
                  options: {low: 10, high: 99}}
"""

from __future__ import annotations

import re
import zlib

_NUMBER = re.compile(r"-?\d+")


class GuessNumber:
    def __init__(self, low: int = 1, high: int = 100, turn_cost: float = 0.1):
        if low > high:
            raise ValueError(f"low ({low}) must not be above high ({high})")
        self.low, self.high, self.turn_cost = low, high, turn_cost

    def reset(self, prompt: str, label: str | None, metadata: dict) -> str | None:
        self.secret = self.low + zlib.crc32(prompt.encode()) % (self.high - self.low + 1)
        self.guesses = 0
        return f" guess {self.low}-{self.high}:"

    def step(self, action: str) -> tuple[str | None, float, bool, dict]:
        found = _NUMBER.search(action)
        if found is None:
            return None, 0.0, True, {"guesses": self.guesses, "solved": 0.0, "invalid": 1.0}
        guess = int(found.group())
        self.guesses += 1
        distance = abs(guess - self.secret) / (self.high - self.low + 1)
        if guess == self.secret:
            return None, 1.0, True, {"guesses": self.guesses, "solved": 1.0, "distance": 0.0}
        hint = " higher:" if guess < self.secret else " lower:"
        return hint, -self.turn_cost, False, {"guesses": self.guesses, "solved": 0.0, "distance": distance}
