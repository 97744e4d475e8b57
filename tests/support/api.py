"""A run driven through the REST API on the real stack, as the lifecycle, scheduler and fault tests drive
it: the API client, an experiment and its launch, and the checks that what the platform stored is exactly what
the run folder holds. The stack itself is tests/support/stack.py's; the fixtures that start it for a module are
tests/support/stack_fixtures.py's."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import requests

from tests.support.stack import REPO_ROOT, PlatformStack, ray_get_json

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
        status = ray_get_json(f"{stack.ray}/api/jobs/{run_id}")["status"]
        if status in ("SUCCEEDED", "FAILED", "STOPPED") or time.monotonic() > deadline:
            return status
        time.sleep(0.3)


def assert_store_matches_the_run_folder(run: dict) -> None:
    """No gap, no duplicate: what the platform stored is exactly the run folder's events.jsonl."""
    assert_store_matches_events(run, run_folder_events(run))


def assert_store_matches_events(run: dict, events: list[dict], rollouts_dir: Path | None = None) -> None:
    """What the platform stored of `run` is exactly `events` (its events.jsonl), each seq once, and the
    rollout store (`rollouts_dir`; a native run's is in its resolved config) holds every file announced."""
    from posttrain.telemetry.models import MetricRow, RolloutFile, RunLog

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


def ray_state(stack: PlatformStack, kind: str) -> list[dict]:
    """Ray's state API (`actors`, `placement_groups`) over HTTP, as the dashboard reads it."""
    return ray_get_json(f"{stack.ray}/api/v0/{kind}?limit=1000")["data"]["result"]["result"]


def admitted_at(api: Api, run_id: str) -> str:
    """When admission started the run: the time of its move to `starting`."""
    moves = api.get(f"/api/runs/{run_id}/transitions/")
    return next(t["at"] for t in moves if t["to_state"] == "starting")


def start_simulated_run(api: Api, folder: Path, name: str, steps: int, rate: float) -> subprocess.Popen:
    """A run simulated through the SDK (bench/simulated_run.py: the engine's event log and sender) in its own
    process, as `api`'s user, its run folder under `folder`; its first line of output names the run."""
    token = api.session.headers["Authorization"].split()[1]
    command = [sys.executable, "-m", "bench.simulated_run", "--url", api.base, "--token", token, "--dir", str(folder)]
    command += ["--name", name, "--steps", str(steps), "--rate", str(rate), "--metrics", "10", "--samples", "2"]
    return subprocess.Popen(command, cwd=REPO_ROOT, env=os.environ, stdout=subprocess.PIPE, text=True)
