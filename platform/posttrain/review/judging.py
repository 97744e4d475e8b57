"""Writes of judges: a registered reward (a verifier, a reward model, an HTTP judge, python code) scoring
rollouts as a recorded background job, and a judge that agrees well with the humans registered as a
reward for the next run.

A judge run is user code: the web process only records it (`JudgeRun`, queued) and sends the Celery task
`workers.review_judge_run` after commit, routed to the `user_code` queue (settings.CELERY_TASK_ROUTES).
The worker claims it (compare-and-set queued → running), scores the rollouts in batches through the
registry's `reward_score` (python code in the engine's sandbox, a reward model in a subprocess, exactly
as a run scores), stores one `JudgeScore` per rollout and counts its progress, and ends it done or failed
(posttrain.core.job_runner, the runner of every worker job). A rollout the reward fails on keeps a null
score and its errors: a judge that cannot score an item has no opinion on it (a run would score it 0). A
worker killed at the hard time limit leaves the run `running` until the periodic expiry fails it with the
reason; start a new one.

What a judge run scores: a campaign's rollout copies (the items' pre-labels, and the judge's agreement
with the humans: posttrain.review.selectors.judge_agreement), or a pool of runs' rollouts (`source`:
runs and steps) that a new campaign then picks from by the reward_vs_judge rule.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from itertools import islice
from typing import Any

from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import ValidationError
from django.db.models import F

from posttrain.core.errors import InvalidInput
from posttrain.core.job_runner import job_dispatch, job_run
from posttrain.projects.access import readable
from posttrain.projects.models import Project
from posttrain.registry.models import RewardFunction
from posttrain.registry.services import reward_create
from posttrain.registry.services.reward_try import reward_score
from posttrain.review.models import Campaign, JudgeRun, JudgeRunState, JudgeScore, ReviewRollout
from posttrain.review.sampling import validate_source
from posttrain.runs.models import Run
from posttrain.telemetry.selectors import rollouts_query, rollouts_total

SCORE_BATCH = 64
MAX_POOL_ROLLOUTS = 20_000
# A judge registered as a reward must agree with the humans at least "substantially" (Cohen's kappa above
# 0.6 on Landis & Koch's 1977 scale): below it, training on the judge trains on its disagreements.
MIN_REGISTER_KAPPA = 0.6


def _settings(threshold: Any, score_min: Any, score_max: Any) -> tuple[float, float, float]:
    errors = []
    values = {"threshold": threshold, "score_min": score_min, "score_max": score_max}
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            errors.append({"loc": name, "msg": "must be a finite number"})
    if not errors and score_max <= score_min:
        errors.append({"loc": "score_max", "msg": f"must be greater than score_min ({score_min})"})
    if errors:
        raise InvalidInput(errors)
    return float(threshold), float(score_min), float(score_max)


def _create(
    reward: RewardFunction, user: User | AnonymousUser | None, total: int, project: Project, **fields: Any
) -> JudgeRun:
    threshold, score_min, score_max = _settings(
        fields.pop("threshold", 0.5), fields.pop("score_min", 0.0), fields.pop("score_max", 1.0)
    )
    judge = JudgeRun.objects.create(
        project=project,
        reward=reward,
        reward_name=reward.name,
        spec=reward.spec,
        threshold=threshold,
        score_min=score_min,
        score_max=score_max,
        total=total,
        created_by=user if user is not None and user.is_authenticated else None,
        **fields,
    )
    job_dispatch(judge)
    return judge


def judge_run_create(
    campaign: Campaign,
    reward: RewardFunction,
    user: User | AnonymousUser | None = None,
    *,
    threshold: Any = 0.5,
    score_min: Any = 0.0,
    score_max: Any = 1.0,
) -> JudgeRun:
    """Pre-score every rollout the campaign's items show with `reward`, on a worker (queued now)."""
    total = ReviewRollout.objects.filter(campaign=campaign).count()
    return _create(
        reward,
        user,
        total,
        campaign.project,
        campaign=campaign,
        threshold=threshold,
        score_min=score_min,
        score_max=score_max,
    )


def judge_pool_create(
    reward: RewardFunction,
    source: Any,
    user: User | AnonymousUser | None = None,
    *,
    project: Project,
    threshold: Any = 0.5,
    score_min: Any = 0.0,
    score_max: Any = 1.0,
) -> JudgeRun:
    """Score the runs' rollouts at the source's steps with `reward` (a pool for the reward_vs_judge rule), in
    `project`; the runs are ones `user` reads."""
    if not isinstance(source, dict):
        raise InvalidInput.one("source", "required: an object with runs and steps or step_range")
    pool = validate_source({"runs": source.get("runs"), **_steps_only(source)}, "single")
    pool = {"runs": pool["runs"], "steps": pool["steps"], "step_range": pool["step_range"]}
    known = {str(pk) for pk in readable(Run.objects.filter(pk__in=pool["runs"]), user).values_list("pk", flat=True)}
    missing = [i for i, run_id in enumerate(pool["runs"]) if run_id not in known]
    if missing:
        raise InvalidInput.one(f"source.runs[{missing[0]}]", f"no run with id {pool['runs'][missing[0]]}")
    total = rollouts_total(pool["runs"], pool["steps"], pool["step_range"])  # the index's count: no file read
    if total == 0:
        raise InvalidInput.one("source", "the runs have no rollouts at these steps")
    if total > MAX_POOL_ROLLOUTS:
        raise InvalidInput.one(
            "source", f"has {total} rollouts; a judge scores at most {MAX_POOL_ROLLOUTS}: choose fewer steps"
        )
    return _create(
        reward,
        user,
        total,
        project,
        source=pool,
        threshold=threshold,
        score_min=score_min,
        score_max=score_max,
    )


def _steps_only(source: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(source) - {"runs", "steps", "step_range"})
    if unknown:
        raise InvalidInput.one(f"source.{unknown[0]}"[:300], "unknown field (the fields: runs, steps, step_range)")
    return {name: source[name] for name in ("steps", "step_range") if source.get(name) is not None}


def _pool_rollouts(pool: dict[str, Any], *, text: bool) -> Iterator[dict[str, Any]]:
    return rollouts_query(
        pool["runs"],
        steps=pool["steps"],
        step_range=None if pool["step_range"] is None else tuple(pool["step_range"]),
        text=text,
    )


# --- the worker's side ---------------------------------------------------------------------------


def _targets(judge: JudgeRun) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(where the score belongs, the sample to score) for every rollout the run scores."""
    if judge.campaign_id is not None:
        rollouts = ReviewRollout.objects.filter(campaign_id=judge.campaign_id).order_by("pk")
        for rollout in rollouts.only("pk", "prompt", "response", "label").iterator(chunk_size=SCORE_BATCH * 4):
            yield {"rollout_id": rollout.pk}, _sample(rollout.prompt, rollout.response, rollout.label)
        return
    for row in _pool_rollouts(judge.source or {}, text=True):
        yield (
            {"run_id": row["run"], "step": row["step"], "index": row["index"]},
            _sample(row["prompt"], row["response"], row["label"]),
        )


def _sample(prompt: str, response: str, label: str | None) -> dict[str, Any]:
    return {"prompt": prompt, "response": response, "label": label, "metadata": {}}


def judge_run_execute(judge_id: Any) -> None:
    """The worker's side (posttrain.core.job_runner): score the run's rollouts in batches; the scores stored
    before a failure or the soft time limit stay, counted."""
    job_run(JudgeRun, judge_id, _score_all, needs_sandbox=lambda judge: judge.spec.get("type") == "python")


def _score_all(judge: JudgeRun) -> dict[str, Any]:
    targets = _targets(judge)
    while batch := list(islice(targets, SCORE_BATCH)):
        _score_batch(judge, batch)
    return {}


def _score_batch(judge: JudgeRun, batch: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
    result = reward_score(judge.spec, [sample for _, sample in batch])
    scores = []
    for i, (where, _) in enumerate(batch):
        errors = [str(e)[:500] for e in result["errors"][i]] if i < len(result["errors"]) else []
        value = result["scores"][i]
        finite = isinstance(value, (int, float)) and math.isfinite(value)
        scores.append(
            JudgeScore(judge_run=judge, score=None if errors or not finite else float(value), errors=errors, **where)
        )
    JudgeScore.objects.bulk_create(scores)
    failed = sum(score.score is None for score in scores)
    JudgeRun.objects.filter(pk=judge.pk, state=JudgeRunState.RUNNING).update(
        scored=F("scored") + len(scores), failed_samples=F("failed_samples") + failed
    )


# --- a judge that agrees well, as a reward --------------------------------------------------------


def judge_register_reward(
    judge: JudgeRun,
    name: str,
    agreement: dict[str, Any],
    *,
    question: str | None = None,
    project: Project,
    user: User | AnonymousUser | None = None,
) -> RewardFunction:
    """Register the judge's reward again under `name` in `project`, its description carrying the agreement measured on
    the campaign (`agreement`: posttrain.review.selectors.judge_agreement of this run), so the next run
    can use it with that evidence attached. Refused below MIN_REGISTER_KAPPA on the question (default:
    the first one the judge answered with a defined kappa)."""
    campaign = judge.campaign
    if campaign is None or judge.state != JudgeRunState.DONE:
        raise InvalidInput.one("judge", "only a finished judge run over a campaign has measured agreement")
    if judge.reward is None:
        raise InvalidInput.one("judge", f"the reward {judge.reward_name!r} was deleted from the registry")
    measured = [q for q in agreement["questions"] if q["kappa"] is not None]
    chosen = next((q for q in measured if question is None or q["key"] == question), None)
    if chosen is None:
        raise InvalidInput.one(
            "question", "no agreement measured yet: the judge and the humans need labels on common items"
        )
    if chosen["kappa"] < MIN_REGISTER_KAPPA:
        raise InvalidInput.one(
            "question",
            f"the judge's kappa on {chosen['key']!r} is {chosen['kappa']:.3f}, below {MIN_REGISTER_KAPPA} "
            "(substantial agreement): it would train the policy on its disagreements with the humans",
        )
    reward = judge.reward
    spec = {key: value for key, value in reward.spec.items() if key != "name"}  # the new name names the metric
    if reward.kind == RewardFunction.Kind.PYTHON:
        spec.pop("path", None)  # the registry stores the code again and sets the path
    description = (
        f"{reward.name} as validated on review campaign {campaign.name!r} (#{campaign.pk}), judge run "
        f"#{judge.pk}: Cohen's kappa {chosen['kappa']:.3f} with the humans on {chosen['label']!r} over "
        f"{chosen['items']} items{_rates_text(chosen)}."
    )
    try:
        return reward_create(
            name, reward.kind, spec, reward.source, project=project, description=description, user=user
        )
    except ValidationError as exc:
        raise InvalidInput(
            [{"loc": field, "msg": msg} for field, messages in exc.message_dict.items() for msg in messages]
        ) from None


def _rates_text(question: dict[str, Any]) -> str:
    rates = question["rates"]
    if question["kind"] == "pairwise" or rates.get("tpr") is None or rates.get("fpr") is None:
        return ""
    return f" (true positive rate {rates['tpr']:.3f}, false positive rate {rates['fpr']:.3f})"
