"""The update checks the rollout engine's log-probs against its own training forward (every row, no extra
pass) when that forward is the eval forward; metrics named `*_max` are maxima over micro-batches, the other
statistics means over the update's tokens, whatever the micro-batch split."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rl_engine.config import validate_config
from rl_engine.trainer import (
    Experience,
    TokenBatch,
    TorchTrainer,
    batched_logprobs,
    combine_metric,
    has_active_dropout,
)


def _trainer(tiny_demo: Path, micro_batch_size: int = 2, **model_config) -> TorchTrainer:
    from transformers import AutoModelForCausalLM

    cfg = validate_config(
        {
            "name": "gap",
            "model": {"path": str(tiny_demo / "model")},
            "data": {"path": "d.jsonl"},
            "rewards": [{"type": "exact_match"}],
            "rollout": {"samples_per_prompt": 2},
            "train": {"micro_batch_size": micro_batch_size},
        }
    )
    model = AutoModelForCausalLM.from_pretrained(tiny_demo / "model", **model_config)
    return TorchTrainer(cfg, model, None, None)


def _batch() -> TokenBatch:
    return TokenBatch.build([[5, 6, 7], [8, 9], [5, 9], [6]], [[10, 11, 12], [13, 14], [15, 16, 17], [18]], 0)


def test_the_update_compares_every_rows_engine_logprobs_with_its_training_forward(tiny_demo):
    trainer = _trainer(tiny_demo)
    assert trainer.exact_training_logprobs
    batch = _batch()
    exact = batched_logprobs(trainer.model.eval(), batch, 4, 1.0)
    engine = exact.clone()
    engine[3, 0] += 0.3  # a real token of the last row: in the second micro-batch of two
    engine[1, 2] += 5.0  # padding (row 1 has two response tokens): must not count
    exp = Experience(batch, torch.zeros_like(batch.response_mask), None, None, rollout_logprobs=engine)

    metrics = trainer.update(exp)

    assert metrics["rollout/logprob_diff_max"] == pytest.approx(0.3, abs=1e-5)
    # A mean over the batch's 9 real tokens, as one batch would give: rows 0-1 (the first micro-batch) hold 5
    # tokens with no gap, rows 2-3 hold 4 with one of 0.3. (Not the mean of the micro-batch means, 0.3/4/2.)
    assert metrics["rollout/logprob_diff_mean"] == pytest.approx(0.3 / 9, abs=1e-5)
    assert metrics["kl/rollout_vs_policy"] == pytest.approx(0.3 / 9, abs=1e-5)


def test_an_update_in_two_micro_batches_logs_and_steps_as_one_batch_would(tiny_demo):
    """Rows 0-1 hold 5 response tokens, rows 2-3 hold 4: split in two the micro-batches differ in size, and
    the token-weighted accumulation must still give the one-batch loss, entropy and gradient."""
    batch = _batch()
    advantages = torch.tensor([[1.0, -1.0, 0.5], [2.0, 1.0, 0.0], [-1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    exp = Experience(batch, advantages * batch.response_mask, None, None)
    torch.manual_seed(0)
    whole = _trainer(tiny_demo, micro_batch_size=4).update(exp)
    torch.manual_seed(0)
    split = _trainer(tiny_demo, micro_batch_size=2).update(exp)
    for name in ("policy/loss", "policy/entropy", "policy/grad_norm"):
        assert split[name] == pytest.approx(whole[name], rel=1e-4), name


def test_micro_batch_metrics_combine_as_weighted_means_and_maxima():
    assert combine_metric("rollout/logprob_diff_mean", [0.0, 0.075], [5, 4]) == pytest.approx(0.3 / 9)
    assert combine_metric("rollout/logprob_diff_max", [0.1, 0.3], [5, 4]) == 0.3
    assert combine_metric("policy/grad_norm", [1.0, 2.0]) == 1.5


def test_without_engine_logprobs_or_with_old_logprobs_the_update_reports_no_gap(tiny_demo):
    trainer = _trainer(tiny_demo)
    batch = _batch()
    exact = batched_logprobs(trainer.model.eval(), batch, 4, 1.0)
    assert "rollout/logprob_diff_max" not in trainer.update(Experience(batch, torch.zeros_like(exact), None, None))
    # With old log-probs the loop compares against those, before the update.
    stale = Experience(batch, torch.zeros_like(exact), exact, None, rollout_logprobs=exact)
    assert "rollout/logprob_diff_max" not in trainer.update(stale)


def test_a_policy_with_dropout_leaves_the_comparison_to_an_eval_forward(tiny_demo):
    assert _trainer(tiny_demo, attention_dropout=0.1).exact_training_logprobs is False
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.05))
    assert has_active_dropout(model)
    assert not has_active_dropout(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.0)))


def test_the_rollout_corrections_weights_reach_the_policy_loss(tiny_demo):
    """Weights multiply each token's loss: all zero and the policy gets no gradient at all; halved, the
    loss halves."""
    trainer = _trainer(tiny_demo)
    batch = _batch()
    advantages = torch.tensor([[1.0, -1.0, 0.5], [2.0, 1.0, 0.0], [-1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    advantages = advantages * batch.response_mask
    zero = trainer.update(Experience(batch, advantages, None, None, correction_weights=torch.zeros_like(advantages)))
    assert zero["policy/grad_norm"] == 0.0 and zero["policy/loss"] == 0.0

    full = _trainer(tiny_demo).update(Experience(batch, advantages, None, None))
    half = _trainer(tiny_demo).update(
        Experience(batch, advantages, None, None, correction_weights=0.5 * batch.response_mask)
    )
    assert half["policy/loss"] == pytest.approx(full["policy/loss"] / 2, rel=1e-5)
    assert half["policy/grad_norm"] == pytest.approx(full["policy/grad_norm"] / 2, rel=1e-4)
