"""What an annotator sees of a campaign and of an item (see the package docstring: decided here and
nowhere else).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User

from posttrain.review.guidelines import question_guidelines, render_markdown
from posttrain.review.models import Campaign, Judgement, ReviewItem, ReviewRollout
from posttrain.review.questions import swap_pairwise
from posttrain.review.selectors.judges import _judge_item_answers, _judge_scores, _judge_settings, latest_judge
from posttrain.review.steps import split_steps, uses_tokens


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
