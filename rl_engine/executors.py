"""Executors turn a step's prompts into trajectories, token in / token out: the full token ids after
each prompt, which of them are the policy's actions (trained) and which are observations (masked out
of every loss term), the engine's log-probs of the actions, and per-turn rewards and logs.

Algorithms see only `Sample`s (`response_ids`, `action_mask`), so every algorithm runs unchanged with
every executor. Nothing generated is ever decoded and re-encoded on the training path: a trajectory's
ids are the engine's ids, and only environment text (observations) is tokenised.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, field, replace
from typing import Any

from rl_engine.config import EnvironmentConfig
from rl_engine.data import Prompt
from rl_engine.rollout import FinishReason, RolloutBackend, Sample, SamplingParams


@dataclass
class Rollouts:
    """A step's trajectories, prompt-major (the `n` of prompt 0, then prompt 1, ...)."""

    samples: list[Sample]
    env_rewards: list[float] | None = None  # each episode's summed turn rewards (multi-turn)
    errors: list[list[str]] | None = None  # per episode: why it ended early
    turns: list[list[dict[str, Any]]] | None = None  # per episode: [{"role", "text", "reward"}]
    logs: list[dict[str, float]] | None = None  # per episode: turns, env logs
    final_texts: list[str] | None = None  # per episode: the model's last turn (for reward functions)
    env_seconds: float = 0.0  # time spent inside the environment

    def metrics(self) -> dict[str, float]:
        if self.logs is None:
            return {}
        names = sorted({name for log in self.logs for name in log})
        out = {f"env/{name}": statistics.fmean(log[name] for log in self.logs if name in log) for name in names}
        out["env/episode_errors"] = float(sum(1 for e in self.errors or [] if e))
        return out


class SingleTurnExecutor:
    """One response per sample: the rollout engine's output as it is (the default)."""

    def __init__(self, rollout: RolloutBackend):
        self.rollout = rollout

    def run(self, prompts: list[Prompt], params: SamplingParams) -> Rollouts:
        return Rollouts(self.rollout.generate([p.token_ids for p in prompts], params))

    def close(self) -> None:
        pass


@dataclass
class Trajectory:
    """The ids after a prompt as a multi-turn executor builds them: the engine's own ids for each of the
    policy's turns (actions, with its log-probs) and the tokenised observations between them (masked)."""

    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    logprobs_known: bool = True  # False once an engine turn came without log-probs

    def observe(self, token_ids: list[int]) -> None:
        self.tokens.extend(token_ids)
        self.mask.extend([0] * len(token_ids))
        self.logprobs.extend([0.0] * len(token_ids))

    def act(self, sample: Sample, trained: bool = True) -> None:
        """The engine's turn; `trained` False: a turn it played for another seat (self-play), kept in the context
        and masked out of the loss like an observation."""
        self.tokens.extend(sample.response_ids)
        self.mask.extend([int(trained)] * len(sample.response_ids))
        self.logprobs_known = self.logprobs_known and sample.logprobs is not None
        self.logprobs.extend(sample.logprobs or [0.0] * len(sample.response_ids))

    def sample(self, prompt_index: int, finish_reason: FinishReason) -> Sample:
        return Sample(
            prompt_index,
            list(self.tokens),
            finish_reason,
            tuple(self.logprobs) if self.logprobs_known else None,
            tuple(self.mask),
        )


@dataclass
class _Episode:
    key: int
    prompt_index: int
    prompt_ids: list[int]
    trajectory: Trajectory = field(default_factory=Trajectory)
    turns: list[dict[str, Any]] = field(default_factory=list)
    reward: float = 0.0
    logs: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    done: bool = False
    finish_reason: FinishReason = "stop"
    last_action: str = ""
    next_trained: bool = True  # the environment's say on the next turn: the learner's (trained) or another seat's

    def fail(self, reason: str) -> None:
        self.errors.append(f"environment: {reason}")
        self.done = True


class EnvironmentExecutor:
    """Multi-turn episodes against a user environment: each turn, every open episode's whole context
    (prompt, its actions and the observations so far, as ids) goes to the rollout engine in one batch;
    the environment answers all of them in one round trip."""

    def __init__(self, rollout: RolloutBackend, tokenizer: Any, cfg: EnvironmentConfig):
        from rl_engine.environments import EnvironmentPool

        self.rollout = rollout
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.pool = EnvironmentPool(cfg)
        self._keys = itertools.count()
        self.pool._ensure_worker()  # a broken file fails the run at start, naming environment.path

    def _tokens(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"][: self.cfg.max_observation_tokens]

    def run(self, prompts: list[Prompt], params: SamplingParams) -> Rollouts:
        self.pool.seconds = 0.0
        episodes = [
            _Episode(next(self._keys), i, list(p.token_ids)) for i, p in enumerate(prompts) for _ in range(params.n)
        ]
        self._reset(episodes, prompts)
        one = replace(params, n=1)
        for turn in range(1, self.cfg.max_turns + 1):
            active = [e for e in episodes if not e.done]
            if not active:
                break
            samples = self.rollout.generate([e.prompt_ids + e.trajectory.tokens for e in active], one)
            texts = self.tokenizer.batch_decode([s.response_ids for s in samples], skip_special_tokens=True)
            for episode, sample, text in zip(active, samples, texts):
                episode.trajectory.act(sample, trained=episode.next_trained)
                episode.finish_reason = sample.finish_reason
                if episode.next_trained:  # the reward functions score the learner's last turn
                    episode.last_action = text
                action = {"role": "assistant", "text": text, "reward": None}
                episode.turns.append(action if episode.next_trained else {**action, "trained": False})
            self._step(active, texts, last_turn=turn == self.cfg.max_turns)
            if self.pool.lost:  # the process went down: the other open episodes went with it
                for episode in episodes:
                    if not episode.done:
                        episode.fail("the environment process was restarted")
        self.pool.call("end", [(e.key, None) for e in episodes if not self.pool.lost])
        for episode in episodes:
            episode.logs["turns"] = float(sum(1 for t in episode.turns if t["role"] == "assistant"))
        return Rollouts(
            samples=[e.trajectory.sample(e.prompt_index, e.finish_reason) for e in episodes],
            env_rewards=[e.reward for e in episodes],
            errors=[e.errors for e in episodes],
            turns=[e.turns for e in episodes],
            logs=[e.logs for e in episodes],
            final_texts=[e.last_action for e in episodes],
            env_seconds=self.pool.seconds,
        )

    def _reset(self, episodes: list[_Episode], prompts: list[Prompt]) -> None:
        """Opens each episode; the environment's first observation, if any, starts its trajectory."""
        by_key = {e.key: e for e in episodes}
        first = self.pool.call(
            "reset",
            [
                (
                    e.key,
                    {
                        "prompt": prompts[e.prompt_index].raw,
                        "label": prompts[e.prompt_index].label,
                        "metadata": prompts[e.prompt_index].metadata,
                    },
                )
                for e in episodes
            ],
        )
        for key, (ok, value) in first.items():
            if not ok:
                by_key[key].fail(value)
                continue
            by_key[key].next_trained = value["next_turn_trained"]
            if value["observation"]:
                by_key[key].trajectory.observe(self._tokens(value["observation"]))
                by_key[key].turns.append({"role": "environment", "text": value["observation"], "reward": None})

    def _step(self, active: list[_Episode], texts: list[str], last_turn: bool) -> None:
        """Sends each open episode's action; its reply scores it, ends it or observes for the next turn."""
        replies = self.pool.call("step", [(e.key, text) for e, text in zip(active, texts)])
        for episode in active:
            ok, value = replies[episode.key]
            if not ok:
                episode.fail(value)
                continue
            episode.reward += value["reward"]
            episode.logs.update(value["logs"])
            episode.next_trained = value["next_turn_trained"]
            episode.turns.append({"role": "environment", "text": value["observation"] or "", "reward": value["reward"]})
            if value["done"]:
                episode.done = True
            elif last_turn:
                episode.done, episode.finish_reason = True, "length"  # out of turns
            elif value["observation"]:
                episode.trajectory.observe(self._tokens(value["observation"]))

    def close(self) -> None:
        self.pool.close()
