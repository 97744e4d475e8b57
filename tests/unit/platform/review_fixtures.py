"""Helpers of the review tests (imported by the test_review_* modules): runs whose samples arrive the
real way (services.events_ingest), annotators, and campaigns over them."""

from __future__ import annotations

from typing import Any

from posttrain.review import services as review
from posttrain.review.models import Campaign, ReviewItem
from posttrain.runs import services
from posttrain.runs.models import Run, RunState
from tests.unit.platform.runs_fixtures import event, make_run, sample_record

PASS_FAIL = [{"key": "correct", "kind": "pass_fail", "label": "Is the answer correct?"}]
PREFERENCE = [{"key": "better", "kind": "pairwise", "label": "Which answer is better?"}]


def run_with_samples(experiment: Any, steps: dict[int, list[dict[str, Any]]], name: str = "") -> Run:
    """A running run whose samples events (one per step) were ingested like the engine's."""
    run = make_run(experiment, RunState.RUNNING, name=name)
    events = [
        event(run, seq, "samples", step, {"samples": samples})
        for seq, (step, samples) in enumerate(sorted(steps.items()), start=1)
    ]
    services.events_ingest(run.id, events)
    return run


def sample(
    index: int, reward: float | None, prompt: str, response: str, group: int = 0, **extra: Any
) -> dict[str, Any]:
    return sample_record(
        index,
        reward=reward,
        prompt=prompt,
        response=response,
        group=group,
        components=extra.pop("components", {"exact_answer": reward}),
        **extra,
    )


def single_campaign(
    runs: list[Run],
    annotators: list[Any],
    *,
    k: int = 10,
    overlap: int = 1,
    rule: str = "random",
    questions: list[dict] | None = None,
    activate: bool = True,
    **fields: Any,
) -> Campaign:
    campaign = review.campaign_create(
        name="review",
        kind="single",
        questions=questions or PASS_FAIL,
        source={"runs": [str(r.id) for r in runs], "rule": rule, "k": k, "seed": 7, **fields.pop("source", {})},
        overlap=overlap,
        annotators=annotators,
        **fields,
    )
    return review.campaign_activate(campaign) if activate else campaign


def pair_campaign(
    runs: list[Run],
    annotators: list[Any],
    *,
    k: int = 10,
    overlap: int = 1,
    activate: bool = True,
    questions: list[dict] | None = None,
    **fields: Any,
) -> Campaign:
    campaign = review.campaign_create(
        name="prefs",
        kind="pair",
        questions=questions or PREFERENCE,
        source={"runs": [str(r.id) for r in runs], "rule": "random", "k": k, "seed": 3, **fields.pop("source", {})},
        overlap=overlap,
        annotators=annotators,
        **fields,
    )
    return review.campaign_activate(campaign) if activate else campaign


def shown_as(item: ReviewItem, sample_id: int) -> str:
    """The letter the annotator sees on the response of this sample ("A" is the one shown first)."""
    first_shown = item.sample_b_id if item.display_swap else item.sample_a_id
    return "A" if sample_id == first_shown else "B"
