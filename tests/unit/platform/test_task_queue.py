"""Tasks sent by name (posttrain.core.task_queue): every name the platform sends is one the worker has,
and a sent task reaches the real broker as that task with its arguments."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from celery import Celery

from posttrain.core import task_queue
from posttrain.core.job_runner import worker_job_kinds
from posttrain.core.task_queue import TASK_PREFIX, celery_app
from tests.support.stack import redis_database

PLATFORM = Path(__file__).resolve().parents[3] / "platform" / "posttrain"
SENDERS = {"task_send", "run_task"}  # core.dispatch.run_task(name, run_id) wraps task_send


def _called_name(func: ast.expr) -> str | None:
    """`task_send(...)` or `dispatch.run_task(...)`."""
    if isinstance(func, ast.Name):
        return func.id
    return func.attr if isinstance(func, ast.Attribute) else None


def _sent_task_names() -> set[str]:
    names = set()
    for path in PLATFORM.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and _called_name(node.func) in SENDERS
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                names.add(node.args[0].value)
    return names


def test_every_task_the_platform_sends_is_registered_in_the_worker():
    from workers.celery_app import app

    app.loader.import_default_modules()
    # A worker job is sent by the one runner under its kind's task name (posttrain.core.job_runner.job_dispatch).
    sent = _sent_task_names() | {kind.task_name for kind in worker_job_kinds()}
    assert sent >= {"admit_runs", "run_cancel", "reward_trial_run", "review_judge_run"}
    assert {TASK_PREFIX + name for name in sent} <= set(app.tasks)


def test_the_worker_and_the_web_process_share_one_celery_app():
    from workers.celery_app import app

    assert app is celery_app()


def test_a_sent_task_reaches_the_broker_by_name_with_its_arguments(monkeypatch, settings):
    # A broker database of its own: a platform stack's worker, started by another test of the session and
    # still up, consumes the shared `celery` queue and would take the message first.
    private = Celery("posttrain-test")
    private.config_from_object("django.conf:settings", namespace="CELERY")
    broker = redis_database(settings.CELERY_BROKER_URL, 14)
    if broker is None:
        pytest.skip("this test needs the Redis broker; run it with `make test`")
    private.conf.broker_url = broker
    monkeypatch.setattr(task_queue, "celery_app", lambda: private)
    with private.connection_for_read() as connection:
        queue = connection.SimpleQueue("celery")
        queue.clear()
        task_queue.task_send("run_submit", "a-run-id", expires=30)
        message = queue.get(timeout=10)
        message.ack()
        queue.close()
    args, kwargs, _ = message.decode()  # Celery's message protocol 2: (args, kwargs, embed)
    assert message.headers["task"] == "workers.run_submit" and message.headers["expires"] is not None
    assert (list(args), kwargs) == (["a-run-id"], {})
