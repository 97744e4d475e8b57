"""Reads of the runs app. The web process never imports ray: job logs come over Ray's Jobs HTTP API."""

from __future__ import annotations

import json
import math
import string
import urllib.error
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connection
from django.db.models import Count, QuerySet, TextField
from django.db.models.fields.json import KeyTransform
from django.db.models.functions import Cast

from posttrain.core.errors import DispatchError
from posttrain.registry.selectors import latest_probes
from posttrain.runs import diagnostics, hacking, rollouts
from posttrain.runs.hacking_examples import pick_examples
from posttrain.runs.models import Checkpoint, Experiment, MetricRow, Run, RunLog, RunTransition
from posttrain.runs.rollouts import RunId
from posttrain.runs.series import read_series

RAY_HTTP_TIMEOUT_S = 5.0
DEFAULT_LOG_TAIL_CHARS = 200_000


def experiment_list() -> QuerySet[Experiment]:
    return (
        Experiment.objects.select_related("model", "dataset", "created_by")
        .prefetch_related("experimentreward_set__reward")
        .annotate(run_count=Count("runs"))
    )


def experiment_probe_summaries(experiment: Experiment) -> list[dict[str, Any]]:
    """Per reward of the experiment, its newest probe on the experiment's dataset (registry.RewardProbe), as
    the experiment and its runs' pages show it: {reward, reward_name, probe (id or None), state, hackable,
    worst, fraction, url}. A reward never probed there has probe None; an external run's project has none."""
    if experiment.dataset_id is None:
        return []
    rewards = [(link.reward_id, link.reward.name) for link in experiment.experimentreward_set.select_related("reward")]
    latest = latest_probes([reward_id for reward_id, _ in rewards], experiment.dataset_id)
    summaries = []
    for reward_id, name in rewards:
        probe = latest.get(reward_id)
        report = (probe.result or {}) if probe is not None else {}
        worst = report.get("worst")
        fraction = next((p["fraction"] for p in report.get("probes", []) if p["probe"] == worst), None)
        summaries.append(
            {
                "reward": reward_id,
                "reward_name": name,
                "probe": str(probe.pk) if probe is not None else None,
                "state": probe.state if probe is not None else None,
                "hackable": bool(report.get("hackable")),
                "worst": worst,
                "fraction": fraction,
                "url": f"/api/rewards/{reward_id}/probes/{probe.pk}/" if probe is not None else None,
            }
        )
    return summaries


def run_list() -> QuerySet[Run]:
    # The list serializer names each run's model and dataset: joined here, so a page is one query.
    return Run.objects.select_related("experiment__model", "experiment__dataset", "created_by")


def validate_run_id_prefix(prefix: str) -> None:
    digits = prefix.replace("-", "")
    if not digits or len(digits) > 32 or any(c not in string.hexdigits for c in digits):
        raise ValidationError("must be the start of a run id: 1 to 32 hex digits (dashes optional)")


def runs_with_id_prefix(queryset: QuerySet[Run], prefix: str) -> QuerySet[Run]:
    """The runs whose id starts with `prefix` (validate_run_id_prefix's form), as a range of ids: both databases
    order UUIDs as their hex digits (Postgres by their bytes, SQLite by its 32-character text), and the
    primary key's index serves the range."""
    digits = prefix.replace("-", "").lower()
    return queryset.filter(id__gte=uuid.UUID(digits.ljust(32, "0")), id__lte=uuid.UUID(digits.ljust(32, "f")))


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
) -> Iterator[dict[str, Any]]:
    """The runs' rollouts as plain dicts, read from their rollout files (posttrain.runs.rollouts): the one
    read review campaigns pick their items through.

    Which rollouts: those of `run_ids`, at `steps` (a list) or within `step_range` (first, last,
    inclusive) or at every step; `refs` narrows them to exactly those (run id, step, index).
    Each dict holds ROLLOUT_FIELDS: `run` (the run id as a string), `step`, `index`, `group` (the
    prompt group), `reward` (a finite float, or None where the engine reported none or a non-finite
    one), `components` (component name -> score; {} when absent) and `finish_reason`; with `text` also
    ROLLOUT_TEXT_FIELDS: `prompt`, `response`, `label` (the dataset's reference answer, or None) and `turns`
    (a multi-turn episode's [{role, text, reward}], [] for a single turn);
    with `tokens` also `tokens`, the per-token view ({text: [piece], rollout_logprob, trainer_logprob,
    entropy, advantage: base64 float16, versions}; {} when the step had none). Order: by run id, step
    and index. Streams: the files are read a few at a time; the texts only when asked for."""
    wanted: dict[tuple[str, int], set[int]] | None = None
    if refs is not None:
        wanted = {}
        for run_id, step, index in refs:
            wanted.setdefault((str(run_id), int(step)), set()).add(int(index))
        if not wanted:
            return
        chosen = {step for _, step in wanted}
        steps = sorted(chosen if steps is None else chosen & set(steps))
    columns = [c for c in ROLLOUT_FIELDS if c != "run"]
    if text:
        columns += list(ROLLOUT_TEXT_FIELDS)
    if tokens:
        columns += ["versions", "token_text", *rollouts.VIEW_COLUMNS.values()]
    filters = rollouts.RolloutFilter(steps=steps, step_range=step_range)
    for run_id in sorted({str(r) for r in run_ids}):
        for row in rollouts.rollouts_query([run_id], filters=filters, columns=columns):
            if wanted is not None and row["index"] not in wanted.get((row["run"], row["step"]), ()):
                continue
            if not isinstance(row.get("components"), dict):
                row["components"] = {}
            if text:
                row["turns"] = [dict(turn) for turn in row.get("turns") or []]
            if tokens:
                row["tokens"] = rollouts.packed_view(row)
            yield row


def run_alerts(run_id: Any, *, with_examples: bool = True) -> list[diagnostics.Alert]:
    """The diagnostics rules and the reward-hacking signals (posttrain.runs.diagnostics, runs.hacking) over
    the run's stored metric series, by step; with `with_examples`, each alert that names an examples rule
    carries the indices of the rollouts of its step that show it (read through `rollouts_query`). The column
    store: a long run's alerts cost a few block reads, not a scan of every step's row."""
    logged = Run.objects.filter(pk=run_id).values_list("summary", flat=True).first() or {}
    names = sorted({*diagnostics.METRICS_USED, *hacking.metrics_used(list(logged))})
    stored, _, _ = read_series([run_id], names)
    series = {
        name: (
            [int(step) for step in points.steps],
            [None if math.isnan(value) else value for value in points.values.tolist()],
        )
        for (_, name), points in stored.items()
    }
    alerts = diagnostics.ordered([*diagnostics.diagnose(series), *hacking.hacking_alerts(series)])
    if not with_examples:
        return alerts
    steps = sorted({alert.step for alert in alerts if alert.examples_rule})
    by_step: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for rollout in rollouts_query([str(run_id)], steps=steps, text=True) if steps else ():
        by_step[rollout["step"]].append(rollout)
    return [
        replace(alert, examples=tuple(pick_examples(alert.examples_rule, by_step[alert.step])))
        if alert.examples_rule
        else alert
        for alert in alerts
    ]


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
