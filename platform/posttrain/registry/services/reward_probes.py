"""Reward probes: a registered reward scored on adversarial answers built from a dataset against the honest
ones (rl_engine.reward_probes), as a `RewardProbe` job (queued -> running -> done | failed) that a worker on
the `user_code` queue runs like "Try it": python rewards in the engine's sandbox, HTTP rewards under the
outbound policy, reward models in a separate process; never in the web process, which only records the job
and reads its report.

Celery's soft time limit ends a probe as failed ("stopped at the time limit"), its hard limit kills the
worker's child, and `reward_probes_expire` (beat, with the trials) fails whatever such a kill left behind.
docs/REWARD_HACKING.md, "Reward probes".
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.db import transaction
from django.utils import timezone

from posttrain.core.task_queue import task_send
from posttrain.registry.models import Dataset, RewardFunction, RewardProbe
from posttrain.registry.services.common import invalid, user_or_none
from posttrain.registry.services.reward_try import reward_score, scoring_spec
from rl_engine.spec.user_code import DataError, build_cases, hackability_report, read_rows, sandbox

STALE_GRACE_S = 60.0
UNFINISHED = (RewardProbe.State.QUEUED, RewardProbe.State.RUNNING)


def reward_probe_start(
    reward: RewardFunction, dataset: Dataset, user: User | AnonymousUser | None = None
) -> RewardProbe:
    """Record a probe of `reward` on `dataset` and send it to the user-code worker after commit. Refuses a
    dataset without a label field (nothing to be honest against); returns the queued probe (the client
    follows it at its URL)."""
    if not dataset.label_field:
        raise invalid("dataset", f"dataset {dataset.name!r} has no label field: probes score answers against it")
    probe = RewardProbe.objects.create(reward=reward, dataset=dataset, created_by=user_or_none(user))
    _dispatch(probe)
    return probe


def _dispatch(probe: RewardProbe) -> None:
    """Sent after commit: the worker must see the row."""
    transaction.on_commit(lambda: task_send("reward_probe_run", str(probe.pk)))


def reward_probe_run(probe_id: Any) -> None:
    """The worker's side: claim the queued probe (compare-and-set), build the cases from the dataset, score
    them with the reward as a run would, store the report. A reward failing on samples is part of the
    report (they score 0, counted per probe); a failure to run at all fails the probe with its reason."""
    claimed = RewardProbe.objects.filter(pk=probe_id, state=RewardProbe.State.QUEUED).update(
        state=RewardProbe.State.RUNNING, started_at=timezone.now()
    )
    if not claimed:
        return
    probe = RewardProbe.objects.select_related("reward", "dataset").get(pk=probe_id)
    try:
        spec = scoring_spec(probe.reward.spec)
        if spec.get("type") == "python":
            sandbox.require()  # no sandbox here: the probe says what to install, the code does not run
        cases = build_cases(_dataset_rows(probe.dataset), seed=0)
        scored = reward_score(spec, [case.as_sample() for case in cases])
        report = hackability_report(cases, scored["scores"], scored["errors"])
        first_row = cases[0].row
        examples = [
            {"probe": case.probe, "response": case.response[:500], "score": score}
            for case, score in zip(cases, scored["scores"])
            if case.row == first_row
        ]
    except SoftTimeLimitExceeded:
        _finish(probe, RewardProbe.State.FAILED, error=_stopped_at_time_limit())
        return
    except (sandbox.SandboxUnavailable, DataError, ValueError) as exc:
        _finish(probe, RewardProbe.State.FAILED, error=str(exc)[:2000])
        return
    except Exception as exc:
        _finish(probe, RewardProbe.State.FAILED, error=f"{type(exc).__name__}: {exc}"[:2000])
        raise
    _finish(probe, RewardProbe.State.DONE, result=report, examples=examples)


def reward_probes_expire(now: Any = None) -> int:
    """Fail the probes no worker can finish any more: killed at the user-code hard time limit, or never taken.
    Periodic (beat, with `reward_trials_expire`); returns how many."""
    now = now or timezone.now()
    stale = now - timedelta(seconds=settings.USER_CODE_TIME_LIMIT_S + STALE_GRACE_S)
    queued_long_ago = now - timedelta(seconds=settings.REWARD_PROBE_QUEUE_S)
    return RewardProbe.objects.filter(state=RewardProbe.State.RUNNING, started_at__lt=stale).update(
        state=RewardProbe.State.FAILED,
        error=f"no worker finished it: the user-code worker stops user code after "
        f"{settings.USER_CODE_TIME_LIMIT_S:g}s; try again",
        finished_at=now,
    ) + RewardProbe.objects.filter(state=RewardProbe.State.QUEUED, created_at__lt=queued_long_ago).update(
        state=RewardProbe.State.FAILED,
        error=f"no worker took it within {settings.REWARD_PROBE_QUEUE_S:g}s: is the user-code worker running "
        f"(`celery -A workers.celery_app worker -Q {settings.USER_CODE_QUEUE}`)? Try again",
        finished_at=now,
    )


def _dataset_rows(dataset: Dataset) -> list[tuple[str, str | None, dict[str, Any]]]:
    """(prompt, label, metadata) of every row of the stored dataset file, by the dataset's fields."""
    rows = []
    for number, row in enumerate(read_rows(dataset.path, dataset.format), start=1):
        prompt = row.get(dataset.prompt_field)
        if not isinstance(prompt, str):
            raise DataError(f"row {number}: field {dataset.prompt_field!r} is missing or not text")
        label = row.get(dataset.label_field)
        metadata = {k: v for k, v in row.items() if k not in (dataset.prompt_field, dataset.label_field)}
        rows.append((prompt, None if label is None else str(label), metadata))
    return rows


def _stopped_at_time_limit() -> str:
    return f"stopped at the user-code time limit ({settings.USER_CODE_SOFT_TIME_LIMIT_S:g}s): the reward is too slow"


def _finish(
    probe: RewardProbe,
    state: str,
    *,
    result: dict[str, Any] | None = None,
    examples: list[dict[str, Any]] | None = None,
    error: str = "",
) -> None:
    RewardProbe.objects.filter(pk=probe.pk, state=RewardProbe.State.RUNNING).update(
        state=state, result=result, examples=examples or [], error=error, finished_at=timezone.now()
    )
