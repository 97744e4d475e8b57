"""The record stage: a step's metrics (rewards, lengths, throughput, environments) and its `samples` records."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

import torch

from rl_engine.config import RunConfig
from rl_engine.data import Prompt
from rl_engine.loop.timing import StepTimer
from rl_engine.rewards.base import RewardResult
from rl_engine.rollout import Sample

if TYPE_CHECKING:
    from rl_engine.loop.stages import Collected, Scored


def step_metrics(cfg: RunConfig, collected: Collected, scored: Scored, timer: StepTimer) -> dict[str, float]:
    """The record stage's step metrics: rewards, lengths, throughput."""
    metrics = _rollout_metrics(
        scored.reward,
        scored.task_scores,
        scored.scores,
        collected.lengths,
        collected.samples,
        cfg.rollout.samples_per_prompt,
    )
    metrics["batch/kept_fraction"] = float(scored.keep.float().mean())
    metrics.update(environment_metrics(collected.prompts, collected.samples, scored.scores.tolist()))
    metrics.update(collected.rollouts.metrics())
    generate_s = timer.timings["generate"] if timer.overlapped_generate is None else timer.overlapped_generate
    metrics["throughput/tokens_per_s"] = float(collected.lengths.sum()) / max(generate_s, 1e-9)
    if timer.overlapped_generate is not None:
        metrics["rollout/overlapped_generate_s"] = timer.overlapped_generate
    return metrics


def _rollout_metrics(
    reward: RewardResult,
    task_scores: torch.Tensor,
    scores: torch.Tensor,
    lengths: torch.Tensor,
    samples: list[Sample],
    group: int,
) -> dict[str, float]:
    grouped = task_scores.view(-1, group)
    metrics = {
        "reward/mean": float(scores.mean()),
        "reward/std": float(scores.std()) if len(scores) > 1 else 0.0,
        "reward/task_mean": float(task_scores.mean()),
        "reward/errors": float(sum(1 for e in reward.errors if e)),
        "reward/group_all_equal_rate": float((grouped.max(1).values == grouped.min(1).values).float().mean()),
        "response/length_mean": float(lengths.mean()),
        "response/length_max": float(lengths.max()),
        "response/length_min": float(lengths.min()),
        "response/truncated_rate": sum(s.finish_reason == "length" for s in samples) / len(samples),
    }
    for name, values in reward.components.items():
        metrics[f"reward/{name}"] = statistics.fmean(values)
    for key, value in reward.extra_logs.items():
        metrics[f"reward/{key}"] = float(value)
    for name, seconds in reward.timings.items():
        metrics[f"timing/reward/{name}"] = seconds
    return metrics


def environment_metrics(prompts: list[Prompt], samples: list[Sample], scores: list[float]) -> dict[str, float]:
    """`env/<name>/reward/mean` (and its samples and spread) for each environment of a mixed run: the rows' `env`
    field names it (the platform sets it when it mixes environments' datasets)."""
    by_env: dict[str, list[float]] = {}
    for sample, score in zip(samples, scores, strict=True):
        name = prompts[sample.prompt_index].metadata.get("env")
        if isinstance(name, str) and name and "/" not in name:
            by_env.setdefault(name, []).append(score)
    metrics: dict[str, float] = {}
    for name, values in sorted(by_env.items()):
        metrics[f"env/{name}/reward/mean"] = statistics.fmean(values)
        metrics[f"env/{name}/reward/std"] = statistics.pstdev(values)
        metrics[f"env/{name}/samples"] = float(len(values))
    return metrics


def sample_records(collected: Collected, scored: Scored, advantages: torch.Tensor) -> list[dict[str, Any]]:
    """The record stage's `samples` event: every sample with its text, rewards and advantage."""
    prompts, reward = collected.prompts, scored.reward
    records: list[dict[str, Any]] = [
        {
            "index": i,
            "group": s.prompt_index,
            "prompt": prompts[s.prompt_index].text,
            "response": collected.texts[i],
            "label": prompts[s.prompt_index].label,
            "reward": float(scored.scores[i]),
            "components": {name: values[i] for name, values in reward.components.items()},
            "advantage": float(advantages[i]),
            "length": int(collected.lengths[i]),
            "finish_reason": s.finish_reason,
            "errors": reward.errors[i],
            "kept": bool(scored.keep[i]),
        }
        for i, s in enumerate(collected.samples)
    ]
    for record, sample in zip(records, collected.samples):
        if sample.segments is not None:  # async mode: [version, tokens] per segment
            record["versions"] = [list(segment) for segment in sample.segments]
    rollouts = collected.rollouts
    if rollouts.turns is not None:
        episode_logs = rollouts.logs
        assert episode_logs is not None  # an executor that reports turns reports each episode's logs with them
        for record, turns, logs in zip(records, rollouts.turns, episode_logs):
            record["turns"], record["env"] = turns, logs
    return records
