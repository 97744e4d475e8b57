"""A campaign's judgements as files: preference pairs for reward-model or DPO training, ratings as rows.

  trl            JSONL, TRL's standard preference format: {"prompt", "chosen", "rejected"} per line
  openai         JSONL, OpenAI's preference fine-tuning format:
                 {"input": {"messages": [{"role": "user", "content": prompt}]},
                  "preferred_output": [{"role": "assistant", "content": chosen}],
                  "non_preferred_output": [{"role": "assistant", "content": rejected}]}
  ratings_jsonl  JSONL, one line per judgement: item, annotator, both samples (id, run, step, reward,
                 components, response), the answers (pairwise "A" = sample_a) and seconds
  ratings_csv    the same as CSV: answers in `answer.<key>` columns (tags joined with "|", pass/fail as
                 true/false), without the components

Preference pairs come from pair campaigns: per item, the strict plurality of its annotators' answers to
the pairwise question (the first one, or the one named). Items whose plurality is "tie" or "both_bad",
whose top answers are level (one annotator says A, another B) or that nobody judged give no pair: a
preference dataset should hold only preferences the humans actually expressed.

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
from posttrain.registry.models import Dataset
from posttrain.registry.services import dataset_register_path
from posttrain.review.models import Campaign, CampaignKind, Judgement
from posttrain.review.selectors import pairwise_majority
from posttrain.runs.models import Sample


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
    "reward_a",
    "response_a",
    "sample_b",
    "run_b",
    "step_b",
    "reward_b",
    "response_b",
    "seconds",
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
    """One pair per item whose humans preferred one response (see the module doc), in queue order."""
    key = _pairwise_key(campaign, question)
    answers: dict[int, list[Any]] = {}
    for item_id, given in Judgement.objects.filter(item__campaign=campaign).values_list("item_id", "answers"):
        answers.setdefault(item_id, []).append(given.get(key))
    pairs = []
    for item in campaign.items.select_related("sample_a", "sample_b").order_by("position"):
        winner = pairwise_majority(answers.get(item.pk, []))
        if winner not in ("A", "B") or item.sample_b is None:
            continue
        chosen, rejected = (item.sample_a, item.sample_b) if winner == "A" else (item.sample_b, item.sample_a)
        pairs.append(PreferencePair(item.pk, item.sample_a.prompt, chosen.response, rejected.response))
    return pairs


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


def _sample_fields(sample: Sample | None, suffix: str) -> dict[str, Any]:
    if sample is None:
        return {
            f"sample_{suffix}": None,
            f"run_{suffix}": None,
            f"step_{suffix}": None,
            f"reward_{suffix}": None,
            f"components_{suffix}": None,
            f"response_{suffix}": None,
        }
    # Keys in a fixed order (Postgres jsonb reorders them): the same judgements always give the same bytes,
    # so registering an unchanged export again finds the same dataset.
    components = dict(sorted(sample.components.items())) if isinstance(sample.components, dict) else sample.components
    return {
        f"sample_{suffix}": sample.pk,
        f"run_{suffix}": str(sample.run_id),
        f"step_{suffix}": sample.step,
        f"reward_{suffix}": sample.reward,
        f"components_{suffix}": components,
        f"response_{suffix}": sample.response,
    }


def rating_rows(campaign: Campaign) -> list[dict[str, Any]]:
    """One row per judgement, by item position then annotator name (pairwise answers: "A" = sample_a);
    answers in the campaign's question order."""
    keys = [q["key"] for q in campaign.questions]
    judgements = (
        Judgement.objects.filter(item__campaign=campaign)
        .select_related("annotator", "item__sample_a", "item__sample_b")
        .order_by("item__position", "annotator__username")
    )
    return [
        {
            "campaign": campaign.pk,
            "item": j.item_id,
            "position": j.item.position,
            "annotator": j.annotator.get_username(),
            "prompt": j.item.sample_a.prompt,
            **_sample_fields(j.item.sample_a, "a"),
            **_sample_fields(j.item.sample_b, "b"),
            "answers": {key: j.answers[key] for key in keys if key in j.answers},
            "seconds": j.seconds,
        }
        for j in judgements
    ]


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "|".join(str(v) for v in value)
    return value


def _csv_line(values: list[Any]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(values)
    return buffer.getvalue()


def ratings_csv_lines(campaign: Campaign, rows: list[dict[str, Any]]) -> Iterator[str]:
    keys = [q["key"] for q in campaign.questions]
    yield _csv_line(_FIXED_CSV_COLUMNS + [f"answer.{key}" for key in keys])
    for row in rows:
        yield _csv_line(
            [_csv_value(row[c]) for c in _FIXED_CSV_COLUMNS] + [_csv_value(row["answers"].get(key)) for key in keys]
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
        what = "preference pairs (items whose annotators preferred A or B)" if format == "trl" else "judgements"
        raise InvalidInput.one("format", f"nothing to export yet: the campaign has no {what}")
    staging = Path(settings.STORAGE_ROOT) / "review" / "exports" / f"campaign-{campaign.pk}"
    staging.mkdir(parents=True, exist_ok=True)
    path = staging / f"{format}-{uuid.uuid4().hex}.{kind.extension}"
    path.write_text("".join(export.lines), encoding="utf-8")
    try:
        # The registry copies the file into its content-addressed store; the staged copy is not needed after.
        dataset, created = dataset_register_path(
            name or f"{campaign.name[:150]} ({format})",
            str(path),
            format=kind.extension,
            prompt_field="prompt",
            label_field="",
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
