"""Reward functions: specs validated by the engine's schema, python code checked in the sandbox,
and "try it" scoring samples the way a run would."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from posttrain.registry.models import RewardFunction
from rl_engine.config import validate_config
from tests.unit.platform.helpers import an_experiment, default_project, grant_server_paths

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _researcher_may_name_server_paths(researcher):
    """These tests register files on the server, which an admin grants (tests/security tries it without)."""
    grant_server_paths(researcher)


VERL_SOURCE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": float(solution_str.strip() == ground_truth), "length": len(solution_str)}
"""

OPENRLHF_SOURCE = """
import os

def reward_func(queries, prompts, labels, **kwargs):
    return {"rewards": [float(os.getpid()) for _ in queries], "extra_logs": {"calls": 1.0}}
"""


def create(client, **body):
    return client.post("/api/rewards/", body, format="json")


def try_(client, reward_id: int, samples: list[dict]):
    return client.post(f"/api/rewards/{reward_id}/try/", {"samples": samples}, format="json")


def test_a_builtin_reward_stores_the_engines_full_spec_named_for_metrics(researcher_client):
    response = create(researcher_client, name="Has a number", kind="builtin", spec={"type": "regex", "pattern": r"\d+"})
    assert response.status_code == 201, response.content
    spec = response.json()["spec"]
    assert spec == {
        "type": "regex",
        "name": "Has_a_number",
        "pattern": r"\d+",
        "full_match": False,
        "score_match": 1.0,
        "score_miss": 0.0,
        "max_error_rate": 0.5,
    }
    # The stored spec, plus a weight, is a valid reward of a run config.
    validate_config(
        {"name": "r", "model": {"path": "m"}, "data": {"path": "d.jsonl"}, "rewards": [{**spec, "weight": 0.5}]}
    )


def test_spec_field_errors_come_out_in_the_engines_wording(researcher_client):
    response = create(
        researcher_client, name="r", kind="builtin", spec={"type": "regex", "pattern": "(", "full_mach": True}
    )
    assert response.status_code == 400
    errors = {}
    for error in response.json()["errors"]:
        errors.setdefault(error["loc"], []).append(error["msg"])
    assert errors["spec.pattern"] == ["invalid regular expression: missing ): ("]
    assert errors["spec.full_mach"] == ["unknown field 'full_mach' (did you mean 'full_match'?)"]


def test_builtin_try_scores_each_sample_with_its_label(researcher_client):
    reward = create(researcher_client, name="exact", kind="builtin", spec={"type": "exact_match"}).json()
    response = try_(
        researcher_client,
        reward["id"],
        [
            {"prompt": "2+2=", "response": "4", "label": "4"},
            {"prompt": "2+3=", "response": "6", "label": 5},
            {"prompt": "x", "response": "y"},
        ],
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["scores"] == [1.0, 0.0, 0.0]
    assert body["components"] == {"exact": [1.0, 0.0, 0.0]}
    assert body["errors"] == [[], [], ["exact: no label to compare against"]]


def test_python_source_is_stored_by_hash_and_scored_in_the_sandbox(researcher_client, storage):
    response = create(researcher_client, name="verl-exact", kind="python", source=VERL_SOURCE)
    assert response.status_code == 201, response.content
    reward = response.json()
    stored = Path(reward["spec"]["path"])
    assert stored.parent == storage / "rewards" and stored.read_text() == VERL_SOURCE
    assert reward["source"] == VERL_SOURCE
    assert [p.name for p in stored.parent.iterdir()] == [stored.name]  # the staged file was moved

    body = try_(
        researcher_client,
        reward["id"],
        [{"prompt": "p", "response": " 7 ", "label": "7"}, {"prompt": "p", "response": "8", "label": "7"}],
    ).json()
    assert body["scores"] == [1.0, 0.0]
    assert body["extra_logs"] == {"verl-exact/length": 2.0}


def test_python_reward_code_never_runs_in_the_web_process(researcher_client):
    reward = create(researcher_client, name="pid", kind="python", source=OPENRLHF_SOURCE).json()
    body = try_(researcher_client, reward["id"], [{"prompt": "p", "response": "r"}]).json()
    assert body["errors"] == [[]]
    assert body["scores"][0] != float(os.getpid())


def test_a_python_reward_from_a_server_file_stores_its_text(researcher_client, tmp_path):
    source = tmp_path / "my_reward.py"
    source.write_text(VERL_SOURCE)
    reward = create(researcher_client, name="from-file", kind="python", spec={"path": str(source)}).json()
    source.write_text("raise SystemExit('edited later')\n")
    assert reward["source"] == VERL_SOURCE
    assert Path(reward["spec"]["path"]).read_text() == VERL_SOURCE


def test_a_syntax_error_in_python_source_names_the_line(researcher_client, storage):
    response = create(
        researcher_client, name="bad", kind="python", source="def compute_score(a, b, c):\n    return (\n"
    )
    assert response.status_code == 400
    [error] = response.json()["errors"]
    assert error["loc"] == "source" and "line 2" in error["msg"]
    assert not (storage / "rewards").exists() or not list((storage / "rewards").iterdir())


def test_http_reward_is_checked_by_the_engine_schema(researcher_client, settings):
    settings.HTTP_ALLOW = ["127.0.0.1"]  # an admin allowed reward servers on this machine
    ok = create(
        researcher_client,
        name="server",
        kind="http",
        spec={"url": "http://127.0.0.1:9/score", "retries": 0, "timeout_s": 0.5},
    )
    assert ok.status_code == 201
    assert ok.json()["spec"]["type"] == "http"
    body = try_(researcher_client, ok.json()["id"], [{"prompt": "p", "response": "r"}]).json()
    assert body["scores"] == [0.0] and "failed" in body["errors"][0][0]


def test_a_reward_model_may_be_given_by_registered_model_name(researcher_client, tiny_model):
    from posttrain.registry.services import model_register

    model_register("tiny-rm", str(tiny_model), project=default_project())
    response = create(researcher_client, name="rm", kind="reward_model", spec={"path": "tiny-rm"})
    assert response.status_code == 201, response.content
    assert response.json()["spec"]["path"] == str(tiny_model.resolve())


def test_reward_model_try_runs_in_a_subprocess_and_returns_scores(researcher_client, tiny_model, monkeypatch):
    from rl_engine.rewards.reward_model import RewardModelReward

    def no_torch_here(self):
        raise AssertionError("the reward model was loaded in the web process")

    monkeypatch.setattr(RewardModelReward, "load", no_torch_here)  # the child process is unaffected
    reward = create(researcher_client, name="rm", kind="reward_model", spec={"path": str(tiny_model)}).json()
    body = try_(
        researcher_client, reward["id"], [{"prompt": "1+1=", "response": "2"}, {"prompt": "2+2=", "response": "4"}]
    ).json()
    assert body["errors"] == [[], []], body
    assert len(body["components"]["rm"]) == 2 and all(isinstance(x, float) for x in body["scores"])


def test_reward_model_try_reports_a_timeout_as_sample_errors(researcher_client, tiny_model, settings):
    settings.REWARD_TRY_TIMEOUT_S = 0.05
    reward = create(researcher_client, name="rm", kind="reward_model", spec={"path": str(tiny_model)}).json()
    body = try_(researcher_client, reward["id"], [{"prompt": "p", "response": "r"}]).json()
    assert body["scores"] == [0.0]
    assert "longer than 0.05s" in body["errors"][0][0]


def test_a_reward_can_be_renamed_without_changing_its_metric_name(researcher_client):
    reward = create(researcher_client, name="first", kind="builtin", spec={"type": "boxed_math"}).json()
    response = researcher_client.patch(f"/api/rewards/{reward['id']}/", {"name": "second"}, format="json")
    assert response.json()["name"] == "second"
    assert response.json()["spec"]["name"] == "first"


def test_deleting_a_reward_an_experiment_uses_is_refused_with_409(researcher_client):
    reward = RewardFunction.objects.get(
        pk=create(researcher_client, name="used", kind="builtin", spec={"type": "exact_match"}).json()["id"]
    )
    an_experiment(rewards=[reward], name="scored-by-it")
    response = researcher_client.delete(f"/api/rewards/{reward.pk}/")
    assert response.status_code == 409
    assert "scored-by-it" in response.json()["errors"][0]["msg"]
    assert (
        researcher_client.delete(
            f"/api/rewards/{create(researcher_client, name='free', kind='builtin', spec={'type': 'exact_match'}).json()['id']}/"
        ).status_code
        == 204
    )


def test_rewards_filter_by_kind(researcher_client):
    create(researcher_client, name="a", kind="builtin", spec={"type": "exact_match"})
    create(researcher_client, name="b", kind="http", spec={"url": "https://rm.example/score"})
    assert [r["name"] for r in researcher_client.get("/api/rewards/", {"kind": "http"}).json()["results"]] == ["b"]
    assert researcher_client.get("/api/rewards/", {"kind": "nope"}).status_code == 400


@pytest.mark.timeout(30)
def test_try_bounds_the_retries_of_an_http_reward_so_the_request_answers_quickly(researcher_client, settings):
    from tests.support.stack import free_port

    settings.HTTP_ALLOW = ["127.0.0.1"]  # an admin allowed reward servers on this machine
    spec = {"url": f"http://127.0.0.1:{free_port()}/score", "retries": 6, "backoff_s": 10}
    reward = create(researcher_client, name="patient", kind="http", spec=spec).json()
    body = try_(researcher_client, reward["id"], [{"prompt": "p", "response": "r"}]).json()
    assert "failed after 2 attempts" in body["errors"][0][0]
    assert RewardFunction.objects.get(pk=reward["id"]).spec["retries"] == 6  # runs keep the stored spec


def test_a_try_the_worker_has_not_finished_answers_202_with_the_trial_to_poll(researcher_client, settings, monkeypatch):
    import importlib

    trials = importlib.import_module("posttrain.registry.services.reward_try")
    reward = create(researcher_client, name="exact", kind="builtin", spec={"type": "exact_match"}).json()
    sent = []
    monkeypatch.setattr(trials, "_dispatch", lambda trial, wait_s: sent.append(trial.pk))  # a busy worker
    settings.REWARD_TRY_WAIT_S = 0.2
    response = try_(researcher_client, reward["id"], [{"prompt": "2+2=", "response": "4", "label": "4"}])
    assert response.status_code == 202, response.content
    pending = response.json()
    assert pending["state"] == "queued" and pending["result"] is None
    assert pending["url"] == f"/api/rewards/{reward['id']}/trials/{pending['id']}/"

    trials.reward_trial_run(sent[0])  # the worker gets to it
    done = researcher_client.get(pending["url"]).json()
    assert done["state"] == "done" and done["result"]["scores"] == [1.0] and done["finished_at"]
    other = create(researcher_client, name="other", kind="builtin", spec={"type": "exact_match"}).json()
    assert researcher_client.get(f"/api/rewards/{other['id']}/trials/{pending['id']}/").status_code == 404


def test_new_python_source_no_worker_checks_in_time_is_a_503_and_nothing_is_stored(
    researcher_client, settings, monkeypatch, storage
):
    import importlib

    trials = importlib.import_module("posttrain.registry.services.reward_try")
    monkeypatch.setattr(trials, "_dispatch", lambda trial, wait_s: None)
    settings.REWARD_CHECK_QUEUE_S = 0.2
    response = create(researcher_client, name="late", kind="python", source=VERL_SOURCE, spec={"timeout_s": 0.1})
    assert response.status_code == 503
    assert "no worker checked the code within 0.3s" in response.json()["errors"][0]["msg"]
    assert not RewardFunction.objects.filter(name="late").exists()
    assert not list((storage / "rewards").iterdir())


def test_without_a_sandbox_python_rewards_are_refused_saying_what_to_install(researcher_client, monkeypatch):
    reward = create(researcher_client, name="ok", kind="python", source=VERL_SOURCE).json()
    monkeypatch.setenv("POSTTRAIN_BWRAP", "/nonexistent/bwrap")
    monkeypatch.delenv("POSTTRAIN_ALLOW_UNSANDBOXED_CODE", raising=False)
    response = create(researcher_client, name="refused", kind="python", source=VERL_SOURCE)
    assert response.status_code == 503
    assert "install Debian's bubblewrap" in response.json()["errors"][0]["msg"]
    response = try_(researcher_client, reward["id"], [{"prompt": "p", "response": "7", "label": "7"}])
    assert response.status_code == 503 and "POSTTRAIN_ALLOW_UNSANDBOXED_CODE=1" in response.json()["errors"][0]["msg"]
    # Built-in rewards run no user code: their try is unaffected.
    builtin = create(researcher_client, name="exact", kind="builtin", spec={"type": "exact_match"}).json()
    assert try_(researcher_client, builtin["id"], [{"prompt": "p", "response": "7", "label": "7"}]).status_code == 200

    monkeypatch.setenv("POSTTRAIN_ALLOW_UNSANDBOXED_CODE", "1")  # the admin's override
    assert create(researcher_client, name="allowed", kind="python", source=VERL_SOURCE).status_code == 201
    body = try_(researcher_client, reward["id"], [{"prompt": "p", "response": "7", "label": "7"}]).json()
    assert body["scores"] == [1.0]


@pytest.mark.parametrize(("name", "spec", "loc"), [("errors", {}, "name"), ("mine", {"name": "mean"}, "spec.name")])
def test_a_reward_named_like_one_of_the_engines_curves_is_refused_where_the_name_came_from(
    researcher_client, name, spec, loc
):
    response = create(researcher_client, name=name, kind="builtin", spec={"type": "exact_match", **spec})
    assert response.status_code == 400
    [error] = response.json()["errors"]
    assert error["loc"] == loc and "is reserved: reward/" in error["msg"]


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8000/api/runs/", "http://169.254.169.254/latest/meta-data/", "http://[::1]:8265/"]
)
def test_an_http_reward_aimed_inside_the_cluster_is_refused_at_registration(researcher_client, url):
    response = create(researcher_client, name="ssrf", kind="http", spec={"url": url})
    assert response.status_code == 400
    [error] = response.json()["errors"]
    assert error["loc"] == "spec.url" and "an admin may allow it (POSTTRAIN_HTTP_ALLOW)" in error["msg"]
    assert not RewardFunction.objects.filter(name="ssrf").exists()


def test_a_server_files_failed_import_check_never_quotes_it(researcher_client, tmp_path):
    secret = tmp_path / "notes.py"
    secret.write_text("hunter2 is the password\n")  # a NameError would name 'hunter2'
    response = create(researcher_client, name="leak", kind="python", spec={"path": str(secret)})
    assert response.status_code == 400
    [error] = response.json()["errors"]
    assert error["loc"] == "spec.path" and "the file does not import as a reward" in error["msg"]
    assert "hunter2" not in response.content.decode()


def test_trials_no_worker_finished_are_failed_by_the_periodic_check(settings):
    from datetime import timedelta

    from django.utils import timezone

    from posttrain.core.job_runner import worker_jobs_expire
    from posttrain.registry.models import RewardTrial

    now = timezone.now()
    stale = now - timedelta(seconds=settings.USER_CODE_TIME_LIMIT_S + 31)
    running = RewardTrial.objects.create(kind="try", spec={"type": "python"}, state="running", started_at=stale)
    fresh = RewardTrial.objects.create(kind="try", spec={"type": "python"}, state="running", started_at=now)
    assert worker_jobs_expire() == 1
    running.refresh_from_db()
    fresh.refresh_from_db()
    assert running.state == "failed" and "the user-code worker stops user code after 150s" in running.error
    assert fresh.state == "running"


def test_a_regex_the_linear_time_engine_refuses_is_a_400_naming_the_pattern(researcher_client):
    for pattern, why in [(r"(\w+) \1", "backreferences"), (r"\d+(?= apples)", "lookahead and lookbehind")]:
        response = create(researcher_client, name="r", kind="builtin", spec={"type": "regex", "pattern": pattern})
        assert response.status_code == 400
        [error] = response.json()["errors"]
        assert error["loc"] == "spec.pattern" and f"{why} are not supported" in error["msg"], error
    response = create(researcher_client, name="r", kind="builtin", spec={"type": "regex", "pattern": "a" * 1001})
    assert response.json()["errors"] == [
        {"loc": "spec.pattern", "msg": "is 1001 characters long; a pattern may have at most 1000"}
    ]


@pytest.mark.timeout(60)  # with backtracking, the try would hold the worker for longer than the universe has
def test_a_catastrophic_pattern_in_try_it_finishes_and_scores_zero(researcher_client):
    spec = {"type": "regex", "pattern": r"^(a+)+$", "full_match": True}
    reward = create(researcher_client, name="nested", kind="builtin", spec=spec).json()
    body = try_(researcher_client, reward["id"], [{"prompt": "p", "response": "a" * n + "!"} for n in (31, 5000)])
    assert body.json()["scores"] == [0.0, 0.0] and body.json()["errors"] == [[], []]


@pytest.mark.timeout(120)
def test_a_builtin_in_try_it_is_ended_at_the_cap_wherever_it_is(researcher_client, monkeypatch):
    import importlib
    import random

    trials = importlib.import_module("posttrain.registry.services.reward_try")
    monkeypatch.setattr(trials, "TRY_TIMEOUT_CAP_S", 0.05)
    # RE2's slowest case within the bounds: an automaton too large for its memory, on long texts (seconds
    # of C code in all; a Python-level timeout could not interrupt it).
    spec = {"type": "regex", "pattern": r"[ab]*a[ab]{999}c"}
    reward = create(researcher_client, name="slow", kind="builtin", spec=spec).json()
    rng = random.Random(0)
    text = "".join(rng.choice("ab") for _ in range(100_000))
    body = try_(researcher_client, reward["id"], [{"prompt": "p", "response": text}] * 8).json()
    assert body["scores"] == [0.0] * 8
    assert body["errors"] == [["slow: scoring took longer than 0.05s and was stopped"]] * 8
