"""What a run needs of the cluster, read from its placement plan (the admission's and Ray's one source)."""

from __future__ import annotations

import pytest

from rl_engine.config import validate_config
from rl_engine.distributed.placement import resource_needs, threads_for


def needs(**placement) -> dict:
    return resource_needs(
        validate_config(
            {
                "name": "p",
                "model": {"path": "m"},
                "data": {"path": "d.jsonl"},
                "rewards": [{"type": "exact_match"}],
                "placement": placement,
            }
        )
    )


def test_the_hybrid_engine_needs_only_its_driver_sized_by_the_larger_role():
    assert needs(cpus_per_trainer=2, cpus_per_rollout_engine=1, gpus_per_rollout_engine=0.5) == {
        "driver": {"CPU": 2.0, "GPU": 0.5},
        "bundles": [],
        "total": {"CPU": 2.0, "GPU": 0.5},
    }


def test_the_default_config_needs_one_cpu_and_no_gpu():
    assert needs()["total"] == {"CPU": 1.0, "GPU": 0.0}


def test_actors_need_their_bundles_and_a_driver_that_reserves_nothing():
    got = needs(mode="separate", rollout_engines=2, cpus_per_trainer=2, cpus_per_rollout_engine=1, gpus_per_trainer=1)
    assert got["driver"] == {"CPU": 0.0, "GPU": 0.0}
    assert got["bundles"] == [{"CPU": 2, "GPU": 1}, {"CPU": 1}, {"CPU": 1}]
    assert got["total"] == {"CPU": pytest.approx(4.0), "GPU": pytest.approx(1.0)}


def test_colocated_pairs_sum_one_bundle_per_pair():
    got = needs(rollout_engines=2, trainer_ranks=2, cpus_per_trainer=1, cpus_per_rollout_engine=0.5)
    assert got["bundles"] == [{"CPU": 1}, {"CPU": 1}]
    assert got["total"]["CPU"] == 2.0


def test_a_process_runs_as_many_threads_as_whole_cpus_it_holds_and_at_least_one():
    assert [threads_for(c) for c in (0, 0.5, 1, 2, 2.5)] == [1, 1, 1, 2, 2]
