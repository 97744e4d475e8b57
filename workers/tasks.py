"""Celery tasks. Each one loads what it needs by id and calls a single service."""

import platform

from workers.celery_app import app


@app.task(name="workers.ping", ignore_result=False)
def ping() -> dict:
    """Round trip through the broker; also proves the stdlib `platform` module is intact in a worker."""
    return {"pong": True, "python": platform.python_version()}
