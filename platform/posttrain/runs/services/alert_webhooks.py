"""Where an experiment's runs send their critical alerts: the webhook URL, checked under the outbound policy
(rl_engine/outbound.py) when it is set (posttrain.telemetry.alerts checks it again, resolved and pinned, at every POST
and delivers the alerts)."""

from __future__ import annotations

from posttrain.core.errors import InvalidInput
from posttrain.core.outbound import outbound_policy
from posttrain.runs.models import Experiment
from rl_engine.spec.user_code import OutboundRefused


def webhook_url_checked(url: str, loc: str = "webhook_url") -> str:
    """The URL to store ("" clears it): an http(s) URL the outbound policy allows now (a host that does not
    resolve yet is accepted: it is checked again at every POST). InvalidInput names `loc` and the rule."""
    url = (url or "").strip()
    if not url:
        return ""
    if len(url) > 2000:
        raise InvalidInput.one(loc, "at most 2000 characters")
    try:
        outbound_policy().check_url(url, resolve="if_possible")
    except OutboundRefused as exc:
        raise InvalidInput.one(loc, str(exc)) from None
    return url


def experiment_set_webhook(experiment: Experiment, url: str) -> Experiment:
    """Set (or clear, with "") where the experiment's runs send their critical alerts."""
    experiment.webhook_url = webhook_url_checked(url)
    Experiment.objects.filter(pk=experiment.pk).update(webhook_url=experiment.webhook_url)
    return experiment
