"""A reward that fails is loud, on the real stack (issue case 10, delivery 8): names of the engine's own curves
are refused at registration, extra curves are bounded, and a real engine run posting through the real event
path fails with its reward's first error when most samples fail, or raises a critical alert when a few do.
The engine runs as its own process (`python -m rl_engine train`) with the config the platform resolved at launch,
as the Ray job would (this stack has no Ray head: the run's worker-side submit is the one step done here)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.security.helpers import Api, World, api_for, assert_stack_alive
from tests.support.stack import REPO_ROOT, PlatformStack

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.mark.parametrize("name", ["mean", "std", "errors", "task_mean", "group_all_equal_rate"])
def test_a_reward_named_like_one_of_the_engines_own_curves_is_refused(name, stack: PlatformStack, world: World):
    api = api_for(stack, "mallory")
    response = api.post("/api/rewards/", {"name": name, "kind": "builtin", "spec": {"type": "exact_match"}})
    assert response.status_code == 400
    [error] = response.json()["errors"]
    assert error["loc"] == "name" and error["msg"].startswith(f"{name!r} is reserved: reward/{name} is one of")


def test_a_reward_cannot_add_more_than_32_curves_or_unusable_names(stack: PlatformStack, world: World):
    source = (
        "def reward_func(queries, prompts, labels, **kwargs):\n"
        "    logs = {f'curve_{i}': 1.0 for i in range(1000)}\n"
        "    logs['x' * 300] = 1.0\n"
        "    return {'rewards': [1.0] * len(queries), 'extra_logs': logs}\n"
    )
    api = api_for(stack, "mallory")
    created = api.post("/api/rewards/", {"name": "curvy", "kind": "python", "source": source})
    assert created.status_code == 201, created.text
    body = api.post(f"/api/rewards/{created.json()['id']}/try/", {"samples": [{"prompt": "p", "response": "r"}]})
    assert body.status_code == 200, body.text
    assert sorted(body.json()["extra_logs"]) == sorted(f"curvy/curve_{i}" for i in range(32))
    assert_stack_alive(stack)


@pytest.fixture(scope="module")
def demo(world: World) -> Path:
    """The tiny demo task, built inside the import root (where a researcher may name it)."""
    from rl_engine.demo.build import build_demo

    out = world.imports / "demo"
    if not (out / "manifest.json").exists():
        build_demo(out, seed=0, model_size="tiny", sft_steps=10, progress=False)
    return out


def launched_run(api: Api, demo: Path, reward_source: str, name: str) -> dict:
    """A run of the demo task with one python reward, launched through the API (queued: no Ray here)."""
    model = api.post("/api/models/", {"name": f"tiny {name}", "path": str(demo / "model")})
    assert model.status_code == 201, model.text
    dataset = api.post("/api/datasets/", {"name": f"sums {name}", "path": str(demo / "data" / "train.jsonl")})
    assert dataset.status_code in (200, 201), dataset.text
    reward = api.post("/api/rewards/", {"name": name, "kind": "python", "source": reward_source})
    assert reward.status_code == 201, reward.text
    experiment = api.post(
        "/api/experiments/",
        {
            "name": name,
            "model": model.json()["id"],
            "dataset": dataset.json()["id"],
            "rewards": [{"reward": reward.json()["id"], "weight": 1.0}],
            "config": {
                "rollout": {"prompts_per_step": 2, "samples_per_prompt": 4, "max_new_tokens": 4},
                "train": {"steps": 2, "micro_batch_size": 8},
                "logging": {"eval_every": 0, "heartbeat_s": 1},
                "checkpoint": {"every_steps": 0, "save_final": False},
            },
        },
    )
    assert experiment.status_code == 201, experiment.text
    run = api.post(f"/api/experiments/{experiment.json()['id']}/launch/", {"seed": 1})
    assert run.status_code == 201, run.text
    return api.get(f"/api/runs/{run.json()['id']}/").json()


def engine_run(stack: PlatformStack, run: dict) -> subprocess.CompletedProcess:
    """The engine on the platform's resolved config, posting its events to the real web server."""
    from posttrain.core.run_tokens import ingest_token
    from rl_engine.config import dump_config, validate_config

    run_dir = Path(run["resolved_config"]["logging"]["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    config = run_dir / "config.yaml"
    config.write_text(dump_config(validate_config(run["resolved_config"])))
    env = {
        **os.environ,
        "POSTTRAIN_RUN_ID": run["id"],
        "POSTTRAIN_EVENTS_URL": f"{stack.web.url}/api/runs/{run['id']}/events",
        "POSTTRAIN_INGEST_TOKEN": ingest_token(run["id"]),
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.run(
        [sys.executable, "-m", "rl_engine", "train", str(config), "--run-dir", str(run_dir), "--no-progress"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def wait_for_state(api: Api, run_id: str, states: set[str], timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        run = api.get(f"/api/runs/{run_id}/").json()
        if run["state"] in states or time.monotonic() > deadline:
            return run
        time.sleep(0.5)


def test_a_reward_failing_on_most_of_a_steps_samples_fails_the_run_with_its_first_error(
    stack: PlatformStack, world: World, demo: Path
):
    source = "def reward_func(queries, prompts, labels, **kwargs):\n    raise RuntimeError('the judge is down')\n"
    api = api_for(stack, "ada", server_paths=True)
    run = launched_run(api, demo, source, "judge")
    done = engine_run(stack, run)
    assert done.returncode != 0
    run = wait_for_state(api, run["id"], {"failed"})
    assert run["state"] == "failed"
    assert run["state_reason"] == (
        "RewardsFailed: reward 'judge' failed on 8 of 8 samples of the step (100%, over its max_error_rate of 0.5); "
        "the first error: RuntimeError: the judge is down (line 2)"
    )
    assert_stack_alive(stack)


def test_a_reward_failing_on_a_few_samples_is_a_critical_alert_and_the_run_goes_on(
    stack: PlatformStack, world: World, demo: Path
):
    source = (
        "def reward_func(queries, prompts, labels, **kwargs):\n    return [float('nan')] + [1.0] * (len(queries) - 1)\n"
    )
    api = api_for(stack, "ada", server_paths=True)
    run = launched_run(api, demo, source, "mostly")
    done = engine_run(stack, run)
    assert done.returncode == 0, done.stderr[-3000:]
    run = wait_for_state(api, run["id"], {"succeeded"})
    assert run["state"] == "succeeded"
    alerts = api.get(f"/api/runs/{run['id']}/alerts/").json()["alerts"]
    failing = [a for a in alerts if a["code"] == "reward_errors"]
    assert len(failing) == 1 and failing[0]["severity"] == "critical" and failing[0]["step"] == 1
    samples = api.get(f"/api/runs/{run['id']}/samples/", params={"limit": 100}).json()["results"]
    assert sum(1 for s in samples if s["errors"]) == 2  # one of 8 in each of the 2 steps, with its reason
    assert all(s["errors"] == ["mostly: score is not finite: nan"] for s in samples if s["errors"])
    assert_stack_alive(stack)
