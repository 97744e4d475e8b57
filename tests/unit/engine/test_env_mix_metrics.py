"""A run that mixes environments keeps its curves per environment (the rows' `env` field), and each
package's reward leaves the other environments' rows alone."""

from __future__ import annotations

import pytest

from rl_engine.data import Prompt
from rl_engine.loop import environment_metrics
from rl_engine.metric_catalogue import lookup
from rl_engine.rollout import Sample


def prompt(env: str | None) -> Prompt:
    return Prompt(text="p", raw="p", token_ids=[1], label=None, metadata={} if env is None else {"env": env})


def test_rewards_are_averaged_per_environment_named_by_the_rows_env_field():
    prompts = [prompt("arith"), prompt("spell"), prompt(None)]
    samples = [Sample(0, [1], "stop"), Sample(0, [1], "stop"), Sample(1, [1], "stop"), Sample(2, [1], "stop")]
    metrics = environment_metrics(prompts, samples, [1.0, 0.0, 0.5, 9.0])
    assert metrics == {
        "env/arith/reward/mean": 0.5,
        "env/arith/reward/std": 0.5,
        "env/arith/samples": 2.0,
        "env/spell/reward/mean": 0.5,
        "env/spell/reward/std": 0.0,
        "env/spell/samples": 1.0,
    }
    assert environment_metrics([prompt(None)], [Sample(0, [1], "stop")], [1.0]) == {}


@pytest.mark.parametrize("name", ["env/arith/reward/mean", "env/arith/reward/std", "env/arith/samples"])
def test_per_environment_metrics_are_in_the_catalogue(name):
    assert lookup(name) is not None
