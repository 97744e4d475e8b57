"""A campaign's items drawn from its source: the picks, the gold rows mixed in, the rollouts copied into
the campaign, and the items made of them in queue order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from posttrain.core.errors import InvalidInput
from posttrain.registry.models import Dataset
from posttrain.review.candidates import candidate_batches
from posttrain.review.gold import MAX_GOLD_DATASET_ROWS, GoldRow, gold_count, gold_rows
from posttrain.review.models import (
    Campaign,
    CampaignKind,
    GoldSource,
    JudgeRun,
    JudgeRunState,
    JudgeScore,
    ReviewItem,
    ReviewRollout,
)
from posttrain.review.sampling import Pick, RolloutKey, queue_order, select
from posttrain.telemetry.rollouts import Gap, unique_gaps
from posttrain.telemetry.selectors import rollouts_query, rollouts_total
from rl_engine.spec.user_code import DataError, read_rows

MAX_ITEMS = 5000


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
