"""Installed environments in the registry: a worker generates their rows in the engine's sandbox and registers
them as a dataset with the environment's own scoring (or its engine environment section); "Try it" plays one
episode turn by turn; environments mix by weight into one dataset whose rows name their environment."""

from __future__ import annotations

import importlib

import pytest

from posttrain.registry.models import Dataset, Environment, RewardFunction
from tests.unit.platform.helpers import default_project

pytestmark = pytest.mark.django_db
pytest.importorskip("reasoning_gym")
pytest.importorskip("textarena")

services = importlib.import_module("posttrain.registry.services.environments")


@pytest.fixture(autouse=True)
def workers_run_here(monkeypatch, storage):
    """The worker's services run right away in this process (these tests run in one transaction, so nothing
    is sent after commit); the package's code still runs in the sandbox."""
    monkeypatch.setattr(services, "_dispatch_generate", lambda env: services.environment_generate(env.pk))
    monkeypatch.setattr(services, "_dispatch_trial", lambda trial, wait_s: services.environment_trial_run(trial.pk))


def register(client, **body):
    return client.post("/api/environments/", body, format="json")


def rows_of(environment: Environment) -> list[dict]:
    return services._rows(environment.dataset)


def test_a_reasoning_gym_task_becomes_a_dataset_and_its_scorer_a_reward(researcher_client):
    response = register(
        researcher_client, name="arith", package="reasoning_gym", env_id="basic_arithmetic", size=5, seed=3
    )
    assert response.status_code == 201, response.content
    environment = Environment.objects.get(name="arith")
    assert environment.state == "ready", environment.error
    assert environment.version == importlib.metadata.version("reasoning-gym")
    rows = rows_of(environment)
    assert len(rows) == 5 and {r["env"] for r in rows} == {"arith"}
    assert environment.dataset.row_count == 5
    assert environment.reward.spec["type"] == "reasoning_gym" and environment.run_environment is None
    body = researcher_client.get(f"/api/environments/{environment.pk}/").json()
    assert body["state"] == "ready" and body["dataset_name"] == "arith" and body["reward_name"] == "arith"

    right = researcher_client.post(
        f"/api/environments/{environment.pk}/try/",
        {"moves": [f"<answer>{rows[1]['label']}</answer>"], "row": 1},
        format="json",
    )
    assert right.status_code == 200, right.content
    assert right.json()["reward"] == 1.0 and right.json()["errors"] == []
    wrong = researcher_client.post(
        f"/api/environments/{environment.pk}/try/", {"moves": ["<answer>x</answer>"]}, format="json"
    )
    assert wrong.json()["reward"] == 0.0


def test_a_textarena_game_is_played_turn_by_turn_in_try_it(researcher_client):
    response = register(researcher_client, name="guess", package="textarena", env_id="GuessTheNumber-v0", size=2)
    environment = Environment.objects.get(pk=response.json()["id"])
    assert environment.state == "ready", environment.error
    assert environment.run_environment == {
        "package": "textarena",
        "options": {"env_id": "GuessTheNumber-v0"},
        "files": [],
    }
    assert environment.reward is None
    played = researcher_client.post(
        f"/api/environments/{environment.pk}/try/", {"moves": ["[1]", "[2]"]}, format="json"
    ).json()
    assert [t["role"] for t in played["turns"]][:2] == ["assistant", "environment"]
    assert played["turns"][0]["text"] == "[1]" and played["prompt"] == rows_of(environment)[0]["prompt"]


def test_an_unknown_task_fails_the_environment_with_the_packages_message(researcher_client):
    register(researcher_client, name="nope", package="reasoning_gym", env_id="no_such_task", size=2)
    environment = Environment.objects.get(name="nope")
    assert environment.state == "failed" and "not registered" in environment.error
    assert environment.dataset is None
    response = researcher_client.post(f"/api/environments/{environment.pk}/try/", {"moves": ["1"]}, format="json")
    assert response.status_code == 400 and response.json()["errors"][0]["loc"] == "environment"


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"package": "gym"}, "package"),
        ({"env_id": " "}, "env_id"),
        ({"size": 0}, "size"),
        ({"package": "textarena", "arguments": "seat 1"}, "arguments"),
    ],
)
def test_bad_registrations_name_the_field(researcher_client, body, loc):
    base = {"name": "e", "package": "reasoning_gym", "env_id": "basic_arithmetic", "size": 2}
    response = register(researcher_client, **{**base, **body})
    assert response.status_code == 400
    assert response.json()["errors"][0]["loc"] == loc
    assert not Environment.objects.exists()


def test_single_turn_environments_mix_by_weight_and_multi_turn_ones_are_refused(researcher_client):
    register(researcher_client, name="arith", package="reasoning_gym", env_id="basic_arithmetic", size=6)
    register(researcher_client, name="spell", package="reasoning_gym", env_id="spell_backward", size=6)
    response = researcher_client.post(
        "/api/environments/mix/",
        {"name": "both", "environments": [{"environment": "arith", "weight": 3}, {"environment": "spell"}], "size": 20},
        format="json",
    )
    assert response.status_code == 201, response.content
    assert response.json()["rewards"] == ["arith", "spell"]
    dataset = Dataset.objects.get(pk=response.json()["dataset"]["id"])
    envs = [row["env"] for row in services._rows(dataset)]
    assert len(envs) == 20 and set(envs) == {"arith", "spell"} and envs.count("arith") > envs.count("spell")

    register(researcher_client, name="guess", package="textarena", env_id="GuessTheNumber-v0", size=2)
    refused = researcher_client.post(
        "/api/environments/mix/",
        {"name": "x", "environments": [{"environment": "arith"}, {"environment": "guess"}]},
        format="json",
    )
    assert refused.status_code == 400 and refused.json()["errors"][0]["loc"] == "environments.1"


def test_a_run_config_from_an_environment_validates_with_the_engine(tmp_path_factory):
    from posttrain.runs.services.experiments import validated_engine_config_and_needs
    from rl_engine.config import EnvironmentConfig

    environment = services.environment_create(
        "guess", "textarena", "TicTacToe-v0", {"num_players": 2, "seat": 1}, size=1, project=default_project()
    )
    environment.refresh_from_db()
    assert EnvironmentConfig.model_validate(environment.run_environment).options == {
        "env_id": "TicTacToe-v0",
        "num_players": 2,
        "seat": 1,
    }
    config, _ = validated_engine_config_and_needs(
        {
            "name": "t",
            "model": {"path": str(tmp_path_factory.mktemp("policy"))},  # in the tests' import root, not storage
            "data": {"path": environment.dataset.path},
            "environment": environment.run_environment,
        }
    )
    assert config["environment"]["package"] == "textarena"
    assert not RewardFunction.objects.exists()


def test_an_experiment_on_a_multi_turn_environment_needs_no_reward_of_its_own(tmp_path_factory):
    from posttrain.core.errors import InvalidInput
    from posttrain.runs.services.experiments import experiment_check
    from tests.unit.platform.helpers import a_model_row

    environment = services.environment_create(
        "guess", "textarena", "GuessTheNumber-v0", size=2, project=default_project()
    )
    environment.refresh_from_db()
    model = a_model_row(path=str(tmp_path_factory.mktemp("policy")))  # in the tests' import root, not storage
    checked = experiment_check(
        name="guess",
        model=model,
        dataset=environment.dataset,
        rewards=[],
        config={"environment": environment.run_environment},
        project=default_project(),
    )
    assert checked.rewards == [] and checked.engine_config["environment"]["options"]["env_id"] == "GuessTheNumber-v0"
    with pytest.raises(InvalidInput) as refused:
        experiment_check(
            name="plain", model=model, dataset=environment.dataset, rewards=[], config={}, project=default_project()
        )
    assert refused.value.errors[0]["loc"] == "rewards"


def test_an_openenv_server_at_a_url_is_refused_at_registration(researcher_client):
    response = register(
        researcher_client, name="remote", package="openenv", env_id="my_env.app:app", arguments={"url": "http://x"}
    )
    assert response.status_code == 400 and response.json()["errors"][0]["loc"] == "arguments"


def test_a_verifiers_taskset_from_a_server_file_is_generated_and_scored_by_its_own_functions(
    researcher, researcher_client, tmp_path
):
    import shutil
    from pathlib import Path

    from tests.unit.platform.helpers import grant_server_paths

    grant_server_paths(researcher)  # naming a server file is a permission an admin grants
    fixture = tmp_path / "vf_sums.py"  # inside the tests' import root
    shutil.copy(Path(__file__).resolve().parents[2] / "fixtures" / "verifiers_envs" / "vf_sums.py", fixture)
    missing = register(
        researcher_client, name="v", package="verifiers", env_id="vf_sums", files=[str(tmp_path / "x.py")]
    )
    assert missing.status_code == 400 and missing.json()["errors"][0]["loc"] == "files.0"
    register(researcher_client, name="sums", package="verifiers", env_id="vf_sums", size=3, files=[str(fixture)])
    environment = Environment.objects.get(name="sums")
    assert environment.state == "ready", environment.error
    assert environment.reward.spec["type"] == "verifiers" and environment.reward.spec["files"] == [str(fixture)]
    row = rows_of(environment)[0]
    played = researcher_client.post(
        f"/api/environments/{environment.pk}/try/", {"moves": [row["extra_info"]["task"]["answer"]]}, format="json"
    ).json()
    assert played["reward"] == pytest.approx(1.2) and played["errors"] == []


def test_a_verifiers_tool_taskset_is_played_as_episodes_in_try_it(researcher, researcher_client, tmp_path):
    import json
    import re
    import shutil
    from pathlib import Path

    from tests.unit.platform.helpers import grant_server_paths

    grant_server_paths(researcher)
    fixture = tmp_path / "vf_multiply_tools.py"
    shutil.copy(Path(__file__).resolve().parents[2] / "fixtures" / "verifiers_envs" / fixture.name, fixture)
    register(researcher_client, name="products", package="verifiers", env_id="vf_multiply_tools", files=[str(fixture)])
    environment = Environment.objects.get(name="products")
    assert environment.state == "ready", environment.error
    # The taskset's tasks have tools: a run plays them as episodes, scored by the taskset at the end of each.
    assert environment.reward is None
    assert environment.run_environment == {
        "package": "verifiers",
        "options": {"taskset": "vf_multiply_tools", "args": {}, "max_turns": services.VERIFIERS_TURNS},
        "files": [str(fixture)],
        "max_turns": services.VERIFIERS_TURNS,
        "max_observation_tokens": services.VERIFIERS_OBSERVATION_TOKENS,
    }
    row = rows_of(environment)[0]
    a, b = map(int, re.findall(r"\d+", row["prompt"])[:2])
    call = json.dumps({"name": "calculator_multiply", "arguments": {"a": a, "b": b}})
    played = researcher_client.post(
        f"/api/environments/{environment.pk}/try/",
        {"moves": [f"<tool_call>{call}</tool_call>", str(a * b)]},
        format="json",
    ).json()
    assert played["errors"] == [] and played["done"] and played["reward"] == 1.0
    assert [t["role"] for t in played["turns"]] == ["environment", "assistant"] * 2 + ["environment"]
    assert played["turns"][2]["text"] == f"<tool_response>\n{a * b}\n</tool_response>"
    register(researcher_client, name="arith", package="reasoning_gym", env_id="basic_arithmetic", size=4)
    refused = researcher_client.post(
        "/api/environments/mix/",
        {"name": "m", "environments": [{"environment": "arith"}, {"environment": "products"}]},
        format="json",
    )
    assert refused.status_code == 400 and refused.json()["errors"][0]["loc"] == "environments.1"
