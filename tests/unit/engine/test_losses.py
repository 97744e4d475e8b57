"""Loss aggregation, the policy losses by name, PPO's clipped surrogate, the value loss and entropy
against hand-computed values. Each other policy loss has its own test file (test_policy_loss_<name>.py)."""

import math

import pytest
import torch
from torch.testing import assert_close

from rl_engine.algorithms import (
    AGGREGATION_MODES,
    aggregate,
    entropy_from_logits,
    masked_mean,
    masked_whiten,
    policy_loss,
    value_loss,
)
from rl_engine.algorithms.catalogue import POLICY_LOSSES
from rl_engine.algorithms.registry import POLICY_LOSS_FUNCTIONS

NAN = float("nan")


def logprobs_for_ratios(
    ratios: list[list[float]], old: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """New and old log-probs whose ratio exp(new - old) is exactly `ratios`."""
    ratio = torch.tensor(ratios, dtype=torch.float64)
    old = torch.full_like(ratio, -1.0) if old is None else old
    return (old + ratio.log()).requires_grad_(), old


# --- aggregate -----------------------------------------------------------------------------------

LOSS_TOK = torch.tensor([[1.0, 2.0, 3.0], [4.0, NAN, NAN]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token_mean", (1 + 2 + 3 + 4) / 4),  # 2.5: every token weighs the same
        ("seq_mean_token_sum", (6 + 4) / 2),  # 5.0
        ("seq_mean_token_mean", (6 / 3 + 4 / 1) / 2),  # 3.0: every sequence weighs the same
        ("seq_mean_token_sum_norm", (1 + 2 + 3 + 4) / (2 * 5)),  # 1.0 with norm_constant 5
    ],
)
def test_aggregate_modes_match_hand_values_and_ignore_padding(mode, expected):
    assert_close(aggregate(LOSS_TOK, MASK, mode, norm_constant=5), torch.tensor(expected))


def test_every_aggregation_mode_is_tested_above():
    assert set(AGGREGATION_MODES) == {
        "token_mean",
        "seq_mean_token_sum",
        "seq_mean_token_mean",
        "seq_mean_token_sum_norm",
    }


def test_dr_grpo_aggregation_needs_the_generation_budget():
    with pytest.raises(ValueError, match="norm_constant"):
        aggregate(LOSS_TOK, MASK, "seq_mean_token_sum_norm")


def test_unknown_aggregation_mode_is_refused():
    with pytest.raises(ValueError, match="unknown aggregation mode"):
        aggregate(LOSS_TOK, MASK, "sum")  # type: ignore[arg-type]


def test_sequence_means_count_empty_rows_in_the_batch_size():
    loss_tok = torch.tensor([[2.0, 4.0], [9.0, 9.0]])
    mask = torch.tensor([[1, 1], [0, 0]])
    assert_close(aggregate(loss_tok, mask, "seq_mean_token_mean"), torch.tensor(1.5))
    assert_close(aggregate(loss_tok, mask, "token_mean"), torch.tensor(3.0))


def test_aggregate_refuses_a_loss_shaped_unlike_the_mask():
    with pytest.raises(ValueError, match="expected"):
        aggregate(torch.zeros(2, 4), MASK)


# --- policy loss ---------------------------------------------------------------------------------

# Four tokens with ratios and advantages chosen so that each clipping case appears once:
#   t0 r=1.5 A=+1: max(-1.5, -1.2) = -1.2   (clipped high)
#   t1 r=0.5 A=-1: max( 0.5,  0.8) =  0.8   (clipped low)
#   t2 r=1.1 A=+2: max(-2.2, -2.2) = -2.2   (inside the trust region)
#   t3 r=0.7 A=-2: max( 1.4,  1.6) =  1.6   (clipped low)
RATIOS = [[1.5, 0.5, 1.1, 0.7]]
ADVANTAGES = torch.tensor([[1.0, -1.0, 2.0, -2.0]], dtype=torch.float64)
ONE_ROW = torch.ones(1, 4)


def test_policy_loss_is_the_clipped_surrogate():
    logp, old = logprobs_for_ratios(RATIOS)
    loss, stats = policy_loss(logp, old, ADVANTAGES, ONE_ROW, clip_low=0.2, clip_high=0.2)
    assert_close(loss, torch.tensor((-1.2 + 0.8 - 2.2 + 1.6) / 4, dtype=torch.float64))
    assert_close(stats["clip_ratio"], torch.tensor(0.75, dtype=torch.float64))
    assert_close(stats["clip_ratio_high"], torch.tensor(0.25, dtype=torch.float64))
    assert_close(stats["clip_ratio_low"], torch.tensor(0.5, dtype=torch.float64))


def test_clipped_tokens_get_no_gradient():
    logp, old = logprobs_for_ratios(RATIOS)
    loss, _ = policy_loss(logp, old, ADVANTAGES, ONE_ROW)
    loss.backward()
    # Only t2 is unclipped: d(-A r)/d logp = -A r = -2.2, divided by the 4 tokens of token_mean.
    assert_close(logp.grad, torch.tensor([[0.0, 0.0, -2.2 / 4, 0.0]], dtype=torch.float64))


def test_clip_higher_lets_a_positive_advantage_token_rise_further():
    # With clip_high 0.28, t0 (r=1.5) is cut at 1.28 instead of 1.2.
    logp, old = logprobs_for_ratios(RATIOS)
    loss, stats = policy_loss(logp, old, ADVANTAGES, ONE_ROW, clip_low=0.2, clip_high=0.28)
    assert_close(loss, torch.tensor((-1.28 + 0.8 - 2.2 + 1.6) / 4, dtype=torch.float64))

    # A token at r=1.25 with A>0: clipped under symmetric 0.2, free (and still learning) under 0.28.
    logp, old = logprobs_for_ratios([[1.25]])
    advantage = torch.ones(1, 1, dtype=torch.float64)
    symmetric, symmetric_stats = policy_loss(logp, old, advantage, torch.ones(1, 1), 0.2, 0.2)
    higher, higher_stats = policy_loss(logp, old, advantage, torch.ones(1, 1), 0.2, 0.28)
    assert_close(symmetric, torch.tensor(-1.2, dtype=torch.float64))
    assert_close(higher, torch.tensor(-1.25, dtype=torch.float64))
    assert symmetric_stats["clip_ratio"].item() == 1.0 and higher_stats["clip_ratio"].item() == 0.0


def test_clip_low_and_clip_high_act_on_their_own_side():
    # clip_low only matters for A<0 tokens pushed down; a wider clip_low frees t1 (r=0.5) and t3 (r=0.7).
    logp, old = logprobs_for_ratios(RATIOS)
    loss, stats = policy_loss(logp, old, ADVANTAGES, ONE_ROW, clip_low=0.6, clip_high=0.2)
    assert_close(loss, torch.tensor((-1.2 + 0.5 - 2.2 + 1.4) / 4, dtype=torch.float64))
    assert_close(stats["clip_ratio_low"], torch.tensor(0.0, dtype=torch.float64))


def test_dual_clip_caps_the_loss_of_negative_advantages_at_c_times_abs_a():
    # t0 r=5 A=-1: plain PPO max(5, 1.2) = 5, dual-clip c=3 caps at 3.
    # t1 r=2 A=-1: 2 < 3, untouched.   t2 r=5 A=+1: positive advantages are never dual-clipped (-1.2).
    logp, old = logprobs_for_ratios([[5.0, 2.0, 5.0]])
    advantages = torch.tensor([[-1.0, -1.0, 1.0]], dtype=torch.float64)
    mask = torch.ones(1, 3)
    plain, _ = policy_loss(logp, old, advantages, mask)
    dual, stats = policy_loss(logp, old, advantages, mask, dual_clip=3.0)
    assert_close(plain, torch.tensor((5.0 + 2.0 - 1.2) / 3, dtype=torch.float64))
    assert_close(dual, torch.tensor((3.0 + 2.0 - 1.2) / 3, dtype=torch.float64))
    assert_close(stats["dual_clip_ratio"], torch.tensor(1 / 3, dtype=torch.float64))

    dual.backward()
    # The capped token is constant (no gradient); t1 keeps d(-A r)/dlogp = r = 2; t2 is clipped.
    assert_close(logp.grad, torch.tensor([[0.0, 2.0 / 3, 0.0]], dtype=torch.float64))


def test_dual_clip_must_exceed_one():
    logp, old = logprobs_for_ratios([[1.0]])
    with pytest.raises(ValueError, match="dual_clip"):
        policy_loss(logp, old, torch.ones(1, 1), torch.ones(1, 1), dual_clip=0.9)


def test_policy_loss_stats_report_ratio_and_approx_kl_over_real_tokens():
    # Ratios 2 and 0.5 (padding holds 100): k3 of KL(old||new) = (r - 1) - ln r
    #   -> (1 - ln 2) + (-0.5 + ln 2) = 0.5 over two tokens = 0.25.
    logp, old = logprobs_for_ratios([[2.0, 0.5, 100.0]])
    _, stats = policy_loss(logp, old, torch.ones(1, 3, dtype=torch.float64), torch.tensor([[1, 1, 0]]))
    f64 = {"dtype": torch.float64}
    assert_close(stats["approx_kl"], torch.tensor(0.25, **f64))
    assert_close(stats["ratio_mean"], torch.tensor(1.25, **f64))
    assert_close(stats["ratio_max"], torch.tensor(2.0, **f64))
    assert_close(stats["ratio_min"], torch.tensor(0.5, **f64))
    assert all(not value.requires_grad for value in stats.values())


def test_policy_loss_ignores_whatever_sits_in_padding():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    logp = torch.tensor([[-1.0, -0.5, 0.0], [-2.0, 0.0, 0.0]], requires_grad=True)
    old = torch.tensor([[-1.1, -0.4, 0.0], [-2.5, 0.0, 0.0]])
    adv = torch.tensor([[0.5, 0.5, 0.0], [-1.0, 0.0, 0.0]])
    pad = ~mask.bool()
    dirty_logp = torch.where(pad, torch.tensor(50.0), logp.detach()).requires_grad_()
    dirty_old = torch.where(pad, torch.tensor(NAN), old)
    dirty_adv = torch.where(pad, torch.tensor(-1e6), adv)

    for mode in AGGREGATION_MODES:
        clean_loss, clean_stats = policy_loss(logp, old, adv, mask, agg=mode, norm_constant=3)
        dirty_loss, dirty_stats = policy_loss(dirty_logp, dirty_old, dirty_adv, mask, agg=mode, norm_constant=3)
        assert_close(dirty_loss, clean_loss)
        assert_close(dirty_stats, clean_stats)

    clean_loss.backward()
    dirty_loss.backward()
    assert_close(dirty_logp.grad, logp.grad)
    assert torch.all(logp.grad[pad] == 0)


def test_per_sequence_advantages_broadcast_over_tokens():
    logp, old = logprobs_for_ratios([[1.1, 0.9], [1.3, 1.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    per_seq = torch.tensor([1.0, -2.0], dtype=torch.float64)
    per_tok = per_seq.unsqueeze(-1) * mask
    assert_close(policy_loss(logp, old, per_seq, mask)[0], policy_loss(logp, old, per_tok, mask)[0])


def test_policy_loss_uses_the_requested_aggregation():
    logp, old = logprobs_for_ratios([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    # At ratio 1 the per-token loss is -A: [-1, -2, -3] and [-4].
    expected = {
        "token_mean": -10 / 4,
        "seq_mean_token_sum": -(6 + 4) / 2,
        "seq_mean_token_mean": -(2 + 4) / 2,
        "seq_mean_token_sum_norm": -10 / (2 * 8),
    }
    for mode, value in expected.items():
        loss, _ = policy_loss(logp, old, adv, mask, agg=mode, norm_constant=8)
        assert_close(loss, torch.tensor(value, dtype=torch.float64))


def test_at_ratio_one_the_gradient_is_the_vanilla_policy_gradient():
    logp, old = logprobs_for_ratios([[1.0, 1.0]])
    loss, stats = policy_loss(logp, old, torch.tensor([[3.0, -1.0]], dtype=torch.float64), torch.ones(1, 2))
    loss.backward()
    assert_close(logp.grad, torch.tensor([[-1.5, 0.5]], dtype=torch.float64))
    assert stats["clip_ratio"].item() == 0.0 and stats["approx_kl"].item() == 0.0


# --- any policy loss, by name --------------------------------------------------------------------


def test_every_policy_loss_file_is_registered_under_its_catalogue_spec():
    assert set(POLICY_LOSS_FUNCTIONS.names()) == set(POLICY_LOSSES)


def test_an_unknown_policy_loss_is_refused_naming_the_choices():
    logp, old = logprobs_for_ratios([[1.0]])
    with pytest.raises(ValueError, match="unknown policy loss 'dpo'; expected one of: .*gspo"):
        policy_loss(logp, old, torch.ones(1, 1), torch.ones(1, 1), name="dpo")


def test_dual_clip_is_refused_for_a_loss_without_one():
    logp, old = logprobs_for_ratios([[1.0]])
    with pytest.raises(ValueError, match="policy loss 'gspo' has no dual clip"):
        policy_loss(logp, old, torch.ones(1, 1), torch.ones(1, 1), dual_clip=3.0, name="gspo")


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_every_policy_loss_ignores_whatever_sits_in_padding(name):
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    logp = torch.tensor([[-1.0, -0.5, 0.0], [-2.0, 0.0, 0.0]], requires_grad=True)
    old = torch.tensor([[-1.1, -0.4, 0.0], [-2.5, 0.0, 0.0]])
    adv = torch.tensor([[0.5, 0.5, 0.0], [-1.0, 0.0, 0.0]])
    weights = torch.tensor([[1.0, 0.5, 0.0], [2.0, 0.0, 0.0]])
    pad = ~mask.bool()
    dirty_logp = torch.where(pad, torch.tensor(50.0), logp.detach()).requires_grad_()
    dirty_old = torch.where(pad, torch.tensor(NAN), old)
    dirty_adv = torch.where(pad, torch.tensor(-1e6), adv)
    dirty_weights = torch.where(pad, torch.tensor(NAN), weights)

    clean_loss, clean_stats = policy_loss(logp, old, adv, mask, 0.2, 0.2, name=name, weights=weights)
    dirty_loss, dirty_stats = policy_loss(
        dirty_logp, dirty_old, dirty_adv, mask, 0.2, 0.2, name=name, weights=dirty_weights
    )
    assert_close(dirty_loss, clean_loss)
    assert_close(dirty_stats, clean_stats)
    clean_loss.backward()
    dirty_loss.backward()
    assert_close(dirty_logp.grad, logp.grad)
    assert torch.all(logp.grad[pad] == 0) and logp.grad[~pad].abs().sum() > 0


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES))
def test_correction_weights_multiply_each_tokens_loss_and_a_zero_weight_drops_the_token(name):
    """Weights scale the per-token loss before aggregation, the denominators unchanged: a token-level
    loss at ratio 1 with weights [2, 0] is (2 * -A0 + 0) / 2 under token_mean."""
    logp, old = logprobs_for_ratios([[1.0, 1.0]])
    adv = torch.tensor([[1.0, 1.0]], dtype=torch.float64)
    mask = torch.ones(1, 2)
    plain, _ = policy_loss(logp, old, adv, mask, 0.2, 0.2, agg="token_mean", name=name)
    weighted, _ = policy_loss(
        logp, old, adv, mask, 0.2, 0.2, agg="token_mean", name=name, weights=torch.tensor([[2.0, 0.0]])
    )
    per_token = plain.item()  # at ratio 1 every token's loss is the same
    assert_close(weighted.item(), (2 * per_token + 0 * per_token) / 2)
    weighted.backward()
    assert logp.grad[0, 1] == 0 or POLICY_LOSSES[name].level == "sequence"


def test_correction_weights_are_not_differentiated():
    logp, old = logprobs_for_ratios([[1.0]])
    weights = torch.tensor([[0.5]], requires_grad=True)
    loss, _ = policy_loss(logp, old, torch.ones(1, 1, dtype=torch.float64), torch.ones(1, 1), weights=weights)
    loss.backward()
    assert weights.grad is None


# --- value loss ----------------------------------------------------------------------------------

# t0 v=1.0 old=0.8 R=1.5: both errors 0.25            -> 0.125
# t1 v=2.0 old=1.0 R=3.0: unclipped 1, clipped (1.2-3)^2 = 3.24 -> 1.62 (clipped term is larger)
# t2 v=0.0 old=0.0 R=-1 : 1 and 1                       -> 0.5
VALUES = torch.tensor([[1.0, 2.0, 0.0]], dtype=torch.float64)
OLD_VALUES = torch.tensor([[0.8, 1.0, 0.0]], dtype=torch.float64)
RETURNS = torch.tensor([[1.5, 3.0, -1.0]], dtype=torch.float64)


def test_value_loss_takes_the_max_of_clipped_and_unclipped_errors():
    loss, stats = value_loss(VALUES, OLD_VALUES, RETURNS, torch.ones(1, 3), clip=0.2)
    assert_close(loss, torch.tensor((0.125 + 1.62 + 0.5) / 3, dtype=torch.float64))
    assert_close(stats["clip_ratio"], torch.tensor(1 / 3, dtype=torch.float64))


def test_value_loss_without_clip_is_half_the_squared_error():
    loss, stats = value_loss(VALUES, OLD_VALUES, RETURNS, torch.ones(1, 3), clip=None)
    assert_close(loss, torch.tensor((0.125 + 0.5 + 0.5) / 3, dtype=torch.float64))
    assert stats["clip_ratio"].item() == 0.0


def test_value_loss_ignores_whatever_sits_in_padding_and_aggregates_as_asked():
    mask = torch.tensor([[1, 1, 0]])
    values = VALUES.clone().requires_grad_()
    dirty_values = torch.where(mask.bool(), VALUES, torch.tensor(NAN, dtype=torch.float64)).requires_grad_()
    dirty_returns = torch.where(mask.bool(), RETURNS, torch.tensor(1e9, dtype=torch.float64))
    clean, _ = value_loss(values, OLD_VALUES, RETURNS, mask, clip=0.2, agg="seq_mean_token_sum")
    dirty, _ = value_loss(dirty_values, OLD_VALUES, dirty_returns, mask, clip=0.2, agg="seq_mean_token_sum")
    assert_close(clean, torch.tensor(0.125 + 1.62, dtype=torch.float64))
    assert_close(dirty, clean)
    clean.backward()
    dirty.backward()
    assert_close(dirty_values.grad, values.grad)


# --- entropy and masked helpers ------------------------------------------------------------------


def test_entropy_of_uniform_logits_is_log_vocab_size():
    assert_close(entropy_from_logits(torch.zeros(2, 3, 4)), torch.full((2, 3), math.log(4)))


def test_entropy_matches_hand_value_and_ignores_banned_tokens():
    # p = [0.5, 0.25, 0.25]: H = 0.5 ln 2 + 0.5 ln 4 = 1.5 ln 2; a -inf logit adds nothing.
    logits = torch.tensor([[[math.log(0.5), math.log(0.25), math.log(0.25), float("-inf")]]], requires_grad=True)
    entropy = entropy_from_logits(logits)
    assert_close(entropy, torch.tensor([[1.5 * math.log(2)]]))
    entropy.sum().backward()
    assert torch.isfinite(logits.grad).all()


def test_masked_mean_ignores_padding_and_is_zero_without_tokens():
    x = torch.tensor([[1.0, 3.0, NAN], [5.0, NAN, NAN]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert_close(masked_mean(x, mask), torch.tensor(3.0))
    assert_close(masked_mean(x, mask, dim=-1), torch.tensor([2.0, 5.0]))
    assert_close(masked_mean(x, torch.zeros(2, 3)), torch.tensor(0.0))


def test_masked_whiten_gives_zero_mean_unit_variance_over_real_tokens():
    x = torch.tensor([[1.0, 2.0, NAN], [3.0, 4.0, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    whitened = masked_whiten(x, mask)
    # Tokens 1..5: mean 3, population std sqrt(2).
    expected = torch.tensor([[-2.0, -1.0, 0.0], [0.0, 1.0, 2.0]], dtype=torch.float64) / math.sqrt(2)
    assert_close(whitened, expected)
    assert_close(masked_whiten(x, mask, shift_mean=False), torch.where(mask.bool(), expected + 3.0, 0.0))
