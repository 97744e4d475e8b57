"""Cross-check our GRPO advantage and loss, GSPO, CISPO and the rollout correction against TRL's
``GRPOTrainer`` (written against TRL 1.16).

Loss — TRL's own code is called. ``GRPOTrainer._compute_loss(self, model, inputs)`` is invoked as an
unbound function on a stand-in ``self`` that exposes only the attributes the method reads. The seam
is ``self._get_per_token_logps_and_entropies``: the stand-in returns fixed per-token log-probs (a leaf
tensor we can take gradients against) instead of running a model, so everything after it — ratio,
clipping, KL term, loss-type aggregation, clip metrics — is TRL's code, unmodified.

Advantage — there is no seam: TRL computes it inline in the middle of
``_generate_and_score_completions`` (which also generates and scores completions). We therefore
reproduce exactly its lines for ``multi_objective_aggregation="sum_then_normalize"`` using TRL's own
``nanstd`` helper, and pin them: a test checks that those lines are still present, verbatim, in the
installed TRL's source, so a TRL change that alters them fails loudly instead of silently.

Mapping (float64 inputs; required agreement 1e-6, observed about 1e-9). The residual is TRL's, not
ours: ``nanstd`` computes its Bessel factor ``count / (count - 1)`` from integer counts, which torch
divides in float32 even for float64 input, so TRL's std carries a ~1e-8 relative error.

=====================  ==========================================================
TRL                    ours
=====================  ==========================================================
scale_rewards="group"  ``grpo_advantages(..., eps=1e-4)`` (TRL hard-codes 1e-4; both use
                       the unbiased std, TRL via ``nanstd``)
scale_rewards="none"   ``dr_grpo_advantages``
loss_type="grpo"       ``agg="seq_mean_token_mean"``
loss_type="bnpo"       ``agg="token_mean"``
loss_type="dapo"       ``agg="token_mean"`` (TRL divides by ``num_items_in_batch``, the
                       token count of the whole generation batch; equal on one process
                       with no gradient accumulation, which is the case fed here)
loss_type="dr_grpo"    ``agg="seq_mean_token_sum_norm", norm_constant=max_completion_length``
epsilon / epsilon_high ``clip_low`` / ``clip_high``
beta * k3 in the loss  ``beta * aggregate(kl_estimate(logp, ref, "k3"), agg)``; the loss
                       is linear in the per-token terms, so adding after aggregation is
                       the same as TRL's adding before
delta (INTELLECT-2)    ``dual_clip=delta``; see below
clip_ratio/*_mean      ``stats["clip_ratio"|"clip_ratio_low"|"clip_ratio_high"]``
importance_sampling_   ``policy_loss(name="gspo")`` (GSPO) with ``loss_type="grpo"``
level="sequence"
loss_type="cispo"      ``policy_loss(name="cispo", clip_low=1, clip_high=epsilon_high - 1)``:
                       TRL's ``epsilon_high`` is the largest weight itself
vllm_importance_       ``rollout_correction``: ``token_truncate`` = ``token_tis``,
sampling_mode          ``sequence_truncate`` = ``sequence_tis``, ``token_mask`` =
                       ``token_mis`` (with ``clip_min=0.5, clip_max=5`` it is ``icepop``),
                       ``sequence_mask`` = ``sequence_mis``; ``clip_min``/``clip_max`` are
                       ``low``/``high``. TRL's ratio reaches the loss as
                       ``inputs["importance_sampling_ratio"]``; ours as ``weights``.
=====================  ==========================================================

Not in TRL 1.16, so not cross-checked: GMPO; the geometric-mean sequence mask (``geo_mask``; TRL's
``off_policy_mask_threshold`` is DeepSeek-V3.2's different rule: drop negative-advantage sequences whose
mean KL exceeds a threshold); the ``rollout_corr/*`` diagnostics (TRL logs only min/mean/max of its
ratio and the mean/max |log-prob difference|).

Definitional differences found (documented, tested as differences where testable):

1. ``use_bias_correction_kl`` — TRL 1.16 defaults it to True and then multiplies the k3 term by the
   importance ratio ``pi_theta / pi_old`` (DeepSeek-V3.2's unbiased reverse-KL gradient). Our
   ``kl_estimate`` is the plain Schulman k3. They agree with the flag off; with it on TRL's loss is
   exactly ours with ``k3 * ratio`` as the KL term (test below).
2. ``delta`` vs dual-clip — TRL's ``delta`` clamps the ratio at ``delta`` in the *unclipped* branch for
   every token (INTELLECT-2's two-sided clipping); Ye et al.'s dual-clip caps the loss of
   negative-advantage tokens at ``c * |A|``. For ``delta = c >= 1 + epsilon_high`` the two give the
   same loss and gradient: for A < 0 both give ``|A| * min(max(r, 1 - eps_low), c)``; for A > 0 the
   clipped branch ``min(r, 1 + eps_high)`` is below ``delta`` anyway. For ``delta < 1 + epsilon_high``
   they differ (TRL warns against it); not cross-checked.
3. ``eps`` — TRL adds a fixed 1e-4 to the group std; our default is 1e-6. Passed as 1e-4 here.
4. ``scale_rewards="batch"`` (one std over the batch's sequences, Bessel-corrected) has no exact
   counterpart: our REINFORCE++-baseline whitens over *tokens* with the population std, so longer
   responses weigh more. Not cross-checked.
5. Our policy loss clamps the log-ratio to +-20 and our k3 clamps its log-ratio to +-20; TRL clamps
   neither. The inputs here stay far inside those bounds.
6. TRL's ``loss_type="grpo"`` etc. also divide by ``current_gradient_accumulation_steps``; set to 1
   here, and in our engine gradient accumulation is the trainer's business, not the loss function's.
7. CISPO's clip metric: TRL counts tokens with ``ratio > epsilon_high`` and ``A > 0``; ours counts every
   token whose weight was truncated, whatever the advantage's sign (the weight is truncated for both).
8. Rollout correction: TRL's ratio on padded slots is 1 (its loss masks them); ours is 0. Only real
   tokens are compared.
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from torch.testing import assert_close

from rl_engine.algorithms import (
    CorrectionInputs,
    aggregate,
    dr_grpo_advantages,
    grpo_advantages,
    kl_estimate,
    policy_loss,
    rollout_correction,
)

# Importing TRL (transformers, accelerate, datasets, vLLM probes) alone takes ~10 s on the CI machines.
pytestmark = pytest.mark.slow

pytest.importorskip("trl")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # TRL warns about the installed vLLM version on import.
    grpo_trainer_module = pytest.importorskip("trl.trainer.grpo_trainer")
    trl_utils = pytest.importorskip("trl.trainer.utils")

GRPOTrainer = grpo_trainer_module.GRPOTrainer
nanstd = trl_utils.nanstd

GROUP_SIZE = 4
NUM_GROUPS = 3
MAX_COMPLETION_LENGTH = 9  # generation budget for dr_grpo; wider than the batch's T on purpose
TOLERANCE = {"rtol": 0.0, "atol": 1e-6}

TRL_TO_OUR_AGGREGATION = {
    "grpo": "seq_mean_token_mean",
    "bnpo": "token_mean",
    "dapo": "token_mean",
    "dr_grpo": "seq_mean_token_sum_norm",
}


# --- TRL's advantage lines, reproduced -----------------------------------------------------------

# The lines of GRPOTrainer._generate_and_score_completions that `trl_group_advantages` reproduces.
PINNED_TRL_LINES = (
    "mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)",
    "mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(num_generations, dim=0)",
    "std_rewards = nanstd(rewards.view(-1, num_generations), dim=1)",
    "std_rewards = std_rewards.repeat_interleave(num_generations, dim=0)",
    "advantages = rewards - mean_grouped_rewards",
    'if self.scale_rewards != "none":',
    "advantages = advantages / (std_rewards + 1e-4)",
)


def trl_group_advantages(rewards: torch.Tensor, num_generations: int, scale_rewards: str) -> torch.Tensor:
    """TRL 1.16's per-sequence advantage for scale_rewards in {"group", "none"} (one reward function)."""
    mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)
    mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(num_generations, dim=0)
    std_rewards = nanstd(rewards.view(-1, num_generations), dim=1)
    std_rewards = std_rewards.repeat_interleave(num_generations, dim=0)
    advantages = rewards - mean_grouped_rewards
    if scale_rewards != "none":
        advantages = advantages / (std_rewards + 1e-4)
    return torch.nan_to_num(advantages, nan=0.0)


# --- TRL's loss, called through a stand-in `self` ------------------------------------------------


class _SingleProcessAccelerator:
    """Only what `_compute_loss` touches: collectives are identities on one process."""

    num_processes = 1

    def reduce(self, tensor, reduction="sum"):
        return tensor

    def gather(self, tensor):
        return tensor

    def gather_for_metrics(self, tensor):
        return tensor


def trl_compute_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    ref_logps: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    *,
    loss_type: str,
    beta: float,
    epsilon_low: float,
    epsilon_high: float,
    delta: float | None = None,
    use_bias_correction_kl: bool = False,
    importance_sampling_level: str = "token",
    importance_sampling_ratio: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, list[float]]]:
    """Run `GRPOTrainer._compute_loss` on fixed log-probs; return its loss and its logged metrics.
    `importance_sampling_ratio` is the vLLM correction's ratio (TRL then behaves as with vLLM)."""
    batch, length = logps.shape
    metrics: dict[str, dict[str, list[float]]] = {"train": defaultdict(list), "eval": defaultdict(list)}
    stand_in = SimpleNamespace(
        # The seam: instead of a forward pass, hand back the fixed per-token log-probs (and dummy entropies).
        _get_per_token_logps_and_entropies=lambda *args, **kwargs: (logps, torch.zeros_like(logps), None),
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level=importance_sampling_level,
        beta=beta,
        loss_type=loss_type,
        epsilon_low=epsilon_low,
        epsilon_high=epsilon_high,
        args=SimpleNamespace(delta=delta, use_bias_correction_kl=use_bias_correction_kl, steps_per_generation=1),
        use_vllm=importance_sampling_ratio is not None,
        vllm_importance_sampling_correction=importance_sampling_ratio is not None,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        max_completion_length=MAX_COMPLETION_LENGTH,
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        _metrics=metrics,
        accelerator=_SingleProcessAccelerator(),
    )
    inputs = {
        "prompt_ids": torch.zeros(batch, 1, dtype=torch.long),
        "prompt_mask": torch.ones(batch, 1, dtype=torch.long),
        "completion_ids": torch.zeros(batch, length, dtype=torch.long),
        "completion_mask": mask,
        "advantages": advantages,
        "old_per_token_logps": old_logps,
        "ref_per_token_logps": ref_logps,
        "num_items_in_batch": mask.sum(),
    }
    if importance_sampling_ratio is not None:
        inputs["importance_sampling_ratio"] = importance_sampling_ratio
    loss = GRPOTrainer._compute_loss(stand_in, None, inputs)
    return loss, metrics["train"]


# --- shared batch --------------------------------------------------------------------------------


def make_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """Three prompts x four samples, right-padded to 6 tokens, float64, ratios spread around 1."""
    generator = torch.Generator().manual_seed(seed)
    batch, length = GROUP_SIZE * NUM_GROUPS, 6
    lengths = torch.randint(1, length + 1, (batch,), generator=generator)
    lengths[0] = length  # at least one full row
    mask = (torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)).long()
    old_logps = -torch.rand(batch, length, generator=generator, dtype=torch.float64) * 3
    # Log-ratio spread +-0.6 so that both clip sides (and the delta/dual-clip cap at r > 1.5) are hit.
    logps = old_logps + (torch.rand(batch, length, generator=generator, dtype=torch.float64) - 0.5) * 1.2
    ref_logps = old_logps + (torch.rand(batch, length, generator=generator, dtype=torch.float64) - 0.5) * 0.8
    rewards = torch.randint(0, 3, (batch,), generator=generator).to(torch.float64) / 2
    rewards[GROUP_SIZE : 2 * GROUP_SIZE] = 1.0  # one group with identical rewards: advantage 0 in both
    return {"mask": mask, "old_logps": old_logps, "logps": logps, "ref_logps": ref_logps, "rewards": rewards}


def our_loss(
    batch: dict[str, torch.Tensor],
    advantages: torch.Tensor,
    *,
    loss_type: str,
    beta: float,
    epsilon_low: float,
    epsilon_high: float,
    dual_clip: float | None = None,
    bias_corrected_kl: bool = False,
) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    """Our policy loss (+ beta * k3 KL term) on a fresh leaf; returns loss, stats and d loss / d logps."""
    logps = batch["logps"].clone().requires_grad_()
    agg = TRL_TO_OUR_AGGREGATION[loss_type]
    norm_constant = MAX_COMPLETION_LENGTH if agg == "seq_mean_token_sum_norm" else None
    loss, stats = policy_loss(
        logps,
        batch["old_logps"],
        advantages,
        batch["mask"],
        clip_low=epsilon_low,
        clip_high=epsilon_high,
        dual_clip=dual_clip,
        agg=agg,
        norm_constant=norm_constant,
    )
    if beta != 0.0:
        kl = kl_estimate(logps, batch["ref_logps"], "k3", batch["mask"])
        if bias_corrected_kl:  # TRL's use_bias_correction_kl: k3 weighted by the (differentiable) ratio
            kl = kl * torch.exp(logps - batch["old_logps"])
        loss = loss + beta * aggregate(kl, batch["mask"], agg, norm_constant)
    loss.backward()
    return loss.detach(), stats, logps.grad


def trl_loss(batch, advantages_per_sequence, **kwargs) -> tuple[torch.Tensor, dict[str, list[float]], torch.Tensor]:
    logps = batch["logps"].clone().requires_grad_()
    loss, metrics = trl_compute_loss(
        logps, batch["old_logps"], batch["ref_logps"], batch["mask"], advantages_per_sequence, **kwargs
    )
    loss.backward()
    return loss.detach(), metrics, logps.grad


# --- advantages ----------------------------------------------------------------------------------


def test_reproduced_trl_advantage_lines_are_still_in_the_installed_trl():
    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    for line in PINNED_TRL_LINES:
        assert line in source, f"TRL's advantage code changed; re-derive the cross-check. Missing: {line}"


def test_grpo_advantages_match_trl_group_scaling():
    batch = make_batch()
    trl_per_sequence = trl_group_advantages(batch["rewards"], GROUP_SIZE, scale_rewards="group")
    ours = grpo_advantages(batch["rewards"], batch["mask"], GROUP_SIZE, eps=1e-4)
    assert_close(ours, trl_per_sequence.unsqueeze(-1) * batch["mask"], **TOLERANCE)
    assert trl_per_sequence.abs().sum() > 0  # the batch does carry signal


def test_dr_grpo_advantages_match_trl_without_reward_scaling():
    batch = make_batch(seed=1)
    trl_per_sequence = trl_group_advantages(batch["rewards"], GROUP_SIZE, scale_rewards="none")
    ours = dr_grpo_advantages(batch["rewards"], batch["mask"], GROUP_SIZE)
    assert_close(ours, trl_per_sequence.unsqueeze(-1) * batch["mask"], **TOLERANCE)


# --- loss ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("loss_type", sorted(TRL_TO_OUR_AGGREGATION))
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_grpo_loss_and_gradient_match_trl(loss_type, beta):
    batch = make_batch()
    trl_advantages = trl_group_advantages(batch["rewards"], GROUP_SIZE, scale_rewards="group")
    our_advantages = grpo_advantages(batch["rewards"], batch["mask"], GROUP_SIZE, eps=1e-4)
    clip = {"epsilon_low": 0.2, "epsilon_high": 0.28}  # asymmetric: DAPO clip-higher

    theirs, metrics, their_grad = trl_loss(batch, trl_advantages, loss_type=loss_type, beta=beta, **clip)
    ours, stats, our_grad = our_loss(batch, our_advantages, loss_type=loss_type, beta=beta, **clip)

    assert_close(ours, theirs, **TOLERANCE)
    assert_close(our_grad, their_grad, **TOLERANCE)
    assert their_grad.abs().sum() > 0
    # Clip metrics: TRL's "region" is exactly our "clip was active" definition.
    assert_close(stats["clip_ratio"].item(), metrics["clip_ratio/region_mean"][-1], **TOLERANCE)
    assert_close(stats["clip_ratio_low"].item(), metrics["clip_ratio/low_mean"][-1], **TOLERANCE)
    assert_close(stats["clip_ratio_high"].item(), metrics["clip_ratio/high_mean"][-1], **TOLERANCE)
    assert metrics["clip_ratio/low_mean"][-1] > 0 and metrics["clip_ratio/high_mean"][-1] > 0
    if beta != 0.0:
        our_kl = aggregate(kl_estimate(batch["logps"], batch["ref_logps"], "k3"), batch["mask"], "token_mean")
        assert_close(our_kl.item(), metrics["kl"][-1], **TOLERANCE)


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo"])
def test_trl_delta_two_sided_clip_equals_our_dual_clip_when_delta_exceeds_the_upper_clip(loss_type):
    batch = make_batch(seed=2)
    trl_advantages = trl_group_advantages(batch["rewards"], GROUP_SIZE, scale_rewards="group")
    our_advantages = grpo_advantages(batch["rewards"], batch["mask"], GROUP_SIZE, eps=1e-4)
    clip = {"epsilon_low": 0.2, "epsilon_high": 0.2}
    cap = 1.3  # >= 1 + epsilon_high; some negative-advantage tokens of the batch have ratios above it

    theirs, _, their_grad = trl_loss(batch, trl_advantages, loss_type=loss_type, beta=0.0, delta=cap, **clip)
    ours, stats, our_grad = our_loss(batch, our_advantages, loss_type=loss_type, beta=0.0, dual_clip=cap, **clip)

    assert stats["dual_clip_ratio"] > 0  # the cap is really exercised
    assert_close(ours, theirs, **TOLERANCE)
    assert_close(our_grad, their_grad, **TOLERANCE)


def test_trl_default_bias_corrected_kl_is_k3_weighted_by_the_ratio():
    """Difference 1: TRL's default ``use_bias_correction_kl=True`` weights k3 by ``pi_theta / pi_old``.

    Our plain k3 term then gives a different loss; multiplying our k3 by the ratio reproduces TRL's
    loss and gradient exactly, so that weighting is the only difference.
    """
    batch = make_batch(seed=3)
    trl_advantages = trl_group_advantages(batch["rewards"], GROUP_SIZE, scale_rewards="group")
    our_advantages = grpo_advantages(batch["rewards"], batch["mask"], GROUP_SIZE, eps=1e-4)
    settings = {"loss_type": "bnpo", "beta": 0.5, "epsilon_low": 0.2, "epsilon_high": 0.2}

    theirs, _, their_grad = trl_loss(batch, trl_advantages, use_bias_correction_kl=True, **settings)
    plain, _, _ = our_loss(batch, our_advantages, **settings)
    assert (plain - theirs).abs() > 1e-4

    # ... and is exactly ours once k3 is multiplied by pi_theta / pi_old.
    corrected, _, our_grad = our_loss(batch, our_advantages, bias_corrected_kl=True, **settings)
    assert_close(corrected, theirs, **TOLERANCE)
    assert_close(our_grad, their_grad, **TOLERANCE)


# --- GSPO and CISPO ------------------------------------------------------------------------------


def our_named_loss(batch, advantages, name: str, clip_low: float, clip_high: float, agg: str, weights=None):
    logps = batch["logps"].clone().requires_grad_()
    loss, stats = policy_loss(
        logps, batch["old_logps"], advantages, batch["mask"], clip_low, clip_high, agg=agg, name=name, weights=weights
    )
    loss.backward()
    return loss.detach(), stats, logps.grad


def test_gspo_matches_trls_sequence_level_importance_sampling():
    batch = make_batch(seed=8)
    trl_advantages = trl_group_advantages(batch["rewards"], GROUP_SIZE, scale_rewards="group")
    our_advantages = grpo_advantages(batch["rewards"], batch["mask"], GROUP_SIZE, eps=1e-4)
    clip = {"epsilon_low": 0.05, "epsilon_high": 0.08}  # sequence ratios spread about +-0.15 here

    theirs, metrics, their_grad = trl_loss(
        batch, trl_advantages, loss_type="grpo", beta=0.0, importance_sampling_level="sequence", **clip
    )
    ours, stats, our_grad = our_named_loss(batch, our_advantages, "gspo", 0.05, 0.08, "seq_mean_token_mean")

    assert_close(ours, theirs, **TOLERANCE)
    assert_close(our_grad, their_grad, **TOLERANCE)
    assert their_grad.abs().sum() > 0
    # TRL counts clipped sequences over sequences, we over tokens: compare that some clip on both sides.
    assert metrics["clip_ratio/low_mean"][-1] > 0 and metrics["clip_ratio/high_mean"][-1] > 0
    assert stats["clip_ratio_low"] > 0 and stats["clip_ratio_high"] > 0


def test_cispo_matches_trls_cispo_loss():
    batch = make_batch(seed=5)
    trl_advantages = trl_group_advantages(batch["rewards"], GROUP_SIZE, scale_rewards="group")
    our_advantages = grpo_advantages(batch["rewards"], batch["mask"], GROUP_SIZE, eps=1e-4)
    largest_weight = 1.3  # some of the batch's ratios (up to e^0.6) are truncated

    theirs, _, their_grad = trl_loss(
        batch, trl_advantages, loss_type="cispo", beta=0.0, epsilon_low=0.2, epsilon_high=largest_weight
    )
    ours, stats, our_grad = our_named_loss(batch, our_advantages, "cispo", 1.0, largest_weight - 1, "token_mean")

    assert stats["clip_ratio_high"] > 0
    assert_close(ours, theirs, **TOLERANCE)
    assert_close(our_grad, their_grad, **TOLERANCE)


# --- rollout correction: TRL's vLLM importance sampling ----------------------------------------

# The lines of GRPOTrainer._generate_and_score_completions that `trl_importance_sampling_ratio` reproduces.
PINNED_TRL_IS_LINES = (
    "per_token_logps_diff = (old_per_token_logps - sampling_per_token_logps) * mask",
    "per_token_logps_diff = torch.nan_to_num(per_token_logps_diff, nan=0.0)",
    'sequence_level_is = self.vllm_importance_sampling_mode in ["sequence_mask", "sequence_truncate"]',
    "per_sequence_logps_diff = per_token_logps_diff.sum(dim=-1, keepdim=True)",
    "vllm_importance_sampling_ratio = torch.exp(logps_diff)",
    'if self.vllm_importance_sampling_mode in ["sequence_truncate", "token_truncate"]:',
    "invalid_mis_mask = (vllm_importance_sampling_ratio < min_val) | (",
)


def trl_importance_sampling_ratio(old, sampling, mask, mode: str, clip_min, clip_max) -> torch.Tensor:
    """TRL 1.16's vLLM importance-sampling ratio: `[B, T]` (token modes) or `[B, 1]` (sequence modes)."""
    per_token_logps_diff = (old - sampling) * mask
    per_token_logps_diff = torch.nan_to_num(per_token_logps_diff, nan=0.0)
    sequence_level_is = mode in ["sequence_mask", "sequence_truncate"]
    logps_diff = per_token_logps_diff.sum(dim=-1, keepdim=True) if sequence_level_is else per_token_logps_diff
    ratio = torch.exp(logps_diff)
    if mode in ["sequence_truncate", "token_truncate"]:
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    min_val = clip_min if clip_min is not None else -math.inf
    max_val = clip_max if clip_max is not None else math.inf
    return ratio.masked_fill((ratio < min_val) | (ratio > max_val), value=0.0)


def correction_batch(seed: int = 6) -> dict[str, torch.Tensor]:
    """make_batch's rows with a rollout engine's log-probs: the trainer's plus noise of +-0.9, so that
    token ratios (up to ~2.5) and sequence ratios cross the thresholds below."""
    batch = make_batch(seed)
    generator = torch.Generator().manual_seed(seed + 100)
    noise = (torch.rand(batch["old_logps"].shape, generator=generator, dtype=torch.float64) - 0.5) * 1.8
    batch["sampling_logps"] = batch["old_logps"] + noise
    return batch


def test_reproduced_trl_importance_sampling_lines_are_still_in_the_installed_trl():
    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    for line in PINNED_TRL_IS_LINES:
        assert line in source, f"TRL's importance-sampling code changed; re-derive the cross-check. Missing: {line}"


@pytest.mark.parametrize(
    ("trl_mode", "clip_min", "clip_max", "ours", "low", "high"),
    [
        ("token_truncate", None, 2.0, "token_tis", None, 2.0),
        ("token_truncate", 0.5, 2.0, "token_tis", 0.5, 2.0),
        ("sequence_truncate", None, 2.0, "sequence_tis", None, 2.0),
        ("token_mask", None, 2.0, "token_mis", None, 2.0),
        ("token_mask", 0.5, 5.0, "icepop", None, None),  # IcePop's interval, from the catalogue
        ("sequence_mask", 0.5, 2.0, "sequence_mis", 0.5, 2.0),
    ],
)
def test_our_correction_weights_equal_trls_importance_sampling_ratio(trl_mode, clip_min, clip_max, ours, low, high):
    batch = correction_batch()
    mask = batch["mask"]
    theirs = trl_importance_sampling_ratio(
        batch["old_logps"], batch["sampling_logps"], mask, trl_mode, clip_min, clip_max
    )
    result = rollout_correction(ours, CorrectionInputs(batch["sampling_logps"], batch["old_logps"], mask), low, high)
    assert_close(result.weights, theirs.expand_as(mask) * mask, **TOLERANCE)
    # The thresholds are really exercised on this batch.
    changed = result.metrics["rollout_corr/masked_fraction"] + result.metrics["rollout_corr/truncated_fraction"]
    assert changed > 0


@pytest.mark.parametrize(
    ("trl_mode", "ours", "loss", "loss_type"),
    [
        ("token_truncate", "token_tis", "ppo_clip", "bnpo"),
        ("sequence_mask", "sequence_mis", "ppo_clip", "grpo"),
        ("token_mask", "token_mis", "gspo", "grpo"),
    ],
)
def test_the_corrected_loss_and_gradient_equal_trls(trl_mode, ours, loss, loss_type):
    batch = correction_batch(seed=7)
    mask = batch["mask"]
    trl_advantages = trl_group_advantages(batch["rewards"], GROUP_SIZE, scale_rewards="group")
    our_advantages = grpo_advantages(batch["rewards"], mask, GROUP_SIZE, eps=1e-4)
    ratio = trl_importance_sampling_ratio(batch["old_logps"], batch["sampling_logps"], mask, trl_mode, 0.5, 2.0)
    weights = rollout_correction(ours, CorrectionInputs(batch["sampling_logps"], batch["old_logps"], mask), 0.5, 2.0)
    level = "sequence" if loss == "gspo" else "token"
    clip = (0.05, 0.08) if loss == "gspo" else (0.2, 0.28)

    theirs, _, their_grad = trl_loss(
        batch,
        trl_advantages,
        loss_type=loss_type,
        beta=0.0,
        epsilon_low=clip[0],
        epsilon_high=clip[1],
        importance_sampling_level=level,
        importance_sampling_ratio=ratio,
    )
    agg = TRL_TO_OUR_AGGREGATION[loss_type]
    ours_loss, _, our_grad = our_named_loss(batch, our_advantages, loss, *clip, agg, weights=weights.weights)

    assert_close(ours_loss, theirs, **TOLERANCE)
    assert_close(our_grad, their_grad, **TOLERANCE)
