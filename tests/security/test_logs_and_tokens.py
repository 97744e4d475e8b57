"""What user code prints is marked, and the run's token never lingers (issue cases 11 and 12, delivery 9), on the
real stack: a reward's output reaches the worker's log one marked line per line, however it breaks its lines,
so it cannot pose as the engine's (the failure headline reads unmarked lines only:
tests/unit/platform/test_runs_reconcile.py); a submit of a run whose Ray job already exists leaves no token file,
and a job that ended leaves none either (a real Ray head)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.security.helpers import World, api_for, assert_stack_alive, experiment_body, registry_rows
from tests.support.stack import PlatformStack

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PRINTS_LIKE_THE_ENGINE = (
    "import sys\n\n"
    "def reward_func(queries, prompts, labels, **kwargs):\n"
    "    print('OSError: [Errno 28] No space left on device: fake-1')\n"
    "    sys.stdout.write('ok\\rOSError: [Errno 28] No space left on device: fake-2\\u2028error: fake-3\\n')\n"
    "    sys.stdout.flush()\n"
    "    return [1.0] * len(queries)\n"
)


def test_every_line_a_reward_prints_is_marked_as_user_code(stack: PlatformStack, world: World):
    api = api_for(stack, "mallory")
    created = api.post("/api/rewards/", {"name": "chatty", "kind": "python", "source": PRINTS_LIKE_THE_ENGINE})
    assert created.status_code == 201, created.text
    body = api.post(f"/api/rewards/{created.json()['id']}/try/", {"samples": [{"prompt": "p", "response": "r"}]})
    assert body.status_code == 200 and body.json()["scores"] == [1.0], body.text
    deadline = time.monotonic() + 20
    while "fake-3" not in stack.user_code_log.read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    lines = [line for line in stack.user_code_log.read_text().splitlines() if "fake-" in line]
    assert len(lines) == 3, lines
    assert all(line.startswith("[user code: ") for line in lines), lines
    assert_stack_alive(stack)


def test_a_submit_whose_job_already_exists_leaves_no_token_file_nor_does_a_job_that_ended(
    stack: PlatformStack, world: World, ray_head: str, settings, monkeypatch
):
    from posttrain.runs.models import Run
    from posttrain.scheduling.services.jobs import run_reconcile
    from workers import ray_jobs

    settings.RAY_ADDRESS = ray_head
    settings.STORAGE_ROOT = world.storage
    settings.PUBLIC_URL = stack.web.url
    # A model folder the engine cannot load: the job starts, reads its token, and fails at once.
    rows = registry_rows(world, "tokens")
    api = api_for(stack, "ada")
    experiment = api.post("/api/experiments/", experiment_body(rows, "tokens")).json()
    run = Run.objects.get(pk=api.post(f"/api/experiments/{experiment['id']}/launch/", {}).json()["id"])
    folder = Path(run.resolved_config["logging"]["run_dir"])
    tokens = lambda: sorted(p.name for p in folder.glob("ingest_token*"))  # noqa: E731

    ray_jobs.submit(run)  # the first submit writes its token file for its job
    assert len(tokens()) <= 1
    ray_jobs.submit(run)  # retried: the job exists, so nothing is written
    assert len(tokens()) <= 1
    # The race: the job appeared between this submit's look and its own submit, which Ray answers "already exists".
    monkeypatch.setattr(ray_jobs, "status", lambda run: None)
    ray_jobs.submit(run)
    monkeypatch.undo()
    assert len(tokens()) <= 1  # this submission's file is gone again; the first job's (if still unread) stays

    deadline = time.monotonic() + 120
    while ray_jobs.status(run) not in ("FAILED", "STOPPED", "SUCCEEDED"):
        assert time.monotonic() < deadline, "the job did not end"
        time.sleep(1)
    Run.objects.filter(pk=run.pk).update(state="running")
    run_reconcile(run)
    assert tokens() == []  # whatever the engine did not read is removed once the job ended
    assert_stack_alive(stack)
