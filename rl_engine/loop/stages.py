"""One RL step as flat stages, each timed: collect → score → reference/values (the no-grad forward passes) →
advantages → correction → update → sync → record (`run_step`). The algorithms are chosen by name
(`rl_engine.algorithms.catalogue`): the estimator in the advantages stage, the rollout correction in the
correction stage, the policy loss inside the trainer's update."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import cast

import torch

from rl_engine.algorithms import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    CorrectionInputs,
    CorrectionResult,
    drop_flagged,
    dynamic_sampling_keep,
    kl_estimate,
    kl_penalized_rewards,
    masked_mean,
    overlong_penalty,
    rollout_correction,
)
from rl_engine.config import RunConfig
from rl_engine.data import Prompt
from rl_engine.executors import Rollouts
from rl_engine.interfaces import AsyncRolloutRole
from rl_engine.ledger import Draw, SampleOutcome
from rl_engine.loop.engine import Engine
from rl_engine.loop.prefetch import take_rollouts
from rl_engine.loop.records import sample_records, step_metrics
from rl_engine.loop.timing import StepTimer, timing_metrics
from rl_engine.response_stats import step_response_metrics
from rl_engine.rewards import RewardBatch
from rl_engine.rewards.base import RewardResult
from rl_engine.rewards.loud import check_error_rates
from rl_engine.rollout import Sample
from rl_engine.rollout_filters import apply_filters, note_dropped
from rl_engine.rollout_store import StepRollouts
from rl_engine.staleness import staleness_metrics
from rl_engine.trainer import Experience, TokenBatch, rollout_logprob_gap


def run_step(engine: Engine, step: int) -> tuple[dict[str, float], StepRollouts]:
    """One RL step as flat stages, each timed (`timing/<stage>`): collect → score → reference/values →
    advantages → correction → update → sync → record. Returns its metrics and every rollout sample with
    what its update read (for the step's rollout file, `rl_engine.rollout_store`). A step whose groups
    dynamic sampling dropped entirely stops after score."""
    timer = StepTimer()
    started = time.perf_counter()
    metrics: dict[str, float] = {}
    collected = collect(engine, step, timer)
    if engine.cfg.backends.async_rollout:
        metrics.update(staleness_metrics(collected.samples, step - 1, engine.cfg.backends.max_staleness))
    with timer.phase("reward"):
        scored = score(engine, collected)
    metrics.update(scored.metrics)
    engine.ledger.resolve(step, collected.draws, sample_outcomes(collected, scored))
    advantages_per_sample = torch.zeros(len(collected.samples))
    every = engine.cfg.logging.token_view_every
    rollouts = StepRollouts(
        step,
        [],
        collected.samples,
        [collected.prompts[s.prompt_index].token_ids for s in collected.samples],
        token_view=bool(every and step % every == 0),
    )
    if scored.keep.any():
        batch = forward_passes(engine, collected, scored, timer, metrics)
        with timer.phase("advantages"):
            advantages, returns = compute_advantages(engine.cfg, batch, metrics)
        with timer.phase("correction"):
            correction = correct(engine.cfg, batch, trainer_version=step - 1)
        metrics.update(correction.metrics)
        with timer.phase("train"):
            metrics.update(update(engine, batch, advantages, returns, correction))
        mask = batch.mask
        advantages_per_sample[batch.rows] = (advantages * mask).sum(1) / mask.sum(1).clamp(min=1)
        rollouts.rows, rollouts.response_attention = (
            batch.rows,
            batch.tokens.attention_mask[:, batch.tokens.prompt_width :],
        )
        rollouts.batch_tensors = update_tensors(batch, advantages, returns, correction)
        metrics["advantages/mean"] = float(masked_mean(advantages, mask))
        metrics["advantages/abs_mean"] = float(masked_mean(advantages.abs(), mask))
        train_tokens = float(batch.tokens.attention_mask.sum())
        metrics["throughput/train_tokens_per_s"] = train_tokens / max(timer.timings["train"], 1e-9)
    if scored.keep.any() or engine.cfg.backends.async_rollout:
        # In async mode a step without an update is a policy version all the same: staleness counts steps (the
        # trainer is version `step - 1` at step `step`, as a checkpoint resumes it), so the engines take version
        # `step`, the same weights, after the batches ahead; else every later batch looks one update staler.
        sync(engine, step, timer)
    with timer.phase("record"):
        metrics.update(step_metrics(engine.cfg, collected, scored, timer))
        rollouts.records = sample_records(collected, scored, advantages_per_sample)
    metrics.update(timing_metrics(timer))
    metrics["timing/step"] = time.perf_counter() - started
    return metrics, rollouts


@dataclass
class Collected:
    """The collect stage's output: the step's prompts and trajectories, decoded."""

    step: int
    draws: list[Draw]  # the rows behind `prompts`, with their epochs (the ledger's keys)
    prompts: list[Prompt]
    rollouts: Rollouts
    texts: list[str]
    lengths: torch.Tensor  # [N] the policy's own tokens per sample

    @property
    def samples(self) -> list[Sample]:
        return self.rollouts.samples


@dataclass
class Scored:
    """The score stage's output."""

    reward: RewardResult
    task_scores: torch.Tensor  # [N] the reward components' weighted sum
    scores: torch.Tensor  # [N] what the advantages see: task scores plus shaping (overlong penalty)
    keep: torch.Tensor  # [N] bool: the rows that train (dynamic sampling drops whole groups)
    metrics: dict[str, float] = field(default_factory=dict)  # what the filters dropped, the responses' statistics
    reasons: list[str | None] = field(default_factory=list)  # [N] what left each row out; None where it trains


@dataclass
class TrainingBatch:
    """The kept rows as tokens, with every log-prob and value the later stages read; `[B, T]` tensors."""

    rows: torch.Tensor  # [B] indices into the step's samples
    tokens: TokenBatch
    scores: torch.Tensor  # [B]
    rollout_logprobs: torch.Tensor | None  # the rollout engine's: the behaviour policy
    ref_logprobs: torch.Tensor | None = None
    old_logprobs: torch.Tensor | None = None  # the trainer's before the update: the proximal policy
    values: torch.Tensor | None = None
    policy_versions: torch.Tensor | None = None  # [B, T] the version that sampled each token (async mode)

    @property
    def mask(self) -> torch.Tensor:
        return self.tokens.response_mask


def collect(engine: Engine, step: int, timer: StepTimer) -> Collected:
    """Generate (or, async, take the batch generated during the last step), and decode it."""
    draws, prompts, rollouts = take_rollouts(engine, step, timer)
    samples = rollouts.samples
    texts = engine.tokenizer.batch_decode([s.response_ids for s in samples], skip_special_tokens=True)
    lengths = torch.tensor([s.action_count for s in samples], dtype=torch.float32)
    return Collected(step, draws, prompts, rollouts, texts, lengths)


def score(engine: Engine, collected: Collected) -> Scored:
    """Rewards, reward shaping, and which rows train (dynamic sampling, then `rollout.filters`), with the
    responses' statistics (`rl_engine.response_stats`)."""
    alg, ro = engine.cfg.algorithm, engine.cfg.rollout
    reward = score_rollouts(engine, collected.prompts, collected.rollouts, collected.texts)
    check_error_rates(reward, {spec.name: spec.max_error_rate for spec in engine.cfg.rewards})  # loud, not silent
    task_scores = torch.tensor(reward.total, dtype=torch.float32)
    scores = task_scores.clone()
    if alg.overlong.enabled:
        scores = scores + overlong_penalty(
            collected.lengths, ro.max_new_tokens, alg.overlong.buffer_tokens, alg.overlong.penalty
        )
    samples, vocab = collected.samples, len(engine.tokenizer)
    keep = torch.ones(len(scores), dtype=torch.bool)
    reasons: list[str | None] = [None] * len(samples)
    if alg.dynamic_sampling:
        keep = dynamic_sampling_keep(scores, ro.samples_per_prompt).repeat_interleave(ro.samples_per_prompt)
        reasons = [None if kept else "dynamic_sampling" for kept in keep.tolist()]
    stale: dict[str, float] = {}
    if engine.cfg.backends.async_rollout:
        keep, stale = drop_stale(engine.cfg, collected, keep, reasons)
    filtered = apply_filters(engine.cfg, collected.texts, samples, scores, keep, vocab, reasons)
    stats = step_response_metrics(
        collected.texts,
        [s.response_ids for s in samples],
        [s.prompt_index for s in samples],
        [s.logprobs for s in samples],
        vocab,
    )
    return Scored(reward, task_scores, scores, filtered.keep, {**filtered.metrics, **stale, **stats}, filtered.reasons)


def drop_stale(
    cfg: RunConfig, collected: Collected, keep: torch.Tensor, reasons: list[str | None]
) -> tuple[torch.Tensor, dict[str, float]]:
    """Async mode: samples with a token more than `backends.max_staleness` versions behind the trainer (version
    `step - 1`) leave the update (with their group under a group estimator), counted in `staleness/dropped`.
    The engines never run further ahead than the bound, so this holds the bound rather than shapes the data."""
    bound, trainer_version = cfg.backends.max_staleness, collected.step - 1
    flags = [trainer_version - sample_versions(s, collected.step)[0] > bound for s in collected.samples]
    group = cfg.rollout.samples_per_prompt if cfg.algorithm.is_group_estimator else None
    kept = drop_flagged(keep, torch.tensor(flags, dtype=torch.bool), group)
    return kept, {"staleness/dropped": float(note_dropped(keep, kept, "staleness", reasons))}


def sample_versions(sample: Sample, step: int) -> tuple[int, int]:
    """The oldest and newest policy version of a sample's tokens (sync mode: the trainer's, `step - 1`)."""
    if not sample.segments:
        return step - 1, step - 1
    versions = [version for version, _ in sample.segments]
    return min(versions), max(versions)


def sample_outcomes(collected: Collected, scored: Scored) -> list[SampleOutcome]:
    """What the step did with each sample, for the ledger."""
    keep = scored.keep.tolist()
    return [
        SampleOutcome(
            prompt_index=sample.prompt_index,
            kept=keep[i],
            reason=None if keep[i] else (scored.reasons[i] if scored.reasons else None),
            versions=sample_versions(sample, collected.step),
            reward_error=bool(scored.reward.errors[i]),
        )
        for i, sample in enumerate(collected.samples)
    ]


def score_rollouts(engine: Engine, prompts: list[Prompt], rollouts: Rollouts, texts: list[str]) -> RewardResult:
    """The configured rewards (on the model's last turn when an environment ran) plus the environment's
    own reward as the `environment` component."""
    samples = rollouts.samples
    if engine.reward is not None:
        scored = rollouts.final_texts if rollouts.final_texts is not None else texts
        result = engine.reward.score(_reward_batch(prompts, samples, scored))
    else:
        result = RewardResult([0.0] * len(samples), {}, [[] for _ in samples], {}, {})
    if rollouts.env_rewards is not None:
        result.total = [t + r for t, r in zip(result.total, rollouts.env_rewards)]
        result.components = {"environment": list(rollouts.env_rewards), **result.components}
        env_errors = rollouts.errors
        assert env_errors is not None  # an executor with env rewards reports each episode's errors with them
        result.errors = [errors + env for errors, env in zip(result.errors, env_errors)]
        result.timings = {"environment": rollouts.env_seconds, **result.timings}
    return result


def _reward_batch(prompts: list[Prompt], samples: list[Sample], texts: list[str]) -> RewardBatch:
    chosen = [prompts[s.prompt_index] for s in samples]
    return RewardBatch(
        prompts=[p.text for p in chosen],
        responses=texts,
        labels=[p.label for p in chosen],
        queries=[p.text + t for p, t in zip(chosen, texts)],
        finish_reasons=[s.finish_reason for s in samples],
        metadata=[p.metadata for p in chosen],
    )


def needs_old_logprobs(cfg: RunConfig, batch_size: int) -> bool:
    """Whether the step needs the policy's log-probs before the update from a forward pass of their own.
    With one update per batch the old policy is the current one: its log-probs come free from the
    training forward pass (ratio exactly 1), so the pass is skipped — unless the KL goes into the reward,
    async mode measures how far the samples' policy is behind, or a rollout correction compares them
    with the rollout engine's."""
    alg, tr = cfg.algorithm, cfg.train
    single_update = tr.epochs_per_batch == 1 and (tr.mini_batch_size or batch_size) >= batch_size
    kl_in_reward = alg.kl.coef > 0 and alg.kl.placement == "reward"
    correction = "old_logprobs" in alg.rollout_correction.spec.needs
    return not single_update or kl_in_reward or cfg.backends.async_rollout or correction


# Rows whose log-probs get an eval forward of their own for `rollout/logprob_diff_*` when the training
# forward runs with dropout: a small no-grad pass (a few % of a step) is enough to watch for drift.
_GAP_SAMPLES = 16


def forward_passes(
    engine: Engine, collected: Collected, scored: Scored, timer: StepTimer, metrics: dict[str, float]
) -> TrainingBatch:
    """The reference/values stage: the kept rows as tokens, and the no-grad forward passes the step needs
    (reference, old policy, critic), each timed."""
    trainer = engine.trainer
    rows = scored.keep.nonzero().squeeze(-1)
    samples = [collected.samples[i] for i in rows]
    tokens = TokenBatch.build(
        [collected.prompts[s.prompt_index].token_ids for s in samples],
        [s.response_ids for s in samples],
        engine.rollout.pad_id,
        [s.action_mask for s in samples],
    )
    mask = tokens.response_mask
    batch = TrainingBatch(rows, tokens, scored.scores[rows], _engine_logprobs(samples, mask))
    batch.policy_versions = _token_versions(samples, mask)
    if batch.rollout_logprobs is None and engine.cfg.algorithm.rollout_correction.spec.needs:
        raise RuntimeError(
            "algorithm.rollout_correction: the rollout reported no log-probs of its samples, so there is "
            "nothing to correct against; set the method to 'none'"
        )
    if batch.rollout_logprobs is None and engine.cfg.ratio_against_behaviour:
        raise RuntimeError(
            "algorithm.ratio_against: the rollout reported no log-probs of its samples, so the ratio cannot be "
            "taken against them; set it to 'proximal'"
        )
    if trainer.ref_model is not None:
        with timer.phase("forward_reference"):
            batch.ref_logprobs = trainer.forward(tokens, "reference")
    with timer.phase("forward_policy"):
        if needs_old_logprobs(engine.cfg, len(rows)):
            batch.old_logprobs = trainer.forward(tokens, "policy")
        if batch.rollout_logprobs is not None and batch.old_logprobs is not None:
            metrics.update(rollout_logprob_gap(batch.rollout_logprobs, batch.old_logprobs, mask))
        elif batch.rollout_logprobs is not None and not trainer.exact_training_logprobs:
            # Dropout makes the training forward's log-probs differ from the engine's by design: a few
            # rows get an eval forward of their own.
            few = slice(0, _GAP_SAMPLES)
            metrics.update(
                rollout_logprob_gap(
                    batch.rollout_logprobs[few], trainer.forward(tokens.select(few), "policy"), mask[few]
                )
            )
    if trainer.critic is not None:
        with timer.phase("forward_values"):
            batch.values = trainer.forward(tokens, "values")
    return batch


def _engine_logprobs(samples: list[Sample], mask: torch.Tensor) -> torch.Tensor | None:
    """The rollout engine's log-probs of the sampled tokens as a `[B, T]` tensor shaped like `mask`; None
    when a sample came without them (greedy decoding)."""
    found = [s.logprobs for s in samples if s.logprobs is not None]
    if not samples or len(found) < len(samples):
        return None
    engine = torch.zeros_like(mask)
    for row, logprobs in enumerate(found):
        engine[row, : len(logprobs)] = torch.tensor(logprobs, dtype=mask.dtype)
    return engine


def _token_versions(samples: list[Sample], mask: torch.Tensor) -> torch.Tensor | None:
    """The policy version of each sampled token as a `[B, T]` tensor shaped like `mask`; None when a
    sample carries no versions (sync mode)."""
    if not samples or any(s.segments is None for s in samples):
        return None
    versions = torch.zeros(mask.shape, dtype=torch.long)
    for row, sample in enumerate(samples):
        per_token = sample.token_versions or []
        versions[row, : len(per_token)] = torch.tensor(per_token, dtype=torch.long)
    return versions


def compute_advantages(
    cfg: RunConfig, batch: TrainingBatch, metrics: dict[str, float]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The configured estimator, by name, with the KL penalty folded into token rewards when it goes there."""
    alg = cfg.algorithm
    token_rewards = None
    if alg.kl.coef > 0 and alg.kl.placement == "reward":
        kl = kl_estimate(batch.old_logprobs, batch.ref_logprobs, alg.kl.estimator, batch.mask)
        token_rewards = kl_penalized_rewards(batch.scores, kl, batch.mask, alg.kl.coef)
        metrics["kl/mean"] = float(masked_mean(kl, batch.mask))
    inputs = AdvantageInputs(
        scores=batch.scores,
        mask=batch.mask,
        group_size=cfg.rollout.samples_per_prompt,
        normalize_std=alg.normalizes_advantage_std,
        token_rewards=token_rewards,
        values=batch.values,
        gamma=alg.gamma,
        lam=alg.lam,
    )
    return ADVANTAGE_ESTIMATORS.get(alg.name)(inputs)


def correct(cfg: RunConfig, batch: TrainingBatch, trainer_version: int) -> CorrectionResult:
    """The rollout correction: weights on the policy loss from the rollout engine's log-probs (behaviour)
    against the trainer's before the update (proximal, version `trainer_version`), and the
    `rollout_corr/*` metrics."""
    settings = cfg.algorithm.rollout_correction
    if not settings.spec.needs:
        return CorrectionResult(None, {})
    inputs = CorrectionInputs(
        behaviour_logprobs=batch.rollout_logprobs,
        proximal_logprobs=batch.old_logprobs,
        mask=batch.mask,
        policy_versions=batch.policy_versions,
        trainer_version=trainer_version,
    )
    return rollout_correction(settings.method, inputs, *settings.thresholds)


def update(
    engine: Engine,
    batch: TrainingBatch,
    advantages: torch.Tensor,
    returns: torch.Tensor | None,
    correction: CorrectionResult,
) -> dict[str, float]:
    """The trainer's update over the batch (the policy loss by name inside it), its ratio taken against
    `ratio_denominator`."""
    return engine.trainer.update(experience_for(engine.cfg, batch, advantages, returns, correction))


def experience_for(
    cfg: RunConfig,
    batch: TrainingBatch,
    advantages: torch.Tensor,
    returns: torch.Tensor | None,
    correction: CorrectionResult,
) -> Experience:
    """What the update reads (`rl_engine.replay` rebuilds it from a step's rollout file the same way)."""
    alg = cfg.algorithm
    return Experience(
        batch.tokens,
        advantages,
        ratio_denominator(cfg, batch),
        batch.ref_logprobs if alg.kl.placement == "loss" else None,
        batch.values,
        returns,
        # Without old log-probs the engine's are checked against the training forward's, every row, free.
        batch.rollout_logprobs if batch.old_logprobs is None else None,
        correction.weights,
        batch.rollout_logprobs if alg.loss.behaviour_weighted else None,
    )


def ratio_denominator(cfg: RunConfig, batch: TrainingBatch) -> torch.Tensor | None:
    """The log-probs the policy loss's ratio is taken against (`algorithm.ratio_against`). Behaviour: the
    rollout engine's, so that PPO's clip keeps the update within a trust region of the policy that sampled
    the batch; a batch generated updates ago (async mode) has tokens the trainer already moved past the clip,
    and they get no further push. Proximal: the trainer's before this update; with one update per batch the
    ratio starts at exactly 1 and the clip never engages, so stale samples would be trained as if they were
    on-policy. None: no forward pass computed them (one on-policy update: the training forward's own,
    detached, are the old policy)."""
    return batch.rollout_logprobs if cfg.ratio_against_behaviour else batch.old_logprobs


def sync(engine: Engine, step: int, timer: StepTimer) -> None:
    """The rollout engines take the updated weights, policy version `step` (async: queued after the
    batches generated ahead, or between two segments with partial rollout; the step does not wait)."""
    with timer.phase("weight_sync"):
        if engine.cfg.backends.async_rollout:
            cast(AsyncRolloutRole, engine.rollout).queue_weights(step)
        else:
            engine.sync_weights()


def update_tensors(
    batch: TrainingBatch, advantages: torch.Tensor, returns: torch.Tensor | None, correction: CorrectionResult
) -> dict[str, torch.Tensor | None]:
    """The `[B, T]` tensors of the update, by rollout-file column: what the per-token view shows and what
    `rl_engine.replay` needs to rebuild the update without generating."""
    return {
        "trainer_logprob": batch.old_logprobs,
        "ref_logprob": batch.ref_logprobs,
        "token_advantage": advantages,
        "is_weight": correction.weights,
        "value": batch.values,
        "return": returns,
    }
