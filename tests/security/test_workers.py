"""User code never holds the workers that start runs (issue case 6, delivery 6), on the real stack: an upload whose
import check hangs runs on the `user_code` worker, is stopped at Celery's soft time limit (8 s here) and answered
as a problem of the code, while the runs worker goes on admitting a run launched meanwhile."""

from __future__ import annotations

import threading
import time

import pytest

from tests.security.helpers import (
    HARD_LIMIT_S,
    SOFT_LIMIT_S,
    World,
    api_for,
    assert_stack_alive,
    experiment_body,
    registry_rows,
)
from tests.support.stack import PlatformStack

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

HANGS_AT_IMPORT = (
    "import time\n"
    "time.sleep(600)\n\n"
    "def reward_func(queries, prompts, labels, **kwargs):\n"
    "    return [1.0] * len(queries)\n"
)


def wait_for(predicate, timeout_s: float, what: str) -> float:
    started = time.monotonic()
    while not predicate():
        assert time.monotonic() - started < timeout_s, f"{what} did not happen within {timeout_s}s"
        time.sleep(0.2)
    return time.monotonic() - started


def test_a_hanging_upload_holds_only_the_user_code_worker_and_stops_at_its_time_limit(
    stack: PlatformStack, world: World
):
    from posttrain.registry.models import RewardFunction

    api = api_for(stack, "mallory")
    outcome: dict = {}

    def register() -> None:
        started = time.monotonic()
        outcome["response"] = api.post(
            "/api/rewards/",
            {"name": "sleeper", "kind": "python", "source": HANGS_AT_IMPORT, "spec": {"timeout_s": 600}},
        )
        outcome["seconds"] = time.monotonic() - started

    user_code_log_before = len(stack.user_code_log.read_text())
    hanging = threading.Thread(target=register)
    hanging.start()
    wait_for(
        lambda: "workers.reward_trial_run[" in stack.user_code_log.read_text()[user_code_log_before:],
        30,
        "the user-code worker taking the import check",
    )

    # Meanwhile a run is launched: the runs worker takes its admission pass at once.
    experiment = api.post("/api/experiments/", experiment_body(registry_rows(world, "workers"), "launched meanwhile"))
    assert experiment.status_code == 201, experiment.text
    worker_log_before = len(stack.worker_log.read_text())
    launched = api.post(f"/api/experiments/{experiment.json()['id']}/launch/", {})
    assert launched.status_code == 201, launched.text
    waited = wait_for(
        lambda: "workers.admit_runs[" in stack.worker_log.read_text()[worker_log_before:],
        15,
        "the runs worker taking the admission pass",
    )
    assert hanging.is_alive(), f"the import check ended before the admission pass ({waited:.1f}s)"

    hanging.join(timeout=HARD_LIMIT_S + 60)
    response = outcome["response"]
    assert response.status_code == 400, response.text
    assert response.json()["errors"] == [
        {"loc": "source", "msg": f"importing the file was stopped at the user-code time limit ({SOFT_LIMIT_S}s)"}
    ]
    assert SOFT_LIMIT_S <= outcome["seconds"] < HARD_LIMIT_S + 30
    assert not RewardFunction.objects.filter(name="sleeper").exists()

    # The user-code worker takes the next upload as before.
    fine = "def reward_func(queries, prompts, labels, **kwargs):\n    return [1.0] * len(queries)\n"
    assert api.post("/api/rewards/", {"name": "fine", "kind": "python", "source": fine}).status_code == 201
    assert_stack_alive(stack)
