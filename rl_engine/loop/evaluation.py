"""Held-out evaluation: greedy decoding on the eval prompts, scored with the run's own rewards."""

from __future__ import annotations

import statistics

from rl_engine.data import Prompt
from rl_engine.loop.engine import Engine
from rl_engine.loop.stages import score_rollouts
from rl_engine.rollout import SamplingParams


def evaluate(engine: Engine, prompts: list[Prompt], max_new_tokens: int, batch_size: int = 256) -> dict[str, float]:
    """Greedy decoding on held-out prompts (whole episodes when an environment runs), scored with the
    run's own rewards."""
    params = SamplingParams(n=1, max_new_tokens=max_new_tokens, stop=tuple(engine.cfg.rollout.stop), greedy=True)
    totals: list[float] = []
    components: dict[str, list[float]] = {}
    lengths: list[float] = []
    env_logs: list[dict[str, float]] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        rollouts = engine.executor.run(chunk, params)
        env_logs.extend(rollouts.logs or [])
        texts = engine.tokenizer.batch_decode([s.response_ids for s in rollouts.samples], skip_special_tokens=True)
        result = score_rollouts(engine, chunk, rollouts, texts)
        totals.extend(result.total)
        for name, values in result.components.items():
            components.setdefault(name, []).extend(values)
        lengths.extend(s.action_count for s in rollouts.samples)
    metrics = {
        "eval/reward/mean": statistics.fmean(totals),
        "eval/response/length_mean": statistics.fmean(lengths),
        "eval/size": float(len(prompts)),
    }
    for name, values in components.items():
        metrics[f"eval/reward/{name}"] = statistics.fmean(values)
    for name in sorted({k for log in env_logs for k in log}):
        metrics[f"eval/env/{name}"] = statistics.fmean(log[name] for log in env_logs if name in log)
    return metrics
