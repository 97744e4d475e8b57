"""KL estimators and KL-penalised token rewards against hand-computed values."""

import math

import pytest
import torch
from torch.testing import assert_close

from rl_engine.algorithms import K3_LOG_RATIO_CLAMP, kl_estimate, kl_penalized_rewards

LN2 = math.log(2.0)


def test_estimators_match_hand_values_for_a_ratio_of_two():
    # policy p = 0.5, reference q = 0.25 on the sampled token: log p/q = ln 2.
    logp = torch.tensor([[math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25)]])
    assert_close(kl_estimate(logp, ref, "k1"), torch.tensor([[LN2]]))
    assert_close(kl_estimate(logp, ref, "k2"), torch.tensor([[0.5 * LN2**2]]))
    # k3 = q/p - 1 - log(q/p) = 0.5 - 1 + ln 2
    assert_close(kl_estimate(logp, ref, "k3"), torch.tensor([[0.5 - 1 + LN2]]))


def test_k3_for_a_ratio_of_one_half():
    # p = 0.25, q = 0.5: k3 = 2 - 1 - ln 2; k1 is negative, k3 is not.
    logp = torch.tensor([[math.log(0.25)]])
    ref = torch.tensor([[math.log(0.5)]])
    assert_close(kl_estimate(logp, ref, "k3"), torch.tensor([[1 - LN2]]))
    assert kl_estimate(logp, ref, "k1").item() < 0


def test_k1_and_k3_are_unbiased_for_the_exact_kl():
    # Exact expectation over a 3-token vocabulary, tokens weighted by the policy p.
    p = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    q = torch.tensor([0.25, 0.25, 0.5], dtype=torch.float64)
    exact = (p * (p / q).log()).sum()  # = 0.25 ln 2
    assert_close(exact, torch.tensor(0.25 * LN2, dtype=torch.float64))
    for estimator in ("k1", "k3"):
        per_token = kl_estimate(p.log().unsqueeze(0), q.log().unsqueeze(0), estimator)[0]
        assert_close((p * per_token).sum(), exact)


def test_estimators_are_zero_when_policy_equals_reference():
    logp = torch.tensor([[-0.3, -2.0, -5.0]])
    for estimator in ("k1", "k2", "k3"):
        assert_close(kl_estimate(logp, logp.clone(), estimator), torch.zeros(1, 3))


def test_k2_and_k3_are_never_negative():
    torch.manual_seed(0)
    logp = -torch.rand(4, 5) * 5
    ref = -torch.rand(4, 5) * 5
    assert (kl_estimate(logp, ref, "k2") >= 0).all()
    assert (kl_estimate(logp, ref, "k3") >= 0).all()


def test_k3_clamps_the_log_ratio_instead_of_overflowing():
    # The reference likes a token the policy has made impossible: ref - logp = 1000 would overflow exp().
    logp = torch.tensor([[-1000.0]], requires_grad=True)
    kl = kl_estimate(logp, torch.tensor([[0.0]]), "k3")
    clamp = K3_LOG_RATIO_CLAMP
    assert_close(kl, torch.tensor([[math.exp(clamp) - clamp - 1]]))
    kl.sum().backward()
    assert torch.isfinite(logp.grad).all()


def test_masked_estimate_is_zero_on_padding_and_ignores_garbage_there():
    mask = torch.tensor([[1, 1, 0]])
    logp = torch.tensor([[-1.0, -2.0, float("nan")]], requires_grad=True)
    ref = torch.tensor([[-1.5, -1.0, float("inf")]])
    kl = kl_estimate(logp, ref, "k3", mask=mask)
    assert_close(kl[0, 2], torch.tensor(0.0))
    assert_close(kl[0, :2], kl_estimate(logp[:, :2].detach(), ref[:, :2], "k3")[0])
    kl.sum().backward()
    assert torch.isfinite(logp.grad).all()


def test_unknown_estimator_is_refused():
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_estimate(torch.zeros(1, 1), torch.zeros(1, 1), "k4")  # type: ignore[arg-type]


def test_kl_penalized_rewards_put_the_score_on_the_last_real_token():
    # coef 0.5: row 0 = -0.5*[0.1, 0.2, 0.3] + [0, 0, 1]; row 1 has 2 tokens, its padded kl (9) is ignored.
    scores = torch.tensor([1.0, 2.0])
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    rewards = kl_penalized_rewards(scores, kl, mask, coef=0.5)
    assert_close(rewards, torch.tensor([[-0.05, -0.1, 0.85], [-0.2, 1.75, 0.0]]))


def test_kl_penalized_rewards_with_zero_coef_is_just_the_score():
    rewards = kl_penalized_rewards(torch.tensor([3.0]), torch.tensor([[5.0, 5.0, 5.0]]), torch.tensor([[1, 0, 0]]), 0.0)
    assert_close(rewards, torch.tensor([[3.0, 0.0, 0.0]]))


def test_kl_penalized_rewards_drop_the_score_of_an_empty_response():
    rewards = kl_penalized_rewards(torch.tensor([3.0]), torch.zeros(1, 2), torch.zeros(1, 2), 0.1)
    assert_close(rewards, torch.zeros(1, 2))
