"""Reads of what runs reported: metric series, rollouts (from their files), log lines and the Ray job's logs (over
Ray's Jobs HTTP API: the web process never imports ray)."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from django.conf import settings
from django.db.models.fields.json import KeyTransform

from posttrain.core.errors import DispatchError
from posttrain.core.ray_auth import RayTokenUnavailable, ray_request, refused_reason
from posttrain.runs.models import Run
from posttrain.telemetry import rollouts
from posttrain.telemetry.models import MetricRow, RunLog
from posttrain.telemetry.rollouts import RunId

RAY_HTTP_TIMEOUT_S = 5.0
DEFAULT_LOG_TAIL_CHARS = 200_000


def _jsonable_number(value: Any) -> Any:
    """Metric values as JSON numbers; the engine's "nan"/"inf" strings become null (a gap in a curve)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return value


def run_metric_series(
    run: Run, names: list[str] | None = None, step_min: int | None = None, step_max: int | None = None
) -> dict[str, dict[str, list]]:
    """{name: {"steps": [...], "values": [...]}} in step order, for the named metrics or all of them."""
    rows = MetricRow.objects.filter(run=run)
    if step_min is not None:
        rows = rows.filter(step__gte=step_min)
    if step_max is not None:
        rows = rows.filter(step__lte=step_max)
    rows = rows.order_by("step", "seq")
    series: dict[str, dict[str, list]] = {}
    if names:
        # Only the requested keys leave the database, not every row's whole JSON object.
        keys = {f"m{i}": KeyTransform(name, "values") for i, name in enumerate(names)}
        for step, *values in rows.annotate(**keys).values_list("step", *keys):
            for name, value in zip(names, values):
                if value is not None:
                    entry = series.setdefault(name, {"steps": [], "values": []})
                    entry["steps"].append(step)
                    entry["values"].append(_jsonable_number(value))
        return {name: series.get(name, {"steps": [], "values": []}) for name in names}
    for step, values in rows.values_list("step", "values"):
        for name, value in values.items():
            entry = series.setdefault(name, {"steps": [], "values": []})
            entry["steps"].append(step)
            entry["values"].append(_jsonable_number(value))
    return dict(sorted(series.items()))


RolloutRef = tuple[str, int, int]  # (run id, step, index)
ROLLOUT_FIELDS: tuple[str, ...] = ("run", "step", "index", "group", "reward", "components", "finish_reason")
ROLLOUT_TEXT_FIELDS: tuple[str, ...] = ("prompt", "response", "label", "turns")


def rollouts_query(
    run_ids: Sequence[RunId],
    *,
    steps: Sequence[int] | None = None,
    step_range: tuple[int, int] | None = None,
    refs: Iterable[RolloutRef] | None = None,
    text: bool = False,
    tokens: bool = False,
    gaps: list[rollouts.Gap] | None = None,
) -> Iterator[dict[str, Any]]:
    """The runs' rollouts as plain dicts, read from their rollout files (posttrain.telemetry.rollouts): the one
    read review campaigns copy their items through.

    Which rollouts: those of `run_ids`, at `steps` (a list) or within `step_range` (first, last,
    inclusive) or at every step; `refs` narrows them to exactly those (run id, step, index), in the query.
    Each dict holds ROLLOUT_FIELDS: `run` (the run id as a string), `step`, `index`, `group` (the
    prompt group), `reward` (a finite float, or None where the engine reported none or a non-finite
    one), `components` (component name -> score; {} when absent) and `finish_reason`; with `text` also
    ROLLOUT_TEXT_FIELDS: `prompt`, `response`, `label` (the dataset's reference answer, or None) and `turns`
    (a multi-turn episode's [{role, text, reward}], [] for a single turn);
    with `tokens` also `tokens`, the per-token view ({text: [piece], rollout_logprob, trainer_logprob,
    entropy, advantage: base64 float16, versions}; {} when the step had none). Texts and lists are cut
    as every answer cuts them (rollouts.SHOWN); `truncated` ({what: its full length}) is there only when
    something was. Order: by run id, step and index. Streams: the files are read a few at a time; the
    texts only when asked for. Files DuckDB cannot read are left out, each added to `gaps`."""
    wanted = _wanted_keys(refs)
    if wanted is not None and not wanted:
        return
    columns = _query_columns(text, tokens)
    for run_id in sorted({str(r) for r in run_ids}):
        filters = _run_filters(run_id, steps, step_range, wanted)
        if filters is None:
            continue
        for row in rollouts.rollouts_query([run_id], filters=filters, columns=columns, gaps=gaps):
            yield _shaped_row(row, text, tokens)


def _wanted_keys(refs: Iterable[RolloutRef] | None) -> dict[str, list[tuple[int, int]]] | None:
    """{run id: [(step, index)]} of `refs`, or None without refs (every rollout wanted)."""
    if refs is None:
        return None
    wanted: dict[str, list[tuple[int, int]]] = {}
    for run_id, step, index in refs:
        wanted.setdefault(str(run_id), []).append((int(step), int(index)))
    return wanted


def _query_columns(text: bool, tokens: bool) -> list[str]:
    """The rollout file's columns read: ROLLOUT_FIELDS, with `text` the texts, with `tokens` the per-token view."""
    columns = [c for c in ROLLOUT_FIELDS if c != "run"]
    if text:
        columns += list(ROLLOUT_TEXT_FIELDS)
    if tokens:
        columns += ["versions", "token_text", *rollouts.VIEW_COLUMNS.values()]
    return columns


def _run_filters(
    run_id: str,
    steps: Sequence[int] | None,
    step_range: tuple[int, int] | None,
    wanted: dict[str, list[tuple[int, int]]] | None,
) -> rollouts.RolloutFilter | None:
    """The filter of one run's rollouts; None when `wanted` names none of the run's."""
    filters = rollouts.RolloutFilter(steps=steps, step_range=step_range)
    if wanted is not None:
        keys = wanted.get(run_id, [])
        if not keys:
            return None
        chosen = {step for step, _ in keys}
        filters.steps = sorted(chosen if steps is None else chosen & set(steps))
        filters.keys = keys
    return filters


def _shaped_row(row: dict[str, Any], text: bool, tokens: bool) -> dict[str, Any]:
    """A row as rollouts_query answers it: components a dict, turns plain dicts, the per-token view
    packed, and `truncated` only when something was."""
    if not isinstance(row.get("components"), dict):
        row["components"] = {}
    if text:
        row["turns"] = [dict(turn) for turn in row.get("turns") or []]
    if tokens:
        row["tokens"] = rollouts.packed_view(row)
    if not row["truncated"]:
        del row["truncated"]
    return row


def rollouts_total(
    run_ids: Sequence[RunId], steps: Sequence[int] | None = None, step_range: Sequence[int] | None = None
) -> int:
    """How many rollouts the runs' indexed files hold at `steps` (or within `step_range`): the index's
    count, no file read."""
    files = rollouts.run_files(run_ids, steps)
    if step_range is not None:
        files = [f for f in files if step_range[0] <= f.step <= step_range[1]]
    return sum(f.rows for f in files)


def run_log_entries(run: Run, *, upto_seq: int, limit: int = 500) -> list[dict[str, Any]]:
    """The engine's last `limit` log events up to `upto_seq`, oldest first (the run page's log tail)."""
    rows = (
        RunLog.objects.filter(run=run, seq__lte=upto_seq)
        .order_by("-seq")
        .values("seq", "step", "time", "level", "message")[:limit]
    )
    return [dict(row) for row in rows][::-1]


def run_job_logs(run: Run, tail_chars: int = DEFAULT_LOG_TAIL_CHARS) -> dict[str, Any]:
    """The Ray job's stdout/stderr (its tail), read over `GET <RAY_ADDRESS>/api/jobs/<id>/logs`. An
    external run has no job: its client's log events instead, one `[level] message` line each."""
    if run.is_external:
        lines = [f"[{e['level']}] {e['message']}" for e in run_log_entries(run, upto_seq=run.last_seq, limit=10_000)]
        text = "\n".join(lines) + ("\n" if lines else "")
        truncated = len(text) > tail_chars
        return {"logs": text[-tail_chars:] if truncated else text, "truncated": truncated, "job": None}
    address = settings.RAY_ADDRESS.rstrip("/")
    if not address.startswith(("http://", "https://")):
        raise DispatchError(f"RAY_ADDRESS must be the Ray dashboard URL (http://host:8265), got {address!r}")
    url = f"{address}/api/jobs/{run.ray_job_id}/logs"
    try:
        with urllib.request.urlopen(ray_request(url), timeout=RAY_HTTP_TIMEOUT_S) as response:
            logs = json.load(response).get("logs") or ""
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return {"logs": "", "truncated": False, "job": None}
        raise DispatchError(refused_reason(exc.code) or f"Ray answered {exc.code} for the job's logs") from None
    except RayTokenUnavailable as exc:
        raise DispatchError(str(exc)) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise DispatchError(f"cannot read the job's logs from Ray at {address}: {exc}") from None
    truncated = len(logs) > tail_chars
    return {"logs": logs[-tail_chars:] if truncated else logs, "truncated": truncated, "job": run.ray_job_id}
