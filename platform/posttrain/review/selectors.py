"""Reads of review: campaign lists with progress, the annotator's and the reviewer's view of an item,
results next to the rewards, the items' labels (gold, decisions, weighted votes), the agreement tables
before and after adjudication, and a judge's agreement with the humans.

What an annotator may see is decided here, in `item_for_annotator`, and nowhere else: the prompt, the
reference answer and the response(s) as A/B (with its steps when a question labels them), the
guidelines, and a judge's suggestion when the campaign shows them; in a blind campaign nothing about
rewards, reward components, runs, steps or ids; never another annotator's answers, and nothing that
tells a gold item from another. A reviewer (`item_for_reviewer`) sees every judgement of the item.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.db.models import Count, Exists, F, Min, OuterRef, Prefetch, Q, QuerySet, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from posttrain.review.agreement import Answered, campaign_agreement, judge_question_agreement
from posttrain.review.guidelines import question_guidelines, render_markdown
from posttrain.review.labels import (
    GOLD_POLICY_DEFAULTS,
    GoldCheck,
    JudgeSettings,
    Label,
    after_adjudication,
    disagreeing_questions,
    gold_checks,
    graded,
    item_labels,
    judge_answer,
    rounded_rating,
)
from posttrain.review.models import (
    Campaign,
    CampaignState,
    Judgement,
    JudgeRun,
    JudgeRunState,
    JudgeScore,
    ReviewItem,
    ReviewRollout,
    ReviewState,
    Skip,
)
from posttrain.review.questions import swap_pairwise
from posttrain.review.services import open_items, review_items
from posttrain.review.steps import split_steps, uses_tokens

RESULT_ORDERINGS: tuple[str, ...] = (
    "position",
    "-position",
    "disagreement",
    "-disagreement",
    "reward",
    "-reward",
    "judgements",
    "-judgements",
)
# A single item is flagged when the humans' verdict and the reward's standing among the campaign's items
# are at least this far apart on a 0..1 scale (e.g. humans fail it but its reward is in the top half).
SINGLE_DISAGREEMENT_FLAG = 0.5


# --- campaigns and progress ---------------------------------------------------------------------


def campaign_list() -> QuerySet[Campaign]:
    """Campaigns with item_count, items_complete and judgement_total, one query per page."""
    annotators = Prefetch("annotators", queryset=get_user_model().objects.order_by("username"))
    return (
        Campaign.objects.select_related("created_by", "project")
        .prefetch_related(annotators)
        .annotate(
            item_count=Count("items"),
            items_complete=Count("items", filter=Q(items__judgement_count__gte=F("overlap"))),
            judgement_total=Coalesce(Sum("items__judgement_count"), 0),
        )
    )


def annotator_campaigns(user: User) -> QuerySet[Campaign]:
    """The campaigns the user is assigned to (any state): annotators reach nothing else."""
    return Campaign.objects.filter(annotators=user)


def annotator_items(user: User) -> QuerySet[ReviewItem]:
    return ReviewItem.objects.select_related("campaign", "rollout_a__run", "rollout_b__run").filter(
        campaign__annotators=user
    )


def annotator_progress(campaign: Campaign, user: User, now: datetime | None = None) -> dict[str, Any]:
    """judged: items the user judged; remaining: items they may still judge (some may be locked by others
    or skipped); available: of those, claimable now; done: nothing remains."""
    now = now or timezone.now()
    # One aggregate over the user's open items: this runs on every judgement an annotator submits.
    locked = Q(locked_by__isnull=False, locked_until__gt=now)
    counts = open_items(campaign, user).aggregate(
        remaining=Count("pk"),
        locked_by_others=Count("pk", filter=locked & ~Q(locked_by=user)),
        skipped=Count("pk", filter=Q(Exists(Skip.objects.filter(item=OuterRef("pk"), annotator=user)))),
        held=Min("pk", filter=locked & Q(locked_by=user)),
    )
    return {
        "judged": Judgement.objects.filter(item__campaign=campaign, annotator=user).count(),
        "remaining": counts["remaining"],
        "available": counts["remaining"] - counts["locked_by_others"],
        "skipped": counts["skipped"],
        "held_item": counts["held"],
        "done": counts["remaining"] == 0,
    }


def campaign_progress(campaign: Campaign, now: datetime | None = None) -> dict[str, Any]:
    now = now or timezone.now()
    items = campaign.items.aggregate(
        total=Count("pk"),
        complete=Count("pk", filter=Q(judgement_count__gte=campaign.overlap)),
        judgements=Coalesce(Sum("judgement_count"), 0),
        locked=Count("pk", filter=Q(locked_until__gt=now)),
    )
    judged = dict(
        Judgement.objects.filter(item__campaign=campaign)
        .values("annotator")
        .annotate(n=Count("pk"))
        .values_list("annotator", "n")
    )
    seconds = dict(
        Judgement.objects.filter(item__campaign=campaign)
        .values("annotator")
        .annotate(s=Sum("seconds"))
        .values_list("annotator", "s")
    )
    per_annotator = [
        {
            "annotator": user.get_username(),
            "judged": judged.get(user.pk, 0),
            "seconds": float(seconds.get(user.pk) or 0.0),
            "holding": campaign.items.filter(locked_by=user, locked_until__gt=now).exists(),
        }
        for user in campaign.annotators.order_by("username")
    ]
    needed = items["total"] * campaign.overlap
    review = campaign.items.aggregate(
        pending=Count("pk", filter=Q(review_state=ReviewState.PENDING)),
        decided=Count("pk", filter=Q(review_state=ReviewState.DECIDED)),
        gold=Count("pk", filter=Q(gold__isnull=False)),
    )
    return {
        "items": items["total"],
        "items_complete": items["complete"],
        "items_locked": items["locked"],
        "judgements": items["judgements"],
        "judgements_needed": needed,
        "fraction": items["judgements"] / needed if needed else 0.0,
        "per_annotator": per_annotator,
        "gold_items": review["gold"],
        "review_pending": review["pending"],
        "review_decided": review["decided"],
    }


def annotator_queue(user: User, now: datetime | None = None) -> list[tuple[Campaign, dict[str, Any]]]:
    """The user's active campaigns, each with their progress."""
    campaigns = annotator_campaigns(user).filter(state=CampaignState.ACTIVE).order_by("created_at", "pk")
    return [(campaign, annotator_progress(campaign, user, now)) for campaign in campaigns]


# --- what an annotator sees ---------------------------------------------------------------------


def _rollout_facts(rollout: ReviewRollout) -> dict[str, Any]:
    """Where a rollout copy came from and its reward (a gold row has no run: run, step and index are null)."""
    run = rollout.run
    return {
        "id": rollout.pk,
        "run": None if rollout.run_id is None else str(rollout.run_id),
        "run_name": None if run is None else (run.name or str(rollout.run_id)),
        "step": rollout.step,
        "index": rollout.index,
        "reward": rollout.reward,
        "components": rollout.components,
    }


def _questions_with_guidelines(questions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**question, **question_guidelines(question)} for question in questions]


def campaign_for_annotator(campaign: Campaign) -> dict[str, Any]:
    return {
        "id": campaign.pk,
        "name": campaign.name,
        "instructions": campaign.instructions,
        "instructions_html": render_markdown(campaign.instructions),
        "kind": campaign.kind,
        "blind": campaign.blind,
        "questions": _questions_with_guidelines(campaign.questions),
    }


def _steps_view(campaign: Campaign, rollout: ReviewRollout) -> dict[str, Any] | None:
    """The response cut into steps for a steps question; the token pieces where it marks tokens."""
    question = next((q for q in campaign.questions if q["kind"] == "steps"), None)
    if question is None:
        return None
    steps = split_steps(rollout.response, rollout.tokens)
    view: dict[str, Any] = {"texts": steps.texts, "starts": steps.starts, "unit": "sentence", "tokens": None}
    if uses_tokens(question, steps):
        view.update(unit="token", tokens=list(rollout.tokens["text"]))
    return view


def _shown(item: ReviewItem, swap: bool) -> list[ReviewRollout]:
    if item.rollout_b is None:
        return [item.rollout_a]
    return [item.rollout_b, item.rollout_a] if swap else [item.rollout_a, item.rollout_b]


def latest_judge(campaign: Campaign) -> JudgeRun | None:
    """The campaign's most recent finished judge run: the one whose pre-labels annotators may be shown."""
    return campaign.judge_runs.filter(state=JudgeRunState.DONE).order_by("-finished_at", "-pk").first()


def _judge_scores(judge: JudgeRun) -> dict[int, float | None]:
    return dict(JudgeScore.objects.filter(judge_run=judge, rollout__isnull=False).values_list("rollout_id", "score"))


def _judge_settings(judge: JudgeRun) -> JudgeSettings:
    return JudgeSettings(judge.threshold, judge.score_min, judge.score_max)


def _judge_item_answers(
    questions: list[dict[str, Any]], item: ReviewItem, scores: dict[int, float | None], settings: JudgeSettings
) -> dict[str, Any]:
    """The judge's answers on one item, as stored ("A" = rollout_a)."""
    score_a = scores.get(item.rollout_a_id)
    score_b = scores.get(item.rollout_b_id) if item.rollout_b_id is not None else None
    answers = {q["key"]: judge_answer(q, score_a, score_b, settings) for q in graded(questions)}
    return {key: value for key, value in answers.items() if value is not None}


def _suggestion(campaign: Campaign, item: ReviewItem) -> dict[str, Any] | None:
    """The latest judge's pre-labels as the annotator sees them (pairwise in display order)."""
    judge = latest_judge(campaign) if campaign.show_suggestions else None
    if judge is None:
        return None
    scores = _judge_scores(judge)
    answers = _judge_item_answers(campaign.questions, item, scores, _judge_settings(judge))
    return {
        "judge": judge.reward_name,
        "answers": swap_pairwise(campaign.questions, answers, item.display_swap),
        "scores": [scores.get(rollout.pk) for rollout in _shown(item, item.display_swap)],
    }


def _item_head(item: ReviewItem) -> dict[str, Any]:
    """What every view of an item starts with: where it is, and the prompt with its reference answer."""
    return {
        "id": item.pk,
        "campaign": item.campaign_id,
        "position": item.position,
        "kind": item.campaign.kind,
        "prompt": item.rollout_a.prompt,
        "reference": item.rollout_a.label,
    }


def item_for_annotator(item: ReviewItem, user: User) -> dict[str, Any]:
    """The item as the annotator may see it. Pairs show in the item's display order ("A" may be rollout_b);
    the user's own earlier answers (only theirs) come back in the same terms."""
    campaign = item.campaign
    responses = []
    for label, rollout in zip("AB", _shown(item, item.display_swap)):
        response: dict[str, Any] = {"label": label, "text": rollout.response, "steps": _steps_view(campaign, rollout)}
        if rollout.turns:  # a multi-turn episode, read turn by turn (its rewards only where runs are not hidden)
            response["turns"] = [
                {
                    "role": turn.get("role"),
                    "text": turn.get("text"),
                    "reward": None if campaign.blind else turn.get("reward"),
                }
                for turn in rollout.turns
            ]
        if not campaign.blind:
            response["sample"] = _rollout_facts(rollout)
        responses.append(response)
    mine = Judgement.objects.filter(item=item, annotator=user).values_list("answers", flat=True).first()
    return {
        **_item_head(item),
        "responses": responses,
        "suggestion": _suggestion(campaign, item),
        "locked_until": item.locked_until if item.locked_by_id == user.pk else None,
        "my_answers": None if mine is None else swap_pairwise(campaign.questions, mine, item.display_swap),
    }


# --- researchers: items, results, agreement -----------------------------------------------------


def campaign_items(campaign: Campaign) -> QuerySet[ReviewItem]:
    return (
        campaign.items.select_related("rollout_a__run", "rollout_b__run", "locked_by", "decided_by")
        .annotate(skip_count=Count("skips"))
        .order_by("position")
    )


def _answered(campaign: Campaign) -> list[Answered]:
    rows = (
        Judgement.objects.filter(item__campaign=campaign)
        .select_related("annotator")
        .order_by("item__position", "annotator__username")
    )
    return [
        Answered(item=j.item_id, annotator=j.annotator.get_username(), answers=j.answers, seconds=j.seconds)
        for j in rows
    ]


@dataclass(frozen=True)
class CampaignLabels:
    """Every item's labels (gold, a reviewer's decision, else the annotators' weighted vote) and the gold
    checks that weighed the annotators (posttrain.review.labels)."""

    policy: dict[str, Any]
    checks: dict[str, GoldCheck]
    labels: dict[int, dict[str, Label]]  # item -> question key -> label

    def weight(self, annotator: str) -> float:
        check = self.checks.get(annotator)
        return 1.0 if check is None else check.weight


def campaign_labels(campaign: Campaign, rows: list[Answered] | None = None) -> CampaignLabels:
    rows = _answered(campaign) if rows is None else rows
    items = list(campaign.items.values_list("pk", "gold", "decision"))
    policy = {**GOLD_POLICY_DEFAULTS, **(campaign.gold_policy or {})}
    checks = gold_checks(campaign.questions, {pk: gold for pk, gold, _ in items if gold}, rows, policy)
    weights = {annotator: check.weight for annotator, check in checks.items()}
    by_item: dict[int, list[Answered]] = defaultdict(list)
    for row in rows:
        by_item[row.item].append(row)
    labels = {
        pk: item_labels(campaign.questions, by_item.get(pk, []), weights, gold=gold, decision=decision)
        for pk, gold, decision in items
    }
    return CampaignLabels(policy, checks, labels)


def agreement(campaign: Campaign) -> dict[str, Any]:
    """The agreement report: per question before adjudication (the annotators' own answers) and after it
    (each decided item's answers replaced by the decision), each annotator's statistics and gold check, and
    the adjudication counts."""
    rows = _answered(campaign)
    decisions: dict[int, dict[str, Any]] = dict(
        campaign.items.filter(decision__isnull=False).values_list("pk", "decision")  # type: ignore[arg-type]
    )
    before = campaign_agreement(campaign.questions, rows)
    after = campaign_agreement(campaign.questions, after_adjudication(rows, decisions))
    labels = campaign_labels(campaign, rows)
    progress = campaign_progress(campaign)
    return {
        "campaign": campaign.pk,
        **before,
        "after_adjudication": {"questions": after["questions"]},
        "adjudication": {"pending": progress["review_pending"], "decided": progress["review_decided"]},
        "gold": {
            "items": progress["gold_items"],
            "policy": labels.policy,
            "annotators": [asdict(check) for check in labels.checks.values()],
        },
    }


def _plurality(values: list[Any]) -> Any:
    ranked = Counter(values).most_common(2)
    if not ranked or (len(ranked) == 2 and ranked[0][1] == ranked[1][1]):
        return None
    return ranked[0][0]


def pairwise_majority(answers: list[Any]) -> Any:
    """The humans' answer to a pairwise question: the strict plurality of the stored answers ("A" = rollout_a,
    "B", "tie", "both_bad"), None when the top answers are level or nobody answered."""
    return _plurality([a for a in answers if a is not None])


def _question_summary(question: dict[str, Any], values: list[Any]) -> dict[str, Any] | None:
    kind = question["kind"]
    if kind == "pass_fail":
        return {"n": len(values), "pass_rate": sum(values) / len(values) if values else None}
    if kind == "rating":
        return {"n": len(values), "mean": sum(values) / len(values) if values else None}
    if kind == "pairwise":
        counts = Counter(values)
        return {
            "n": len(values),
            "counts": {c: counts.get(c, 0) for c in question["choices"]},
            "majority": pairwise_majority(values),
        }
    if kind == "tags":
        counts = Counter(tag for chosen in values for tag in chosen)
        return {"n": len(values), "counts": {tag: counts.get(tag, 0) for tag in question["options"]}}
    if kind == "steps":
        firsts = Counter("none" if v.get("first_wrong") is None else str(v["first_wrong"]) for v in values)
        return {"n": len(values), "first_wrong": dict(sorted(firsts.items()))}
    return None


def _human_score(questions: list[dict[str, Any]], summary: dict[str, Any]) -> float | None:
    """The humans' verdict on a single item on 0..1: the pass rate of the first pass/fail question, else the
    mean of the first rating question scaled to its range."""
    for question in questions:
        entry = summary.get(question["key"])
        if question["kind"] == "pass_fail" and entry and entry["pass_rate"] is not None:
            return entry["pass_rate"]
    for question in questions:
        entry = summary.get(question["key"])
        if question["kind"] == "rating" and entry and entry["mean"] is not None:
            return (entry["mean"] - question["min"]) / (question["max"] - question["min"])
    return None


def _reward_ranks(rewards: list[float]) -> dict[float, float]:
    """Each reward's standing among the campaign's rewards on 0..1 (mean rank of ties / (n − 1))."""
    ordered = sorted(rewards)
    if len(ordered) == 1:
        return {ordered[0]: 0.5}
    ranks: dict[float, float] = {}
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[i]:
            j += 1
        ranks[ordered[i]] = ((i + j) / 2) / (len(ordered) - 1)
        i = j + 1
    return ranks


def _result_sample(rollout: ReviewRollout) -> dict[str, Any]:
    return {**_rollout_facts(rollout), "response": rollout.response, "label": rollout.label}


def _labels_json(labels: dict[str, Label]) -> dict[str, Any]:
    return {key: {"value": label.value, "source": label.source} for key, label in labels.items()}


def campaign_results(
    campaign: Campaign, *, ordering: str = "position", disagreements_only: bool = False
) -> list[dict[str, Any]]:
    """Per item: the samples with their rewards and components, every judgement, a per-question summary,
    and whether the humans disagree with the reward.

    Pairs: `reward_preferred` is the sample with the higher reward ("A" = rollout_a, "tie" when equal),
    `human_preferred` the plurality answer of the first pairwise question; they disagree when both name a
    different sample. Singles: `human_score` (see _human_score) against `reward_rank`, the reward's standing
    among the campaign's items; `disagreement` = |human_score − reward_rank|, flagged from 0.5."""
    questions = campaign.questions
    items = list(campaign.items.select_related("rollout_a__run", "rollout_b__run", "decided_by").order_by("position"))
    judgements: dict[int, list[Judgement]] = {}
    for judgement in (
        Judgement.objects.filter(item__campaign=campaign).select_related("annotator").order_by("annotator__username")
    ):
        judgements.setdefault(judgement.item_id, []).append(judgement)
    ranks = _reward_ranks([i.rollout_a.reward for i in items if i.rollout_b is None and i.rollout_a.reward is not None])
    first_pairwise = next((q["key"] for q in questions if q["kind"] == "pairwise"), None)
    labels = campaign_labels(campaign)
    judge = latest_judge(campaign)
    judge_scores = _judge_scores(judge) if judge is not None else {}
    results = []
    for item in items:
        mine = judgements.get(item.pk, [])
        summary = {}
        for question in questions:
            entry = _question_summary(
                question, [j.answers[question["key"]] for j in mine if j.answers.get(question["key"]) is not None]
            )
            if entry is not None:
                summary[question["key"]] = entry
        row: dict[str, Any] = {
            "item": item.pk,
            "position": item.position,
            "selection": item.selection,
            "prompt": item.rollout_a.prompt,
            "samples": {"A": _result_sample(item.rollout_a)},
            "judgement_count": item.judgement_count,
            "complete": item.judgement_count >= campaign.overlap,
            "judgements": [
                {
                    "annotator": j.annotator.get_username(),
                    "answers": j.answers,
                    "seconds": j.seconds,
                    "updated_at": j.updated_at,
                }
                for j in mine
            ],
            "summary": summary,
            "gold": item.gold,
            "gold_source": item.gold_source,
            "review_state": item.review_state,
            "disputed": disagreeing_questions(questions, [j.answers for j in mine], campaign.review_rating_spread),
            "decision": item.decision,
            "decided_by": None if item.decided_by is None else item.decided_by.get_username(),
            "decided_at": item.decided_at,
            "labels": _labels_json(labels.labels.get(item.pk, {})),
            "judge": None
            if judge is None
            else {
                "run": judge.pk,
                "reward": judge.reward_name,
                "answers": _judge_item_answers(questions, item, judge_scores, _judge_settings(judge)),
                "scores": {
                    side: judge_scores.get(rollout_id)
                    for side, rollout_id in (("A", item.rollout_a_id), ("B", item.rollout_b_id))
                    if rollout_id is not None
                },
            },
        }
        if item.rollout_b is not None:
            row["samples"]["B"] = _result_sample(item.rollout_b)
            reward_a, reward_b = item.rollout_a.reward, item.rollout_b.reward
            reward_preferred = (
                None
                if reward_a is None or reward_b is None
                else ("A" if reward_a > reward_b else "B" if reward_b > reward_a else "tie")
            )
            human = summary[first_pairwise]["majority"] if first_pairwise else None
            both_pick = reward_preferred in ("A", "B") and human in ("A", "B")
            row.update(
                {
                    "reward_preferred": reward_preferred,
                    "human_preferred": human,
                    "disagreement": (1.0 if reward_preferred != human else 0.0) if both_pick else None,
                }
            )
        else:
            human_score = _human_score(questions, summary)
            reward = item.rollout_a.reward
            reward_rank = ranks.get(reward) if reward is not None else None
            row.update(
                {
                    "human_score": human_score,
                    "reward_rank": reward_rank,
                    "disagreement": None
                    if human_score is None or reward_rank is None
                    else abs(human_score - reward_rank),
                }
            )
        row["disagrees"] = row["disagreement"] is not None and row["disagreement"] >= SINGLE_DISAGREEMENT_FLAG
        results.append(row)
    if disagreements_only:
        results = [row for row in results if row["disagrees"]]
    return _sorted_results(results, ordering)


def _sorted_results(results: list[dict[str, Any]], ordering: str) -> list[dict[str, Any]]:
    descending = ordering.startswith("-")
    field = ordering.lstrip("-")
    value = {
        "position": lambda r: r["position"],
        "disagreement": lambda r: r["disagreement"],
        "reward": lambda r: r["samples"]["A"]["reward"],
        "judgements": lambda r: r["judgement_count"],
    }[field]
    known = [r for r in results if value(r) is not None]
    unknown = [r for r in results if value(r) is None]  # always last, whichever direction
    known.sort(key=lambda r: r["position"])
    known.sort(key=value, reverse=descending)  # stable either way: equal values stay in queue order
    return known + unknown


# --- reviewers: the adjudication queue -------------------------------------------------------------


def reviewer_campaigns(user: User) -> QuerySet[Campaign]:
    """The campaigns the user reviews (any state): reviewers reach nothing else."""
    return Campaign.objects.filter(reviewers=user)


def reviewer_items(user: User) -> QuerySet[ReviewItem]:
    return ReviewItem.objects.select_related("campaign", "rollout_a__run", "rollout_b__run").filter(
        campaign__reviewers=user
    )


def reviewer_queue(user: User, now: datetime | None = None) -> list[dict[str, Any]]:
    """The user's active or closed campaigns with what is left to adjudicate in each."""
    now = now or timezone.now()
    entries = []
    campaigns = (
        reviewer_campaigns(user)
        .filter(state__in=[CampaignState.ACTIVE, CampaignState.CLOSED])
        .order_by("created_at", "pk")
    )
    for campaign in campaigns:
        pending = review_items(campaign)
        entries.append(
            {
                "id": campaign.pk,
                "name": campaign.name,
                "kind": campaign.kind,
                "state": campaign.state,
                "pending": pending.count(),
                "held_by_others": pending.filter(locked_by__isnull=False, locked_until__gt=now)
                .exclude(locked_by=user)
                .count(),
                "decided": campaign.items.filter(review_state=ReviewState.DECIDED).count(),
                "decided_by_me": campaign.items.filter(decided_by=user).count(),
            }
        )
    return entries


def item_for_reviewer(item: ReviewItem, user: User) -> dict[str, Any]:
    """A pending (or decided) item with every judgement: the responses in stored order ("A" = rollout_a, as
    the judgements' pairwise answers are stored), who answered what, the questions they disagree on, the
    annotators' plurality where they agree, and the decision so far."""
    campaign = item.campaign
    rows = [
        (j.annotator.get_username(), j.answers)
        for j in Judgement.objects.filter(item=item).select_related("annotator").order_by("annotator__username")
    ]
    disputed = disagreeing_questions(
        campaign.questions, [answers for _, answers in rows], campaign.review_rating_spread
    )
    judge = latest_judge(campaign)
    scores = _judge_scores(judge) if judge is not None else {}
    return {
        **_item_head(item),
        "responses": [
            {"label": label, "text": rollout.response, "steps": _steps_view(campaign, rollout)}
            for label, rollout in zip("AB", _shown(item, swap=False))
        ],
        "judgements": [{"annotator": name, "answers": answers} for name, answers in rows],
        "disputed": disputed,
        "agreed": {
            q["key"]: rows[0][1].get(q["key"])
            for q in graded(campaign.questions)
            if q["key"] not in disputed and rows and rows[0][1].get(q["key"]) is not None
        },
        "judge": None
        if judge is None
        else {
            "reward": judge.reward_name,
            "answers": _judge_item_answers(campaign.questions, item, scores, _judge_settings(judge)),
        },
        "review_state": item.review_state,
        "decision": item.decision,
        "locked_until": item.locked_until if item.locked_by_id == user.pk else None,
    }


# --- judges -------------------------------------------------------------------------------------------


def judge_runs(campaign: Campaign | None = None) -> QuerySet[JudgeRun]:
    runs = JudgeRun.objects.select_related("created_by", "project", "campaign")
    return runs.filter(campaign=campaign) if campaign is not None else runs


def judge_agreement(judge: JudgeRun) -> dict[str, Any]:
    """The judge against the humans' labels on its campaign, per question it answers (posttrain.review.
    agreement.judge_question_agreement): kappa, rates, confusion, and the items it gets wrong with what
    each side said. Human labels are the items' final labels (gold, decisions, weighted votes); a rating's
    weighted mean is rounded to a point of the scale."""
    campaign = judge.campaign
    if campaign is None:
        return {"judge": judge.pk, "questions": []}
    items = {item.pk: item for item in campaign.items.select_related("rollout_a").order_by("position")}
    labels = campaign_labels(campaign).labels
    scores = _judge_scores(judge)
    settings = _judge_settings(judge)
    questions = []
    for question in graded(campaign.questions):
        key = question["key"]
        pairs = {}
        for pk, item in items.items():
            human = labels.get(pk, {}).get(key)
            said = _judge_item_answers(campaign.questions, item, scores, settings).get(key)
            if human is None or said is None:
                continue
            value = rounded_rating(human.value) if question["kind"] == "rating" else human.value
            pairs[pk] = (value, said)
        entry = judge_question_agreement(question, pairs)
        if entry is None:
            continue
        entry["wrong"] = [
            {
                "item": pk,
                "position": items[pk].position,
                "prompt": items[pk].rollout_a.prompt[:200],
                "human": pairs[pk][0],
                "judge": pairs[pk][1],
            }
            for pk in entry["wrong"]
        ]
        questions.append(entry)
    return {"judge": judge.pk, "campaign": campaign.pk, "reward": judge.reward_name, "questions": questions}
