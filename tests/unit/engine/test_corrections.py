"""Rollout correction (rl_engine/algorithms/corrections.py) against hand-computed values. The TRL
cross-check of TIS/MIS is in test_trl_crosscheck.py."""

import math

import pytest
import torch
from torch.testing import assert_close

from rl_engine.algorithms import ROLLOUT_CORRECTIONS, CorrectionInputs, rollout_correction
from rl_engine.algorithms.catalogue import CORRECTIONS

# Token ratios rho = pi_proximal / pi_behaviour: row 0 [2.5, 0.4, 1.0], row 1 [1.5, 1.5, pad].
# Sequence ratios: row 0 2.5 * 0.4 * 1 = 1.0, row 1 2.25. Geometric means: 1.0 and 1.5.
RHO = torch.tensor([[2.5, 0.4, 1.0], [1.5, 1.5, 1.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
BEHAVIOUR = torch.tensor([[-1.0, -2.0, -0.5], [-1.2, -0.7, -9.0]], dtype=torch.float64)
PROXIMAL = torch.where(MASK.bool(), BEHAVIOUR + RHO.log(), torch.tensor(float("nan"), dtype=torch.float64))
PAD = torch.tensor(0.0)


def corrected(method: str, low: float | None = None, high: float | None = None, **extra):
    return rollout_correction(method, CorrectionInputs(BEHAVIOUR, PROXIMAL, MASK, **extra), low, high)


def rows(*values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def test_every_catalogued_correction_is_registered_and_nothing_else():
    assert set(ROLLOUT_CORRECTIONS.names()) == set(CORRECTIONS)


@pytest.mark.parametrize(
    ("method", "low", "high", "weights", "masked", "truncated"),
    [
        # TIS: the token ratio truncated above at 2 (the 2.5 token).
        ("token_tis", None, 2.0, rows([2.0, 0.4, 1.0], [1.5, 1.5, 0.0]), 0, 1 / 5),
        # ... and below at 0.5 when asked (the 0.4 token too).
        ("token_tis", 0.5, 2.0, rows([2.0, 0.5, 1.0], [1.5, 1.5, 0.0]), 0, 2 / 5),
        # Sequence TIS: row 1's product 2.25 truncated to 2 on both its tokens.
        ("sequence_tis", None, 2.0, rows([1.0, 1.0, 1.0], [2.0, 2.0, 0.0]), 0, 2 / 5),
        # Token MIS: the 2.5 token is dropped, the others keep their ratio.
        ("token_mis", None, 2.0, rows([0.0, 0.4, 1.0], [1.5, 1.5, 0.0]), 1 / 5, 0),
        # Sequence MIS: row 1 (2.25) is dropped whole.
        ("sequence_mis", None, 2.0, rows([1.0, 1.0, 1.0], [0.0, 0.0, 0.0]), 2 / 5, 0),
        # IcePop, its paper's interval [0.5, 5]: only the 0.4 token falls outside.
        ("icepop", None, None, rows([2.5, 0.0, 1.0], [1.5, 1.5, 0.0]), 1 / 5, 0),
        # Geometric mask [0.9, 1.1]: row 0's geometric mean is 1 (kept, weight 1), row 1's 1.5 (dropped).
        ("geo_mask", 0.9, 1.1, rows([1.0, 1.0, 1.0], [0.0, 0.0, 0.0]), 2 / 5, 0),
    ],
)
def test_correction_weights_match_hand_values(method, low, high, weights, masked, truncated):
    result = corrected(method, low, high)
    assert_close(result.weights, weights)
    assert result.metrics["rollout_corr/masked_fraction"] == pytest.approx(masked)
    assert result.metrics["rollout_corr/truncated_fraction"] == pytest.approx(truncated)
    assert not result.weights.requires_grad


def test_sequences_with_a_dropped_token_are_counted():
    assert corrected("token_mis", high=2.0).metrics["rollout_corr/seq_masked_fraction"] == 0.5
    assert corrected("token_tis", high=2.0).metrics["rollout_corr/seq_masked_fraction"] == 0.0


def test_the_mismatch_metrics_match_hand_values():
    metrics = corrected("metrics").metrics
    log_rho = [math.log(2.5), math.log(0.4), 0.0, math.log(1.5), math.log(1.5)]
    expected = {
        # k1: mean(log behaviour - log proximal) over the 5 real tokens.
        "rollout_corr/kl": -sum(log_rho) / 5,
        # k3: mean(rho - 1 - log rho).
        "rollout_corr/k3_kl": sum(math.exp(lr) - 1 - lr for lr in log_rho) / 5,
        # |mean log behaviour - mean log proximal| per sequence: 0 and log 1.5, then their mean.
        "rollout_corr/log_ppl_abs_diff": math.log(1.5) / 2,
        # mean rho^2 - 1 = (6.25 + 0.16 + 1 + 2.25 + 2.25) / 5 - 1.
        "rollout_corr/chi2_token": 11.91 / 5 - 1,
        # mean (prod rho)^2 - 1 = (1 + 2.25^2) / 2 - 1.
        "rollout_corr/chi2_seq": (1 + 2.25**2) / 2 - 1,
        # Quantiles of [0.4, 1, 1.5, 1.5, 2.5], linear interpolation.
        "rollout_corr/weight_min": 0.4,
        "rollout_corr/weight_p05": 0.4 + 0.2 * 0.6,
        "rollout_corr/weight_p50": 1.5,
        "rollout_corr/weight_p95": 1.5 + 0.8 * 1.0,
        "rollout_corr/weight_max": 2.5,
        # Metrics only: nothing applied.
        "rollout_corr/weight_mean": 1.0,
        "rollout_corr/masked_fraction": 0.0,
        "rollout_corr/truncated_fraction": 0.0,
    }
    for name, value in expected.items():
        assert metrics[name] == pytest.approx(value, abs=1e-9), name


def test_metrics_only_leaves_the_loss_alone_and_none_does_nothing_at_all():
    assert corrected("metrics").weights is None
    off = corrected("none")
    assert off.weights is None and off.metrics == {}


def test_on_policy_samples_get_weight_one_and_zero_divergence():
    same = rollout_correction("token_tis", CorrectionInputs(BEHAVIOUR, BEHAVIOUR.clone(), MASK))
    assert_close(same.weights, MASK.to(torch.float64))
    for name in ("kl", "k3_kl", "log_ppl_abs_diff", "chi2_token", "chi2_seq"):
        assert same.metrics[f"rollout_corr/{name}"] == pytest.approx(0.0, abs=1e-12), name


def test_padding_never_reaches_the_weights_or_the_metrics():
    dirty = BEHAVIOUR.clone()
    dirty[1, 2] = float("inf")
    result = rollout_correction("sequence_tis", CorrectionInputs(dirty, PROXIMAL, MASK), None, 2.0)
    assert_close(result.weights, corrected("sequence_tis", high=2.0).weights)
    assert all(math.isfinite(v) for v in result.metrics.values())


def test_huge_log_ratios_give_finite_weights_and_metrics():
    far = CorrectionInputs(torch.full((1, 2), -80.0), torch.zeros(1, 2), torch.ones(1, 2))
    result = rollout_correction("sequence_mis", far, None, 2.0)
    assert result.weights.tolist() == [[0.0, 0.0]]
    assert all(math.isfinite(v) for v in result.metrics.values())


def test_the_samples_policy_versions_give_the_staleness():
    versions = torch.tensor([7, 5])
    metrics = corrected("metrics", policy_versions=versions, trainer_version=8).metrics
    assert metrics["rollout_corr/staleness_mean"] == 2.0 and metrics["rollout_corr/staleness_max"] == 3.0


def test_per_token_policy_versions_give_the_staleness_of_real_tokens():
    # A partial rollout: row 0's last token was sampled after a sync; row 1's padding carries garbage.
    versions = torch.tensor([[5, 5, 7], [6, 6, -100]])
    metrics = corrected("metrics", policy_versions=versions, trainer_version=8).metrics
    assert metrics["rollout_corr/staleness_mean"] == pytest.approx((3 + 3 + 1 + 2 + 2) / 5)
    assert metrics["rollout_corr/staleness_max"] == 3.0


def test_thresholds_out_of_order_and_unknown_methods_are_refused():
    with pytest.raises(ValueError, match="low .* must be below high"):
        corrected("token_tis", low=3.0, high=2.0)
    with pytest.raises(ValueError, match="unknown rollout correction 'vtrace'; expected one of"):
        corrected("vtrace")
