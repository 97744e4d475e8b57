"""Review services: sampling items from runs, campaign states, and the queue (locks, overlap, skips)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from posttrain.core.errors import IllegalTransition, InvalidInput, ItemUnavailable, NotAssigned
from posttrain.review import selectors
from posttrain.review import services as review
from posttrain.review.models import CampaignState, Judgement, ReviewItem
from posttrain.review.selectors import campaign_for_annotator
from tests.unit.platform.helpers import (
    PASS_FAIL,
    PREFERENCE,
    a_campaign_owner,
    default_project,
    pair_campaign,
    run_with_samples,
    sample,
    shown_as,
    single_campaign,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch")]

YES = {"correct": True}


@pytest.fixture
def annotators(make_user):
    return [make_user("annotator", name) for name in ("ann", "bob", "cat")]


@pytest.fixture
def run(experiment):
    """Two steps of four samples; rewards 0.1·index (+1 at step 2); two components that disagree most on index 2."""

    def step(offset: float) -> list[dict]:
        return [
            sample(
                i,
                offset + 0.1 * i,
                f"question {i // 2}",
                str(i + 1),
                group=i // 2,
                components={"exact_answer": float(i % 2), "format": 1.0 if i != 2 else -3.0},
            )
            for i in range(4)
        ]

    return run_with_samples(experiment, {1: step(0.0), 2: step(1.0)}, name="r1")


def _picked(campaign) -> set[tuple[int, int]]:
    return {(item.rollout_a.step, item.rollout_a.index) for item in campaign.items.select_related("rollout_a")}


# --- sampling ---------------------------------------------------------------------------------


def test_lowest_and_highest_reward_pick_k_samples_per_step(run, annotators):
    lowest = single_campaign([run], annotators, k=1, rule="lowest_reward", activate=False)
    highest = single_campaign([run], annotators, k=2, rule="highest_reward", activate=False)
    assert _picked(lowest) == {(1, 0), (2, 0)}
    assert _picked(highest) == {(1, 3), (1, 2), (2, 3), (2, 2)}
    assert {i.selection["rule"] for i in highest.items.all()} == {"highest_reward"}


def test_component_disagreement_picks_the_largest_spread_between_components(run, annotators):
    campaign = single_campaign(
        [run],
        annotators,
        k=1,
        rule="component_disagreement",
        activate=False,
        source={"components": ["exact_answer", "format"]},
    )
    assert _picked(campaign) == {(1, 2), (2, 2)}  # exact 0 vs format −3: spread 3
    assert {i.selection["score"] for i in campaign.items.all()} == {3.0}


def test_reward_vs_component_picks_where_the_reward_and_the_verifier_differ_most(run, annotators):
    campaign = single_campaign(
        [run], annotators, k=1, rule="reward_vs_component", activate=False, source={"components": ["exact_answer"]}
    )
    # step 1: |0.1i − i%2| is largest at i=1 (0.9); step 2: |1 + 0.1i − i%2| is largest at i=2 (1.2).
    assert _picked(campaign) == {(1, 1), (2, 2)}


def test_random_selection_is_deterministic_by_seed(run, annotators):
    def draw(seed: int) -> list[tuple[int, int]]:
        campaign = single_campaign([run], annotators, k=2, activate=False, source={"seed": seed})
        return [
            (i.rollout_a.step, i.rollout_a.index)
            for i in campaign.items.select_related("rollout_a").order_by("position")
        ]

    assert draw(1) == draw(1)
    assert len(draw(1)) == 4
    assert {tuple(draw(seed)) for seed in range(6)} != {tuple(draw(1))}  # other seeds, other draws


def test_steps_limit_the_selection(run, annotators):
    campaign = single_campaign([run], annotators, k=10, activate=False, source={"steps": [2]})
    assert {step for step, _ in _picked(campaign)} == {2}
    ranged = single_campaign([run], annotators, k=10, activate=False, source={"step_range": [1, 1]})
    assert {step for step, _ in _picked(ranged)} == {1}


def test_pairs_within_a_run_are_two_different_responses_of_one_prompt_group(run, annotators):
    campaign = pair_campaign([run], annotators, k=10, activate=False)
    items = list(campaign.items.select_related("rollout_a", "rollout_b"))
    assert len(items) == 4  # two groups of two, at two steps
    for item in items:
        a, b = item.rollout_a, item.rollout_b
        assert (a.step, a.group, a.prompt) == (b.step, b.group, b.prompt)
        assert a.pk != b.pk and a.response != b.response
        assert item.selection["pairing"] == "same_group"


def test_pairs_across_two_runs_match_the_same_prompt_text(experiment, annotators):
    first = run_with_samples(experiment, {1: [sample(0, 1.0, "2+2=", "4"), sample(1, 0.0, "3+3=", "6")]}, name="a")
    second = run_with_samples(
        experiment,
        {1: [sample(0, 0.0, "2+2=", "5"), sample(1, 0.0, "9+9=", "18")], 3: [sample(0, 1.0, "2+2=", "four")]},
        name="b",
    )
    same = pair_campaign([first, second], annotators, activate=False)
    (item,) = same.items.select_related("rollout_a__run", "rollout_b__run")
    assert (item.rollout_a.run_id, item.rollout_b.run_id) == (first.id, second.id)
    assert (item.rollout_a.response, item.rollout_b.response) == ("4", "5")
    latest = pair_campaign([first, second], annotators, activate=False, source={"pair_steps": "latest"})
    (item,) = latest.items.select_related("rollout_b")
    assert item.rollout_b.response == "four" and item.selection["step"] == {"a": 1, "b": 3}


def test_pairs_skip_responses_with_the_same_text(experiment, annotators):
    run = run_with_samples(
        experiment,
        {
            1: [
                sample(0, 0.0, "q", "same", group=0),
                sample(1, 0.0, "q", "same", group=0),
                sample(2, 0.0, "q", "other", group=0),
                sample(3, 0.0, "r", "dup", group=1),
                sample(4, 0.0, "r", "dup", group=1),
            ]
        },
    )
    campaign = pair_campaign([run], annotators, activate=False)
    (item,) = campaign.items.select_related("rollout_a", "rollout_b")
    assert {item.rollout_a.response, item.rollout_b.response} == {"same", "other"}


def test_pair_sources_take_one_run_or_two(run, experiment, annotators):
    runs = [str(run_with_samples(experiment, {1: [sample(0, 0.0, "q", "a")]}).id) for _ in range(3)]
    with pytest.raises(InvalidInput) as refused:
        review.campaign_create(
            name="x",
            kind="pair",
            questions=[{"key": "b", "kind": "pairwise", "label": "B?"}],
            source={"runs": runs},
            annotators=annotators,
            project=default_project(),
            user=a_campaign_owner(),
        )
    assert refused.value.errors[0]["loc"] == "source.runs"
    with pytest.raises(InvalidInput) as single:
        single_campaign([run], annotators, activate=False, source={"pair_steps": "latest"})
    assert single.value.errors[0]["loc"] == "source.pair_steps"


def test_a_source_that_selects_nothing_is_refused_naming_the_field(run, annotators):
    with pytest.raises(InvalidInput) as refused:
        single_campaign([run], annotators, activate=False, source={"steps": [99]})
    assert refused.value.errors[0]["loc"] == "source"
    assert "selects no items" in refused.value.errors[0]["msg"]


def test_every_invalid_field_is_reported_at_once(run, annotators, researcher):
    with pytest.raises(InvalidInput) as refused:
        review.campaign_create(
            name="",
            kind="single",
            overlap=0,
            annotators=[researcher],
            questions=[{"key": "q", "kind": "rating", "label": "Q", "min": 5, "max": 1}],
            source={"runs": [str(run.id)], "rule": "component_disagreement", "components": ["only_one"], "k": 0},
            project=default_project(),
            user=a_campaign_owner(),
        )
    assert {e["loc"] for e in refused.value.errors} == {
        "name",
        "overlap",
        "annotators[0]",
        "questions[0].max",
        "source.k",
        "source.components",
    }


def test_guidelines_are_markdown_and_a_rubric_has_one_description_per_point(run, annotators, researcher):
    rating = {"key": "q", "kind": "rating", "label": "Q", "min": 1, "max": 3, "help": "Mind **units**."}
    with pytest.raises(InvalidInput) as refused:
        single_campaign([run], annotators, questions=[{**rating, "rubric": ["bad", "good"]}], activate=False)
    assert refused.value.errors == [
        {"loc": "questions[0].rubric", "msg": "must be a list of 3 descriptions, one per point from 1 to 3"}
    ]
    campaign = single_campaign(
        [run],
        annotators,
        questions=[{**rating, "rubric": ["Wrong.", "", "Right <script>x</script>."]}],
        instructions="# Read\n<b>raw</b> [link](javascript:alert(1))",
        activate=False,
    )
    shown = campaign_for_annotator(campaign)
    assert shown["instructions_html"] == (
        "<h1>Read</h1>\n<p>&lt;b&gt;raw&lt;/b&gt; [link](javascript:alert(1))</p>\n"
    )  # raw HTML escaped, a script link left as text
    (question,) = shown["questions"]
    assert question["help_html"] == "<p>Mind <strong>units</strong>.</p>\n"
    assert question["rubric_html"] == ["<p>Wrong.</p>\n", "", "<p>Right &lt;script&gt;x&lt;/script&gt;.</p>\n"]


def test_a_campaign_has_at_most_one_steps_question_and_only_for_single_responses(run, annotators):
    steps = {"key": "s", "kind": "steps", "label": "S"}
    with pytest.raises(InvalidInput) as refused:
        single_campaign([run], annotators, questions=[steps, {**steps, "key": "t"}], activate=False)
    assert refused.value.errors == [
        {"loc": "questions", "msg": "at most one steps question (the first wrong step) per campaign"}
    ]
    with pytest.raises(InvalidInput) as refused:
        pair_campaign([run], annotators, questions=[steps, *PREFERENCE], activate=False)
    assert refused.value.errors[0] == {
        "loc": "questions[0].kind",
        "msg": "steps questions label one response: a single campaign",
    }


# --- campaign states --------------------------------------------------------------------------


def test_activation_needs_as_many_annotators_as_the_overlap(run, annotators):
    campaign = single_campaign([run], annotators[:1], overlap=2, activate=False)
    with pytest.raises(IllegalTransition, match="assign at least 2"):
        review.campaign_activate(campaign)
    review.campaign_update(campaign, annotators=annotators[:2])
    assert review.campaign_activate(campaign).state == CampaignState.ACTIVE


def test_a_closed_campaign_cannot_be_activated_or_closed_again(run, annotators):
    campaign = review.campaign_close(single_campaign([run], annotators))
    for change in (review.campaign_activate, review.campaign_close):
        with pytest.raises(IllegalTransition) as refused:
            change(campaign)
        assert refused.value.state == "closed"


def test_no_work_is_handed_out_in_a_draft_or_closed_campaign(run, annotators):
    ann = annotators[0]
    draft = single_campaign([run], [ann], activate=False)
    with pytest.raises(IllegalTransition):
        review.item_claim_next(draft, ann)
    active = single_campaign([run], [ann])
    item = review.item_claim_next(active, ann)
    review.campaign_close(active)
    with pytest.raises(IllegalTransition):
        review.judgement_submit(item, ann, YES)


def test_only_assigned_annotators_get_items(run, annotators):
    campaign = single_campaign([run], annotators[:1])
    with pytest.raises(NotAssigned):
        review.item_claim_next(campaign, annotators[1])


# --- the queue --------------------------------------------------------------------------------


def test_a_claimed_item_is_locked_until_its_ttl_and_another_annotator_gets_the_next_one(run, annotators):
    ann, bob, _ = annotators
    campaign = single_campaign([run], [ann, bob], k=1, lock_ttl_s=60)
    now = timezone.now()
    first = review.item_claim_next(campaign, ann, now=now)
    assert (first.locked_by, first.locked_until) == (ann, now + timedelta(seconds=60))
    second = review.item_claim_next(campaign, bob, now=now)
    assert second.pk != first.pk
    assert review.item_claim_next(campaign, bob, now=now + timedelta(seconds=59)).pk == second.pk  # still bob's


def test_next_gives_back_the_item_the_annotator_holds_and_renews_its_lock(run, annotators):
    ann = annotators[0]
    campaign = single_campaign([run], [ann], lock_ttl_s=60)
    now = timezone.now()
    held = review.item_claim_next(campaign, ann, now=now)
    again = review.item_claim_next(campaign, ann, now=now + timedelta(seconds=30))
    assert again.pk == held.pk
    assert again.locked_until == now + timedelta(seconds=90)


def test_an_expired_lock_lets_another_annotator_take_the_item(run, annotators):
    ann, bob, _ = annotators
    campaign = single_campaign([run], [ann, bob], k=1, lock_ttl_s=60, source={"steps": [1]})
    now = timezone.now()
    held = review.item_claim_next(campaign, ann, now=now)
    assert review.item_claim_next(campaign, bob, now=now + timedelta(seconds=59)) is None  # the only item is ann's
    taken = review.item_claim_next(campaign, bob, now=now + timedelta(seconds=61))
    assert taken.pk == held.pk and taken.locked_by == bob


def test_a_judgement_needs_the_item_free_for_its_author(run, annotators):
    ann, bob, _ = annotators
    campaign = single_campaign([run], [ann, bob], k=1, lock_ttl_s=60, source={"steps": [1]})
    now = timezone.now()
    item = review.item_claim_next(campaign, ann, now=now)
    with pytest.raises(ItemUnavailable, match="another annotator holds this item"):
        review.judgement_submit(item, bob, YES, now=now)
    # ann's lock expired and nobody took it: ann's late judgement still counts.
    judgement, created = review.judgement_submit(item, ann, YES, 12.5, now=now + timedelta(seconds=120))
    assert created and judgement.seconds == 12.5
    item.refresh_from_db()
    assert (item.judgement_count, item.locked_by) == (1, None)


def test_a_late_judgement_is_refused_when_someone_else_took_the_expired_lock(run, annotators):
    ann, bob, _ = annotators
    campaign = single_campaign([run], [ann, bob], k=1, lock_ttl_s=60, source={"steps": [1]})
    now = timezone.now()
    item = review.item_claim_next(campaign, ann, now=now)
    review.item_claim_next(campaign, bob, now=now + timedelta(seconds=61))
    with pytest.raises(ItemUnavailable):
        review.judgement_submit(item, ann, YES, now=now + timedelta(seconds=62))


def test_next_never_hands_an_annotator_an_item_twice(run, annotators):
    ann, bob, _ = annotators
    campaign = single_campaign([run], [ann, bob], k=1, overlap=2, source={"steps": [1]})
    item = review.item_claim_next(campaign, ann)
    review.judgement_submit(item, ann, YES)
    assert review.item_claim_next(campaign, ann) is None  # needs a second judgement, but not ann's
    assert review.item_claim_next(campaign, bob).pk == item.pk


def test_items_with_overlap_judgements_are_done(run, annotators):
    ann, bob, cat = annotators
    campaign = single_campaign([run], annotators, k=1, overlap=2, source={"steps": [1]})
    for user in (ann, bob):
        review.judgement_submit(review.item_claim_next(campaign, user), user, YES)
    assert review.item_claim_next(campaign, cat) is None
    assert selectors.annotator_progress(campaign, cat)["done"] is True
    progress = selectors.campaign_progress(campaign)
    assert (progress["items_complete"], progress["judgements"], progress["judgements_needed"]) == (1, 2, 2)


def test_a_done_item_refuses_a_judgement_beyond_the_overlap(run, annotators):
    ann, bob, _ = annotators
    campaign = single_campaign([run], [ann, bob], k=1, overlap=1, source={"steps": [1]})
    item = review.item_claim_next(campaign, ann)
    review.judgement_submit(item, ann, YES)
    with pytest.raises(ItemUnavailable, match="has all its 1 judgement"):
        review.judgement_submit(item, bob, YES)


def test_skipped_items_come_back_after_the_unskipped_ones(run, annotators):
    ann = annotators[0]
    campaign = single_campaign([run], [ann], k=10, source={"steps": [1]})  # four items
    order = list(campaign.items.order_by("position").values_list("pk", flat=True))
    first = review.item_claim_next(campaign, ann)
    assert first.pk == order[0]
    review.item_skip(first, ann)
    seen = []
    for _ in range(3):
        item = review.item_claim_next(campaign, ann)
        seen.append(item.pk)
        review.judgement_submit(item, ann, YES)
    assert seen == order[1:]
    assert review.item_claim_next(campaign, ann).pk == order[0]  # the skipped one, last
    assert selectors.annotator_progress(campaign, ann)["skipped"] == 1


def test_release_gives_the_item_back_only_when_held(run, annotators):
    ann, bob, _ = annotators
    campaign = single_campaign([run], [ann, bob], k=1, source={"steps": [1]})
    item = review.item_claim_next(campaign, ann)
    assert review.item_release(item, bob) is False
    assert review.item_release(item, ann) is True
    assert review.item_claim_next(campaign, bob).pk == item.pk


def test_submitting_again_edits_the_annotators_own_judgement(run, annotators):
    ann = annotators[0]
    campaign = single_campaign([run], [ann], k=1, overlap=1, source={"steps": [1]})
    item = review.item_claim_next(campaign, ann)
    review.judgement_submit(item, ann, YES, 5)
    judgement, created = review.judgement_submit(item, ann, {"correct": False}, 3)
    assert not created
    assert (judgement.answers, judgement.seconds) == ({"correct": False}, 8.0)
    item.refresh_from_db()
    assert item.judgement_count == 1


def test_answers_are_checked_against_the_questions(run, annotators):
    ann = annotators[0]
    questions = PASS_FAIL + [
        {"key": "stars", "kind": "rating", "label": "Stars", "min": 1, "max": 5},
        {"key": "issues", "kind": "tags", "label": "Issues", "options": ["rude", "wrong"]},
    ]
    campaign = single_campaign([run], [ann], questions=questions)
    item = review.item_claim_next(campaign, ann)
    with pytest.raises(InvalidInput) as refused:
        review.judgement_submit(item, ann, {"correct": "yes", "stars": 9, "issues": ["bad"], "extra": 1})
    assert {e["loc"] for e in refused.value.errors} == {
        "answers.correct",
        "answers.stars",
        "answers.issues",
        "answers.extra",
    }
    with pytest.raises(InvalidInput) as missing:
        review.judgement_submit(item, ann, {"correct": True})
    assert [e["loc"] for e in missing.value.errors] == ["answers.stars"]
    judgement, _ = review.judgement_submit(item, ann, {"correct": True, "stars": 4.0, "issues": ["wrong", "rude"]})
    assert judgement.answers == {"correct": True, "stars": 4, "issues": ["rude", "wrong"]}


def test_pairwise_answers_are_stored_relative_to_the_items_samples(run, annotators):
    ann = annotators[0]
    campaign = pair_campaign([run], [ann])
    swapped, straight = campaign.items.order_by("position")[:2]
    ReviewItem.objects.filter(pk=swapped.pk).update(display_swap=True)
    ReviewItem.objects.filter(pk=straight.pk).update(display_swap=False)
    for item in (swapped, straight):
        item.refresh_from_db()
        review.judgement_submit(item, ann, {"better": shown_as(item, item.rollout_a_id)})
        assert Judgement.objects.get(item=item).answers == {"better": "A"}  # A = rollout_a, whatever was shown


def test_pairs_show_their_responses_in_a_seeded_random_order(experiment, annotators):
    run = run_with_samples(experiment, {1: [sample(i, 0.0, f"q{i // 2}", f"r{i}", group=i // 2) for i in range(40)]})
    campaign = pair_campaign([run], annotators, k=20, activate=False)
    swaps = list(campaign.items.order_by("position").values_list("display_swap", flat=True))
    assert len(swaps) == 20 and 0 < sum(swaps) < 20
    again = pair_campaign([run], annotators, k=20, activate=False)
    assert list(again.items.order_by("position").values_list("display_swap", flat=True)) == swaps


@pytest.mark.django_db(transaction=True)
def test_concurrent_claims_never_give_two_annotators_the_same_item(experiment, make_user):
    """Two annotators claim and judge as fast as they can, each in its own thread and connection; with
    overlap 1 every item is judged exactly once and no item is ever handed to both."""
    run = run_with_samples(
        experiment, {step: [sample(i, 0.1 * i, f"{step}:{i}", str(i)) for i in range(6)] for step in range(1, 4)}
    )
    ann, bob = make_user("annotator", "ann"), make_user("annotator", "bob")
    campaign = single_campaign([run], [ann, bob], k=6, overlap=1)
    claimed: dict[str, list[int]] = {"ann": [], "bob": []}
    start = threading.Barrier(2)
    failures: list[BaseException] = []

    def work(user) -> None:
        try:
            start.wait()
            while (item := review.item_claim_next(campaign, user)) is not None:
                claimed[user.username].append(item.pk)
                review.judgement_submit(item, user, YES)
        except BaseException as exc:  # reported below: a thread's exception would vanish
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(user,)) for user in (ann, bob)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures
    assert not set(claimed["ann"]) & set(claimed["bob"])
    assert sorted(claimed["ann"] + claimed["bob"]) == sorted(campaign.items.values_list("pk", flat=True))
    assert set(ReviewItem.objects.filter(campaign=campaign).values_list("judgement_count", flat=True)) == {1}


def test_the_humans_verdict_on_an_item_is_the_pass_rate_even_when_a_rating_question_comes_first():
    from posttrain.review.selectors.results import _human_score

    questions = [{"key": "quality", "kind": "rating", "min": 1, "max": 5}, {"key": "ok", "kind": "pass_fail"}]
    assert _human_score(questions, {"quality": {"mean": 5.0}, "ok": {"pass_rate": 0.25}}) == 0.25
    assert _human_score(questions, {"quality": {"mean": 2.0}, "ok": {"pass_rate": None}}) == 0.25  # (2-1)/(5-1)
    assert _human_score(questions, {}) is None
