"""Celery tasks sent by name: the platform never imports the `workers` package, which imports the
platform (docs/ARCHITECTURE.md, "One way down"). The worker process builds its Celery app
here too (workers/celery_app.py), so web and worker read the same CELERY_* settings."""

from __future__ import annotations

from functools import cache

from celery import Celery

TASK_PREFIX = "workers."  # every task in workers/tasks.py is registered as workers.<name>


@cache
def celery_app() -> Celery:
    """The one Celery app of this process, configured from Django's CELERY_* settings."""
    app = Celery("posttrain")
    app.config_from_object("django.conf:settings", namespace="CELERY")
    return app


def task_send(name: str, *args: str, expires: float | None = None) -> None:
    """Queue the task `workers.<name>` with `args`; call it after commit (the worker must see the rows).
    `expires`: seconds after which a worker drops it unrun."""
    celery_app().send_task(TASK_PREFIX + name, args=list(args), expires=expires)
