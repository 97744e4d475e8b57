"""The Tinker losses (rl_engine/tinker/losses.py) against hand-computed values and the engine's losses of the
same name: one datum's Tinker loss is a sum over its tokens, which is the engine's loss aggregated as
``seq_mean_token_sum`` over one sequence."""

from __future__ import annotations

import math

import pytest
import torch

from rl_engine.algorithms.losses import policy_loss
from rl_engine.tinker.losses import LossRefused, datum_loss

LOGPROBS = torch.tensor([-1.0, -0.5, -2.0, -0.25])
SAMPLING = torch.tensor([-1.2, -0.5, -1.0, -0.5])
ADVANTAGES = torch.tensor([1.0, -1.0, 2.0, 0.5])


def _inputs(**extra: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"target_tokens": torch.tensor([1, 2, 3, 4]), "logprobs": SAMPLING, "advantages": ADVANTAGES, **extra}


def _ratios() -> list[float]:
    return [math.exp(a - b) for a, b in zip(LOGPROBS.tolist(), SAMPLING.tolist(), strict=True)]


def test_cross_entropy_is_the_weighted_sum_of_negative_log_probs():
    weights = torch.tensor([0.0, 1.0, 1.0, 0.5])
    loss = datum_loss("cross_entropy", LOGPROBS, {"target_tokens": torch.tensor([1, 2, 3, 4]), "weights": weights})
    assert float(loss) == pytest.approx(0.5 + 2.0 + 0.125)


def test_cross_entropy_without_weights_counts_every_token():
    assert float(datum_loss("cross_entropy", LOGPROBS, {"target_tokens": torch.tensor([1, 2, 3, 4])})) == 3.75


def test_importance_sampling_is_minus_ratio_times_advantage_summed():
    expected = -sum(r * a for r, a in zip(_ratios(), ADVANTAGES.tolist(), strict=True))
    assert float(datum_loss("importance_sampling", LOGPROBS, _inputs())) == pytest.approx(expected, rel=1e-6)


def test_ppo_takes_the_smaller_of_the_clipped_and_unclipped_objective_per_token():
    expected = 0.0
    for r, a in zip(_ratios(), ADVANTAGES.tolist(), strict=True):
        expected -= min(r * a, min(max(r, 0.8), 1.2) * a)
    assert float(datum_loss("ppo", LOGPROBS, _inputs())) == pytest.approx(expected, rel=1e-6)


def test_ppo_reads_its_clip_bounds_from_the_config_or_the_datum():
    loose = datum_loss("ppo", LOGPROBS, _inputs(), {"clip_low_threshold": 0.0, "clip_high_threshold": 100.0})
    assert float(loose) == pytest.approx(float(datum_loss("importance_sampling", LOGPROBS, _inputs())), rel=1e-6)
    per_token = _inputs(clip_low_threshold=torch.full((4,), 0.0), clip_high_threshold=torch.full((4,), 100.0))
    assert float(datum_loss("ppo", LOGPROBS, per_token)) == pytest.approx(float(loose), rel=1e-6)


@pytest.mark.parametrize(("tinker_name", "engine_name"), [("ppo", "ppo_clip"), ("cispo", "cispo")])
def test_a_tinker_loss_and_its_gradient_equal_the_engines_loss_of_the_same_name(tinker_name, engine_name):
    logprobs = LOGPROBS.clone().requires_grad_(True)
    ours = datum_loss(tinker_name, logprobs, _inputs())
    (ours_grad,) = torch.autograd.grad(ours, logprobs)
    logprobs_engine = LOGPROBS.clone().requires_grad_(True)
    mask = torch.ones(1, 4, dtype=torch.bool)
    engine, _ = policy_loss(
        logprobs_engine.unsqueeze(0),
        SAMPLING.unsqueeze(0),
        ADVANTAGES.unsqueeze(0),
        mask,
        clip_low=0.2,
        clip_high=0.2,
        agg="seq_mean_token_sum",
        name=engine_name,
    )
    (engine_grad,) = torch.autograd.grad(engine, logprobs_engine)
    assert float(ours.detach()) == pytest.approx(float(engine.detach()), abs=1e-6)
    assert torch.allclose(ours_grad, engine_grad, atol=1e-6)


def test_gspo_token_equals_the_engines_sequence_gspo_for_a_sequence_level_advantage():
    """GSPO-token's value is GSPO's, and with one advantage per sequence its gradient is too (the paper, §4.3)."""
    advantage = torch.full((4,), 0.7)
    logprobs = LOGPROBS.clone().requires_grad_(True)
    ours = datum_loss("gspo", logprobs, {"logprobs": SAMPLING, "advantages": advantage})
    (ours_grad,) = torch.autograd.grad(ours, logprobs)
    logprobs_engine = LOGPROBS.clone().requires_grad_(True)
    engine, _ = policy_loss(
        logprobs_engine.unsqueeze(0),
        SAMPLING.unsqueeze(0),
        advantage.unsqueeze(0),
        torch.ones(1, 4, dtype=torch.bool),
        clip_low=0.2,
        clip_high=0.2,
        agg="seq_mean_token_sum",
        name="gspo",
    )
    (engine_grad,) = torch.autograd.grad(engine, logprobs_engine)
    assert float(ours.detach()) == pytest.approx(float(engine.detach()), abs=1e-6)
    assert torch.allclose(ours_grad, engine_grad, atol=1e-6)


def test_gspos_sequence_ratio_covers_only_the_tokens_its_mask_marks():
    mask = torch.tensor([0.0, 0.0, 1.0, 1.0])
    seq_ratio = math.exp(((-2.0 - -1.0) + (-0.25 - -0.5)) / 2)
    clipped = min(max(seq_ratio, 0.8), 1.2)
    expected = -sum(min(seq_ratio * a, clipped * a) for a in ADVANTAGES.tolist())
    assert float(datum_loss("gspo", LOGPROBS, _inputs(sequence_ratio_mask=mask))) == pytest.approx(expected, rel=1e-6)


def test_dro_is_the_policy_gradient_term_minus_a_quadratic_penalty_on_the_log_ratio():
    beta = 0.5
    expected = -sum(
        lp * a - 0.5 * beta * (lp - s) ** 2
        for lp, s, a in zip(LOGPROBS.tolist(), SAMPLING.tolist(), ADVANTAGES.tolist(), strict=True)
    )
    assert float(datum_loss("dro", LOGPROBS, _inputs(), {"beta": beta})) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("name", ["stable_reinforce", "custom", "dpo"])
def test_a_loss_not_served_is_refused_by_name(name):
    with pytest.raises(LossRefused, match=f"loss_fn '{name}' is not served here"):
        datum_loss(name, LOGPROBS, _inputs())


def test_an_rl_loss_without_its_sampling_log_probs_names_the_missing_input():
    with pytest.raises(LossRefused, match="'logprobs' is required"):
        datum_loss("ppo", LOGPROBS, {"advantages": ADVANTAGES})
