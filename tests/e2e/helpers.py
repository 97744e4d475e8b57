"""Rows of the e2e tests that are not fixtures: users with the e2e password, an experiment over placeholder
registry rows, runs as ingestion would have left them (the runs list's and the queue page's tests). The
platform's own row helpers are tests/unit/platform/helpers.py's."""

from __future__ import annotations

import uuid

from django.utils import timezone

from tests.support.browser import PASSWORD


def a_researcher(username: str):
    """A researcher who maintains the default project, where these tests' rows are."""
    from posttrain.accounts.services import user_create
    from tests.unit.platform.helpers import join

    return join(user_create(username, PASSWORD, "researcher"), "maintainer")


def an_experiment(name: str):
    from posttrain.registry.models import Dataset, ModelAsset
    from posttrain.runs.models import Experiment

    model = ModelAsset.objects.create(name=f"qwen-tiny-{uuid.uuid4().hex[:6]}", path="/nonexistent/model")
    dataset = Dataset.objects.create(
        name="gsm-mini",
        sha256=uuid.uuid4().hex * 2,
        format="jsonl",
        path="/nonexistent/data.jsonl",
        size_bytes=1,
        row_count=1,
    )
    return Experiment.objects.create(name=name, model=model, dataset=dataset, config={})


def a_run(
    experiment,
    name: str,
    state: str,
    reward: tuple[float, float] | None = None,
    eval_reward: tuple[float, float] | None = None,
    **fields,
):
    """A run as ingestion would have left it: `reward` and `eval_reward` are (last, best) of reward/mean
    and eval/reward/mean."""
    from posttrain.runs.models import Run

    summary = {}
    if reward:
        summary["reward/mean"] = {"last": reward[0], "step": 20, "min": 0.05, "max": reward[1], "count": 20}
    if eval_reward:
        summary["eval/reward/mean"] = {
            "last": eval_reward[0],
            "step": 20,
            "min": 0.1,
            "max": eval_reward[1],
            "count": 3,
        }
    return Run.objects.create(
        experiment=experiment,
        name=name,
        state=state,
        resolved_config={"algorithm": {"name": "grpo"}},
        summary=summary,
        last_step=20 if reward else None,
        started_at=timezone.now(),
        **fields,
    )
