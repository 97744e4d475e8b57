"""The platform's side of the outbound policy (rl_engine/outbound.py): the admin's allow list and the
cluster's own hosts, for checking a URL when a reward is registered, for a "Try it" on a worker, and
handed to every run's engine in its environment (the engine imports no Django)."""

from __future__ import annotations

import urllib.parse

from django.conf import settings

from rl_engine.spec.user_code import ALLOW_ENV, DENY_ENV, OutboundPolicy


def cluster_hosts() -> list[str]:
    """The hosts the platform itself runs on or talks to: its public URL, Ray, the database, Redis, the broker.
    A reward must not reach them (the machine's own interface addresses are refused by the engine as well)."""
    urls = [settings.PUBLIC_URL, settings.RAY_ADDRESS, settings.REDIS_URL, str(settings.CELERY_BROKER_URL or "")]
    hosts = [urllib.parse.urlsplit(url).hostname for url in urls if "://" in url]
    hosts += [str(database.get("HOST") or "") for database in settings.DATABASES.values()]
    return sorted({host.lower() for host in hosts if host and not host.startswith("/")})


def outbound_policy() -> OutboundPolicy:
    return OutboundPolicy(allow=settings.HTTP_ALLOW, deny=cluster_hosts())


def engine_outbound_env() -> dict[str, str]:
    """What a run's engine needs to apply the same policy."""
    return {ALLOW_ENV: " ".join(settings.HTTP_ALLOW), DENY_ENV: " ".join(cluster_hosts())}
