"""One catalogue of algorithm names: the config schema's choices are the registries' names, the
cross-field rules follow the traits, and reading it loads no torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rl_engine.algorithms import catalogue
from rl_engine.algorithms.registry import ADVANTAGE_ESTIMATORS, POLICY_LOSS_FUNCTIONS, ROLLOUT_CORRECTIONS
from rl_engine.config import ConfigError, config_json_schema, validate_config
from tests.unit.engine.helpers import minimal, with_changes


def schema_property(section: str, field: str) -> dict:
    return config_json_schema()["$defs"][section]["properties"][field]


@pytest.mark.parametrize(
    ("section", "field", "registry", "specs"),
    [
        ("AlgorithmConfig", "name", ADVANTAGE_ESTIMATORS, catalogue.ESTIMATORS),
        ("AlgorithmConfig", "policy_loss", POLICY_LOSS_FUNCTIONS, catalogue.POLICY_LOSSES),
        ("RolloutCorrectionConfig", "method", ROLLOUT_CORRECTIONS, catalogue.CORRECTIONS),
    ],
)
def test_the_schemas_choices_are_the_registries_names_each_with_its_help(section, field, registry, specs):
    prop = schema_property(section, field)
    assert set(prop["enum"]) == set(registry.names()) == set(specs)
    assert prop["enumDescriptions"] == [specs[name].help for name in prop["enum"]]
    assert all(prop["enumDescriptions"])


def test_each_policy_loss_lives_in_its_own_file_named_after_it():
    import importlib

    for name in catalogue.POLICY_LOSSES:
        module = importlib.import_module(f"rl_engine.algorithms.policy_losses.{name}")
        assert POLICY_LOSS_FUNCTIONS.get(name) is getattr(module, name)


def test_a_function_registered_under_a_name_the_catalogue_does_not_declare_is_refused():
    with pytest.raises(ValueError, match=r"policy loss 'vanilla' is not in the catalogue"):
        POLICY_LOSS_FUNCTIONS.register("vanilla")


def test_the_catalogue_and_the_config_load_without_torch():
    code = (
        "import sys; import rl_engine.config, rl_engine.algorithms.catalogue; "
        "rl_engine.config.validate_config({'name': 'x', 'model': {'path': 'm'}, 'data': {'path': 'd'}, "
        "'rewards': [{'type': 'exact_match'}], 'algorithm': {'policy_loss': 'gspo'}}); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_group_estimators_need_several_samples_per_prompt_and_token_level_ones_do_not():
    for name, spec in catalogue.ESTIMATORS.items():
        cfg = with_changes({"algorithm.name": name, "rollout.samples_per_prompt": 1})
        if spec.level == "group":
            with pytest.raises(ConfigError) as info:
                validate_config(cfg)
            assert [e["loc"] for e in info.value.errors] == ["rollout.samples_per_prompt"]
        else:
            validate_config(cfg)


def test_kl_in_the_reward_is_allowed_exactly_where_the_estimator_takes_it():
    for name, spec in catalogue.ESTIMATORS.items():
        cfg = with_changes({"algorithm.name": name, "algorithm.kl": {"coef": 0.1, "placement": "reward"}})
        if "reward" in spec.kl_placements:
            validate_config(cfg)
        else:
            with pytest.raises(ConfigError, match="token-level returns"):
                validate_config(cfg)


def test_dual_clip_is_refused_for_policy_losses_without_one():
    for name, spec in catalogue.POLICY_LOSSES.items():
        cfg = with_changes({"algorithm.policy_loss": name, "algorithm.dual_clip": 3.0})
        if spec.dual_clip:
            validate_config(cfg)
        else:
            with pytest.raises(ConfigError) as info:
                validate_config(cfg)
            assert [e["loc"] for e in info.value.errors] == ["algorithm.dual_clip"]


def test_empty_clip_aggregation_and_std_fields_take_the_chosen_algorithms_defaults():
    default = validate_config(minimal()).algorithm
    assert default.clip_range == (0.2, 0.2) and default.aggregation == "token_mean"
    assert default.normalizes_advantage_std is True  # grpo
    gspo = validate_config(with_changes({"algorithm.policy_loss": "gspo", "algorithm.name": "dr_grpo"})).algorithm
    assert gspo.clip_range == (3e-4, 4e-4) and gspo.aggregation == "seq_mean_token_mean"
    assert gspo.normalizes_advantage_std is False  # dr_grpo
    given = validate_config(
        with_changes(
            {
                "algorithm.policy_loss": "gspo",
                "algorithm.clip_high": 0.01,
                "algorithm.loss_agg": "token_mean",
                "algorithm.normalize_advantage_std": True,
            }
        )
    ).algorithm
    assert given.clip_range == (3e-4, 0.01) and given.aggregation == "token_mean" and given.normalizes_advantage_std


def test_rollout_correction_thresholds_default_per_method_and_must_be_ordered():
    icepop = validate_config(with_changes({"algorithm.rollout_correction": {"method": "icepop"}}))
    assert icepop.algorithm.rollout_correction.thresholds == (0.5, 5.0)
    with pytest.raises(ConfigError) as info:
        validate_config(with_changes({"algorithm.rollout_correction": {"method": "icepop", "high": 0.4}}))
    assert [e["loc"] for e in info.value.errors] == ["algorithm.rollout_correction.high"]
    with pytest.raises(ConfigError) as info:
        validate_config(with_changes({"algorithm.rollout_correction": {"method": "tis"}}))
    assert info.value.errors[0]["loc"] == "algorithm.rollout_correction.method"
