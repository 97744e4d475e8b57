"""DAPO dynamic sampling and soft overlong punishment; dropping flagged samples (with their group)."""

import pytest
import torch
from torch.testing import assert_close

from rl_engine.algorithms import drop_flagged, dynamic_sampling_keep, overlong_penalty


def test_dynamic_sampling_drops_groups_whose_rewards_are_all_equal():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    assert dynamic_sampling_keep(rewards, group_size=2).tolist() == [False, True, False]
    assert dynamic_sampling_keep(rewards, group_size=3).tolist() == [True, True]


def test_dynamic_sampling_treats_float_noise_as_equal():
    rewards = torch.tensor([0.5, 0.5 + 1e-9, 0.5, 0.5 + 1e-3])
    assert dynamic_sampling_keep(rewards, group_size=2).tolist() == [False, True]
    assert dynamic_sampling_keep(rewards, group_size=2, atol=1e-2).tolist() == [False, False]


def test_dynamic_sampling_refuses_a_batch_that_is_not_whole_groups():
    with pytest.raises(ValueError, match="group_size"):
        dynamic_sampling_keep(torch.zeros(5), group_size=2)


def test_overlong_penalty_is_zero_then_linear_then_flat():
    # max_len 100, buffer 20: free up to 80, linear to -1 at 100, -1 beyond.
    lengths = torch.tensor([50, 80, 90, 95, 100, 101, 150])
    assert_close(
        overlong_penalty(lengths, max_len=100, buffer_len=20),
        torch.tensor([0.0, 0.0, -0.5, -0.75, -1.0, -1.0, -1.0]),
    )


def test_overlong_penalty_scales_with_the_penalty_factor():
    lengths = torch.tensor([80, 90, 120])
    assert_close(overlong_penalty(lengths, 100, 20, penalty_factor=2.0), torch.tensor([0.0, -1.0, -2.0]))


def test_overlong_penalty_without_buffer_is_a_hard_step_at_max_len():
    assert_close(overlong_penalty(torch.tensor([99, 100, 101]), 100, 0), torch.tensor([0.0, 0.0, -1.0]))


def test_overlong_penalty_refuses_a_buffer_longer_than_max_len():
    with pytest.raises(ValueError, match="buffer_len"):
        overlong_penalty(torch.tensor([1]), max_len=10, buffer_len=11)


def test_drop_flagged_drops_only_the_flagged_row_without_groups():
    keep = torch.tensor([True, True, False, True])
    flagged = torch.tensor([False, True, False, False])
    assert drop_flagged(keep, flagged, group_size=None).tolist() == [True, False, False, True]


def test_drop_flagged_takes_the_flagged_samples_whole_group_under_a_group_estimator():
    keep = torch.ones(6, dtype=torch.bool)
    flagged = torch.tensor([False, False, False, True, False, False])
    # groups of 2: rows 2-3 go together; groups of 3: rows 3-5
    assert drop_flagged(keep, flagged, group_size=2).tolist() == [True, True, False, False, True, True]
    assert drop_flagged(keep, flagged, group_size=3).tolist() == [True, True, True, False, False, False]


def test_drop_flagged_refuses_mismatched_shapes_and_partial_groups():
    with pytest.raises(ValueError, match="batch"):
        drop_flagged(torch.ones(4, dtype=torch.bool), torch.zeros(3, dtype=torch.bool), None)
    with pytest.raises(ValueError, match="group_size"):
        drop_flagged(torch.ones(5, dtype=torch.bool), torch.zeros(5, dtype=torch.bool), 2)
