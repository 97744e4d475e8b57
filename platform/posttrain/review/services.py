"""Writes of review: campaigns, their state, the annotators' queue (claim, release, skip, judge), gold
answers, and the reviewers' queue (adjudication).

Campaign states go draft → active → closed (draft → closed too) as compare-and-set updates
`UPDATE … WHERE state IN (…)`; whoever loses a race gets IllegalTransition with the fresh state.

The queue needs no row locks. An item is claimed by `UPDATE … SET locked_by=me, locked_until=now+ttl
WHERE id=… AND judgement_count < overlap AND (nobody holds an unexpired lock, or I do)`: of two
annotators racing for one item exactly one updates a row, the other moves on to the next candidate.
A judgement is stored in the same transaction as `UPDATE … SET judgement_count = judgement_count + 1,
locked_by = NULL WHERE … (same condition)`, so an item never gets more than `overlap` judgements and
a judgement never lands on an item someone else holds. One judgement per (item, annotator) is a
unique constraint, so "next" can never hand an annotator an item they judged.

Adjudication: that UPDATE also holds the item's row until commit, so the last judgement of an item sees
every other one and decides, in the same transaction, whether its annotators disagree
(posttrain.review.labels.disagreeing_questions): then `review_state` becomes pending and the item is in
its reviewers' queue. A reviewer claims a pending item with the same lock (annotators never claim a
complete item) and decides it: `UPDATE … SET decision=…, review_state='decided' WHERE review_state IN
(pending, decided) AND (free for the reviewer)`. Gold items are never adjudicated: their answer is known.

Every function takes `now` (default: the current time) so tests can move the clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import Exists, F, OuterRef, Q, QuerySet, Subquery
from django.utils import timezone

from posttrain.accounts.roles import Role
from posttrain.accounts.selectors import user_roles
from posttrain.core.errors import IllegalTransition, InvalidInput, ItemUnavailable, NotAssigned
from posttrain.core.task_queue import task_send
from posttrain.projects.access import readable
from posttrain.projects.models import Project
from posttrain.registry.models import Dataset
from posttrain.review.candidates import candidate_batches
from posttrain.review.gold import MAX_GOLD_DATASET_ROWS, GoldRow, gold_count, gold_rows, validate_gold_spec
from posttrain.review.labels import disagreeing_questions, validate_gold_policy
from posttrain.review.models import (
    Campaign,
    CampaignKind,
    CampaignState,
    GoldSource,
    Judgement,
    JudgeRun,
    JudgeRunState,
    JudgeScore,
    ReviewItem,
    ReviewRollout,
    ReviewState,
    Skip,
)
from posttrain.review.questions import swap_pairwise, validate_answers, validate_known_answers, validate_questions
from posttrain.review.sampling import Pick, RolloutKey, queue_order, select, validate_source
from posttrain.review.steps import check_step_answer, split_steps
from posttrain.runs.models import Run
from posttrain.runs.selectors import run_alerts
from posttrain.telemetry.rollouts import Gap, gaps_payload, unique_gaps
from posttrain.telemetry.selectors import rollouts_query, rollouts_total
from rl_engine.spec.user_code import DataError, read_rows

NAME_MAX_CHARS = 200
TEXT_MAX_CHARS = 20_000
MAX_ITEMS = 5000
MAX_OVERLAP = 20
MAX_RATING_SPREAD = 100
MIN_LOCK_TTL_S = 30
MAX_LOCK_TTL_S = 24 * 3600
MAX_SECONDS = 24 * 3600.0
CLAIM_BATCH = 20
MAX_CLAIM_ROUNDS = 50
ANNOTATOR_ROLES = frozenset({Role.ANNOTATOR, Role.ADMIN})
REVIEWER_ROLES = frozenset({Role.REVIEWER, Role.ADMIN})


# =============================================================================================
# Campaigns
# =============================================================================================


def _collect(errors: list[dict[str, str]], check, *args: Any) -> Any:
    """Run one validation, keeping its field errors so the caller reports all of them at once."""
    try:
        return check(*args)
    except InvalidInput as exc:
        errors.extend(exc.errors)
        return None


def _clean_text(value: Any, loc: str, *, limit: int, required: bool = False) -> str:
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise InvalidInput.one(loc, "must be a string")
    value = value.strip()
    if required and not value:
        raise InvalidInput.one(loc, "is required")
    if len(value) > limit:
        raise InvalidInput.one(loc, f"is {len(value)} characters long; at most {limit}")
    if "\x00" in value:
        raise InvalidInput.one(loc, "must not contain NUL characters")
    return value


def _bounded_int(value: Any, loc: str, low: int, high: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput.one(loc, f"must be an integer from {low} to {high} ({what})")
    return value


def _check_kind(kind: Any) -> str:
    if kind not in CampaignKind.values:
        raise InvalidInput.one("kind", f"must be one of {', '.join(CampaignKind.values)}, got {kind!r}"[:300])
    return kind


def _check_people(users: Sequence[User], loc: str, roles: frozenset[str], role: str) -> list[User]:
    errors = []
    for i, user in enumerate(users):
        if not user_roles(user) & roles:
            errors.append({"loc": f"{loc}[{i}]", "msg": f"{user.get_username()!r} does not have the {role} role"})
    if errors:
        raise InvalidInput(errors)
    return list({user.pk: user for user in users}.values())


def _check_annotators(users: Sequence[User]) -> list[User]:
    return _check_people(users, "annotators", ANNOTATOR_ROLES, "annotator")


def _check_reviewers(users: Sequence[User]) -> list[User]:
    return _check_people(users, "reviewers", REVIEWER_ROLES, "reviewer")


def _check_runs(run_ids: list[str], user: User | None) -> None:
    """Every run exists and the user reads it (one they may not read is answered as one that does not exist)."""
    found = {str(pk) for pk in readable(Run.objects.filter(pk__in=run_ids), user).values_list("pk", flat=True)}
    missing = [
        {"loc": f"source.runs[{i}]", "msg": f"no run with id {run_id}"}
        for i, run_id in enumerate(run_ids)
        if run_id not in found
    ]
    if missing:
        raise InvalidInput(missing)


def _alert_pointers(source: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs' current alerts as the alerts rule's pointers: each alert's step, and the rollouts that show
    it as `indices` when the alert names examples (a hacking signal's; None: k of the step at random)."""
    pointers = [
        {
            "run": run_id,
            "step": alert.step,
            "indices": list(alert.examples) if alert.examples else None,
            "code": alert.code,
        }
        for run_id in source["runs"]
        for alert in run_alerts(run_id)
    ]
    if not pointers:
        raise InvalidInput.one("source.rule", "the runs have no alerts: choose another rule")
    return pointers


def _check_readable_inputs(source: dict[str, Any], gold: dict[str, Any] | None, user: User | None) -> None:
    """The judge pool and the gold dataset a campaign names are ones the user reads: a campaign copies from them."""
    judge_run = source.get("judge_run")
    if judge_run is not None and not readable(JudgeRun.objects.filter(pk=judge_run), user).exists():
        raise InvalidInput.one("source.judge_run", f"no judge run {judge_run} over runs' rollouts")
    if gold is not None and not readable(Dataset.objects.filter(pk=gold["dataset"]), user).exists():
        raise InvalidInput.one("gold.dataset", f"no dataset with id {gold['dataset']}")


def _pool_scores(source: dict[str, Any]) -> dict[RolloutKey, float]:
    """reward_vs_judge: the scores of the finished judge run over these runs' rollouts."""
    judge = JudgeRun.objects.filter(pk=source["judge_run"], campaign__isnull=True).first()
    if judge is None:
        raise InvalidInput.one("source.judge_run", f"no judge run {source['judge_run']} over runs' rollouts")
    if judge.state != JudgeRunState.DONE:
        raise InvalidInput.one("source.judge_run", f"judge run {judge.pk} is {judge.state}: wait until it is done")
    missing = sorted(set(source["runs"]) - set((judge.source or {}).get("runs", [])))
    if missing:
        raise InvalidInput.one("source.judge_run", f"judge run {judge.pk} did not score run {missing[0]}")
    scores = JudgeScore.objects.filter(judge_run=judge, score__isnull=False).values_list(
        "run_id", "step", "index", "score"
    )
    return {
        (str(run_id), step, index): score
        for run_id, step, index, score in scores
        if step is not None and index is not None and score is not None  # a pool's scores have all three
    }


@dataclass
class Draw:
    """What a campaign's items are made of: the picks, the gold rows mixed in, and the rollout files the
    picks could not be drawn from."""

    picks: list[Pick]
    gold: list[GoldRow]
    gaps: list[Gap]


def _draw(source: dict[str, Any], kind: str, questions: list, gold: dict[str, Any] | None) -> Draw:
    """The items of a campaign, drawn in DuckDB with a limit per step (posttrain.review.candidates), a batch
    of steps at a time; refused (InvalidInput naming the field) when they are none or too many."""
    judge = _pool_scores(source) if source["rule"] == "reward_vs_judge" else {}
    gaps: list[Gap] = []
    picks: list[Pick] = []
    for batch in candidate_batches(source, kind, judge, gaps):
        picks += select(batch, source, kind)
        if len(picks) > MAX_ITEMS:  # no need to read further steps: it is refused
            raise InvalidInput.one(
                "source.k",
                f"selects more than {MAX_ITEMS} items; at most {MAX_ITEMS} per campaign: lower k or choose fewer steps",
            )
    if not picks:
        unreadable = f" ({len(gaps)} rollout files could not be read: {gaps[0].reason})" if gaps else ""
        raise InvalidInput.one("source", _nothing_selected(source, kind) + unreadable)
    gold_picked = _gold_items(gold, questions, len(picks), source["seed"])
    if len(picks) + len(gold_picked) > MAX_ITEMS:
        raise InvalidInput.one(
            "source.k",
            f"selects {len(picks) + len(gold_picked)} items (gold included); at most {MAX_ITEMS} per campaign: "
            "lower k or choose fewer steps",
        )
    return Draw(picks, gold_picked, unique_gaps(gaps))


def source_rollouts(source: dict[str, Any]) -> int:
    """How many rollouts the source's runs hold at its steps, from the index alone (no file is read)."""
    steps = source["steps"]
    if source["rule"] == "alerts":
        steps = sorted({alert["step"] for alert in source["alerts"]})
    return rollouts_total(source["runs"], steps, source["step_range"])


def _nothing_selected(source: dict[str, Any], kind: str) -> str:
    if kind == CampaignKind.PAIR and len(source["runs"]) == 2:
        return "selects no items: the two runs have no prompt in common at these steps with different responses"
    if kind == CampaignKind.PAIR:
        return "selects no items: no prompt group at these steps has two different responses"
    if source["rule"] in ("component_disagreement", "reward_vs_component"):
        return (
            f"selects no items: no sample at these steps has a finite reward and the components "
            f"{', '.join(source['components'])}"
        )
    if source["rule"] == "reward_vs_judge":
        return "selects no items: no sample at these steps has both a reward and a score from the judge run"
    if source["rule"] == "alerts":
        return "selects no items: the runs have no samples at the steps their alerts point to"
    return "selects no items: the runs have no samples at these steps (with a reward, for the reward rules)"


def _gold_items(spec: dict[str, Any] | None, questions: list, sampled: int, seed: int) -> list[GoldRow]:
    """The gold rows the campaign mixes in (see posttrain.review.gold)."""
    if spec is None:
        return []
    dataset = Dataset.objects.filter(pk=spec["dataset"]).first()
    if dataset is None:
        raise InvalidInput.one("gold.dataset", f"no dataset with id {spec['dataset']}")
    if dataset.row_count > MAX_GOLD_DATASET_ROWS:
        raise InvalidInput.one(
            "gold.dataset", f"has {dataset.row_count} rows; a gold dataset has at most {MAX_GOLD_DATASET_ROWS}"
        )
    try:
        rows = read_rows(dataset.path, dataset.format)
    except (DataError, OSError, ValueError):
        raise InvalidInput.one("gold.dataset", f"dataset {dataset.pk}'s stored file cannot be read") from None
    return gold_rows(
        rows,
        spec,
        questions,
        prompt_field=dataset.prompt_field,
        label_field=dataset.label_field,
        count=gold_count(spec["share"], sampled),
        seed=seed,
    )


def _rollout_copies(campaign: Campaign, picks: list[Pick], source: dict[str, Any]) -> dict[RolloutKey, ReviewRollout]:
    """The picked rollouts copied into the campaign (text, reward, per-token view), by key."""
    keys = {key for pick in picks for key in (pick.a, pick.b) if key is not None}
    copies = [
        ReviewRollout(
            campaign=campaign,
            run_id=rollout["run"],
            step=rollout["step"],
            index=rollout["index"],
            group=rollout["group"],
            prompt=rollout["prompt"],
            response=rollout["response"],
            label=rollout["label"],
            reward=rollout["reward"],
            components=rollout["components"],
            finish_reason=rollout["finish_reason"] or "",
            tokens=rollout["tokens"],
            turns=rollout["turns"],
        )
        for rollout in rollouts_query(source["runs"], refs=keys, text=True, tokens=True)
    ]
    ReviewRollout.objects.bulk_create(copies, batch_size=500)
    return {(str(c.run_id), int(c.step or 0), int(c.index or 0)): c for c in copies}  # copies of runs: both set


def _gold_copies(campaign: Campaign, rows: list[GoldRow], dataset_id: int) -> dict[tuple, ReviewRollout]:
    copies: dict[tuple, ReviewRollout] = {}
    for row in rows:
        for side, response in (("a", row.response_a), ("b", row.response_b)):
            if response is not None:
                copies[("gold", row.row, side)] = ReviewRollout(
                    campaign=campaign, prompt=row.prompt, response=response, dataset_id=dataset_id, dataset_row=row.row
                )
    ReviewRollout.objects.bulk_create(list(copies.values()), batch_size=500)
    return copies


def campaign_create(
    *,
    name: str,
    kind: str,
    questions: Any,
    source: Any,
    description: str = "",
    instructions: str = "",
    blind: bool = True,
    overlap: int = 1,
    lock_ttl_s: int = 600,
    annotators: Sequence[User] = (),
    reviewers: Sequence[User] = (),
    review_rating_spread: int = 2,
    gold: Any = None,
    gold_policy: Any = None,
    show_suggestions: bool = False,
    project: Project,
    user: User | None = None,
) -> Campaign:
    """A draft campaign in `project` with its items sampled from the runs (deterministic by the source's seed),
    each showing its own copy of its rollouts, and the gold rows mixed in (posttrain.review.gold). The runs, the
    judge pool and the gold dataset are ones `user` reads (the caller checked they create in `project`)."""
    errors: list[dict[str, str]] = []
    name = _collect(errors, lambda: _clean_text(name, "name", limit=NAME_MAX_CHARS, required=True))
    description = _collect(errors, lambda: _clean_text(description, "description", limit=TEXT_MAX_CHARS))
    instructions = _collect(errors, lambda: _clean_text(instructions, "instructions", limit=TEXT_MAX_CHARS))
    for field, flag in (("blind", blind), ("show_suggestions", show_suggestions)):
        if not isinstance(flag, bool):
            errors.append({"loc": field, "msg": "must be true or false"})
    _collect(errors, _bounded_int, overlap, "overlap", 1, MAX_OVERLAP, "annotators per item")
    _collect(errors, _bounded_int, lock_ttl_s, "lock_ttl_s", MIN_LOCK_TTL_S, MAX_LOCK_TTL_S, "seconds")
    _collect(errors, _bounded_int, review_rating_spread, "review_rating_spread", 1, MAX_RATING_SPREAD, "rating points")
    annotators = _collect(errors, _check_annotators, annotators)
    reviewers = _collect(errors, _check_reviewers, reviewers)
    gold_policy = _collect(errors, validate_gold_policy, gold_policy)
    kind = _collect(errors, _check_kind, kind)
    if kind is not None:
        questions = _collect(errors, validate_questions, questions, kind)
        source = _collect(errors, validate_source, source, kind)
        if source is not None:
            _collect(errors, _check_runs, source["runs"], user)
        if questions is not None and isinstance(blind, bool):
            gold = _collect(errors, validate_gold_spec, gold, kind, questions, blind)
    if errors:
        raise InvalidInput(errors)
    _check_readable_inputs(source, gold, user)

    if source["rule"] == "alerts" and source["alerts"] is None:
        source["alerts"] = _alert_pointers(source)
    fields = {
        "project": project,
        "name": name,
        "description": description,
        "instructions": instructions,
        "kind": kind,
        "questions": questions,
        "source": source,
        "blind": blind,
        "overlap": overlap,
        "lock_ttl_s": lock_ttl_s,
        "review_rating_spread": review_rating_spread,
        "gold_spec": gold,
        "gold_policy": gold_policy,
        "show_suggestions": show_suggestions,
        "created_by": user if user is not None and user.is_authenticated else None,
    }
    if source_rollouts(source) > settings.REVIEW_CAMPAIGN_INLINE_MAX_ROLLOUTS:
        return _campaign_queue_build(fields, annotators, reviewers)
    draw = _draw(source, kind, questions, gold)
    with transaction.atomic():
        campaign = Campaign.objects.create(**fields, gaps=gaps_payload(draw.gaps, with_run=True))
        campaign.annotators.set(annotators)
        campaign.reviewers.set(reviewers)
        _make_items(campaign, draw)
    return campaign


def _campaign_queue_build(fields: dict[str, Any], annotators: Sequence[User], reviewers: Sequence[User]) -> Campaign:
    """A campaign over more rollouts than a request should read: created building, its items drawn by the
    task `workers.review_campaign_build` (campaign_build) after commit, on the default queue."""
    with transaction.atomic():
        campaign = Campaign.objects.create(**fields, state=CampaignState.BUILDING)
        campaign.annotators.set(annotators)
        campaign.reviewers.set(reviewers)
        transaction.on_commit(lambda: task_send("review_campaign_build", str(campaign.pk)))
    return campaign


def campaign_build(campaign_id: Any) -> None:
    """A worker draws a building campaign's items: building → draft with its items, or → failed with the
    reason (what the request would have answered: none selected, too many, a gold dataset unreadable).
    Idempotent: a campaign no longer building is left alone, and the items are made under its row lock."""
    campaign = Campaign.objects.filter(pk=campaign_id, state=CampaignState.BUILDING).first()
    if campaign is None:
        return
    try:
        draw = _draw(campaign.source, campaign.kind, campaign.questions, campaign.gold_spec)
    except InvalidInput as refused:
        _build_failed(campaign, "; ".join(f"{e['loc']}: {e['msg']}" if e["loc"] else e["msg"] for e in refused.errors))
        return
    except Exception as exc:
        _build_failed(campaign, f"{type(exc).__name__}: {exc}")
        raise
    with transaction.atomic():
        if not Campaign.objects.select_for_update().filter(pk=campaign.pk, state=CampaignState.BUILDING).exists():
            return  # closed meanwhile, or built by another worker
        _make_items(campaign, draw)
        Campaign.objects.filter(pk=campaign.pk).update(
            state=CampaignState.DRAFT, state_changed_at=timezone.now(), gaps=gaps_payload(draw.gaps, with_run=True)
        )


def _build_failed(campaign: Campaign, reason: str) -> None:
    Campaign.objects.filter(pk=campaign.pk, state=CampaignState.BUILDING).update(
        state=CampaignState.FAILED, state_changed_at=timezone.now(), build_error=reason[:2000]
    )


def _make_items(campaign: Campaign, draw: Draw) -> None:
    """The campaign's copies of the picked rollouts and gold rows, and its items in queue order."""
    source, gold = campaign.source, campaign.gold_spec
    gold_picks = [
        Pick(("gold", row.row, "a"), None if row.response_b is None else ("gold", row.row, "b"), {"rule": "gold"})
        for row in draw.gold
    ]
    known = {("gold", row.row, "a"): row.answers for row in draw.gold}
    copies: dict[Any, ReviewRollout] = {
        **_rollout_copies(campaign, draw.picks, source),
        **(_gold_copies(campaign, draw.gold, gold["dataset"]) if gold else {}),
    }
    # A pick whose file went away since the draw (retention) has no copy: it is left out.
    picks = [pick for pick in draw.picks + gold_picks if pick.a in copies and (pick.b is None or pick.b in copies)]
    ReviewItem.objects.bulk_create(
        [
            ReviewItem(
                campaign=campaign,
                position=position,
                rollout_a=copies[pick.a],
                rollout_b=None if pick.b is None else copies[pick.b],
                display_swap=swap,
                selection=pick.selection,
                gold=known.get(pick.a),
                gold_source=GoldSource.DATASET if pick.a in known else GoldSource.NONE,
            )
            for position, (pick, swap) in enumerate(queue_order(picks, source["seed"]))
        ],
        batch_size=1000,
    )


def campaign_update(
    campaign: Campaign,
    *,
    name: str | None = None,
    description: str | None = None,
    instructions: str | None = None,
    annotators: Sequence[User] | None = None,
    reviewers: Sequence[User] | None = None,
    gold_policy: Any = None,
    show_suggestions: bool | None = None,
    review_rating_spread: int | None = None,
) -> Campaign:
    """Edit the texts, who annotates and reviews, how gold weighs judgements and whether annotators see a
    judge's suggestions. Questions and source are fixed: the items were drawn from them. A new rating
    spread applies to items completed from now on."""
    fields = []
    if gold_policy is not None:
        campaign.gold_policy = validate_gold_policy(gold_policy)
        fields.append("gold_policy")
    if show_suggestions is not None:
        if not isinstance(show_suggestions, bool):
            raise InvalidInput.one("show_suggestions", "must be true or false")
        campaign.show_suggestions = show_suggestions
        fields.append("show_suggestions")
    if review_rating_spread is not None:
        campaign.review_rating_spread = _bounded_int(
            review_rating_spread, "review_rating_spread", 1, MAX_RATING_SPREAD, "rating points"
        )
        fields.append("review_rating_spread")
    if name is not None:
        campaign.name = _clean_text(name, "name", limit=NAME_MAX_CHARS, required=True)
        fields.append("name")
    if description is not None:
        campaign.description = _clean_text(description, "description", limit=TEXT_MAX_CHARS)
        fields.append("description")
    if instructions is not None:
        campaign.instructions = _clean_text(instructions, "instructions", limit=TEXT_MAX_CHARS)
        fields.append("instructions")
    with transaction.atomic():
        if annotators is not None:
            annotators = _check_annotators(annotators)
            if campaign.state == CampaignState.ACTIVE and len(annotators) < campaign.overlap:
                raise InvalidInput.one(
                    "annotators",
                    f"an active campaign with overlap {campaign.overlap} needs at least {campaign.overlap} annotators",
                )
            campaign.annotators.set(annotators)
        if reviewers is not None:
            campaign.reviewers.set(_check_reviewers(reviewers))
        if fields:
            campaign.save(update_fields=fields)
    return campaign


def _transition(
    campaign: Campaign, allowed_from: Sequence[str], to_state: str, verb: str, now: datetime | None
) -> Campaign:
    updated = Campaign.objects.filter(pk=campaign.pk, state__in=allowed_from).update(
        state=to_state, state_changed_at=now or timezone.now()
    )
    campaign.refresh_from_db(fields=["state", "state_changed_at"])
    if not updated:
        raise IllegalTransition(f"cannot {verb} a campaign that is {campaign.state}", campaign.state)
    return campaign


def campaign_activate(campaign: Campaign, *, now: datetime | None = None) -> Campaign:
    """Open the queue to the annotators (draft → active)."""
    assigned = campaign.annotators.count()
    if campaign.state == CampaignState.DRAFT and assigned < campaign.overlap:
        raise IllegalTransition(
            f"assign at least {campaign.overlap} annotator(s) (the overlap) before activating; {assigned} assigned",
            campaign.state,
        )
    return _transition(campaign, [CampaignState.DRAFT], CampaignState.ACTIVE, "activate", now)


def campaign_close(campaign: Campaign, *, now: datetime | None = None) -> Campaign:
    """Stop the work (draft or active → closed; a building or failed campaign too); judgements stay for
    results and export."""
    return _transition(
        campaign,
        [CampaignState.DRAFT, CampaignState.ACTIVE, CampaignState.BUILDING, CampaignState.FAILED],
        CampaignState.CLOSED,
        "close",
        now,
    )


# =============================================================================================
# The queue
# =============================================================================================


def _require_assigned(campaign: Campaign, user: User) -> None:
    if not campaign.annotators.filter(pk=user.pk).exists():
        raise NotAssigned()


def _require_active(campaign: Campaign) -> None:
    state = Campaign.objects.values_list("state", flat=True).get(pk=campaign.pk)  # fresh: it may have closed
    if state != CampaignState.ACTIVE:
        raise IllegalTransition(f"the campaign is {state}: only an active campaign takes work", state)


def _free_for(user: User, now: datetime) -> Q:
    """Nobody else holds an unexpired lock."""
    return Q(locked_by__isnull=True) | Q(locked_until__lte=now) | Q(locked_by=user)


def open_items(campaign: Campaign, user: User) -> QuerySet[ReviewItem]:
    """Items the user may still judge: not done (fewer than `overlap` judgements), not judged by them."""
    judged = Judgement.objects.filter(item=OuterRef("pk"), annotator=user)
    return campaign.items.filter(judgement_count__lt=campaign.overlap).exclude(Exists(judged))


def _claimable(campaign: Campaign, user: User, now: datetime) -> QuerySet[ReviewItem]:
    """Open items nobody else holds, in queue order: unskipped ones first, then the ones this user
    skipped, earliest skip first."""
    last_skip = Skip.objects.filter(item=OuterRef("pk"), annotator=user).order_by("-at").values("at")[:1]
    return (
        open_items(campaign, user)
        .filter(_free_for(user, now))
        .annotate(skipped_at=Subquery(last_skip))
        .order_by(F("skipped_at").asc(nulls_first=True), "position")
    )


def _load(pk: int) -> ReviewItem:
    return ReviewItem.objects.select_related("campaign", "rollout_a__run", "rollout_b__run").get(pk=pk)


def item_claim_next(campaign: Campaign, user: User, *, now: datetime | None = None) -> ReviewItem | None:
    """Lock the user's next item and return it; None when nothing is left for them now.

    An item the user already holds comes back (its lock renewed): reloading the page loses nothing."""
    now = now or timezone.now()
    _require_assigned(campaign, user)
    _require_active(campaign)
    until = now + timedelta(seconds=campaign.lock_ttl_s)
    held = (
        open_items(campaign, user)
        .filter(locked_by=user, locked_until__gt=now)
        .order_by("position")
        .values_list("pk", flat=True)
        .first()
    )
    if held is not None and ReviewItem.objects.filter(pk=held, locked_by=user).update(locked_until=until):
        return _load(held)
    for _ in range(MAX_CLAIM_ROUNDS):
        candidates = list(_claimable(campaign, user, now).values_list("pk", flat=True)[:CLAIM_BATCH])
        if not candidates:
            return None
        for pk in candidates:
            # The same conditions as the candidate query, checked again in the UPDATE itself: another
            # annotator (or this user in another tab) may have taken or judged the item since.
            won = (
                open_items(campaign, user)
                .filter(pk=pk)
                .filter(_free_for(user, now))
                .update(locked_by=user, locked_until=until)
            )
            if won:
                return _load(pk)
    raise ItemUnavailable("other annotators took every item offered to you just now; ask for the next item again")


def item_release(item: ReviewItem, user: User) -> bool:
    """Give the item back without judging it; False when the user did not hold it."""
    _require_assigned(item.campaign, user)
    return ReviewItem.objects.filter(pk=item.pk, locked_by=user).update(locked_by=None, locked_until=None) == 1


def item_skip(item: ReviewItem, user: User, *, now: datetime | None = None) -> Skip:
    """Put the item off: its lock is released and it comes back after the user's unskipped items."""
    now = now or timezone.now()
    _require_assigned(item.campaign, user)
    _require_active(item.campaign)
    if Judgement.objects.filter(item=item, annotator=user).exists():
        raise ItemUnavailable("you have judged this item already; there is nothing to skip")
    with transaction.atomic():
        skip = Skip.objects.create(item=item, annotator=user, at=now)
        ReviewItem.objects.filter(pk=item.pk, locked_by=user).update(locked_by=None, locked_until=None)
    return skip


def _check_seconds(seconds: Any) -> float:
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, (int, float))
        or not math.isfinite(seconds)
        or not 0 <= seconds <= MAX_SECONDS
    ):
        raise InvalidInput.one("seconds", f"must be a number of seconds from 0 to {MAX_SECONDS:.0f}")
    return float(seconds)


def judgement_submit(
    item: ReviewItem, user: User, answers: Any, seconds: Any = 0.0, *, now: datetime | None = None
) -> tuple[Judgement, bool]:
    """Store the user's answers on the item (as they saw it: pairwise "A" is the response shown as A);
    returns (judgement, created). The lock is released.

    A first judgement needs the item free for the user (they hold the lock, or nobody holds an unexpired
    one) and still short of `overlap` judgements. Submitting again edits the user's own judgement: the
    answers are replaced and the seconds added up."""
    now = now or timezone.now()
    campaign = item.campaign
    _require_assigned(campaign, user)
    _require_active(campaign)
    shown = _with_steps(campaign, item, validate_answers(campaign.questions, answers), "answers")
    seconds = _check_seconds(seconds)
    stored = swap_pairwise(campaign.questions, shown, item.display_swap)
    try:
        with transaction.atomic():
            existing = Judgement.objects.select_for_update().filter(item=item, annotator=user).first()
            if existing is not None:
                ReviewItem.objects.select_for_update().filter(pk=item.pk).first()  # as the first path's UPDATE
                existing.answers = stored
                existing.seconds += seconds
                existing.save(update_fields=["answers", "seconds", "updated_at"])
                _refresh_review_state(item.pk, campaign)
                return existing, False
            taken = (
                ReviewItem.objects.filter(pk=item.pk, judgement_count__lt=campaign.overlap)
                .filter(_free_for(user, now))
                .update(judgement_count=F("judgement_count") + 1, locked_by=None, locked_until=None)
            )
            if not taken:
                raise _why_unavailable(item.pk, campaign, now)
            judgement = Judgement.objects.create(item=item, annotator=user, answers=stored, seconds=seconds)
            _refresh_review_state(item.pk, campaign)
            return judgement, True
    except IntegrityError:  # the same user's concurrent submission won; this one changed nothing
        raise ItemUnavailable("you have judged this item already") from None


def _with_steps(campaign: Campaign, item: ReviewItem, answers: dict[str, Any], loc: str) -> dict[str, Any]:
    """Steps answers checked against the item's own response and normalised (posttrain.review.steps)."""
    questions = [q for q in campaign.questions if q["kind"] == "steps" and answers.get(q["key"]) is not None]
    if not questions:
        return answers
    steps = split_steps(item.rollout_a.response, item.rollout_a.tokens)
    return {
        **answers,
        **{q["key"]: check_step_answer(q, answers[q["key"]], steps, f"{loc}.{q['key']}") for q in questions},
    }


def _refresh_review_state(item_id: int, campaign: Campaign) -> None:
    """Called with the item's row locked, after a judgement was stored: a complete item whose annotators
    disagree is pending review; one they now agree on (an annotator edited their answer) is not. Decided
    and gold items keep their state."""
    fresh = ReviewItem.objects.values("judgement_count", "review_state", "gold").get(pk=item_id)
    if fresh["review_state"] == ReviewState.DECIDED or fresh["gold"] or fresh["judgement_count"] < campaign.overlap:
        return
    answers = list(Judgement.objects.filter(item_id=item_id).values_list("answers", flat=True))
    disagree = disagreeing_questions(campaign.questions, answers, campaign.review_rating_spread)
    state = ReviewState.PENDING if disagree else ReviewState.NONE
    if state != fresh["review_state"]:
        ReviewItem.objects.filter(pk=item_id).update(review_state=state)


def _why_unavailable(pk: int, campaign: Campaign, now: datetime) -> ItemUnavailable:
    fresh = ReviewItem.objects.get(pk=pk)
    if fresh.judgement_count >= campaign.overlap:
        return ItemUnavailable(f"the item has all its {campaign.overlap} judgement(s) already")
    # Released since the claim failed (locked_until cleared): held, but no longer until a known time.
    until = f" until {fresh.locked_until.isoformat()}" if fresh.locked_until is not None else ""
    return ItemUnavailable(f"another annotator holds this item{until}")


# =============================================================================================
# Gold answers set by the owner
# =============================================================================================


def item_gold_set(item: ReviewItem, answers: Any) -> ReviewItem:
    """Mark the item as gold with its known answers (graded questions; pairwise "A" = rollout_a), or
    unmark it (`answers` None). A gold item leaves the reviewers' queue: its answer is known."""
    campaign = item.campaign
    with transaction.atomic():
        locked = ReviewItem.objects.select_for_update().select_related("rollout_a").get(pk=item.pk)
        if answers is None:
            if locked.gold_source == GoldSource.DATASET:
                raise InvalidInput.one("answers", "a gold row from the campaign's dataset stays gold")
            locked.gold, locked.gold_source = None, GoldSource.NONE
            locked.save(update_fields=["gold", "gold_source"])
            _refresh_review_state(locked.pk, campaign)
        else:
            known = _with_steps(
                campaign, locked, validate_known_answers(campaign.questions, answers, "answers"), "answers"
            )
            locked.gold = known
            if locked.gold_source != GoldSource.DATASET:
                locked.gold_source = GoldSource.OWNER
            fields = ["gold", "gold_source"]
            if locked.review_state == ReviewState.PENDING:
                locked.review_state = ReviewState.NONE
                fields.append("review_state")
            locked.save(update_fields=fields)
    item.refresh_from_db()
    return item


# =============================================================================================
# The reviewers' queue: adjudication
# =============================================================================================


def _require_reviewer(campaign: Campaign, user: User) -> None:
    if not campaign.reviewers.filter(pk=user.pk).exists():
        raise NotAssigned()


def _require_reviewable(campaign: Campaign) -> None:
    """Adjudication goes on while annotators work and after the campaign closes; a draft has no work."""
    state = Campaign.objects.values_list("state", flat=True).get(pk=campaign.pk)
    if state == CampaignState.DRAFT:
        raise IllegalTransition("the campaign is draft: nothing to adjudicate before it is active", state)


def review_items(campaign: Campaign) -> QuerySet[ReviewItem]:
    """Items waiting for a reviewer: complete, not gold, and their annotators disagree."""
    return campaign.items.filter(review_state=ReviewState.PENDING)


def item_claim_for_review(campaign: Campaign, user: User, *, now: datetime | None = None) -> ReviewItem | None:
    """Lock the reviewer's next pending item (the one they hold first) and return it; None when none is left."""
    now = now or timezone.now()
    _require_reviewer(campaign, user)
    _require_reviewable(campaign)
    until = now + timedelta(seconds=campaign.lock_ttl_s)
    pending = review_items(campaign)
    for _ in range(MAX_CLAIM_ROUNDS):
        held = pending.filter(locked_by=user, locked_until__gt=now).order_by("position").values_list("pk", flat=True)
        free = pending.filter(_free_for(user, now)).order_by("position").values_list("pk", flat=True)
        candidates = [*held[:1], *free[:CLAIM_BATCH]]
        if not candidates:
            return None
        for pk in candidates:
            # Checked again in the UPDATE: another reviewer may have taken or decided it since.
            if pending.filter(pk=pk).filter(_free_for(user, now)).update(locked_by=user, locked_until=until):
                return _load(pk)
    raise ItemUnavailable("other reviewers took every item offered to you just now; ask for the next item again")


def item_review_release(item: ReviewItem, user: User) -> bool:
    """Give a pending item back undecided; False when the reviewer did not hold it."""
    _require_reviewer(item.campaign, user)
    released = ReviewItem.objects.filter(pk=item.pk, locked_by=user, review_state=ReviewState.PENDING).update(
        locked_by=None, locked_until=None
    )
    return released == 1


def decision_submit(item: ReviewItem, user: User, answers: Any, *, now: datetime | None = None) -> ReviewItem:
    """The reviewer's answers become the item's label (recorded with who decided and when). Pairwise "A"
    means rollout_a (the reviewer sees the stored order). The questions the annotators disagree on are
    required; a decided item may be decided again (the last decision stands)."""
    now = now or timezone.now()
    campaign = item.campaign
    _require_reviewer(campaign, user)
    _require_reviewable(campaign)
    judged = list(Judgement.objects.filter(item=item).values_list("answers", flat=True))
    required = tuple(disagreeing_questions(campaign.questions, judged, campaign.review_rating_spread))
    decided = _with_steps(
        campaign, item, validate_known_answers(campaign.questions, answers, "answers", required), "answers"
    )
    updated = (
        ReviewItem.objects.filter(pk=item.pk, review_state__in=[ReviewState.PENDING, ReviewState.DECIDED])
        .filter(_free_for(user, now))
        .update(
            decision=decided,
            decided_by=user,
            decided_at=now,
            review_state=ReviewState.DECIDED,
            locked_by=None,
            locked_until=None,
        )
    )
    if not updated:
        fresh = ReviewItem.objects.get(pk=item.pk)
        if fresh.review_state == ReviewState.NONE:
            raise ItemUnavailable("this item's annotators agree (or it is gold): it needs no decision")
        raise ItemUnavailable("another reviewer holds this item")
    return _load(item.pk)
