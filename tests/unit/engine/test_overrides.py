"""`--set key.path=value` overrides (`python -m rl_engine train --set`, `manage.py demo_launch --set`, the
benchmarks): a field of an optional section the config leaves out creates that section with its defaults."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rl_engine.__main__ import load_run_config
from rl_engine.config import AgentConfig, dump_config, validate_config
from rl_engine.config.overrides import OverrideError, apply_overrides

MINIMAL = {
    "name": "overrides",
    "model": {"path": "model"},
    "data": {"path": "train.jsonl"},
    "rewards": [{"type": "exact_match"}],
}


def a_config_file(folder: Path) -> Path:
    """The minimal config as the engine writes it (`agent: null` and every other default spelled out)."""
    (folder / "model").mkdir()
    (folder / "train.jsonl").write_text('{"prompt": "1+1=", "label": "2"}\n')
    path = folder / "run.yaml"
    path.write_text(dump_config(validate_config(MINIMAL)))
    assert yaml.safe_load(path.read_text())["agent"] is None
    return path


def test_a_field_of_an_absent_optional_section_creates_it_with_its_defaults(tmp_path):
    cfg = load_run_config(str(a_config_file(tmp_path)), ["agent.port=18123"])

    assert cfg.agent is not None and cfg.agent.port == 18123
    assert cfg.agent.model_dump() == AgentConfig(port=18123).model_dump()


def test_a_section_missing_from_the_dict_is_created_too():
    data = apply_overrides({"name": "x"}, ["agent.max_turns=3", "agent.host=0.0.0.0"])
    assert data["agent"] == {"max_turns": 3, "host": "0.0.0.0"}


def test_an_override_below_a_value_that_is_no_section_names_it():
    with pytest.raises(OverrideError, match=r"--set name.port: 'name' is not a section"):
        apply_overrides({"name": "x"}, ["name.port=1"])


def test_a_bad_value_in_the_created_section_is_refused_by_the_schema_naming_the_field(tmp_path):
    from rl_engine.config import ConfigError

    with pytest.raises(ConfigError, match=r"agent\.port"):
        load_run_config(str(a_config_file(tmp_path)), ["agent.port=70000"])
