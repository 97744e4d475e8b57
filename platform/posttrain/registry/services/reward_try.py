""" "Try it" and the import check of new python source: user code a web request asks for, run on a
Celery worker in the engine's sandbox, never in the web process, which only waits for the outcome (a
`RewardTrial` row, queued -> running -> done | failed) for a bounded time.

The task goes to the `user_code` queue (settings.USER_CODE_QUEUE), which a worker of its own serves, so
user code never delays run submission or admission; Celery's soft time limit ends a trial as a result
("stopped at the time limit"), its hard limit kills the worker's child, and `worker_jobs_expire` (beat)
fails whatever such a kill left `running` (posttrain.core.job_runner, the runner of every worker job).

Scoring off a run ("Try it", probes, judges) is bounded per call by one cap, `TRY_TIMEOUT_CAP_S`, whatever
the reward type, each by the mechanism that can stop it: python code (and the reasoning-gym and verifiers
adapters) in its sandbox, whose parent kills a call at its `timeout_s` (`scoring_spec` caps it); an HTTP
reward's exchange, closed at its `timeout_s` (capped too, retries at most one); the rewards the engine runs
in its own process (the builtins, a reward model) in a child process of their own that the kernel ends at
the cap after loading (`python -m rl_engine.rewards score --cap-s`), since a builtin stuck in C code cannot
be interrupted from Python. Loading a reward model is bounded apart, by REWARD_TRY_TIMEOUT_S for the
child's whole life."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User

from posttrain.core.errors import WorkerUnavailable
from posttrain.core.job_runner import job_dispatch, job_run, job_wait
from posttrain.core.outbound import outbound_policy
from posttrain.registry.models import RewardFunction, RewardTrial
from posttrain.registry.services.common import invalid, user_or_none
from rl_engine.spec.user_code import CompositeReward, RewardBatch, build_component, check_reward_file

MAX_TRY_SAMPLES = 32
# One scoring call off a run, every reward type: a python call, an HTTP exchange, a builtin's or a reward
# model's whole batch.
TRY_TIMEOUT_CAP_S = 10.0
REWARD_TRY_TIMEOUT_S = 180.0  # a scoring child's whole life, a reward model's loading included (settings overrides)
SANDBOXED_TYPES = ("python", "reasoning_gym", "verifiers")  # reward code that runs in the engine's sandbox
# The types that stop themselves at their own `timeout_s`; every other type is scored in a child process.
SELF_TIMED_TYPES = (*SANDBOXED_TYPES, "http")


def reward_try(
    reward: RewardFunction, samples: list[dict[str, Any]], user: User | AnonymousUser | None = None
) -> RewardTrial:
    """Score sample inputs exactly as a run would, on a worker: the engine's component and composite,
    python code in its sandbox, a reward model in a separate process. Waits up to REWARD_TRY_WAIT_S;
    the returned trial is finished (`result`: {"scores", "components", "errors", "extra_logs"}) or still
    queued/running (the client polls it)."""
    batch = _try_batch(samples)
    trial = RewardTrial.objects.create(
        kind=RewardTrial.Kind.TRY,
        reward=reward,
        spec=scoring_spec(reward.spec),
        samples=[
            {"prompt": p, "response": r, "label": lab, "metadata": m}
            for p, r, lab, m in zip(batch.prompts, batch.responses, batch.labels, batch.metadata)
        ],
        created_by=user_or_none(user),
    )
    _dispatch(trial, settings.REWARD_TRY_WAIT_S)
    return job_wait(trial, settings.REWARD_TRY_WAIT_S)


def reward_import_check(source_file: Path, spec: dict[str, Any], user: User | AnonymousUser | None = None) -> list[str]:
    """Problems found importing a new python reward's staged source on a worker ([] = usable). Raises
    WorkerUnavailable when no worker answered within the file's own timeout plus REWARD_CHECK_QUEUE_S."""
    trial = RewardTrial.objects.create(
        kind=RewardTrial.Kind.IMPORT_CHECK,
        spec={**spec, "path": str(source_file)},
        created_by=user_or_none(user),
    )
    # The worker stops a check at the user-code time limit whatever the spec's own timeout says.
    bound = min(float(spec["timeout_s"]), settings.USER_CODE_TIME_LIMIT_S) + settings.REWARD_CHECK_QUEUE_S
    _dispatch(trial, bound)
    trial = job_wait(trial, bound)
    if trial.state == RewardTrial.State.DONE:
        return list((trial.result or {})["problems"])
    if trial.state == RewardTrial.State.FAILED:
        raise WorkerUnavailable(f"the worker could not check the code: {trial.error}")
    raise WorkerUnavailable(
        f"no worker checked the code within {bound:g}s; is the user-code worker running (`celery -A "
        f"workers.celery_app worker -Q {settings.USER_CODE_QUEUE}`)? Try again"
    )


def reward_trial_run(trial_id: Any) -> None:
    """The worker's side (posttrain.core.job_runner): whatever the user code does happens in its sandbox, so a
    failure of the code is a result, not a failed trial; so is a stop at the soft time limit."""
    job_run(
        RewardTrial,
        trial_id,
        _run_trial,
        needs_sandbox=_needs_sandbox,
        at_soft_limit=lambda trial: {"result": _stopped_at_time_limit(trial)},
    )


def _needs_sandbox(trial: RewardTrial) -> bool:
    return trial.kind == RewardTrial.Kind.IMPORT_CHECK or trial.spec.get("type") in SANDBOXED_TYPES


def _run_trial(trial: RewardTrial) -> dict[str, Any]:
    return {"result": _run_try(trial) if trial.kind == RewardTrial.Kind.TRY else _run_import_check(trial)}


def _stopped_at_time_limit(trial: RewardTrial) -> dict[str, Any]:
    reason = f"stopped at the user-code time limit ({settings.USER_CODE_SOFT_TIME_LIMIT_S:g}s)"
    if trial.kind == RewardTrial.Kind.IMPORT_CHECK:
        return {"problems": [f"importing the file was {reason}"]}
    return _failed_result(trial.spec.get("name", "reward"), len(trial.samples), reason)


def _dispatch(trial: RewardTrial, wait_s: float) -> None:
    """It expires when nobody waits for it any more."""
    job_dispatch(trial, expires=wait_s)


def _run_import_check(trial: RewardTrial) -> dict[str, Any]:
    spec = trial.spec
    problems = check_reward_file(
        spec["path"], function=spec.get("function"), timeout_s=spec["timeout_s"], memory_mb=spec["memory_mb"]
    )
    return {"problems": problems}


def _run_try(trial: RewardTrial) -> dict[str, Any]:
    return reward_score(trial.spec, trial.samples)


def reward_score(spec: dict[str, Any], samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Score `{prompt, response, label, metadata}` samples with one reward spec as a run would: the engine's
    component and composite, python code in its sandbox (call `sandbox.require()` first), builtins and reward
    models in a child process ended at TRY_TIMEOUT_CAP_S. Worker side only. {"scores", "components",
    "errors", "extra_logs"}, one entry per sample; a sample the reward failed on scores 0 with its errors
    listed."""
    batch = RewardBatch.build(
        [s["prompt"] for s in samples],
        [s["response"] for s in samples],
        [s["label"] for s in samples],
        metadata=[s["metadata"] for s in samples],
    )
    try:  # building is cheap and runs nothing: a pattern compiles, a file is parsed, a model is not loaded yet
        component = build_component(spec, outbound=outbound_policy())
    except ValueError as exc:
        return _failed_result(spec.get("name", "reward"), len(batch), f"the stored reward cannot be built: {exc}")
    if spec.get("type") not in SELF_TIMED_TYPES:
        component.close()
        return _score_in_subprocess(spec, batch, TRY_TIMEOUT_CAP_S)
    with CompositeReward([(component, 1.0)]) as composite:
        result = composite.score(batch)
    return {
        "scores": result.total,
        "components": result.components,
        "errors": result.errors,
        "extra_logs": result.extra_logs,
    }


def scoring_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The stored spec with its waiting bounded, for scoring off a run ("Try it", probes): a web request must
    answer in seconds and a probe finish within the user-code time limit, while a run may wait out a server's
    retries or a slow per-sample call. Everything else is unchanged."""
    spec = dict(spec)
    if "timeout_s" in spec and spec.get("type") in SELF_TIMED_TYPES:
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


def _score_in_subprocess(spec: dict[str, Any], batch: RewardBatch, cap_s: float) -> dict[str, Any]:
    """Run `python -m rl_engine.rewards score` (torch loads there, never here): the kernel ends it `cap_s`
    after its components loaded, and we kill it at REWARD_TRY_TIMEOUT_S whatever it does."""
    timeout_s = float(getattr(settings, "REWARD_TRY_TIMEOUT_S", REWARD_TRY_TIMEOUT_S))
    name = spec.get("name", "reward")
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
            [sys.executable, "-m", "rl_engine.rewards", "score", "--cap-s", repr(cap_s)],
            input=json.dumps(payload),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=settings.REPO_ROOT,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return _failed_result(name, len(batch), f"scoring took longer than {timeout_s:g}s and was stopped")
    if proc.returncode == -signal.SIGALRM:
        return _failed_result(name, len(batch), f"scoring took longer than {cap_s:g}s and was stopped")
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not lines:
        detail = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        return _failed_result(name, len(batch), f"scoring process failed: {detail}")
    try:
        return json.loads(lines[-1])  # the result is the last line; libraries may print before it
    except json.JSONDecodeError:
        return _failed_result(name, len(batch), "scoring process printed no result")


def _failed_result(name: str, n: int, reason: str) -> dict[str, Any]:
    return {
        "scores": [0.0] * n,
        "components": {name: [0.0] * n},
        "errors": [[f"{name}: {reason}"] for _ in range(n)],
        "extra_logs": {},
    }
