"""Writes of the runs app: experiments, the run state machine, dispatch to Ray, event ingestion.

State changes go through `run_transition`, a compare-and-set `UPDATE … WHERE state=<old>` recorded
with a RunTransition row (reason, time) in the same transaction; whoever loses a race sees 0 rows
updated and decides again from the fresh state. Side effects (Celery tasks, live publishing) run in
`transaction.on_commit`, so a rolled-back write never dispatches anything.

The functions that talk to Ray (`run_submit`, `run_stop`, `run_reconcile`, `runs_reconcile`) run in
the Celery worker only; they take the Ray Jobs client as `jobs` (default: `workers.ray_jobs`,
imported lazily, so the web process never imports ray).
"""

from __future__ import annotations

import copy
import logging
import math
import re
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from posttrain.registry.models import Dataset, ModelAsset, RewardFunction
from posttrain.runs import live, series
from posttrain.runs.errors import IllegalTransition, InvalidInput, JobsUnavailable, SeqConflict
from posttrain.runs.event_schema import finite_or_none
from posttrain.runs.models import (
    TERMINAL_STATES,
    Checkpoint,
    Experiment,
    ExperimentReward,
    MetricRow,
    Run,
    RunLog,
    RunState,
    RunTransition,
    Sample,
)
from posttrain.runs.tokens import ingest_token, token_hash

logger = logging.getLogger(__name__)

S = RunState
ACTIVE_STATES = (S.STARTING, S.RUNNING, S.CANCELLING)  # a Ray job exists (or should)
# The state machine of DESIGN.md. Terminal states have no way out.
ALLOWED_TRANSITIONS: dict[str, frozenset[str]] = {
    S.DRAFT: frozenset({S.QUEUED, S.CANCELLED}),
    S.QUEUED: frozenset({S.STARTING, S.RUNNING, S.CANCELLING, S.CANCELLED, S.FAILED, S.SUCCEEDED}),
    S.STARTING: frozenset({S.RUNNING, S.CANCELLING, S.SUCCEEDED, S.FAILED, S.CANCELLED}),
    S.RUNNING: frozenset({S.CANCELLING, S.SUCCEEDED, S.FAILED, S.CANCELLED}),
    S.CANCELLING: frozenset({S.CANCELLED, S.SUCCEEDED, S.FAILED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
}
# Set by the platform, never by the experiment's config (they come from the registry or the launch).
_PLATFORM_FIELDS = {
    "model.path": "comes from the experiment's registry model",
    "data.path": "comes from the experiment's registry dataset",
    "data.format": "comes from the experiment's registry dataset",
    "data.prompt_field": "comes from the experiment's registry dataset",
    "data.label_field": "comes from the experiment's registry dataset",
    "rewards": "comes from the experiment's rewards (registry reward functions with weights)",
    "logging.run_dir": "is set per run by the platform (<storage>/runs/<run id>)",
}
PLATFORM_FIELDS: tuple[str, ...] = tuple(_PLATFORM_FIELDS)  # the launch form leaves these out
_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.\- ]+")
_REWARD_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.\-]+")
MAX_TAGS = 20
MAX_TAG_LENGTH = 50
MAX_NOTE_LENGTH = 20_000
MAX_SEED = 2**31 - 1
_REASON_LIMIT = 4000


# =============================================================================================
# Experiments
# =============================================================================================


def _run_config_name(name: str) -> str:
    """The engine's run name from an experiment name (letters, digits, spaces and - _ . only)."""
    cleaned = _NAME_CHARS.sub("-", name).strip(" -")[:100]
    return cleaned or "experiment"


def _reward_name(reward: RewardFunction) -> str:
    return _REWARD_NAME_CHARS.sub("_", reward.name).strip("_")[:100] or reward.kind


def build_engine_config(
    config: dict[str, Any],
    model: ModelAsset,
    dataset: Dataset,
    rewards: Sequence[tuple[RewardFunction, float]],
    *,
    name: str,
) -> dict[str, Any]:
    """The full engine config: the experiment's config plus model, data and rewards from the registry."""
    full = copy.deepcopy(config)
    full.setdefault("name", _run_config_name(name))
    for section in ("model", "data"):
        if section in full and not isinstance(full[section], dict):
            raise InvalidInput.one(section, f"must be an object, got {type(full[section]).__name__}")
    full["model"] = {**full.get("model", {}), "path": model.path}
    full["data"] = {
        **full.get("data", {}),
        "path": dataset.path,
        "format": dataset.format,
        "prompt_field": dataset.prompt_field,
        "label_field": dataset.label_field or None,
    }
    specs = []
    for reward, weight in rewards:
        spec = dict(reward.spec) if isinstance(reward.spec, dict) else {}
        spec.setdefault("name", _reward_name(reward))  # metrics read reward/<registry name>
        spec["weight"] = weight
        specs.append(spec)
    full["rewards"] = specs
    return full


def _validated(full: dict[str, Any]) -> dict[str, Any]:
    """The engine's own validation (rl_engine.config): ConfigError becomes a 400 naming each `loc`."""
    from rl_engine.config import ConfigError, check_runnable, validate_config

    try:
        config = validate_config(full)
        check_runnable(config)  # refused at launch, not as a failed run later
    except ConfigError as exc:
        raise InvalidInput(exc.errors) from None
    return config.model_dump(mode="json")


def _nul_at(value: Any, loc: str = "") -> str | None:
    """Where a NUL character hides in a JSON value (Postgres jsonb cannot store one), or None."""
    if isinstance(value, str):
        return loc if "\x00" in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{loc}.{key}" if loc else str(key)
            if "\x00" in str(key):
                return here
            found = _nul_at(item, here)
            if found is not None:
                return found
    if isinstance(value, list):
        for i, item in enumerate(value):
            found = _nul_at(item, f"{loc}.{i}" if loc else str(i))
            if found is not None:
                return found
    return None


def _check_platform_fields(config: dict[str, Any]) -> None:
    errors = []
    for dotted, why in _PLATFORM_FIELDS.items():
        section, _, key = dotted.partition(".")
        if not key:
            present = section in config
        else:
            present = isinstance(config.get(section), dict) and key in config[section]
        if present:
            errors.append({"loc": dotted, "msg": f"{why}; leave it out of the config"})
    if errors:
        raise InvalidInput(errors)


def _check_rewards(rewards: Sequence[tuple[RewardFunction, float]]) -> list[tuple[RewardFunction, float]]:
    if not rewards:
        raise InvalidInput.one("rewards", "at least one reward function is required")
    errors, seen = [], set()
    for i, (reward, weight) in enumerate(rewards):
        if reward.pk in seen:
            errors.append({"loc": f"rewards[{i}].reward", "msg": f"reward {reward.name!r} is listed twice"})
        seen.add(reward.pk)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            errors.append({"loc": f"rewards[{i}].weight", "msg": "must be a finite number"})
    if errors:
        raise InvalidInput(errors)
    return [(reward, float(weight)) for reward, weight in rewards]


@dataclass(frozen=True)
class CheckedExperiment:
    rewards: list[tuple[RewardFunction, float]]
    # Validated, defaults filled in: what a run of the experiment gets, before its seed and run_dir.
    engine_config: dict[str, Any]


def experiment_check(
    *,
    name: str,
    model: ModelAsset,
    dataset: Dataset,
    rewards: Sequence[tuple[RewardFunction, float]],
    config: dict[str, Any],
) -> CheckedExperiment:
    """Every check `experiment_create` makes, writing nothing: the launch form validates with it as
    the researcher types, so the form and the create can never disagree."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidInput.one("name", "required")
    if len(name) > 200:
        raise InvalidInput.one("name", "at most 200 characters")
    if not isinstance(config, dict):
        raise InvalidInput.one("config", f"must be an object (the engine run config), got {type(config).__name__}")
    nul = _nul_at(config)
    if nul is not None:
        raise InvalidInput.one(nul or "config", "contains a NUL character")
    rewards = _check_rewards(rewards)
    _check_platform_fields(config)
    if "seed" in config:  # the launch defaults to it, so a seed the launch refuses is refused here already
        _clean_seed(config["seed"], 0)
    return CheckedExperiment(rewards, _validated(build_engine_config(config, model, dataset, rewards, name=name)))


def experiment_create(
    *,
    name: str,
    model: ModelAsset,
    dataset: Dataset,
    rewards: Sequence[tuple[RewardFunction, float]],
    config: dict[str, Any],
    user=None,
    description: str = "",
) -> Experiment:
    """An experiment whose config, completed from the registry, passes the engine's validation.

    `config` is stored as given (without model.path, data.* of the dataset, rewards, logging.run_dir)."""
    rewards = experiment_check(name=name, model=model, dataset=dataset, rewards=rewards, config=config).rewards
    with transaction.atomic():
        experiment = Experiment.objects.create(
            name=name.strip(),
            description=description or "",
            model=model,
            dataset=dataset,
            config=config,
            created_by=user if getattr(user, "is_authenticated", False) else None,
        )
        ExperimentReward.objects.bulk_create(
            ExperimentReward(experiment=experiment, reward=reward, weight=weight, position=i)
            for i, (reward, weight) in enumerate(rewards)
        )
    return experiment


def experiment_engine_config(experiment: Experiment) -> dict[str, Any]:
    rewards = [(link.reward, link.weight) for link in experiment.experimentreward_set.select_related("reward")]
    return build_engine_config(experiment.config, experiment.model, experiment.dataset, rewards, name=experiment.name)


# =============================================================================================
# The state machine
# =============================================================================================


def run_transition(run_id: uuid.UUID | str, from_states: Iterable[str], to_state: str, reason: str) -> bool:
    """Move a run from one of `from_states` to `to_state` if it is still there (compare-and-set).

    Returns True when this call made the change (and recorded it), False when the run was in another
    state: the caller lost a race or asked too late and must decide from the fresh state."""
    from_states = list(dict.fromkeys(from_states))
    for old in from_states:
        if to_state not in ALLOWED_TRANSITIONS[old]:
            raise ValueError(f"{old} -> {to_state} is not a transition of the run state machine")
    now = timezone.now()
    reason = (reason or "")[:_REASON_LIMIT]
    fields: dict[str, Any] = {"state": to_state, "state_reason": reason, "state_changed_at": now}
    if to_state == S.RUNNING:
        fields["started_at"] = now
    if to_state in TERMINAL_STATES:
        fields["finished_at"] = now
    with transaction.atomic():
        for old in from_states:
            if Run.objects.filter(pk=run_id, state=old).update(**fields):
                RunTransition.objects.create(run_id=run_id, from_state=old, to_state=to_state, reason=reason)
                # Open run pages learn of it on the live channel (the SSE stream re-reads the run).
                change = {"type": "state", "run": str(run_id), "from_state": old, "state": to_state, "reason": reason}
                transaction.on_commit(lambda: live.publish(run_id, [change]))
                return True
    return False


def _user_label(user) -> str:
    return getattr(user, "username", None) or "someone"


# =============================================================================================
# Launch, clone, resume, edit, cancel (web side)
# =============================================================================================


def _clean_seed(seed: Any, default: int) -> int:
    if seed is None:
        return default
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise InvalidInput.one("seed", f"must be an integer between 0 and {MAX_SEED}")
    return seed


def _clean_tags(tags: Any) -> list[str]:
    if tags is None:
        return []
    if not isinstance(tags, (list, tuple)):
        raise InvalidInput.one("tags", "must be a list of strings")
    cleaned: list[str] = []
    for i, tag in enumerate(tags):
        if not isinstance(tag, str) or not tag.strip():
            raise InvalidInput.one(f"tags[{i}]", "must be a non-empty string")
        tag = tag.strip()
        if len(tag) > MAX_TAG_LENGTH:
            raise InvalidInput.one(f"tags[{i}]", f"at most {MAX_TAG_LENGTH} characters")
        if tag not in cleaned:
            cleaned.append(tag)
    if len(cleaned) > MAX_TAGS:
        raise InvalidInput.one("tags", f"at most {MAX_TAGS} tags")
    return cleaned


def _clean_note(note: Any) -> str:
    if note is None:
        return ""
    if not isinstance(note, str):
        raise InvalidInput.one("note", "must be a string")
    if len(note) > MAX_NOTE_LENGTH:
        raise InvalidInput.one("note", f"at most {MAX_NOTE_LENGTH} characters")
    return note


def run_dir_for(run_id: uuid.UUID | str) -> Path:
    return Path(settings.STORAGE_ROOT) / "runs" / str(run_id)


def _create_queued_run(
    *,
    experiment: Experiment,
    config: dict[str, Any],
    seed: int,
    tags: list[str],
    note: str,
    user,
    reason: str,
    parent: Run | None = None,
    resume_from: Checkpoint | None = None,
) -> Run:
    run_id = uuid.uuid4()
    full = copy.deepcopy(config)
    full["seed"] = seed
    full["logging"] = {**(full.get("logging") or {}), "run_dir": str(run_dir_for(run_id))}
    resolved = _validated(full)
    with transaction.atomic():
        number = Run.objects.filter(experiment=experiment).count() + 1
        run = Run.objects.create(
            id=run_id,
            experiment=experiment,
            name=f"{experiment.name} #{number}"[:200],
            seed=seed,
            state=S.QUEUED,
            state_reason=reason,
            resolved_config=resolved,
            tags=tags,
            note=note,
            parent=parent,
            resume_from=resume_from,
            ingest_token_hash=token_hash(ingest_token(run_id)),
            created_by=user if getattr(user, "is_authenticated", False) else None,
        )
        RunTransition.objects.create(run=run, from_state=S.DRAFT, to_state=S.QUEUED, reason=reason)
        transaction.on_commit(lambda: _dispatch("run_submit", run_id))
    return run


def _dispatch(task_name: str, run_id: uuid.UUID | str) -> None:
    from workers import tasks

    getattr(tasks, task_name).delay(str(run_id))


def run_launch(
    experiment: Experiment, *, seed: int | None = None, tags: Any = None, note: Any = None, user=None
) -> Run:
    """A new run of the experiment, committed as `queued`; a Celery task submits its Ray job after commit."""
    seed = _clean_seed(
        seed, default=_clean_seed(experiment.config.get("seed"), 0) if isinstance(experiment.config, dict) else 0
    )
    return _create_queued_run(
        experiment=experiment,
        config=experiment_engine_config(experiment),
        seed=seed,
        tags=_clean_tags(tags),
        note=_clean_note(note),
        user=user,
        reason=f"launched by {_user_label(user)}",
    )


def run_clone(run: Run, *, seed: int | None = None, tags: Any = None, note: Any = None, user=None) -> Run:
    """A new run with exactly the source run's config (not the experiment's current one); new seed optional."""
    if not run.resolved_config:
        raise IllegalTransition("this run has no resolved config to clone (it was never launched)", run.state)
    return _create_queued_run(
        experiment=run.experiment,
        config=run.resolved_config,
        seed=_clean_seed(seed, run.seed),
        tags=_clean_tags(run.tags if tags is None else tags),
        note=_clean_note(note),
        user=user,
        reason=f"cloned from run {run.id} by {_user_label(user)}",
        parent=run,
    )


def run_resume(run: Run, checkpoint: Checkpoint, *, user=None) -> Run:
    """A new run that continues `run` from one of its checkpoints (engine: `--resume <checkpoint>`)."""
    if checkpoint.run_id != run.id:
        raise InvalidInput.one("checkpoint", f"checkpoint {checkpoint.pk} belongs to another run")
    if run.state not in TERMINAL_STATES:
        raise IllegalTransition(f"only a finished run can be resumed; this one is {run.state}", run.state)
    path = Path(checkpoint.path)
    storage = Path(settings.STORAGE_ROOT)
    if path.is_relative_to(storage) and not path.exists():  # outside our storage we cannot tell
        raise InvalidInput.one("checkpoint", f"the folder {path} no longer exists (pruned by checkpoint.keep_last?)")
    return _create_queued_run(
        experiment=run.experiment,
        config=run.resolved_config,
        seed=run.seed,
        tags=list(run.tags),
        note="",
        user=user,
        reason=f"resumed from run {run.id} step {checkpoint.step} by {_user_label(user)}",
        parent=run,
        resume_from=checkpoint,
    )


_UNSET = object()


def run_update(run: Run, *, tags: Any = _UNSET, note: Any = _UNSET) -> Run:
    """Tags and note are the only fields edited after launch."""
    fields = {}
    if tags is not _UNSET:
        fields["tags"] = _clean_tags(tags)
    if note is not _UNSET:
        fields["note"] = _clean_note(note)
    if fields:
        Run.objects.filter(pk=run.pk).update(**fields)
        for key, value in fields.items():
            setattr(run, key, value)
    return run


def run_cancel(run: Run, *, user=None) -> Run:
    """Ask a run to stop. Active runs go to `cancelling` and a task stops the Ray job; a finished run
    is refused (409); cancelling twice is harmless."""
    reason = f"cancel requested by {_user_label(user)}"
    for _ in range(5):  # each lost race re-reads the state; the machine has no cycles, so this ends
        state = Run.objects.filter(pk=run.pk).values_list("state", flat=True).first()
        if state is None or state in TERMINAL_STATES:
            raise IllegalTransition(f"the run already ended ({state}); there is nothing to cancel", state or "missing")
        if state == S.CANCELLING:
            break
        if state == S.DRAFT:
            if run_transition(run.pk, [S.DRAFT], S.CANCELLED, reason):
                break
            continue
        with transaction.atomic():
            if run_transition(run.pk, [state], S.CANCELLING, reason):
                transaction.on_commit(lambda: _dispatch("run_cancel", run.pk))
                break
    run.refresh_from_db()
    return run


# =============================================================================================
# Event ingestion
# =============================================================================================


@dataclass(frozen=True)
class IngestResult:
    acknowledged_seq: int
    stored: int


def events_ingest(run_id: uuid.UUID | str, events: list[dict[str, Any]], *, touch: bool = True) -> IngestResult:
    """Store a validated batch (see event_schema.parse_batch) exactly once.

    Events arrive contiguously: under the run's row lock, events with seq <= last_seq are already
    stored and dropped (this is what makes a retried batch harmless); the rest must continue at
    last_seq + 1 without gaps, else SeqConflict (409 with `expected_seq`) and nothing is stored."""
    now = timezone.now()
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        new = [e for e in events if e["seq"] > run.last_seq]
        expected = run.last_seq + 1
        for offset, event in enumerate(new):
            if event["seq"] != expected + offset:
                raise SeqConflict(
                    expected,
                    f"events must continue at seq {expected} without gaps; got seq {event['seq']} "
                    f"where {expected + offset} was expected",
                )
        update: dict[str, Any] = {"last_event_at": now} if touch else {}
        if new:
            summary = _store_events(run, new)
            if summary is not run.summary:
                update["summary"] = summary
            steps = [e["step"] for e in new if e.get("step") is not None]
            update["last_seq"] = new[-1]["seq"]
            if steps:
                update["last_step"] = max(steps + ([run.last_step] if run.last_step is not None else []))
        if update:
            Run.objects.filter(pk=run.pk).update(**update)
        for event in new:
            if event["type"] == "status":
                _apply_engine_status(run.pk, event["data"])
        if new:
            transaction.on_commit(lambda: live.publish(run.pk, new))
        return IngestResult(acknowledged_seq=update.get("last_seq", run.last_seq), stored=len(new))


def _store_events(run: Run, events: list[dict[str, Any]]) -> dict[str, Any]:
    """Insert the events' rows; returns the run summary with the batch's metrics (the same object
    when the batch has none)."""
    metrics, metric_events, samples, checkpoints, logs = [], [], [], [], []
    for e in events:
        kind, data, step = e["type"], e["data"], e.get("step")
        if kind == "metrics":
            metrics.append(MetricRow(run=run, seq=e["seq"], step=step, time=e["time"], values=data))
            metric_events.append(e)
        elif kind == "samples":
            samples.extend(_sample_row(run, e["seq"], step, record) for record in data["samples"])
        elif kind == "checkpoint":
            checkpoints.append(Checkpoint(run=run, seq=e["seq"], step=step, path=data["path"]))
        elif kind == "log":
            logs.append(
                RunLog(
                    run=run,
                    seq=e["seq"],
                    step=step,
                    time=e["time"],
                    level=data.get("level", "info"),
                    message=data["message"],
                )
            )
    MetricRow.objects.bulk_create(metrics, batch_size=1000)
    summary = series.append_metrics(run.pk, run.summary, metric_events)  # the column store the charts read
    # (run, step, index) and (run, step) are unique: a step recorded twice (an engine re-running a
    # step into the same run) keeps its first rows rather than refusing the whole batch.
    Sample.objects.bulk_create(samples, batch_size=1000, ignore_conflicts=True)
    Checkpoint.objects.bulk_create(checkpoints, ignore_conflicts=True)
    RunLog.objects.bulk_create(logs, batch_size=1000)
    return summary


def _sample_row(run: Run, seq: int, step: int, r: dict[str, Any]) -> Sample:
    label = r.get("label")
    return Sample(
        run=run,
        seq=seq,
        step=step,
        index=r["index"],
        group=r.get("group", 0),
        prompt=r["prompt"],
        response=r["response"],
        label=None if label is None else str(label),
        reward=finite_or_none(r.get("reward")),
        components=r.get("components") or {},
        advantage=finite_or_none(r.get("advantage")),
        length=r["length"],
        finish_reason=r["finish_reason"][:20],
        errors=r.get("errors") or [],
        kept=r.get("kept", True),
        turns=[
            {"role": t["role"], "text": t["text"], "reward": finite_or_none(t.get("reward"))}
            for t in r.get("turns") or []
        ],
        env={k: finite_or_none(v) for k, v in (r.get("env") or {}).items()},
    )


def _apply_engine_status(run_id: uuid.UUID, data: dict[str, Any]) -> None:
    """The engine's own status events drive running and the terminal states it knows about."""
    state, reason = data["state"], data.get("reason") or ""
    if state == "running":
        resumed = data.get("resumed_from")
        run_transition(
            run_id,
            [S.QUEUED, S.STARTING],
            S.RUNNING,
            f"engine started (resuming from {resumed})" if resumed else "engine started",
        )
    elif state == "succeeded":
        run_transition(
            run_id, [S.QUEUED, S.STARTING, S.RUNNING, S.CANCELLING], S.SUCCEEDED, reason or "engine finished every step"
        )
    elif state == "failed":
        if not run_transition(
            run_id, [S.QUEUED, S.STARTING, S.RUNNING], S.FAILED, reason or "engine reported a failure"
        ):
            # Stopping a job can surface as an engine failure (an interrupt): the user asked for it.
            run_transition(
                run_id, [S.CANCELLING], S.CANCELLED, f"cancelled (engine: {reason})" if reason else "cancelled"
            )


# =============================================================================================
# Dispatch to Ray (Celery worker side)
# =============================================================================================


class JobsClient(Protocol):
    """What the worker needs of Ray's Jobs API (workers/ray_jobs.py; tests pass a fake)."""

    def submit(self, run: Run) -> str: ...
    def stop(self, run: Run) -> bool: ...
    def status(self, run: Run) -> str | None: ...  # PENDING RUNNING STOPPED SUCCEEDED FAILED, None = no job
    def logs(self, run: Run) -> str: ...


JOB_TERMINAL = frozenset({"STOPPED", "SUCCEEDED", "FAILED"})


def _default_jobs() -> JobsClient:
    from workers import ray_jobs

    return ray_jobs


def run_submit(run_id: uuid.UUID | str, *, jobs: JobsClient | None = None) -> None:
    """queued → starting once the Ray job is submitted (submission id = run id, so a retried task
    cannot start the run twice); a submit that fails ends the run `failed` with the reason."""
    run = Run.objects.filter(pk=run_id).first()
    if run is None or run.state != S.QUEUED:
        return  # gone, cancelled before it started, or already submitted by an earlier delivery
    jobs = jobs or _default_jobs()
    try:
        jobs.submit(run)
    except JobsUnavailable as exc:
        waited = (timezone.now() - run.state_changed_at).total_seconds()
        if waited < settings.RUN_SUBMIT_TIMEOUT_S:
            logger.info("Ray cannot take run %s yet (%s); the submit will be retried", run.pk, exc)
            raise  # the task retries with backoff; the reconcile resubmits runs left queued
        run_transition(run.pk, [S.QUEUED], S.FAILED, f"Ray did not accept the job within {int(waited)} s: {exc}")
        return
    except Exception as exc:
        logger.warning("submitting run %s failed", run.pk, exc_info=True)
        run_transition(run.pk, [S.QUEUED], S.FAILED, f"submitting the Ray job failed: {type(exc).__name__}: {exc}")
        return
    if not run_transition(run.pk, [S.QUEUED], S.STARTING, "Ray job submitted"):
        run.refresh_from_db()
        if run.state in (S.CANCELLING, S.CANCELLED):  # cancelled while we were submitting
            jobs.stop(run)
            run_reconcile(run, jobs=jobs)


def run_stop(run_id: uuid.UUID | str, *, jobs: JobsClient | None = None, wait_s: float = 20.0) -> None:
    """The worker side of a cancel: stop the Ray job, wait (bounded) until Ray says it ended, then
    settle the run. If Ray is slow, the periodic reconcile finishes the job later."""
    run = Run.objects.filter(pk=run_id).first()
    if run is None or run.state != S.CANCELLING:
        return
    jobs = jobs or _default_jobs()
    jobs.stop(run)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        status = jobs.status(run)
        if status is None or status in JOB_TERMINAL:
            break
        time.sleep(0.5)
    run_reconcile(run, jobs=jobs)


def _log_tail(text: str, max_lines: int = 30, max_chars: int = 3000) -> str:
    tail = "\n".join(text.strip().splitlines()[-max_lines:])
    return tail[-max_chars:]


def _recover_from_run_folder(run: Run) -> int:
    """After the job ended: store any events of the run folder's events.jsonl the platform never got
    (the engine could not deliver them before it exited). Needs the storage shared with the cluster;
    otherwise there is nothing to read and nothing happens."""
    from rl_engine.events import EVENTS_FILE, read_events

    run_dir = (run.resolved_config or {}).get("logging", {}).get("run_dir")
    if not run_dir:
        return 0
    path = Path(run_dir) / EVENTS_FILE
    try:
        events = [e for e in read_events(path) if isinstance(e, dict) and isinstance(e.get("seq"), int)]
    except (OSError, ValueError):
        logger.warning("cannot read %s to recover events of run %s", path, run.pk, exc_info=True)
        return 0
    from posttrain.runs.event_schema import parse_batch

    run.refresh_from_db(fields=["last_seq"])
    missing = [e for e in events if e["seq"] > run.last_seq]
    stored = 0
    for start in range(0, len(missing), 500):
        try:
            chunk = parse_batch({"events": missing[start : start + 500]}, str(run.pk))
            stored += events_ingest(run.pk, chunk, touch=False).stored
        except (InvalidInput, SeqConflict) as exc:
            logger.warning("recovering events of run %s from %s stopped: %s", run.pk, path, exc)
            break
    if stored:
        logger.info("recovered %d events of run %s from %s", stored, run.pk, path)
    return stored


def run_reconcile(run: Run, *, jobs: JobsClient | None = None, now=None) -> None:
    """Bring one active run (starting, running, cancelling) in line with its Ray job."""
    jobs = jobs or _default_jobs()
    run.refresh_from_db()
    if run.state not in ACTIVE_STATES:
        return
    status = jobs.status(run)
    active = [S.STARTING, S.RUNNING, S.CANCELLING]
    if status is None or status in JOB_TERMINAL:
        _recover_from_run_folder(run)
        run.refresh_from_db()
        if run.state not in ACTIVE_STATES:
            return  # the engine's own final status was among the recovered events
    if status is None:
        if run.state == S.CANCELLING:
            run_transition(run.pk, [S.CANCELLING], S.CANCELLED, "cancelled")
        else:
            run_transition(
                run.pk,
                [S.STARTING, S.RUNNING],
                S.FAILED,
                f"the Ray job {run.pk} does not exist (was the Ray cluster restarted?)",
            )
    elif status == "SUCCEEDED":
        run_transition(run.pk, active, S.SUCCEEDED, "the Ray job succeeded (the engine's final status never arrived)")
    elif status == "STOPPED":
        reason = "cancelled" if run.state == S.CANCELLING else "the Ray job was stopped outside Posttrain"
        run_transition(run.pk, active, S.CANCELLED, reason)
    elif status == "FAILED":
        if run.state == S.CANCELLING:
            run_transition(run.pk, [S.CANCELLING], S.CANCELLED, "cancelled")
        else:
            tail = _log_tail(jobs.logs(run))
            run_transition(
                run.pk,
                [S.STARTING, S.RUNNING],
                S.FAILED,
                f"the Ray job failed:\n{tail}" if tail else "the Ray job failed (no logs)",
            )
    elif run.state == S.CANCELLING:
        jobs.stop(run)  # the cancel task may have died before Ray stopped it; ask again
    elif status == "RUNNING":
        _fail_if_lost(run, jobs, now or timezone.now())


def _fail_if_lost(run: Run, jobs: JobsClient, now) -> None:
    """A job Ray calls running whose engine sent nothing for RUN_HEARTBEAT_TIMEOUT_S is lost: the
    platform can no longer tell what it does, so the run fails and the job is stopped."""
    timeout = float(settings.RUN_HEARTBEAT_TIMEOUT_S)
    last = run.last_event_at or run.state_changed_at
    if last is None or now - last < timedelta(seconds=timeout):
        return
    hint = "" if run.last_event_at else f" (no event ever arrived: can the engine reach {settings.PUBLIC_URL}?)"
    if run_transition(run.pk, [S.STARTING, S.RUNNING], S.FAILED, f"lost: no event for {timeout:g}s{hint}"):
        jobs.stop(run)


def runs_reconcile(*, jobs: JobsClient | None = None, queued_grace_s: float = 60.0) -> int:
    """The periodic check (Celery beat): every active run against its Ray job; runs queued for
    longer than `queued_grace_s` (their submit task was lost) are submitted again (idempotent)."""
    jobs = jobs or _default_jobs()
    checked = 0
    for run in Run.objects.filter(state__in=ACTIVE_STATES).order_by("created_at"):
        try:
            run_reconcile(run, jobs=jobs)
        except Exception:  # one unreachable job must not stop the others from being checked
            logger.warning("reconciling run %s failed", run.pk, exc_info=True)
        checked += 1
    stale = timezone.now() - timedelta(seconds=queued_grace_s)
    for run_id in Run.objects.filter(state=S.QUEUED, state_changed_at__lt=stale).values_list("pk", flat=True):
        try:
            run_submit(run_id, jobs=jobs)
        except JobsUnavailable:
            pass  # still queued; the next check tries again
        checked += 1
    return checked
