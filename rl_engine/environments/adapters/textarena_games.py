"""TextArena games as multi-turn environments, over the package's public API only (`textarena.make`, a game's
`reset(num_players, seed)`, `get_observation()`, `step(action)`, `close()`).

This file runs in the sandbox (copied in alone, like a user's environment file): standard library and textarena.

    environment: {package: textarena, options: {env_id: GuessTheNumber-v0}}

A dataset row names its game by `seed` (generated rows: `python textarena_games.py generate SPEC_JSON FD`, one
JSON line per row, the game's first observation as the prompt); rows without one take a seed from the prompt
text, so the samples of one prompt (a GRPO group) play the same game. Each turn the model's text is the move
of the seat to play; the observation back is what the game said since that seat's last view.

- Single-agent games (`num_players: 1`): the game's own reward for seat 0 at the end.
- Self-play (`num_players: 2`, two-player games): the policy plays every seat in one trajectory, each turn told
  which seat it moves for; only `seat`'s moves are trained (the other seats' stay in the context, masked out of
  the loss like observations: `next_turn_trained`), and the episode's reward is the game's reward for `seat`
  (default 0). `seat: alternate` takes seat `seed % num_players`, so both seats learn across games.

A move the game refuses is the game's business (TextArena answers with its own message, or ends the game with
its penalty); the episode ends when the game does, or after `environment.max_turns` moves.
"""

from __future__ import annotations

import json
import os
import sys
import zlib
from typing import Any


def _make(env_id: str) -> Any:
    import textarena

    return textarena.make(env_id=env_id)


def _seed(prompt: str | None, metadata: dict) -> int:
    seed = (metadata or {}).get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool):
        return seed
    return zlib.crc32((prompt or "").encode())


class TextArena:
    def __init__(self, env_id: str, num_players: int = 1, seat: int | str = 0):
        if num_players < 1:
            raise ValueError(f"num_players must be at least 1, got {num_players}")
        if seat != "alternate" and (not isinstance(seat, int) or not 0 <= seat < num_players):
            raise ValueError(f"seat must be a seat of the game (0 to {num_players - 1}) or 'alternate', got {seat!r}")
        self.env_id, self.num_players, self.seat_option = env_id, num_players, seat

    def reset(self, prompt: str, label: str | None, metadata: dict) -> dict:
        seed = _seed(prompt, metadata)
        self.seat = seed % self.num_players if self.seat_option == "alternate" else int(self.seat_option)
        self.game = _make(self.env_id)
        self.game.reset(num_players=self.num_players, seed=seed)
        self.seen: dict[int, str] = {}
        self.moves = 0
        player, observation = self.game.get_observation()
        text = self._news(player, str(observation))
        if (metadata or {}).get("seed") is not None and text.strip() == (prompt or "").strip():
            text = ""  # a generated row's prompt is this observation already
        return {"observation": self._addressed(player, text) or None, "next_turn_trained": player == self.seat}

    def _news(self, player: int, observation: str) -> str:
        """What the game said to `player` since its last view (TextArena repeats the whole history)."""
        before = self.seen.get(player, "")
        self.seen[player] = observation
        return observation[len(before) :] if observation.startswith(before) else observation

    def _addressed(self, player: int, text: str) -> str:
        if self.num_players == 1 or not text:
            return text
        return f"{text}\n[You move for Player {player}]\n"

    def step(self, action: str) -> dict:
        self.moves += 1
        done, _ = self.game.step(action)
        if done:
            rewards, info = self.game.close()
            reward = float((rewards or {}).get(self.seat, 0.0))
            logs = {"moves": float(self.moves), "won": float(reward > 0), "invalid_end": _invalid(info, self.seat)}
            return {"observation": None, "reward": reward, "done": True, "logs": logs}
        player, observation = self.game.get_observation()
        return {
            "observation": self._addressed(player, self._news(player, str(observation))) or None,
            "reward": 0.0,
            "done": False,
            "next_turn_trained": player == self.seat,
        }


def _invalid(info: Any, seat: int) -> float:
    reason = str(((info or {}).get(seat) or {}).get("reason", "")) if isinstance(info, dict) else ""
    return float("invalid" in reason.lower())


def generate(spec: dict) -> list[dict]:
    env_id, size, seed, players = spec["env_id"], int(spec["size"]), int(spec["seed"]), int(spec["num_players"])
    rows = []
    for i in range(size):
        game = _make(env_id)
        game.reset(num_players=players, seed=seed + i)
        _, observation = game.get_observation()
        rows.append({"prompt": str(observation), "label": None, "data_source": f"textarena/{env_id}", "seed": seed + i})
    return rows


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] != "generate":
        print("usage: textarena_games.py generate SPEC_JSON FD", file=sys.stderr)
        return 2
    spec, fd = json.loads(argv[1]), int(argv[2])
    with os.fdopen(fd, "w") as out:
        try:
            rows = generate(spec)
        except Exception as exc:  # the parent reads the reason from the same channel
            out.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n")
            return 1
        for row in rows:
            out.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
