"""Experiments, launch, clone, resume, tags and notes through the API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posttrain.core.run_tokens import ingest_token, token_hash
from posttrain.runs.models import Checkpoint, Experiment, Run, RunState, RunTransition
from tests.unit.platform.helpers import BASE_CONFIG, create_body, make_run, post

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch", "storage")]


def locs(response) -> list[str]:
    return [e["loc"] for e in response.json()["errors"]]


def test_an_experiment_is_created_with_its_rewards_and_its_config_stored_as_given(api, registry):
    response = post(api, "/api/experiments/", create_body(registry))
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["config"] == BASE_CONFIG
    assert [(r["reward_name"], r["weight"]) for r in body["rewards"]] == [("exact answer", 1.0), ("two-digits", 0.5)]
    assert body["run_count"] == 0 and body["created_by"] == "ada"
    assert Experiment.objects.get().config == BASE_CONFIG


@pytest.mark.parametrize(
    ("config", "loc"),
    [
        ({**BASE_CONFIG, "rollout": {"samples_per_prompt": 1}}, "rollout.samples_per_prompt"),
        ({**BASE_CONFIG, "rollout": {"temprature": 0.7}}, "rollout.temprature"),
        ({**BASE_CONFIG, "train": {"lr": -1}}, "train.lr"),
        ({**BASE_CONFIG, "algorithm": {"name": "dpo"}}, "algorithm.name"),
        ({**BASE_CONFIG, "model": {"path": "/elsewhere"}}, "model.path"),
        ({**BASE_CONFIG, "data": {"prompt_field": "text"}}, "data.prompt_field"),
        ({**BASE_CONFIG, "rewards": [{"type": "exact_match"}]}, "rewards"),
        ({**BASE_CONFIG, "logging": {"run_dir": "/tmp/x"}}, "logging.run_dir"),
        ({**BASE_CONFIG, "model": "tiny"}, "model"),
        ({**BASE_CONFIG, "description": "a\x00b"}, "description"),
    ],
)
def test_experiment_config_errors_are_400_naming_the_loc(api, registry, config, loc):
    response = post(api, "/api/experiments/", create_body(registry, config=config))
    assert response.status_code == 400, response.content
    assert loc in locs(response), response.json()
    assert all(e["msg"] for e in response.json()["errors"])
    assert not Experiment.objects.exists()


@pytest.mark.parametrize(
    ("overrides", "loc"),
    [
        ({"name": ""}, "name"),
        ({"model": 987654}, "model"),
        ({"dataset": "sums"}, "dataset"),
        ({"rewards": []}, "rewards"),
        ({"rewards": [{"reward": 987654}]}, "rewards[0].reward"),
        ({"rewards": [{"weight": 1.0}]}, "rewards[0].reward"),
        ({"config": "rollout: 1"}, "config"),
        ({"config": None}, "config"),
    ],
)
def test_bad_experiment_fields_are_400_naming_the_field(api, registry, overrides, loc):
    response = post(api, "/api/experiments/", create_body(registry, **overrides))
    assert response.status_code == 400, response.content
    assert loc in locs(response), response.json()


def test_the_same_reward_twice_and_a_non_finite_weight_are_refused(api, registry):
    exact = registry["exact"].pk
    twice = post(api, "/api/experiments/", create_body(registry, rewards=[{"reward": exact}, {"reward": exact}]))
    assert twice.status_code == 400 and "rewards[1].reward" in locs(twice)
    infinite = post(api, "/api/experiments/", create_body(registry, rewards=[{"reward": exact, "weight": "inf"}]))
    assert infinite.status_code == 400 and "rewards[0].weight" in locs(infinite)


def test_launch_commits_a_queued_run_with_its_resolved_config_and_asks_for_admission_after_commit(
    api, experiment, registry, storage, no_dispatch, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = post(api, f"/api/experiments/{experiment.pk}/launch/", {"seed": 7, "tags": ["a", "b"], "note": "hi"})
    assert response.status_code == 201, response.json()
    run = Run.objects.get()
    assert no_dispatch == [("admit_runs", str(run.id))]
    assert (run.state, run.seed, run.tags, run.note) == (RunState.QUEUED, 7, ["a", "b"], "hi")
    config = run.resolved_config
    assert config["seed"] == 7
    assert config["logging"]["run_dir"] == str(storage / "runs" / str(run.id))
    assert config["model"]["path"] == registry["model"].path
    assert (config["data"]["path"], config["data"]["prompt_field"], config["data"]["label_field"]) == (
        registry["dataset"].path,
        "question",
        "answer",
    )
    assert [(r["name"], r["type"], r["weight"]) for r in config["rewards"]] == [
        ("exact_answer", "exact_match", 1.0),
        ("two-digits", "regex", 0.5),
    ]
    # Only the token's hash is stored; the raw token is derived again by the worker for the engine.
    assert run.ingest_token_hash == token_hash(ingest_token(run.id))
    assert ingest_token(run.id) not in json.dumps(response.json())
    assert list(RunTransition.objects.values_list("from_state", "to_state")) == [("draft", "queued")]


def test_nothing_is_dispatched_when_the_launch_transaction_rolls_back(
    experiment, no_dispatch, django_capture_on_commit_callbacks
):
    from django.db import transaction

    from posttrain.runs import services

    with django_capture_on_commit_callbacks(execute=True), pytest.raises(RuntimeError), transaction.atomic():
        services.run_launch(experiment)
        raise RuntimeError("rolled back")
    assert no_dispatch == [] and not Run.objects.exists()


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"seed": -1}, "seed"),
        ({"seed": "x"}, "seed"),
        ({"tags": "a"}, "tags"),
        ({"tags": [""]}, "tags[0]"),
        ({"tags": ["x" * 51]}, "tags[0]"),
        ({"note": ["x"]}, "note"),
    ],
)
def test_bad_launch_fields_are_400_naming_the_field(api, experiment, body, loc):
    response = post(api, f"/api/experiments/{experiment.pk}/launch/", body)
    assert response.status_code == 400, response.content
    assert loc in locs(response)


def test_clone_copies_the_source_runs_config_with_an_optional_new_seed(api, experiment):
    source = make_run(experiment, RunState.FAILED)
    response = post(api, f"/api/runs/{source.id}/clone/", {"seed": 11})
    assert response.status_code == 201, response.json()
    clone = Run.objects.get(pk=response.json()["id"])
    assert clone.state == RunState.QUEUED and clone.seed == 11 and clone.parent_id == source.id
    # Each run's own folders (its run folder, where its rollout files go) differ; the rest is the source's.
    strip = lambda c: {**c, "seed": None, "logging": {**c["logging"], "run_dir": None, "rollouts_dir": None}}  # noqa: E731
    assert strip(clone.resolved_config) == strip(source.resolved_config)
    assert clone.resolved_config["logging"]["run_dir"].endswith(str(clone.id))
    assert post(api, f"/api/runs/{source.id}/clone/", {}).json()["seed"] == source.seed


def test_resume_creates_a_child_run_that_resumes_from_the_checkpoint(api, experiment, storage):
    source = make_run(experiment, RunState.CANCELLED)
    folder = storage / "runs" / str(source.id) / "checkpoints" / "step_2"
    folder.mkdir(parents=True)
    checkpoint = Checkpoint.objects.create(run=source, step=2, path=str(folder))
    response = post(api, f"/api/runs/{source.id}/resume/", {"checkpoint": checkpoint.pk})
    assert response.status_code == 201, response.json()
    child = Run.objects.get(pk=response.json()["id"])
    assert (child.parent_id, child.resume_from_id, child.seed) == (source.id, checkpoint.pk, source.seed)

    from workers.ray_jobs import entrypoint

    assert entrypoint(child, storage / "config.yaml").endswith(f"--resume {folder}")


def test_ray_reserves_for_the_driver_exactly_the_resources_stored_at_launch(experiment):
    from rl_engine.config import validate_config
    from rl_engine.distributed.placement import resource_needs
    from workers.ray_jobs import engine_env, entrypoint_resources

    run = make_run(experiment)
    assert run.resources["total"] == {"CPU": 1.0, "GPU": 0.0}
    assert entrypoint_resources(run) == {"entrypoint_num_cpus": 1.0}  # the CPU default
    assert engine_env(run, Path("ingest_token"))["OMP_NUM_THREADS"] == "1"

    def with_placement(**placement):
        run.resolved_config["placement"] = placement
        run.resources = resource_needs(validate_config(run.resolved_config))
        return entrypoint_resources(run)

    # The hybrid engine: every role in the driver, on the job's own CPUs and GPU.
    assert with_placement(cpus_per_trainer=2, gpus_per_trainer=1) == {
        "entrypoint_num_cpus": 2,
        "entrypoint_num_gpus": 1,
    }
    assert engine_env(run, Path("ingest_token"))["OMP_NUM_THREADS"] == "2"  # the engine's threads are its grant
    # Actors: their placement group holds the CPUs and GPUs; the driver reserves nothing.
    assert with_placement(mode="separate", gpus_per_trainer=1, gpus_per_rollout_engine=1) == {}


def test_all_at_once_reserves_no_driver_cpus_and_keeps_the_workers_threads(experiment, settings, monkeypatch):
    from workers.ray_jobs import engine_env, entrypoint_resources

    run = make_run(experiment)
    settings.SCHEDULER = "all-at-once"  # the behaviour before the scheduler, for bench/queue_admission.py
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert entrypoint_resources(run) == {}
    assert engine_env(run, Path("ingest_token"))["OMP_NUM_THREADS"] == "3"


def test_the_job_gets_where_its_token_is_never_the_token_and_the_file_is_private(experiment, settings):
    from posttrain.core.run_tokens import ingest_token
    from workers.ray_jobs import engine_env, write_token_file

    run = make_run(experiment)
    path = write_token_file(run)
    env = engine_env(run, path)
    assert ingest_token(run.id) not in json.dumps(env) and "POSTTRAIN_INGEST_TOKEN" not in env
    assert "POSTTRAIN_ALLOW_UNSANDBOXED_CODE" not in env
    assert env["POSTTRAIN_INGEST_TOKEN_FILE"] == str(path)
    assert path.read_text() == ingest_token(run.id)
    assert path.stat().st_mode & 0o777 == 0o600
    assert write_token_file(run) != path  # a file per submission: removing one never removes another's
    settings.ALLOW_UNSANDBOXED_CODE = True  # the admin's choice reaches the run's engine
    assert engine_env(run, path)["POSTTRAIN_ALLOW_UNSANDBOXED_CODE"] == "1"


def test_resume_refuses_a_checkpoint_of_another_run_an_unfinished_run_and_a_pruned_folder(api, experiment, storage):
    source = make_run(experiment, RunState.FAILED)
    other = make_run(experiment, RunState.FAILED)
    foreign = Checkpoint.objects.create(run=other, step=1, path=str(storage))
    response = post(api, f"/api/runs/{source.id}/resume/", {"checkpoint": foreign.pk})
    assert response.status_code == 400 and locs(response) == ["checkpoint"]

    pruned = Checkpoint.objects.create(
        run=source, step=1, path=str(storage / "runs" / str(source.id) / "checkpoints" / "step_1")
    )
    response = post(api, f"/api/runs/{source.id}/resume/", {"checkpoint": pruned.pk})
    assert response.status_code == 400 and "no longer exists" in response.json()["errors"][0]["msg"]

    # A checkpoint event names a folder the engine wrote: one outside the run's own folder (another run's, or
    # anything else a forged event could name) is never resumed from.
    elsewhere = Checkpoint.objects.create(run=source, step=2, path=str(storage / "runs" / str(other.id)))
    response = post(api, f"/api/runs/{source.id}/resume/", {"checkpoint": elsewhere.pk})
    assert response.status_code == 400 and "is not a checkpoint folder of run" in response.json()["errors"][0]["msg"]

    running = make_run(experiment, RunState.RUNNING)
    own = Checkpoint.objects.create(run=running, step=1, path=str(storage))
    response = post(api, f"/api/runs/{running.id}/resume/", {"checkpoint": own.pk})
    assert response.status_code == 409 and response.json()["state"] == "running"
    assert post(api, f"/api/runs/{source.id}/resume/", {"checkpoint": 999999}).status_code == 400


def test_tags_and_note_are_editable_and_nothing_else_is(api, experiment):
    run = make_run(experiment, RunState.RUNNING)
    response = api.patch(
        f"/api/runs/{run.id}/",
        data=json.dumps({"tags": ["best", "best", "lr"], "note": "ok"}),
        content_type="application/json",
    )
    assert response.status_code == 200, response.json()
    run.refresh_from_db()
    assert (run.tags, run.note, run.state) == (["best", "lr"], "ok", RunState.RUNNING)
    bad = api.patch(f"/api/runs/{run.id}/", data=json.dumps({"tags": [3, ""]}), content_type="application/json")
    assert bad.status_code == 400 and any(loc.startswith("tags") for loc in locs(bad))
    assert api.put(f"/api/runs/{run.id}/", data="{}", content_type="application/json").status_code == 405


def test_runs_filter_by_state_experiment_and_tag_and_search_the_note(api, experiment, registry):
    other = Experiment.objects.create(name="other", model=registry["model"], dataset=registry["dataset"], config={})
    a = make_run(experiment, RunState.RUNNING, tags=["x", "lr-high"], note="the good one")
    b = make_run(experiment, RunState.FAILED, tags=["lr"])
    Run.objects.create(experiment=other, state=RunState.SUCCEEDED, tags=["x"])

    def ids(query: str) -> set[str]:
        response = api.get(f"/api/runs/?{query}")
        assert response.status_code == 200, response.content
        return {r["id"] for r in response.json()["results"]}

    assert ids("state=running") == {str(a.id)}
    assert ids("state=running&state=failed") == {str(a.id), str(b.id)}
    assert ids(f"experiment={experiment.pk}") == {str(a.id), str(b.id)}
    assert ids(f"experiment={experiment.pk}&tag=x") == {str(a.id)}
    assert ids("tag=lr") == {str(b.id)}  # a whole tag, not a prefix of "lr-high"
    assert ids("search=good") == {str(a.id)}
    assert api.get("/api/runs/?limit=1").json()["count"] == 3
    bad = api.get("/api/runs/?state=bogus")
    assert bad.status_code == 400 and locs(bad) == ["state"]


def test_the_runs_api_needs_a_login(client, experiment):
    assert client.get("/api/runs/").status_code in (401, 403)
    assert client.post(f"/api/experiments/{experiment.pk}/launch/").status_code in (401, 403)


def test_openapi_schema_documents_the_runs_endpoints(api):
    paths = api.get("/api/schema/", {"format": "json"}).json()["paths"]
    for path in (
        "/api/experiments/",
        "/api/experiments/{id}/launch/",
        "/api/runs/",
        "/api/runs/{id}/cancel/",
        "/api/runs/{id}/metrics/",
        "/api/runs/{id}/samples/",
        "/api/runs/{id}/events/",
        "/api/runs/{id}/logs/",
        "/api/runs/{id}/resume/",
        "/api/runs/{id}/transitions/",
    ):
        assert path in paths, path


def test_an_experiment_asking_for_a_combination_the_engine_cannot_run_is_refused_at_create(api, registry):
    body = {
        "name": "async colocated",
        "model": registry["model"].pk,
        "dataset": registry["dataset"].pk,
        "rewards": [{"reward": registry["exact"].pk}],
        "config": {**BASE_CONFIG, "backends": {"async_rollout": True}},
    }
    response = api.post("/api/experiments/", body, content_type="application/json")
    assert response.status_code == 400
    assert [e["loc"] for e in response.json()["errors"]] == ["backends.async_rollout"]
