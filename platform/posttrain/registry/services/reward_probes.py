"""Reward probes: a registered reward scored on adversarial answers built from a dataset against the honest
ones (rl_engine.reward_probes), as a `RewardProbe` job (queued -> running -> done | failed) that a worker on
the `user_code` queue runs like "Try it": python rewards in the engine's sandbox, HTTP rewards under the
outbound policy, reward models in a separate process; never in the web process, which only records the job
and reads its report.

Celery's soft time limit ends a probe as failed ("stopped at the time limit"), its hard limit kills the
worker's child, and `worker_jobs_expire` (beat, posttrain.core.job_runner) fails whatever such a kill left behind.
docs/REWARD_HACKING.md, "Reward probes".
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AnonymousUser, User

from posttrain.core.job_runner import job_dispatch, job_run
from posttrain.registry.models import Dataset, RewardFunction, RewardProbe
from posttrain.registry.services.common import invalid, user_or_none
from posttrain.registry.services.reward_try import reward_score, scoring_spec
from rl_engine.spec.user_code import DataError, build_cases, hackability_report, read_rows


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
    job_dispatch(probe)


def reward_probe_run(probe_id: Any) -> None:
    """The worker's side (posttrain.core.job_runner): build the cases from the dataset, score them with the
    reward as a run would, store the report. A reward failing on samples is part of the report (they score 0,
    counted per probe); a failure to run at all fails the probe with its reason."""
    job_run(
        RewardProbe,
        probe_id,
        _probe,
        needs_sandbox=lambda probe: probe.reward.spec.get("type") == "python",
        expected=(DataError, ValueError),
        related=("reward", "dataset"),
    )


def _probe(probe: RewardProbe) -> dict[str, Any]:
    spec = scoring_spec(probe.reward.spec)
    cases = build_cases(_dataset_rows(probe.dataset), seed=0)
    scored = reward_score(spec, [case.as_sample() for case in cases])
    report = hackability_report(cases, scored["scores"], scored["errors"])
    first_row = cases[0].row
    examples = [
        {"probe": case.probe, "response": case.response[:500], "score": score}
        for case, score in zip(cases, scored["scores"])
        if case.row == first_row
    ]
    return {"result": report, "examples": examples}


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
