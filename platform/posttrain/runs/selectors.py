"""Reads of the runs app. The web process never imports ray: job logs come over Ray's Jobs HTTP API."""

from __future__ import annotations

import json
import math
import string
import urllib.error
import urllib.request
import uuid
from collections import defaultdict
from dataclasses import replace
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connection
from django.db.models import Count, QuerySet, TextField
from django.db.models.functions import Cast

from posttrain.core.errors import DispatchError
from posttrain.core.ray_auth import RayTokenUnavailable, ray_request, refused_reason
from posttrain.registry.selectors import latest_probes
from posttrain.runs import diagnostics, hacking
from posttrain.runs.hacking_examples import pick_examples
from posttrain.runs.models import Checkpoint, Experiment, Run, RunTransition
from posttrain.telemetry.selectors import rollouts_query, run_log_entries
from posttrain.telemetry.series import read_series

RAY_HTTP_TIMEOUT_S = 5.0
DEFAULT_LOG_TAIL_CHARS = 200_000


def experiment_list() -> QuerySet[Experiment]:
    return (
        Experiment.objects.select_related("project", "model", "dataset", "created_by")
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
    return Run.objects.select_related("project", "experiment__model", "experiment__dataset", "created_by")


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
