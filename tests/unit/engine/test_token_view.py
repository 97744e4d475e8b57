"""The per-token view's storage (rl_engine/token_view.py) and the entropy the transformers rollout records
with each sampled token."""

from __future__ import annotations

import math

import pytest
import torch

from rl_engine.rollout import SampledTokenLogprobs
from rl_engine.token_view import MAX_VIEW_TOKENS, pack_f16, token_view, unpack_f16


def test_packed_values_come_back_at_float16_precision():
    values = [-0.6931, -12.25, 0.0, 3.5, -math.inf]
    packed = pack_f16(values)
    assert len(packed) == math.ceil(2 * len(values) / 3) * 4  # 2 bytes a value, base64
    back = unpack_f16(packed)
    assert back[1:] == [-12.25, 0.0, 3.5, -math.inf]
    assert back[0] == pytest.approx(-0.6931, abs=5e-4)


def test_a_view_packs_the_fields_it_has_and_leaves_out_the_rest():
    view = token_view(["The", " answer"], {"rollout_logprob": [-0.5, -1.0], "advantage": [0.25, 0.25], "entropy": None})
    assert set(view) == {"text", "rollout_logprob", "advantage"}
    assert unpack_f16(view["rollout_logprob"]) == [-0.5, -1.0]


def test_a_view_is_bounded_and_refuses_short_or_unknown_arrays():
    long = token_view(["x"] * (MAX_VIEW_TOKENS + 5), {"advantage": [1.0] * (MAX_VIEW_TOKENS + 5)})
    assert len(long["text"]) == MAX_VIEW_TOKENS == len(unpack_f16(long["advantage"]))
    with pytest.raises(ValueError, match="advantage has 1 values for 2 tokens"):
        token_view(["a", "b"], {"advantage": [1.0]})
    with pytest.raises(ValueError, match="unknown fields \\['ratio'\\]"):
        token_view(["a"], {"ratio": [1.0]})


def test_the_recorded_entropy_is_that_of_the_distribution_sampled_from():
    recorder = SampledTokenLogprobs()
    # Step 1: uniform over 4 tokens (H = ln 4); step 2: top-k left two at 1:3 odds (-inf elsewhere).
    recorder(torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 4))
    recorder(torch.tensor([[0, 2]]), torch.tensor([[0.0, math.log(3.0), -math.inf, -math.inf]]))
    entropies = recorder.entropies(torch.tensor([[2, 1]]))
    expected = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    torch.testing.assert_close(entropies, torch.tensor([[math.log(4.0), expected]]))
