"""A run's whole life on the real stack: uvicorn (the API and the engine's event endpoint) and a Celery
worker on the test database, the Redis broker, a real Ray head running the engine as a Ray job.

Every run is tiny (the tiny demo model, a few steps, two prompts per step) so the file stays short.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.conftest import PlatformStack, platform_stack, postgres_url, stop_ray_jobs

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

RUN_TIMEOUT_S = 150
TERMINAL = {"succeeded", "failed", "cancelled"}
ROLLOUT = {"prompts_per_step": 2, "samples_per_prompt": 4, "max_new_tokens": 4, "temperature": 1.0}


def run_config(steps: int, **sections) -> dict:
    config = {
        "rollout": ROLLOUT,
        "train": {"steps": steps, "lr": 3e-3, "micro_batch_size": 8},
        "logging": {"eval_every": 0, "heartbeat_s": 1},
        "checkpoint": {"save_final": False},
    }
    config.update(sections)
    return config


@pytest.fixture(scope="module")
def demo_assets(tmp_path_factory) -> Path:
    from rl_engine.demo.build import build_demo

    out = tmp_path_factory.mktemp("tiny-demo")
    build_demo(out, seed=0, model_size="tiny", sft_steps=10, progress=False)
    return out


@pytest.fixture(scope="module")
def stack(django_db_setup, django_db_blocker, ray_head, tmp_path_factory) -> Iterator[PlatformStack]:
    from django.db import connection

    with platform_stack(
        ray_head, tmp_path_factory.mktemp("runs-stack"), postgres_url(connection.settings_dict)
    ) as stack:
        yield stack


@pytest.fixture(autouse=True)
def _after_each_test(stack, api):
    """No request may have been a 500; a failed test must not leave a run going into the next one (its
    events and the worker's admission of what it left queued would race the database's flush)."""
    yield
    api.cancel_unfinished()
    stop_ray_jobs(stack.ray)
    errors = [line for line in stack.web.log().splitlines() if '" 500 ' in line]
    stack.web.log_path.write_text("")  # each test checks its own requests
    assert not errors, "\n".join(errors)


class Api:
    def __init__(self, base: str, token: str):
        self.base = base
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Token {token}"

    def get(self, path: str, expect: int = 200, **params):
        response = self.session.get(f"{self.base}{path}", params=params, timeout=30)
        assert response.status_code == expect, response.text[:2000]
        return response.json()

    def post(self, path: str, body: dict | None = None, expect: int = 201):
        response = self.session.post(f"{self.base}{path}", json=body or {}, timeout=30)
        assert response.status_code == expect, response.text[:2000]
        return response.json()

    def wait_for(self, run_id: str, until, timeout_s: float = RUN_TIMEOUT_S, what: str = "") -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            run = self.get(f"/api/runs/{run_id}/")
            if until(run):
                return run
            if time.monotonic() > deadline:
                raise AssertionError(f"run {run_id} did not reach {what or 'the expected state'}: {run}")
            time.sleep(0.5)

    def wait_until_finished(self, run_id: str, timeout_s: float = RUN_TIMEOUT_S) -> dict:
        return self.wait_for(run_id, lambda r: r["state"] in TERMINAL, timeout_s, "a final state")

    def cancel_unfinished(self) -> None:
        """Cancels every run not yet in a final state and waits until each is in one."""
        from posttrain.runs.models import Run

        unfinished = [str(pk) for pk in Run.objects.exclude(state__in=TERMINAL).values_list("pk", flat=True)]
        for run_id in unfinished:
            self.session.post(f"{self.base}/api/runs/{run_id}/cancel/", json={}, timeout=30)
        for run_id in unfinished:
            self.wait_until_finished(run_id, timeout_s=120)


@pytest.fixture
def api(stack) -> Api:
    from rest_framework.authtoken.models import Token

    from tests.unit.platform.helpers import a_researcher

    return Api(stack.web.url, Token.objects.create(user=a_researcher()).key)


@pytest.fixture
def registry(demo_assets, tmp_path):
    """Registry rows for the demo task, straight through the ORM (the registry API is tested elsewhere)."""
    from posttrain.registry.models import Dataset, ModelAsset, RewardFunction

    train = demo_assets / "data" / "train.jsonl"
    raising = tmp_path / "raising_reward.py"
    raising.write_text(
        "def reward_func(queries, prompts, labels, **kwargs):\n    raise RuntimeError('the reward server exploded')\n"
    )
    broken = tmp_path / "broken_reward.py"
    broken.write_text("def reward_func(queries, prompts, labels, **kwargs)\n    return [0.0] * len(queries)\n")
    return {
        "model": ModelAsset.objects.create(name="tiny demo", path=str(demo_assets / "model")),
        "dataset": Dataset.objects.create(
            name="sums",
            sha256="0" * 64,
            format="jsonl",
            path=str(train),
            size_bytes=train.stat().st_size,
            row_count=5000,
            prompt_field="prompt",
            label_field="label",
            columns=["prompt", "label"],
        ),
        "exact": RewardFunction.objects.create(name="correct", kind="builtin", spec={"type": "exact_match"}),
        "format": RewardFunction.objects.create(
            name="two_digits", kind="builtin", spec={"type": "regex", "pattern": r"^\d\d"}
        ),
        "raising": RewardFunction.objects.create(
            name="raising", kind="python", spec={"type": "python", "path": str(raising), "timeout_s": 10}
        ),
        "broken": RewardFunction.objects.create(
            name="broken", kind="python", spec={"type": "python", "path": str(broken)}
        ),
    }


def create_experiment(
    api: Api, registry, name: str, config: dict, rewards=(("exact", 1.0), ("format", 0.5)), model=None
) -> dict:
    return api.post(
        "/api/experiments/",
        {
            "name": name,
            "model": (model or registry["model"]).pk,
            "dataset": registry["dataset"].pk,
            "rewards": [{"reward": registry[key].pk, "weight": weight} for key, weight in rewards],
            "config": config,
        },
    )


def launch(api: Api, experiment: dict, seed: int = 1) -> dict:
    run = api.post(f"/api/experiments/{experiment['id']}/launch/", {"seed": seed, "tags": ["integration"]})
    assert run["state"] == "queued"
    return run


def follow_with_the_cli(api: Api, run_id: str) -> subprocess.Popen:
    """`posttrain runs follow RUN` in its own process; it ends when the run does."""
    env = {**os.environ, "POSTTRAIN_URL": api.base, "POSTTRAIN_TOKEN": api.session.headers["Authorization"].split()[1]}
    return subprocess.Popen(
        [sys.executable, "-m", "posttrain_sdk", "runs", "follow", run_id],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def run_folder_events(run: dict) -> list[dict]:
    from posttrain_sdk.event_log import read_events

    return read_events(Path(run["resolved_config"]["logging"]["run_dir"]) / "events.jsonl")


def ray_job_status(stack: PlatformStack, run_id: str, timeout_s: float = 30) -> str:
    """The Ray job's final status (the engine process may still be exiting when its run already ended)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with urllib.request.urlopen(f"{stack.ray}/api/jobs/{run_id}", timeout=10) as response:
            status = json.load(response)["status"]
        if status in ("SUCCEEDED", "FAILED", "STOPPED") or time.monotonic() > deadline:
            return status
        time.sleep(0.3)


def assert_store_matches_the_run_folder(run: dict) -> None:
    """No gap, no duplicate: what the platform stored is exactly the run folder's events.jsonl."""
    assert_store_matches_events(run, run_folder_events(run))


def assert_store_matches_events(run: dict, events: list[dict], rollouts_dir: Path | None = None) -> None:
    """What the platform stored of `run` is exactly `events` (its events.jsonl), each seq once, and the
    rollout store (`rollouts_dir`; a native run's is in its resolved config) holds every file announced."""
    from posttrain.runs.models import MetricRow, RolloutFile, RunLog

    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert run["last_seq"] == len(events)
    by_type = lambda kind: [e for e in events if e["type"] == kind]  # noqa: E731
    assert list(MetricRow.objects.filter(run_id=run["id"]).order_by("seq").values_list("seq", flat=True)) == [
        e["seq"] for e in by_type("metrics")
    ]
    assert list(RunLog.objects.filter(run_id=run["id"]).order_by("seq").values_list("seq", flat=True)) == [
        e["seq"] for e in by_type("log")
    ]
    # One index row per announced rollout file, and each file in the run's rollout folder is the one its
    # event announced: same bytes, one row per (step, index), every row of that step.
    announced = [(e["step"], e["data"]["file"], e["data"]["rows"], e["data"]["sha256"]) for e in by_type("samples")]
    stored = RolloutFile.objects.filter(run_id=run["id"]).order_by("seq").values_list("step", "name", "rows", "sha256")
    assert list(stored) == announced
    assert_rollout_files_match(rollouts_dir or Path(run["resolved_config"]["logging"]["rollouts_dir"]), announced)


def assert_rollout_files_match(folder: Path, announced: list[tuple[int, str, int, str]]) -> None:
    """Each announced rollout file is in the rollout folder, whole (its SHA-256), with `rows` rows of its
    step and no (step, index) twice across the run."""
    import hashlib
    import io

    import pyarrow.parquet as pq

    seen: set[tuple[int, int]] = set()
    for step, name, rows, sha256 in announced:
        data = (folder / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == sha256, name
        table = pq.read_table(io.BytesIO(data), columns=["step", "index"]).to_pylist()
        keys = {(r["step"], r["index"]) for r in table}
        assert len(table) == rows == len(keys) and {s for s, _ in keys} == {step}, name
        assert not keys & seen, f"{name} repeats rollouts of step {step}"
        seen |= keys


# --- (a) -------------------------------------------------------------------------------------


def test_a_launched_run_succeeds_with_every_steps_metrics_and_every_sample_stored(api, registry, stack):
    steps = 3
    experiment = create_experiment(api, registry, "sums grpo", run_config(steps, checkpoint={"save_final": True}))
    run = launch(api, experiment)
    follower = follow_with_the_cli(api, run["id"])  # from `queued` on, as someone who just launched it
    run = api.wait_until_finished(run["id"])
    assert run["state"] == "succeeded", run
    assert run["state_reason"] == "engine finished every step"
    out, err = follower.communicate(timeout=60)
    assert follower.returncode == 0, err
    assert "state: running" in out and f"step {steps}/{steps} reward/mean=" in out
    assert out.strip().endswith(f"run {run['id']} succeeded")

    series = api.get(f"/api/runs/{run['id']}/metrics/", names="reward/mean,reward/correct,timing/generate")["series"]
    for name in ("reward/mean", "reward/correct", "timing/generate"):
        assert series[name]["steps"] == list(range(1, steps + 1)), name
    samples = api.get(f"/api/runs/{run['id']}/samples/", limit=500)
    assert samples["count"] == steps * ROLLOUT["prompts_per_step"] * ROLLOUT["samples_per_prompt"]
    assert {s["step"] for s in samples["results"]} == set(range(1, steps + 1))
    assert all(s["prompt"] and s["finish_reason"] in ("stop", "length") for s in samples["results"])
    assert [c["step"] for c in api.get(f"/api/runs/{run['id']}/checkpoints/")] == [steps]
    assert [(t["from_state"], t["to_state"]) for t in api.get(f"/api/runs/{run['id']}/transitions/")] == [
        ("draft", "queued"),
        ("queued", "starting"),
        ("starting", "running"),
        ("running", "succeeded"),
    ]
    assert_store_matches_the_run_folder(run)
    assert ray_job_status(stack, run["id"]) == "SUCCEEDED"
    assert "run folder:" in api.get(f"/api/runs/{run['id']}/logs/")["logs"]
    assert_the_token_never_reached_ray(stack, run)


def assert_the_token_never_reached_ray(stack: PlatformStack, run: dict) -> None:
    """Anyone who can list Ray jobs reads their runtime_env: the token went through a 0600 file in the run
    folder instead, which the engine deleted once it had read it."""
    from posttrain.runs.tokens import ingest_token

    with urllib.request.urlopen(f"{stack.ray}/api/jobs/{run['id']}", timeout=10) as response:
        job = json.load(response)
    env = job["runtime_env"]["env_vars"]
    assert "POSTTRAIN_INGEST_TOKEN" not in env
    assert ingest_token(run["id"]) not in json.dumps(job)
    token_file = Path(env["POSTTRAIN_INGEST_TOKEN_FILE"])
    assert token_file.parent == Path(run["resolved_config"]["logging"]["run_dir"])
    assert not token_file.exists()


# --- (b) -------------------------------------------------------------------------------------


def test_failing_rewards_and_a_missing_model_end_as_the_engine_reports_them(
    api, registry, stack, demo_assets, tmp_path
):
    from posttrain.registry.models import ModelAsset

    # A reward_func that raises on every sample: more than its max_error_rate (0.5) of the step failed, so the
    # run fails at once with the first error, loud, instead of training on zeros.
    raising = create_experiment(api, registry, "raising reward", run_config(2), rewards=(("raising", 1.0),))
    # A reward file the engine cannot load: the engine fails the run and says why.
    broken = create_experiment(api, registry, "broken reward", run_config(2), rewards=(("broken", 1.0),))
    # A model folder deleted before the run starts: the engine exits at once; Ray reports the job failed.
    copy = tmp_path / "model-copy"
    shutil.copytree(demo_assets / "model", copy)
    doomed = ModelAsset.objects.create(name="doomed", path=str(copy))
    missing = create_experiment(api, registry, "missing model", run_config(2), model=doomed)
    shutil.rmtree(copy)

    runs = {
        name: launch(api, experiment)["id"]
        for name, experiment in (("raising", raising), ("broken", broken), ("missing", missing))
    }
    finished = {name: api.wait_until_finished(run_id) for name, run_id in runs.items()}

    assert finished["raising"]["state"] == "failed", finished["raising"]
    assert finished["raising"]["state_reason"] == (  # the engine's own status event
        "RewardsFailed: reward 'raising' failed on 8 of 8 samples of the step (100%, over its max_error_rate of "
        "0.5); the first error: RuntimeError: the reward server exploded (line 2)"
    )

    assert finished["broken"]["state"] == "failed", finished["broken"]
    assert finished["broken"]["state_reason"].startswith("ValueError: path:")  # the engine's own status event
    assert "broken_reward.py" in finished["broken"]["state_reason"] or "line" in finished["broken"]["state_reason"]

    assert finished["missing"]["state"] == "failed", finished["missing"]
    assert f"model.path: {copy} does not exist" in finished["missing"]["state_reason"]
    assert ray_job_status(stack, runs["missing"]) == "FAILED"


# --- (c) -------------------------------------------------------------------------------------


def test_cancel_during_running_ends_cancelled_and_stops_the_ray_job(api, registry, stack):
    experiment = create_experiment(api, registry, "long run", run_config(2000))
    run = launch(api, experiment)
    api.wait_for(run["id"], lambda r: r["state"] == "running" and (r["last_step"] or 0) >= 1, what="running")
    cancelling = api.post(f"/api/runs/{run['id']}/cancel/", expect=200)
    assert cancelling["state"] in ("cancelling", "cancelled")
    run = api.wait_until_finished(run["id"], timeout_s=60)
    assert run["state"] == "cancelled", run
    assert ray_job_status(stack, run["id"]) == "STOPPED"
    assert run["last_step"] < 2000
    reasons = [t["reason"] for t in api.get(f"/api/runs/{run['id']}/transitions/")]
    assert "cancel requested by ada" in reasons
    assert api.post(f"/api/runs/{run['id']}/cancel/", expect=409)["state"] == "cancelled"


def ray_state(stack: PlatformStack, kind: str) -> list[dict]:
    """Ray's state API (`actors`, `placement_groups`) over HTTP, as the dashboard reads it."""
    with urllib.request.urlopen(f"{stack.ray}/api/v0/{kind}?limit=1000", timeout=10) as response:
        return json.load(response)["data"]["result"]["result"]


def test_a_run_with_separate_placement_runs_its_roles_as_actors_of_its_job_and_cancel_removes_them(
    api, registry, stack
):
    config = run_config(2000, placement={"mode": "separate", "cpus_per_trainer": 0.5, "cpus_per_rollout_engine": 0.5})
    run = launch(api, create_experiment(api, registry, "separate roles", config))
    run = api.wait_for(run["id"], lambda r: r["state"] == "running" and (r["last_step"] or 0) >= 2, what="two steps")
    described = next(e["data"]["message"] for e in run_folder_events(run) if e["type"] == "log")
    assert "placement separate" in described and "rollout_0 pid" in described
    alive = [a for a in ray_state(stack, "actors") if a["state"] == "ALIVE" and a["class_name"].endswith("Worker")]
    assert sorted(a["class_name"] for a in alive) == ["RewardWorker", "RolloutWorker", "TrainerWorker"]
    memory = api.get(f"/api/runs/{run['id']}/metrics/", names="memory/rollout_0_peak_gb")["series"]
    assert memory["memory/rollout_0_peak_gb"]["values"][0] > 0

    api.post(f"/api/runs/{run['id']}/cancel/", expect=200)
    assert api.wait_until_finished(run["id"], timeout_s=60)["state"] == "cancelled"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        alive = [a for a in ray_state(stack, "actors") if a["state"] == "ALIVE" and a["class_name"].endswith("Worker")]
        groups = [g for g in ray_state(stack, "placement_groups") if g["state"] == "CREATED"]
        if not alive and not groups:
            break
        time.sleep(0.5)
    assert not alive and not groups, (alive, groups)


# --- (d) -------------------------------------------------------------------------------------


def test_the_engine_keeps_its_events_through_a_10_second_web_outage_and_delivers_them_all(api, registry, stack):
    # Still training when the server goes down and through the 10 s it is away (~15 s of steps alone).
    experiment = create_experiment(api, registry, "outage", run_config(300))
    run = launch(api, experiment)
    api.wait_for(run["id"], lambda r: r["state"] == "running" and (r["last_step"] or 0) >= 1, what="running")

    stack.web.stop()
    down_at = time.time()
    time.sleep(10)
    up_at = time.time()
    stack.web.start()

    run = api.wait_until_finished(run["id"])
    assert run["state"] == "succeeded", run
    events = run_folder_events(run)
    assert any(down_at < e["time"] < up_at for e in events), "the engine wrote nothing during the outage"
    assert_store_matches_the_run_folder(run)
    # Delivered by the engine's sender, not recovered from the run folder by the reconcile afterwards.
    assert f"of run {run['id']} from" not in stack.worker_log.read_text()
