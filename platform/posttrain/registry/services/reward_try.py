""" "Try it": score sample inputs with a stored reward exactly as a run would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from django.conf import settings

from posttrain.registry.models import RewardFunction
from posttrain.registry.services.common import (
    invalid,
)
from rl_engine.rewards import CompositeReward, RewardBatch, build_component

MAX_TRY_SAMPLES = 32
TRY_TIMEOUT_CAP_S = 10.0  # per call, for python and http rewards in "try it"


def reward_try(reward: RewardFunction, samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Score sample inputs exactly as a run would: the engine's component and composite, python
    code in its sandbox child, a reward model in a separate process (no torch in this one).

    Returns {"scores": [...], "components": {name: [...]}, "errors": [[...]], "extra_logs": {...}}.
    """
    batch = _try_batch(samples)
    spec = _try_spec(reward.spec)
    if reward.kind == RewardFunction.Kind.REWARD_MODEL:
        return _score_in_subprocess(spec, batch)
    try:
        component = build_component(spec)
    except ValueError as exc:
        raise invalid("spec", f"the stored reward cannot be built: {exc}") from None
    with CompositeReward([(component, 1.0)]) as composite:
        result = composite.score(batch)
    return {
        "scores": result.total,
        "components": result.components,
        "errors": result.errors,
        "extra_logs": result.extra_logs,
    }


def _try_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The stored spec with its waiting bounded: a web request must answer in seconds, while a
    run may wait out a server's retries or a slow per-sample call. Everything else is unchanged."""
    spec = dict(spec)
    if "timeout_s" in spec and spec.get("type") in ("python", "http"):
        spec["timeout_s"] = min(float(spec["timeout_s"]), TRY_TIMEOUT_CAP_S)
    if spec.get("type") == "http":
        spec["retries"] = min(int(spec.get("retries", 0)), 1)
        spec["backoff_s"] = min(float(spec.get("backoff_s", 0.0)), 1.0)
    return spec


def _try_batch(samples: Any) -> RewardBatch:
    if not isinstance(samples, list) or not samples:
        raise invalid("samples", "give a list of at least one {prompt, response, label} sample")
    if len(samples) > MAX_TRY_SAMPLES:
        raise invalid("samples", f"at most {MAX_TRY_SAMPLES} samples per try, got {len(samples)}")
    prompts, responses, labels, metadata = [], [], [], []
    for i, sample in enumerate(samples):
        if not isinstance(sample, dict):
            raise invalid(f"samples.{i}", "must be an object with prompt, response and label")
        for key in ("prompt", "response"):
            if not isinstance(sample.get(key), str):
                raise invalid(f"samples.{i}.{key}", "is required and must be a string")
        label = sample.get("label")
        if label is not None and not isinstance(label, (str, int, float)):
            raise invalid(f"samples.{i}.label", "must be a string, a number or null")
        meta = sample.get("metadata") or {}
        if not isinstance(meta, dict):
            raise invalid(f"samples.{i}.metadata", "must be an object")
        prompts.append(sample["prompt"])
        responses.append(sample["response"])
        labels.append(None if label is None else str(label))  # the engine passes labels as text
        metadata.append(meta)
    return RewardBatch.build(prompts, responses, labels, metadata=metadata)


def _score_in_subprocess(spec: dict[str, Any], batch: RewardBatch) -> dict[str, Any]:
    """Run `python -m rl_engine.rewards score` (torch loads there, never here) with a timeout."""
    timeout_s = float(getattr(settings, "REWARD_TRY_TIMEOUT_S", 180))
    payload = {
        "rewards": [spec],
        "samples": [
            {"prompt": p, "response": r, "label": lab, "metadata": m}
            for p, r, lab, m in zip(batch.prompts, batch.responses, batch.labels, batch.metadata)
        ],
    }
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(settings.REPO_ROOT), os.environ.get("PYTHONPATH")])),
    }
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "rl_engine.rewards", "score"],
            input=json.dumps(payload),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=settings.REPO_ROOT,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return _failed_result(spec["name"], len(batch), f"scoring took longer than {timeout_s:g}s and was stopped")
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not lines:
        detail = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        return _failed_result(spec["name"], len(batch), f"scoring process failed: {detail}")
    try:
        return json.loads(lines[-1])  # the result is the last line; libraries may print before it
    except json.JSONDecodeError:
        return _failed_result(spec["name"], len(batch), "scoring process printed no result")


def _failed_result(name: str, n: int, reason: str) -> dict[str, Any]:
    return {
        "scores": [0.0] * n,
        "components": {name: [0.0] * n},
        "errors": [[f"{name}: {reason}"] for _ in range(n)],
        "extra_logs": {},
    }
