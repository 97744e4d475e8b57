"""Researchers' reads of a campaign's items and results next to the rewards: per-question summaries, the
humans' verdict against the reward, ordering.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.db.models import Count, QuerySet

from posttrain.review.labels import Label, disagreeing_questions
from posttrain.review.models import Campaign, Judgement, ReviewItem, ReviewRollout
from posttrain.review.selectors.annotator_view import _rollout_facts
from posttrain.review.selectors.judges import _judge_item_answers, _judge_scores, _judge_settings, latest_judge
from posttrain.review.selectors.labels_agreement import campaign_labels

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


def campaign_items(campaign: Campaign) -> QuerySet[ReviewItem]:
    return (
        campaign.items.select_related("rollout_a__run", "rollout_b__run", "locked_by", "decided_by")
        .annotate(skip_count=Count("skips"))
        .order_by("position")
    )


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
