"""A campaign's labels as files: preference pairs for reward-model or DPO training, step labels for a
process reward model, ratings as rows.

  trl            JSONL, TRL's standard preference format: {"prompt", "chosen", "rejected"} per line
  openai         JSONL, OpenAI's preference fine-tuning format:
                 {"input": {"messages": [{"role": "user", "content": prompt}]},
                  "preferred_output": [{"role": "assistant", "content": chosen}],
                  "non_preferred_output": [{"role": "assistant", "content": rejected}]}
  prm            JSONL, step labels in PRM800K's style: {"prompt", "steps": [...], "labels": [1, 1, -1]}
                 (posttrain.review.steps: the steps up to the first wrong one)
  ratings_jsonl  JSONL, one line per judgement: item, annotator, both rollouts (reference: run, step,
                 index; reward, components, response), the answers (pairwise "A" = rollout_a), seconds,
                 the annotator's gold weight (0: set aside), whether the item is gold, and the item's
                 labels with who decided them
  ratings_csv    the same as CSV: answers in `answer.<key>` and labels in `label.<key>` columns (tags
                 joined with "|", pass/fail as true/false, a steps answer as its first wrong step or
                 "none"), without the components

Preference pairs and step labels come from each item's label (posttrain.review.labels): a gold item's
known answer, else the reviewer's decision, else its annotators' weighted vote, annotators weighted
by their gold accuracy as the campaign's gold policy says (those set aside count for nothing). Pairs:
items whose label is "tie" or "both_bad", whose top answers weigh the same (one annotator says A,
another B, nobody decided) or that nobody judged give no pair: a preference dataset should hold only
preferences the humans actually expressed. Gold rows drawn from a dataset are left out of pairs and
step labels: they came from that dataset, they are not new data.

`campaign_export_register` stores an export in the registry as a dataset (hashed, counted, previewed by
the registry's own file registration) whose `source_campaign_id` is the campaign.
"""

from __future__ import annotations

import csv
import io
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import ValidationError

from posttrain.core.errors import InvalidInput
from posttrain.projects.models import Project
from posttrain.registry.models import Dataset
from posttrain.registry.services import dataset_register_platform_file
from posttrain.review.models import Campaign, CampaignKind, GoldSource, Judgement, ReviewRollout
from posttrain.review.selectors import campaign_labels
from posttrain.review.steps import prm_record, split_steps


@dataclass(frozen=True)
class ExportFormat:
    content_type: str
    extension: str
    registrable: bool = True


EXPORT_FORMATS: dict[str, ExportFormat] = {
    "trl": ExportFormat("application/x-ndjson", "jsonl"),
    # The registry keeps prompt datasets with a top-level prompt field; OpenAI's rows nest the prompt in
    # input.messages, so this one is a download only (trl holds the same pairs and registers).
    "openai": ExportFormat("application/x-ndjson", "jsonl", registrable=False),
    "prm": ExportFormat("application/x-ndjson", "jsonl"),
    "ratings_jsonl": ExportFormat("application/x-ndjson", "jsonl"),
    "ratings_csv": ExportFormat("text/csv", "csv"),
}
PREFERENCE_FORMATS = ("trl", "openai")
_FIXED_CSV_COLUMNS = [
    "campaign",
    "item",
    "position",
    "annotator",
    "prompt",
    "sample_a",
    "run_a",
    "step_a",
    "index_a",
    "reward_a",
    "response_a",
    "sample_b",
    "run_b",
    "step_b",
    "index_b",
    "reward_b",
    "response_b",
    "seconds",
    "weight",
    "gold",
    "decided_by",
]


@dataclass(frozen=True)
class PreferencePair:
    item: int
    prompt: str
    chosen: str
    rejected: str


def check_format(fmt: Any) -> str:
    if fmt not in EXPORT_FORMATS:
        raise InvalidInput.one("format", f"must be one of {', '.join(EXPORT_FORMATS)}, got {str(fmt)[:50]!r}")
    return fmt


def _pairwise_key(campaign: Campaign, question: str | None) -> str:
    keys = [q["key"] for q in campaign.questions if q["kind"] == "pairwise"]
    if campaign.kind != CampaignKind.PAIR or not keys:
        raise InvalidInput.one(
            "format",
            "preference pairs need a pair campaign with a pairwise question; "
            "export ratings_jsonl or ratings_csv instead",
        )
    if question is None:
        return keys[0]
    if question not in keys:
        raise InvalidInput.one(
            "question", f"{question[:50]!r} is not a pairwise question of the campaign ({', '.join(keys)})"
        )
    return question


def preference_pairs(campaign: Campaign, question: str | None = None) -> list[PreferencePair]:
    """One pair per item whose label prefers one response (see the module doc), in queue order."""
    key = _pairwise_key(campaign, question)
    labels = campaign_labels(campaign).labels
    pairs = []
    items = campaign.items.exclude(gold_source=GoldSource.DATASET).select_related("rollout_a", "rollout_b")
    for item in items.order_by("position"):
        label = labels.get(item.pk, {}).get(key)
        if label is None or label.value not in ("A", "B") or item.rollout_b is None:
            continue
        chosen, rejected = (item.rollout_a, item.rollout_b) if label.value == "A" else (item.rollout_b, item.rollout_a)
        pairs.append(PreferencePair(item.pk, item.rollout_a.prompt, chosen.response, rejected.response))
    return pairs


def _steps_key(campaign: Campaign) -> str:
    key = next((q["key"] for q in campaign.questions if q["kind"] == "steps"), None)
    if key is None:
        raise InvalidInput.one(
            "format", "step labels need a campaign with a steps question; export ratings_jsonl or ratings_csv instead"
        )
    return key


def step_records(campaign: Campaign) -> list[dict[str, Any]]:
    """One PRM800K-style record per item whose steps question has a label, in queue order."""
    key = _steps_key(campaign)
    labels = campaign_labels(campaign).labels
    records = []
    for item in campaign.items.exclude(gold_source=GoldSource.DATASET).select_related("rollout_a").order_by("position"):
        label = labels.get(item.pk, {}).get(key)
        if label is None:
            continue
        rollout = item.rollout_a
        steps = split_steps(rollout.response, rollout.tokens)
        if steps.texts:
            records.append(prm_record(rollout.prompt, steps, label.value.get("first_wrong")))
    return records


def _jsonl(record: dict[str, Any]) -> str:
    return json.dumps(record, ensure_ascii=False) + "\n"


def trl_record(pair: PreferencePair) -> dict[str, Any]:
    return {"prompt": pair.prompt, "chosen": pair.chosen, "rejected": pair.rejected}


def openai_record(pair: PreferencePair) -> dict[str, Any]:
    return {
        "input": {"messages": [{"role": "user", "content": pair.prompt}]},
        "preferred_output": [{"role": "assistant", "content": pair.chosen}],
        "non_preferred_output": [{"role": "assistant", "content": pair.rejected}],
    }


def _sample_fields(rollout: ReviewRollout | None, suffix: str) -> dict[str, Any]:
    if rollout is None:
        return {
            f"sample_{suffix}": None,
            f"run_{suffix}": None,
            f"step_{suffix}": None,
            f"index_{suffix}": None,
            f"reward_{suffix}": None,
            f"components_{suffix}": None,
            f"response_{suffix}": None,
        }
    # Keys in a fixed order (Postgres jsonb reorders them): the same judgements always give the same bytes,
    # so registering an unchanged export again finds the same dataset.
    components = (
        dict(sorted(rollout.components.items())) if isinstance(rollout.components, dict) else rollout.components
    )
    return {
        f"sample_{suffix}": rollout.pk,
        f"run_{suffix}": None if rollout.run_id is None else str(rollout.run_id),
        f"step_{suffix}": rollout.step,
        f"index_{suffix}": rollout.index,
        f"reward_{suffix}": rollout.reward,
        f"components_{suffix}": components,
        f"response_{suffix}": rollout.response,
    }


def _ordered(answers: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    return {
        key: dict(sorted(answers[key].items())) if isinstance(answers[key], dict) else answers[key]
        for key in keys
        if key in answers
    }


def rating_rows(campaign: Campaign) -> list[dict[str, Any]]:
    """One row per judgement, by item position then annotator name (pairwise answers: "A" = rollout_a);
    answers and labels in the campaign's question order."""
    keys = [q["key"] for q in campaign.questions]
    labels = campaign_labels(campaign)
    judgements = (
        Judgement.objects.filter(item__campaign=campaign)
        .select_related("annotator", "item__rollout_a", "item__rollout_b", "item__decided_by")
        .order_by("item__position", "annotator__username")
    )
    rows = []
    for j in judgements:
        annotator = j.annotator.get_username()
        item_labels = labels.labels.get(j.item_id, {})
        rows.append(
            {
                "campaign": campaign.pk,
                "item": j.item_id,
                "position": j.item.position,
                "annotator": annotator,
                "prompt": j.item.rollout_a.prompt,
                **_sample_fields(j.item.rollout_a, "a"),
                **_sample_fields(j.item.rollout_b, "b"),
                "answers": _ordered(j.answers, keys),
                "seconds": j.seconds,
                "weight": labels.weight(annotator),
                "gold": j.item.gold is not None,
                "labels": _ordered({k: label.value for k, label in item_labels.items()}, keys),
                "label_sources": {k: item_labels[k].source for k in keys if k in item_labels},
                "decided_by": None if j.item.decided_by is None else j.item.decided_by.get_username(),
            }
        )
    return rows


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "|".join(str(v) for v in value)
    if isinstance(value, dict):  # a steps answer
        first = value.get("first_wrong")
        return "none" if first is None else first
    return value


def _csv_line(values: list[Any]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(values)
    return buffer.getvalue()


def ratings_csv_lines(campaign: Campaign, rows: list[dict[str, Any]]) -> Iterator[str]:
    keys = [q["key"] for q in campaign.questions]
    graded = [q["key"] for q in campaign.questions if q["key"] in {k for row in rows for k in row["labels"]}]
    yield _csv_line(_FIXED_CSV_COLUMNS + [f"answer.{key}" for key in keys] + [f"label.{key}" for key in graded])
    for row in rows:
        yield _csv_line(
            [_csv_value(row[c]) for c in _FIXED_CSV_COLUMNS]
            + [_csv_value(row["answers"].get(key)) for key in keys]
            + [_csv_value(row["labels"].get(key)) for key in graded]
        )


@dataclass(frozen=True)
class Export:
    lines: list[str]
    records: int  # data rows (the CSV header not counted)


def export_campaign(campaign: Campaign, fmt: str, question: str | None = None) -> Export:
    """The whole file, built before anything is sent, so a bad request is a 400 and not half a download."""
    check_format(fmt)
    if fmt in PREFERENCE_FORMATS:
        record = trl_record if fmt == "trl" else openai_record
        pairs = preference_pairs(campaign, question)
        return Export([_jsonl(record(pair)) for pair in pairs], len(pairs))
    if fmt == "prm":
        records = step_records(campaign)
        return Export([_jsonl(r) for r in records], len(records))
    rows = rating_rows(campaign)
    if fmt == "ratings_jsonl":
        return Export([_jsonl(row) for row in rows], len(rows))
    return Export(list(ratings_csv_lines(campaign, rows)), len(rows))


def export_filename(campaign: Campaign, fmt: str) -> str:
    return f"campaign-{campaign.pk}-{fmt}.{EXPORT_FORMATS[fmt].extension}"


def campaign_export_register(
    campaign: Campaign,
    format: str,
    name: str | None = None,
    user: User | AnonymousUser | None = None,
    *,
    project: Project,
    description: str = "",
    question: str | None = None,
) -> tuple[Dataset, bool]:
    """Write the export under the storage root and register it as a dataset with lineage to the campaign;
    returns (dataset, created). The same content registered before returns that dataset (created False):
    the registry stores each content once."""
    check_format(format)
    kind = EXPORT_FORMATS[format]
    if not kind.registrable:
        raise InvalidInput.one(
            "format",
            "openai rows nest the prompt in input.messages, and registry datasets need "
            "a top-level prompt field: register trl (the same pairs) or download openai",
        )
    export = export_campaign(campaign, format, question)
    if export.records == 0:
        what = {
            "trl": "preference pairs (items whose label prefers A or B)",
            "prm": "step labels (items whose first wrong step is labelled)",
        }.get(format, "judgements")
        raise InvalidInput.one("format", f"nothing to export yet: the campaign has no {what}")
    staging = Path(settings.STORAGE_ROOT) / "review" / "exports" / f"campaign-{campaign.pk}"
    staging.mkdir(parents=True, exist_ok=True)
    path = staging / f"{format}-{uuid.uuid4().hex}.{kind.extension}"
    path.write_text("".join(export.lines), encoding="utf-8")
    try:
        # The registry copies the file into its content-addressed store; the staged copy is not needed after.
        dataset, created = dataset_register_platform_file(
            name or f"{campaign.name[:150]} ({format})",
            path,
            format=kind.extension,
            prompt_field="prompt",
            label_field="",
            project=project,
            user=user,
            description=description or f"Exported from review campaign {campaign.name!r} (#{campaign.pk}) as {format}.",
        )
    except ValidationError as exc:
        raise InvalidInput(
            [{"loc": field, "msg": message} for field, messages in exc.message_dict.items() for message in messages]
        ) from None
    finally:
        path.unlink(missing_ok=True)
    if dataset.source_campaign_id is None:
        Dataset.objects.filter(pk=dataset.pk, source_campaign_id__isnull=True).update(source_campaign_id=campaign.pk)
        dataset.refresh_from_db()
    return dataset, created
