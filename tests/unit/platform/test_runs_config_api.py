"""The launch form's API: the run-config schema, validating an experiment without creating it, and
YAML in and out."""

from __future__ import annotations

import pytest
import yaml

from posttrain.runs.models import Experiment, ExperimentReward, Run
from tests.unit.platform.helpers import BASE_CONFIG, create_body, post

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch", "storage")]


def stored_rows() -> tuple[int, int, int]:
    return Experiment.objects.count(), ExperimentReward.objects.count(), Run.objects.count()


# --- schema ----------------------------------------------------------------------------------


def test_the_schema_endpoint_serves_the_engines_schema_and_the_platform_fields(api):
    from rl_engine.config import config_json_schema

    response = api.get("/api/config/schema/")
    assert response.status_code == 200
    body = response.json()
    assert body["schema"] == config_json_schema()
    assert set(body["platform_fields"]) >= {
        "model.path",
        "data.path",
        "data.format",
        "data.prompt_field",
        "data.label_field",
        "rewards",
        "logging.run_dir",
    }


def test_every_listed_platform_field_is_refused_in_an_experiment_config(api, registry):
    """The list the form hides is exactly what create refuses, so a hidden field can never be needed."""
    fields = api.get("/api/config/schema/").json()["platform_fields"]
    for dotted in fields:
        section, _, key = dotted.partition(".")
        config = {**BASE_CONFIG, section: {**BASE_CONFIG.get(section, {}), key: "x"} if key else []}
        response = post(api, "/api/experiments/validate/", create_body(registry, config=config))
        assert response.status_code == 400, dotted
        assert dotted in [e["loc"] for e in response.json()["errors"]], (dotted, response.json())


# --- validate --------------------------------------------------------------------------------


def test_validate_answers_the_config_a_launched_run_gets(api, registry, storage):
    config = {**BASE_CONFIG, "seed": 5, "rollout": {**BASE_CONFIG["rollout"], "temperature": 0.7}}
    validated = post(api, "/api/experiments/validate/", create_body(registry, config=config))
    assert validated.status_code == 200, validated.json()

    created = post(api, "/api/experiments/", create_body(registry, config=config))
    assert created.status_code == 201, created.json()
    launched = post(api, f"/api/experiments/{created.json()['id']}/launch/", {})
    assert launched.status_code == 201, launched.json()
    run = Run.objects.get(pk=launched.json()["id"])

    expected = run.resolved_config
    # The run's folders (its run folder, where its rollout files go) exist only once there is a run; everything
    # else is already known.
    run_folders = {"run_dir": None, "rollouts_dir": None}
    assert validated.json()["config"] == {**expected, "logging": {**expected["logging"], **run_folders}}
    assert validated.json()["config"]["rollout"]["temperature"] == 0.7
    # The preview's resource needs are those stored on the run and handed to Ray.
    assert (
        validated.json()["resources"]
        == run.resources
        == {
            "driver": {"CPU": 1.0, "GPU": 0.0},
            "bundles": [],
            "total": {"CPU": 1.0, "GPU": 0.0},
        }
    )
    assert validated.json()["config"]["seed"] == 5 == run.seed


def test_validate_yaml_is_the_experiment_config_without_the_platform_fields(api, registry):
    response = post(api, "/api/experiments/validate/", create_body(registry))
    text = response.json()["yaml"]
    assert yaml.safe_load(text) == BASE_CONFIG
    assert "path" not in text and "rewards" not in text
    assert text.index("algorithm") < text.index("rollout") < text.index("train")  # the order given


@pytest.mark.parametrize(
    ("overrides", "loc"),
    [
        ({"config": {**BASE_CONFIG, "rollout": {"samples_per_prompt": 1}}}, "rollout.samples_per_prompt"),
        ({"config": {**BASE_CONFIG, "rollout": {"temprature": 0.7}}}, "rollout.temprature"),
        ({"config": {**BASE_CONFIG, "train": {"lr": -1}}}, "train.lr"),
        ({"config": {**BASE_CONFIG, "model": {"path": "/elsewhere"}}}, "model.path"),
        ({"config": {**BASE_CONFIG, "description": "a\x00b"}}, "description"),
        ({"config": "rollout: 1"}, "config"),
        ({"config": {**BASE_CONFIG, "seed": -1}}, "seed"),  # the engine takes it, the launch would not
        ({"name": ""}, "name"),
        ({"name": "x" * 201}, "name"),
        ({"model": 987654}, "model"),
        ({"rewards": []}, "rewards"),
        ({"rewards": [{"reward": 987654}]}, "rewards[0].reward"),
    ],
)
def test_validate_gives_exactly_the_errors_create_gives_and_writes_nothing(api, registry, overrides, loc):
    body = create_body(registry, **overrides)
    validated = post(api, "/api/experiments/validate/", body)
    assert validated.status_code == 400, validated.content
    assert loc in [e["loc"] for e in validated.json()["errors"]], validated.json()
    assert all(e["msg"] for e in validated.json()["errors"])
    assert stored_rows() == (0, 0, 0)
    created = post(api, "/api/experiments/", body)
    assert created.status_code == 400
    assert created.json() == validated.json()


def test_a_reward_listed_twice_is_refused_at_its_index(api, registry):
    exact = registry["exact"].pk
    response = post(
        api, "/api/experiments/validate/", create_body(registry, rewards=[{"reward": exact}, {"reward": exact}])
    )
    assert response.status_code == 400
    assert [e["loc"] for e in response.json()["errors"]] == ["rewards[1].reward"]


def test_a_valid_experiment_is_validated_without_writing_anything(api, registry, no_dispatch):
    response = post(api, "/api/experiments/validate/", create_body(registry))
    assert response.status_code == 200
    assert stored_rows() == (0, 0, 0)
    assert no_dispatch == []


# --- YAML ------------------------------------------------------------------------------------


def test_a_config_round_trips_through_yaml(api):
    config = {
        "seed": 3,
        "algorithm": {"name": "ppo", "kl": {"coef": 0.05, "estimator": "k1"}, "dual_clip": None},
        "rollout": {"stop": ["\n", "</s>"], "temperature": 0.7},
        "train": {"lr": 1e-6, "betas": [0.9, 0.95]},
        "data": {"system_prompt": "Réponds en français: « 2+2 »"},
    }
    text = post(api, "/api/config/yaml/", {"config": config}).json()["yaml"]
    assert "lr: 1.0e-06" in text and "Réponds" in text
    back = post(api, "/api/config/yaml/", {"yaml": text})
    assert back.status_code == 200
    assert back.json() == {"config": config}


def test_json_text_is_read_as_well(api):
    response = post(api, "/api/config/yaml/", {"yaml": '{"rollout": {"samples_per_prompt": 4}}'})
    assert response.json() == {"config": {"rollout": {"samples_per_prompt": 4}}}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("rollout:\n  samples_per_prompt: 4\n temperature: 0.7\n", "YAML syntax error at line 3"),
        ("train:\n  lr: [1, 2\n", "YAML syntax error at line 3"),
        ("rollout:\n  top_k: 1\nrollout:\n  top_k: 2\n", "duplicate key 'rollout' (first at line 1)"),
        ("- rollout\n- train\n", "must be a mapping of sections, got a list"),
        ("just words\n", "must be a mapping of sections, got a single value ('just words')"),
        ("", "the config is empty"),
        ("rollout:\n  temperature: .nan\n", "rollout.temperature: nan is not allowed"),
        (
            "a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n"
            + "".join(
                f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
                f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
                for i in range(8)
            ),
            "is an alias expanding without end?",
        ),
    ],
)
def test_bad_yaml_is_a_400_at_loc_yaml_naming_the_problem(api, text, expected):
    response = post(api, "/api/config/yaml/", {"yaml": text})
    assert response.status_code == 400, response.content
    [error] = response.json()["errors"]
    assert error["loc"] == "yaml"
    assert expected in error["msg"], error


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({}, ""),
        ({"yaml": "seed: 1\n", "config": {"seed": 1}}, ""),
        ({"config": ["seed", 1]}, "config"),
        ({"yaml": 12}, "yaml"),
    ],
)
def test_the_yaml_endpoint_takes_exactly_one_of_yaml_and_config(api, body, loc):
    response = post(api, "/api/config/yaml/", body)
    assert response.status_code == 400
    assert [e["loc"] for e in response.json()["errors"]] == [loc]


def test_the_config_endpoints_are_for_researchers_only(client, make_user):
    client.force_login(make_user("annotator"))
    for method, url in (
        ("get", "/api/config/schema/"),
        ("post", "/api/config/yaml/"),
        ("post", "/api/experiments/validate/"),
    ):
        assert getattr(client, method)(url).status_code == 403, url
