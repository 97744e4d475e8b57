"""Reads of the runs app. The web process never imports ray: job logs come over Ray's Jobs HTTP API."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Count, Q, QuerySet, TextField
from django.db.models.fields.json import KeyTransform
from django.db.models.functions import Cast

from posttrain.core.errors import DispatchError, NotFound
from posttrain.runs.models import Checkpoint, Experiment, MetricRow, Run, RunLog, RunTransition, Sample

RAY_HTTP_TIMEOUT_S = 5.0
DEFAULT_LOG_TAIL_CHARS = 200_000


def experiment_list() -> QuerySet[Experiment]:
    return (
        Experiment.objects.select_related("model", "dataset", "created_by")
        .prefetch_related("experimentreward_set__reward")
        .annotate(run_count=Count("runs"))
    )


def run_list() -> QuerySet[Run]:
    # The list serializer names each run's model and dataset: joined here, so a page is one query.
    return Run.objects.select_related("experiment__model", "experiment__dataset", "created_by")


def runs_with_tag(queryset: QuerySet[Run], tag: str) -> QuerySet[Run]:
    if connection.vendor == "postgresql":
        return queryset.filter(tags__contains=[tag])
    # SQLite has no JSON containment: match the JSON-quoted tag in the stored text (json.dumps escapes
    # the same way Django stored it, so the quotes delimit a whole tag).
    return queryset.annotate(_tags_text=Cast("tags", TextField())).filter(_tags_text__contains=json.dumps(tag))


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


# The step slider's responses to one prompt: every step of a long run, capped.
MAX_SAME_PROMPT = 2000


def run_samples(
    run: Run,
    *,
    step: int | None = None,
    min_reward: float | None = None,
    max_reward: float | None = None,
    finish_reason: str | None = None,
    q: str | None = None,
) -> QuerySet[Sample]:
    samples = Sample.objects.filter(run=run)
    if step is not None:
        samples = samples.filter(step=step)
    if min_reward is not None:
        samples = samples.filter(reward__gte=min_reward)
    if max_reward is not None:
        samples = samples.filter(reward__lte=max_reward)
    if finish_reason:
        samples = samples.filter(finish_reason=finish_reason)
    if q:
        samples = samples.filter(Q(prompt__icontains=q) | Q(response__icontains=q) | Q(label__icontains=q))
    return samples.order_by("step", "index")


def sample_token_view(run: Run, *, step: int, index: int) -> dict[str, Any]:
    """One sample's per-token view (`Sample.tokens`) and the responses to the same prompt at every step
    (the dialog's step slider: `[{step, index}]` in order). NotFound names the sample when it is not there."""
    sample = Sample.objects.filter(run=run, step=step, index=index).only("prompt", "tokens").first()
    if sample is None:
        raise NotFound(f"run {run.id} has no sample {index} at step {step}")
    same_prompt = Sample.objects.filter(run=run, prompt=sample.prompt).order_by("step", "index")
    return {
        "step": step,
        "index": index,
        "tokens": sample.tokens,
        "same_prompt": list(same_prompt.values("step", "index")[:MAX_SAME_PROMPT]),
    }


def run_log_entries(run: Run, *, upto_seq: int, limit: int = 500) -> list[dict[str, Any]]:
    """The engine's last `limit` log events up to `upto_seq`, oldest first (the run page's log tail)."""
    rows = (
        RunLog.objects.filter(run=run, seq__lte=upto_seq)
        .order_by("-seq")
        .values("seq", "step", "time", "level", "message")[:limit]
    )
    return [dict(row) for row in rows][::-1]


def run_checkpoints(run: Run) -> QuerySet[Checkpoint]:
    return Checkpoint.objects.filter(run=run).order_by("step")


def run_transitions(run: Run) -> QuerySet[RunTransition]:
    return RunTransition.objects.filter(run=run).order_by("at", "id")


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
        with urllib.request.urlopen(url, timeout=RAY_HTTP_TIMEOUT_S) as response:
            logs = json.load(response).get("logs") or ""
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return {"logs": "", "truncated": False, "job": None}
        raise DispatchError(f"Ray answered {exc.code} for the job's logs") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise DispatchError(f"cannot read the job's logs from Ray at {address}: {exc}") from None
    truncated = len(logs) > tail_chars
    return {"logs": logs[-tail_chars:] if truncated else logs, "truncated": truncated, "job": run.ray_job_id}
