"""A run's alerts (`run_alerts`: the rules of posttrain.runs.diagnostics and runs.hacking over its stored metrics),
and how they reach people: its critical alerts POSTed to its experiment's webhook as JSON with a Slack-compatible
body (`{"text": ...}` plus structured fields), by Celery tasks with retries, under the outbound policy
(rl_engine/outbound.py) like HTTP rewards: the URL is checked when it is set (posttrain.runs.services.alert_webhooks)
and again, resolved and pinned, at every POST.

The path: ingestion stores a batch with metrics of a run whose experiment has a webhook and, after commit,
sends `workers.run_alerts_notify`; that task (`alerts_notify`) records each new critical alert once per
(run, code, metric) as an `AlertDelivery` and sends `workers.alert_deliver` for it, which POSTs
(`alert_deliver`): a 2xx answer is sent, a refusal by the policy is failed at once, anything else (no answer,
a 4xx/5xx) is retried with backoff up to WEBHOOK_MAX_ATTEMPTS. docs/REWARD_HACKING.md, "Alert webhooks".
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import asdict, replace
from functools import partial
from typing import Any, Literal

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from posttrain.core import dispatch
from posttrain.core.outbound import outbound_policy
from posttrain.runs import diagnostics, hacking
from posttrain.runs.hacking_examples import pick_examples
from posttrain.runs.models import AlertDelivery, Experiment, Run
from posttrain.telemetry.selectors import rollouts_query
from posttrain.telemetry.series import read_series
from rl_engine.spec.user_code import OutboundFailed, OutboundRefused, post

WEBHOOK_TIMEOUT_S = 10.0
WEBHOOK_MAX_ATTEMPTS = 5
WEBHOOK_BACKOFF_S = (5.0, 30.0, 120.0, 600.0)
"""Seconds before the 2nd, 3rd, ... POST: a receiver restarting is back in seconds, one that is down for
maintenance in minutes; after the fifth attempt (about 13 minutes) the delivery is failed and says why."""

Outcome = Literal["sent", "retry", "failed", "skipped"]


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


def alerts_notify_after_commit(run: Run) -> None:
    """Ingestion's hook: a batch with metrics arrived for `run`; when its experiment has a webhook, look for
    new critical alerts after commit (the task reads the stored series)."""
    if Experiment.objects.filter(pk=run.experiment_id).exclude(webhook_url="").exists():
        transaction.on_commit(lambda: dispatch.run_task("run_alerts_notify", run.pk))


def alerts_notify(run_id: Any) -> int:
    """The run's critical alerts that have no delivery yet, each recorded and sent to the webhook task;
    returns how many. Alerts already delivered (or being delivered) are not sent again."""
    run = Run.objects.select_related("experiment").get(pk=run_id)
    url = run.experiment.webhook_url
    if not url:
        return 0
    new = []
    for alert in run_alerts(run.pk):
        if alert.severity != "critical":
            continue
        if AlertDelivery.objects.filter(run=run, code=alert.code, metric=alert.metric).exists():
            continue
        try:
            with transaction.atomic():
                delivery = AlertDelivery.objects.create(
                    run=run,
                    code=alert.code,
                    metric=alert.metric,
                    step=alert.step,
                    url=url,
                    payload=alert_payload(run, asdict(alert)),
                )
        except IntegrityError:  # another notify task recorded it first
            continue
        new.append(delivery)
    for delivery in new:
        transaction.on_commit(partial(dispatch.run_task, "alert_deliver", str(delivery.pk)))
    return len(new)


def alert_payload(run: Run, alert: dict[str, Any]) -> dict[str, Any]:
    """The JSON body: Slack's incoming webhooks read `text` (mrkdwn); everything else is for a program."""
    page = f"{settings.PUBLIC_URL.rstrip('/')}/runs/{run.pk}/#step-{alert['step']}"
    name = run.name or str(run.pk)
    examples = alert.get("examples")
    text = (
        f":rotating_light: *{alert['severity'].upper()}* `{alert['code']}` in run <{page}|{name}> "
        f"({run.experiment.name}) at step {alert['step']}: {alert['message']}"
    )
    if examples:
        text += f" Example rollouts of step {alert['step']}: {', '.join(f'#{i}' for i in examples)}."
    return {
        "text": text,
        "run": {"id": str(run.pk), "name": name, "experiment": run.experiment.name, "url": page},
        "alert": {
            key: (list(value) if isinstance(value, tuple) else value)
            for key, value in alert.items()
            if key != "examples_rule"
        },
    }


def alert_deliver(delivery_id: Any) -> tuple[Outcome, float | None]:
    """POST one delivery's payload under the outbound policy: ("sent", None) on a 2xx answer, ("failed", None)
    when the policy refuses the URL or the attempts are used up, ("retry", seconds to wait) otherwise;
    ("skipped", None) for a delivery already finished. Each attempt is counted and its error kept."""
    delivery = AlertDelivery.objects.filter(pk=delivery_id, state=AlertDelivery.State.PENDING).first()
    if delivery is None:
        return "skipped", None
    attempt = delivery.attempts + 1
    body = json.dumps(delivery.payload).encode()
    headers = {"Content-Type": "application/json", "User-Agent": "posttrain-alerts/1"}
    error = ""
    try:
        target = outbound_policy().check_url(delivery.url)
        answer = post(target, body, headers, timeout_s=WEBHOOK_TIMEOUT_S, max_bytes=64 * 1024)
        if 200 <= answer.status < 300:
            _record(delivery, attempt, AlertDelivery.State.SENT, "")
            return "sent", None
        error = f"HTTP {answer.status} {answer.reason}"[:500]  # never the body: it may be anything
    except OutboundRefused as exc:
        _record(delivery, attempt, AlertDelivery.State.FAILED, f"refused by the outbound policy: {exc}")
        return "failed", None
    except OutboundFailed as exc:
        error = str(exc)[:500]
    if attempt >= WEBHOOK_MAX_ATTEMPTS:
        _record(delivery, attempt, AlertDelivery.State.FAILED, f"gave up after {attempt} attempts: {error}")
        return "failed", None
    _record(delivery, attempt, AlertDelivery.State.PENDING, error)
    return "retry", WEBHOOK_BACKOFF_S[min(attempt, len(WEBHOOK_BACKOFF_S)) - 1]


def _record(delivery: AlertDelivery, attempt: int, state: str, error: str) -> None:
    AlertDelivery.objects.filter(pk=delivery.pk, state=AlertDelivery.State.PENDING).update(
        attempts=attempt,
        state=state,
        last_error=error,
        sent_at=timezone.now() if state == AlertDelivery.State.SENT else None,
    )
