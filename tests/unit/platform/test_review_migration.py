"""Migration review 0002: items that pointed at runs.Sample rows get their own copy of those rollouts, with
the reference (run, step, index), and keep their judgements."""

from __future__ import annotations

import pytest

from tests.support.migrations import a_run, latest_schema_after, migrate_to

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["latest_schema_after"]  # the fixture, used by name

BEFORE = [("review", "0001_initial")]
AFTER = [("review", "0002_rollout_copies_gold_adjudication_judges")]


# runs.Sample is dropped once the rollouts moved to files (runs 0013, which needs review 0002 first): runs stays
# where the table still exists, and the apps split from it later (which need runs 0016 and 0017) unapplied.
RUNS_WITH_SAMPLES = ("runs", "0012_samples_to_rollout_files")
NOT_YET_SPLIT = [("scheduling", None), ("telemetry", None)]


def _migrate(review_target):
    """Every other app at its latest migration (runs where Sample still exists), review at `review_target`."""
    return migrate_to([RUNS_WITH_SAMPLES, *NOT_YET_SPLIT, *review_target])


def test_existing_items_keep_what_they_showed_as_their_own_copy(latest_schema_after):
    old = _migrate(BEFORE)
    try:
        user = old.get_model("auth", "User").objects.create(username="ann")
        run = a_run(old)
        sample_model = old.get_model("runs", "Sample")
        first, second = (
            sample_model.objects.create(
                run=run,
                step=3,
                index=i,
                group=1,
                prompt="2+2=",
                response=text,
                label="4",
                reward=reward,
                components={"exact": reward},
                length=1,
                finish_reason="stop",
                tokens={"text": [text]} if i else {},
            )
            for i, (text, reward) in enumerate((("4", 1.0), ("5", 0.0)))
        )
        campaign = old.get_model("review", "Campaign").objects.create(
            name="c", kind="pair", questions=[], source={"runs": [str(run.pk)]}
        )
        item_model = old.get_model("review", "ReviewItem")
        pair = item_model.objects.create(campaign=campaign, position=0, sample_a=first, sample_b=second)
        single = item_model.objects.create(campaign=campaign, position=1, sample_a=second)
        old.get_model("review", "Judgement").objects.create(item=pair, annotator=user, answers={"better": "A"})
    finally:
        new = _migrate(AFTER)

    items = new.get_model("review", "ReviewItem").objects.select_related("rollout_a", "rollout_b")
    migrated_pair, migrated_single = items.get(pk=pair.pk), items.get(pk=single.pk)
    a, b = migrated_pair.rollout_a, migrated_pair.rollout_b
    assert (str(a.run_id), a.step, a.index, a.group) == (str(run.pk), 3, 0, 1)
    assert (a.prompt, a.response, a.label, a.reward, a.components, a.finish_reason) == (
        "2+2=",
        "4",
        "4",
        1.0,
        {"exact": 1.0},
        "stop",
    )
    assert (b.response, b.reward, b.tokens) == ("5", 0.0, {"text": ["5"]})
    assert migrated_single.rollout_a_id == b.pk and migrated_single.rollout_b_id is None  # one copy per sample
    assert new.get_model("review", "Judgement").objects.get(item_id=pair.pk).answers == {"better": "A"}
    assert migrated_pair.review_state == "" and migrated_pair.gold is None
