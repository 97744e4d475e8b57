"""The training loop. One step is a row of flat stages, each timed and emitted as `timing/<stage>`:
collect (generate) → score (reward) → reference/values (the no-grad forward passes) → advantages →
correction → update (train) → sync (weight sync) → record; all rollout samples are emitted per step.

The algorithms are chosen by name (`rl_engine.algorithms.catalogue`): the estimator in the
advantages stage, the rollout correction in the correction stage, the policy loss inside the trainer's
update. The loop is backend-agnostic: it talks to the roles of `rl_engine.interfaces` (a rollout, a
trainer, a reward, an executor), built from `rl_engine.components`; this module wires the one-process
ones, and `rl_engine.distributed` the same calls onto Ray actors (several engines or ranks, `separate` placement).

Async mode (`backends.async_rollout`): up to `backends.max_staleness` batches are generated ahead
while this one is scored and trained. The engines run their calls in order, so a weight sync queued
after this step's update lands after the batches submitted before it: the batch a step trains on is
at most `max_staleness` updates behind. With `backends.partial_rollout` the sync instead lands between
two segments of the batch generating (`rl_engine.partial_rollout`). Every sample records the policy
versions it was generated under (`Sample.segments`), logged as the `staleness/*` distribution; the
off-policy gap as `kl/rollout_vs_policy` and the rollout correction's metrics. A checkpoint keeps the
batches generated ahead (`pending`), so a resumed run trains on exactly what it would have. See
docs/ARCHITECTURE.md, "Async mode".
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from posttrain_sdk.event_log import EventLog, Heartbeat
from posttrain_sdk.event_sender import sender_from_env
from rl_engine import sandbox
from rl_engine.algorithms import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    CorrectionInputs,
    CorrectionResult,
    dynamic_sampling_keep,
    kl_estimate,
    kl_penalized_rewards,
    masked_mean,
    overlong_penalty,
    rollout_correction,
)
from rl_engine.checkpoint import EngineState, capture_rng, load_engine_state, restore_rng, save_checkpoint
from rl_engine.components import (
    build_executor,
    build_reward_or_none,
    configure_threads,
    load_policy,
    load_tokenizer,
    load_trainable_policy,
    model_construction,
    partitioned_on_load,
    rollout_backend,
    trainer_class,
)
from rl_engine.config import RunConfig, check_runnable, dump_config
from rl_engine.data import Prompt, PromptData, PromptSampler
from rl_engine.devices import (
    gpu_memory_metrics,
    precision_for,
    resolve_device,
    use_device,
)
from rl_engine.executors import Rollouts
from rl_engine.interfaces import AsyncRolloutRole, ExecutorRole, LocalTrainer, RewardRole, RolloutRole, TrainerRole
from rl_engine.partial_rollout import mixed_seed
from rl_engine.preemption import Preempted, TimeLimitReached, clear_request, preemption_requested, time_limit_reason
from rl_engine.response_stats import step_response_metrics
from rl_engine.rewards import RewardBatch
from rl_engine.rewards.base import RewardResult
from rl_engine.rewards.loud import check_error_rates
from rl_engine.rollout import Sample, SamplingParams
from rl_engine.rollout_filters import apply_filters
from rl_engine.rollout_store import RolloutWriter, StepRollouts
from rl_engine.staleness import staleness_metrics
from rl_engine.trainer import Experience, TokenBatch, ValueModel, rollout_logprob_gap

if TYPE_CHECKING:
    from rl_engine.distributed import RayRoles


@dataclass
class StepTimer:
    timings: dict[str, float] = field(default_factory=dict)
    overlapped_generate: float | None = None  # async mode: generation seconds spent off the critical path

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - started


@dataclass
class Engine:
    """Everything a run holds between steps. With Ray roles (`roles`), `model` is None: the policy
    lives in the trainer ranks, and `trainer`, `rollout` and `reward` are the roles' proxies."""

    cfg: RunConfig
    tokenizer: Any
    model: torch.nn.Module | None
    trainer: TrainerRole  # TorchTrainer / DeepSpeedTrainer, or distributed.RayTrainer
    rollout: RolloutRole  # TransformersRollout / VLLMRollout, or distributed.RayRollout
    reward: RewardRole | None  # CompositeReward, or distributed.RayReward; None: the environment's only
    data: PromptData
    sampler: PromptSampler
    roles: RayRoles | None = None  # when the roles are actors
    # Async mode: the batches generated ahead, for the next steps in order.
    pending: deque[PendingRollout] = field(default_factory=deque)
    device: torch.device | None = None  # the one-process engine's (None with Ray roles: each has its own)
    # Single turn, an environment or an agent, over `rollout`: built from it after the fields above.
    executor: ExecutorRole = field(init=False)

    def __post_init__(self) -> None:
        self.executor = build_executor(self.cfg, self.rollout, self.tokenizer)

    def sync_weights(self) -> float:
        if self.roles is not None:
            return self.roles.sync_weights()
        trainer = cast(LocalTrainer, self.trainer)
        with trainer.full_weights():  # whole weights even when ZeRO-3 partitions them
            return self.rollout.sync_weights(trainer.weights_view())

    def save_checkpoint(self, run_dir: Path, step: int, state: EngineState) -> Path:
        keep = self.cfg.checkpoint.keep_last
        if self.roles is not None:
            return self.roles.trainer.save_checkpoint(run_dir, step, state, keep)
        trainer = cast(LocalTrainer, self.trainer)
        return save_checkpoint(
            run_dir,
            step,
            self.model,
            self.tokenizer,
            state,
            keep,
            weights=trainer.full_state_dict(),
            adapter=trainer.adapter_state_dict(),
        )

    def peak_memory(self) -> dict[str, float]:
        """Peak resident GiB of each role's process (with its children, e.g. vLLM's engine core)."""
        from rl_engine.distributed.process_stats import peak_rss_gb

        # With actors, the driver's children are a local Ray's own processes: the driver alone then.
        memory = {
            "memory/driver_peak_gb": peak_rss_gb(children=self.roles is None),
            **gpu_memory_metrics("driver", self.device),
        }
        if self.roles is not None:
            memory.update(self.roles.peak_memory_gb())
        elif hasattr(self.rollout, "gpu_memory_metrics"):  # an engine in processes of its own (vLLM)
            memory.update(self.rollout.gpu_memory_metrics())
        return memory

    def parameter_count(self) -> int:
        if self.roles is not None:
            return self.roles.trainer.parameter_count()
        assert self.model is not None  # the policy is in this process when no Ray roles hold it (build_engine)
        return sum(getattr(p, "ds_numel", p.numel()) for p in self.model.parameters())  # ZeRO-3: placeholders

    def close(self) -> None:
        try:
            self.executor.close()
            self.rollout.close()
            if self.reward is not None:
                self.reward.close()
        finally:
            if self.roles is not None:
                self.roles.close()


def build_engine(cfg: RunConfig, weights_from: Path | None = None) -> Engine:
    check_runnable(cfg)
    from rl_engine.lora import refuse_qlora_without_cuda

    refuse_qlora_without_cuda(cfg)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    tokenizer = load_tokenizer(cfg)
    from rl_engine.distributed import RayRoles, driver_gpus, uses_actors

    if uses_actors(cfg):
        data = PromptData.load(cfg.data, tokenizer, cfg.seed)
        roles = RayRoles(cfg, weights_from)
        return Engine(
            cfg=cfg,
            tokenizer=tokenizer,
            model=None,
            trainer=roles.trainer,
            rollout=roles.rollout,
            reward=roles.reward,
            data=data,
            sampler=PromptSampler(len(data.train), cfg.seed, cfg.data.shuffle),
            roles=roles,
        )
    # Every role in this process: the GPU Ray gave the job's driver, or the CPU.
    device = resolve_device(cfg, driver_gpus(cfg), "hybrid engine (every role in the driver)")
    refuse_qlora_without_cuda(cfg, device)
    use_device(device)
    precision = precision_for(cfg, device)
    place = None if partitioned_on_load(cfg) else device
    with model_construction(cfg, device):
        model = load_trainable_policy(cfg, weights_from, place, precision)
        ref_model = None
        if cfg.algorithm.kl.coef > 0:
            ref_model = load_policy(cfg.model.path, cfg, place, precision.compute).eval().requires_grad_(False)
        critic = None
        if cfg.algorithm.needs_critic:
            critic = ValueModel.from_pretrained(
                cfg.model.path,
                precision.master,
                cfg.model.trust_remote_code,
                device=place,
                gradient_checkpointing=cfg.model.gradient_checkpointing,
            )
    data = PromptData.load(cfg.data, tokenizer, cfg.seed)
    return Engine(
        cfg=cfg,
        tokenizer=tokenizer,
        model=model,
        trainer=trainer_class(cfg)(cfg, model, ref_model, critic, device=device),
        rollout=rollout_backend(cfg, tokenizer, model, weights_from, device=device, precision=precision),
        reward=build_reward_or_none(cfg, device),
        data=data,
        sampler=PromptSampler(len(data.train), cfg.seed, cfg.data.shuffle),
        device=device,
    )


# --- one step ------------------------------------------------------------------------------------


def _score(engine: Engine, prompts: list[Prompt], rollouts: Rollouts, texts: list[str]) -> RewardResult:
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


@dataclass
class Collected:
    """The collect stage's output: the step's prompts and trajectories, decoded."""

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
        sync(engine, step, timer)
        mask = batch.mask
        advantages_per_sample[batch.rows] = (advantages * mask).sum(1) / mask.sum(1).clamp(min=1)
        rollouts.rows, rollouts.response_attention = (
            batch.rows,
            batch.tokens.attention_mask[:, batch.tokens.prompt_width :],
        )
        rollouts.batch_tensors = update_tensors(batch, advantages, returns, correction)
        if "kl/loss_term" in metrics:
            metrics["kl/mean"] = metrics.pop("kl/loss_term")
        metrics["advantages/mean"] = float(masked_mean(advantages, mask))
        metrics["advantages/abs_mean"] = float(masked_mean(advantages.abs(), mask))
        train_tokens = float(batch.tokens.attention_mask.sum())
        metrics["throughput/train_tokens_per_s"] = train_tokens / max(timer.timings["train"], 1e-9)
    with timer.phase("record"):
        metrics.update(step_metrics(engine.cfg, collected, scored, timer))
        rollouts.records = sample_records(collected, scored, advantages_per_sample)
    metrics.update(timing_metrics(timer))
    metrics["timing/step"] = time.perf_counter() - started
    return metrics, rollouts


# --- the stages ------------------------------------------------------------------------------------


def collect(engine: Engine, step: int, timer: StepTimer) -> Collected:
    """Generate (or, async, take the batch generated during the last step), and decode it."""
    prompts, rollouts = _take_rollouts(engine, step, timer)
    samples = rollouts.samples
    texts = engine.tokenizer.batch_decode([s.response_ids for s in samples], skip_special_tokens=True)
    lengths = torch.tensor([s.action_count for s in samples], dtype=torch.float32)
    return Collected(prompts, rollouts, texts, lengths)


def score(engine: Engine, collected: Collected) -> Scored:
    """Rewards, reward shaping, and which rows train (dynamic sampling, then `rollout.filters`), with the
    responses' statistics (`rl_engine.response_stats`)."""
    alg, ro = engine.cfg.algorithm, engine.cfg.rollout
    reward = _score(engine, collected.prompts, collected.rollouts, collected.texts)
    check_error_rates(reward, {spec.name: spec.max_error_rate for spec in engine.cfg.rewards})  # loud, not silent
    task_scores = torch.tensor(reward.total, dtype=torch.float32)
    scores = task_scores.clone()
    if alg.overlong.enabled:
        scores = scores + overlong_penalty(
            collected.lengths, ro.max_new_tokens, alg.overlong.buffer_tokens, alg.overlong.penalty
        )
    keep = torch.ones(len(scores), dtype=torch.bool)
    if alg.dynamic_sampling:
        keep = dynamic_sampling_keep(scores, ro.samples_per_prompt).repeat_interleave(ro.samples_per_prompt)
    samples, vocab = collected.samples, len(engine.tokenizer)
    filtered = apply_filters(engine.cfg, collected.texts, samples, scores, keep, vocab)
    stats = step_response_metrics(
        collected.texts,
        [s.response_ids for s in samples],
        [s.prompt_index for s in samples],
        [s.logprobs for s in samples],
        vocab,
    )
    return Scored(reward, task_scores, scores, filtered.keep, {**filtered.metrics, **stats})


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


def step_metrics(cfg: RunConfig, collected: Collected, scored: Scored, timer: StepTimer) -> dict[str, float]:
    """The record stage's step metrics: rewards, lengths, throughput."""
    metrics = _rollout_metrics(
        scored.reward,
        scored.task_scores,
        scored.scores,
        collected.lengths,
        collected.samples,
        cfg.rollout.samples_per_prompt,
    )
    metrics["batch/kept_fraction"] = float(scored.keep.float().mean())
    metrics.update(environment_metrics(collected.prompts, collected.samples, scored.scores.tolist()))
    metrics.update(collected.rollouts.metrics())
    generate_s = timer.timings["generate"] if timer.overlapped_generate is None else timer.overlapped_generate
    metrics["throughput/tokens_per_s"] = float(collected.lengths.sum()) / max(generate_s, 1e-9)
    if timer.overlapped_generate is not None:
        metrics["rollout/overlapped_generate_s"] = timer.overlapped_generate
    return metrics


def environment_metrics(prompts: list[Prompt], samples: list[Sample], scores: list[float]) -> dict[str, float]:
    """`env/<name>/reward/mean` (and its samples and spread) for each environment of a mixed run: the rows' `env`
    field names it (the platform sets it when it mixes environments' datasets)."""
    by_env: dict[str, list[float]] = {}
    for sample, score in zip(samples, scores, strict=True):
        name = prompts[sample.prompt_index].metadata.get("env")
        if isinstance(name, str) and name and "/" not in name:
            by_env.setdefault(name, []).append(score)
    metrics: dict[str, float] = {}
    for name, values in sorted(by_env.items()):
        metrics[f"env/{name}/reward/mean"] = statistics.fmean(values)
        metrics[f"env/{name}/reward/std"] = statistics.pstdev(values)
        metrics[f"env/{name}/samples"] = float(len(values))
    return metrics


def sample_records(collected: Collected, scored: Scored, advantages: torch.Tensor) -> list[dict[str, Any]]:
    """The record stage's `samples` event: every sample with its text, rewards and advantage."""
    prompts, reward = collected.prompts, scored.reward
    records: list[dict[str, Any]] = [
        {
            "index": i,
            "group": s.prompt_index,
            "prompt": prompts[s.prompt_index].text,
            "response": collected.texts[i],
            "label": prompts[s.prompt_index].label,
            "reward": float(scored.scores[i]),
            "components": {name: values[i] for name, values in reward.components.items()},
            "advantage": float(advantages[i]),
            "length": int(collected.lengths[i]),
            "finish_reason": s.finish_reason,
            "errors": reward.errors[i],
            "kept": bool(scored.keep[i]),
        }
        for i, s in enumerate(collected.samples)
    ]
    for record, sample in zip(records, collected.samples):
        if sample.segments is not None:  # async mode: [version, tokens] per segment
            record["versions"] = [list(segment) for segment in sample.segments]
    rollouts = collected.rollouts
    if rollouts.turns is not None:
        episode_logs = rollouts.logs
        assert episode_logs is not None  # an executor that reports turns reports each episode's logs with them
        for record, turns, logs in zip(records, rollouts.turns, episode_logs):
            record["turns"], record["env"] = turns, logs
    return records


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


# Stages always reported (0 when they did not run this step), then the ones reported only when they ran.
_TIMED_ALWAYS = ("reward", "forward_policy", "train", "weight_sync")
_TIMED = (
    "generate",
    "environment",
    "reward",
    "forward_reference",
    "forward_policy",
    "forward_values",
    "advantages",
    "correction",
    "train",
    "weight_sync",
    "wait_rollout",
    "record",
)


def timing_metrics(timer: StepTimer) -> dict[str, float]:
    return {
        f"timing/{stage}": timer.timings.get(stage, 0.0)
        for stage in _TIMED
        if stage in timer.timings or stage in _TIMED_ALWAYS
    }


def _sampling_params(cfg: RunConfig, seed: int | None = None) -> SamplingParams:
    ro = cfg.rollout
    return SamplingParams(
        n=ro.samples_per_prompt,
        temperature=ro.temperature,
        top_p=ro.top_p,
        top_k=ro.top_k,
        max_new_tokens=ro.max_new_tokens,
        stop=tuple(ro.stop),
        seed=seed,
    )


@dataclass
class PendingRollout:
    """Async mode: a batch submitted to the rollout engines ahead of its step (`indices` into the
    training prompts); `handles` until it is collected, `samples` after."""

    step: int
    indices: list[int]
    handles: Any = None
    samples: list[Sample] | None = None
    seconds: float = 0.0

    def finish(self, rollout: AsyncRolloutRole) -> list[Sample]:
        """The batch's samples, waited for if they are not in yet."""
        if self.samples is None:
            self.samples, self.seconds = rollout.collect(self.handles)
            self.handles = None
        return self.samples

    def saved(self) -> dict[str, Any]:
        """What a checkpoint keeps of a finished batch."""
        return {"step": self.step, "indices": self.indices, "samples": self.samples, "seconds": self.seconds}


def saved_pending(engine: Engine) -> list[dict[str, Any]]:
    """Async mode: the batches generated ahead, waited for, as a checkpoint keeps them. The sampler has
    already drawn their prompts, so a resumed run that did not have them would skip those prompts."""
    if not engine.pending:
        return []
    rollout = cast(AsyncRolloutRole, engine.rollout)
    for pending in engine.pending:
        pending.finish(rollout)
    return [pending.saved() for pending in engine.pending]


def resume_pending(engine: Engine, state: EngineState) -> None:
    """Async mode on resume: the checkpoint's batches generated ahead come next, as they would have, and
    the engines (loaded with the checkpoint's weights) sample as policy version `state.step`."""
    engine.pending = deque(PendingRollout(**saved) for saved in state.pending)
    cast(AsyncRolloutRole, engine.rollout).set_policy_version(state.step)


def _take_rollouts(engine: Engine, step: int, timer: StepTimer) -> tuple[list[Prompt], Rollouts]:
    """This step's prompts and `Rollouts`. Sync: generated now. Async: the batch submitted during the
    previous step (finished before the last weight sync), and the next one submitted now, to be
    generated from the current weights while this one is scored and trained."""
    cfg = engine.cfg

    def next_prompts() -> list[Prompt]:
        return [engine.data.train[i] for i in engine.sampler.next_batch(cfg.rollout.prompts_per_step)]

    if not cfg.backends.async_rollout:
        prompts = next_prompts()
        with timer.phase("generate"):
            rollouts = engine.executor.run(prompts, _sampling_params(cfg))
            # A colocated engine gives its GPU memory back to the trainer until the weight sync.
            engine.rollout.sleep()
        if rollouts.env_seconds:  # the environment's share of the turns, as a phase of its own
            timer.timings["generate"] -= rollouts.env_seconds
            timer.timings["environment"] = rollouts.env_seconds
        return prompts, rollouts

    rollout = cast(AsyncRolloutRole, engine.rollout)

    def submit(for_step: int) -> PendingRollout:
        indices = engine.sampler.next_batch(cfg.rollout.prompts_per_step)
        # Each batch its own seed: what it draws depends on its step and weights, not on when it ran.
        params = _sampling_params(cfg, mixed_seed(cfg.seed, for_step))
        handles = rollout.submit([engine.data.train[i].token_ids for i in indices], params)
        return PendingRollout(for_step, indices, handles)

    if not engine.pending:  # nothing ahead on the first step
        engine.pending.append(submit(step))
    current = engine.pending.popleft()
    # Keep `max_staleness` batches ahead: the engines generate them while this step trains.
    while len(engine.pending) < cfg.backends.max_staleness and step + len(engine.pending) < cfg.train.steps:
        engine.pending.append(submit(step + len(engine.pending) + 1))
    with timer.phase("wait_rollout"):
        samples = current.finish(rollout)
    # The engines' own time, overlapped with the previous steps' work: not a phase of this step's critical
    # path (`timing/wait_rollout` is), reported as `rollout/overlapped_generate_s`.
    timer.overlapped_generate = current.seconds
    return [engine.data.train[i] for i in current.indices], Rollouts(samples)


# Rows whose log-probs get an eval forward of their own for `rollout/logprob_diff_*` when the training
# forward runs with dropout: a small no-grad pass (a few % of a step) is enough to watch for drift.
_GAP_SAMPLES = 16


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


def _rollout_metrics(
    reward: RewardResult,
    task_scores: torch.Tensor,
    scores: torch.Tensor,
    lengths: torch.Tensor,
    samples: list[Sample],
    group: int,
) -> dict[str, float]:
    grouped = task_scores.view(-1, group)
    metrics = {
        "reward/mean": float(scores.mean()),
        "reward/std": float(scores.std()) if len(scores) > 1 else 0.0,
        "reward/task_mean": float(task_scores.mean()),
        "reward/errors": float(sum(1 for e in reward.errors if e)),
        "reward/group_all_equal_rate": float((grouped.max(1).values == grouped.min(1).values).float().mean()),
        "response/length_mean": float(lengths.mean()),
        "response/length_max": float(lengths.max()),
        "response/length_min": float(lengths.min()),
        "response/truncated_rate": sum(s.finish_reason == "length" for s in samples) / len(samples),
    }
    for name, values in reward.components.items():
        metrics[f"reward/{name}"] = statistics.fmean(values)
    for key, value in reward.extra_logs.items():
        metrics[f"reward/{key}"] = float(value)
    for name, seconds in reward.timings.items():
        metrics[f"timing/reward/{name}"] = seconds
    return metrics


def evaluate(engine: Engine, prompts: list[Prompt], max_new_tokens: int, batch_size: int = 256) -> dict[str, float]:
    """Greedy decoding on held-out prompts (whole episodes when an environment runs), scored with the
    run's own rewards."""
    params = SamplingParams(n=1, max_new_tokens=max_new_tokens, stop=tuple(engine.cfg.rollout.stop), greedy=True)
    totals: list[float] = []
    components: dict[str, list[float]] = {}
    lengths: list[float] = []
    env_logs: list[dict[str, float]] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        rollouts = engine.executor.run(chunk, params)
        env_logs.extend(rollouts.logs or [])
        texts = engine.tokenizer.batch_decode([s.response_ids for s in rollouts.samples], skip_special_tokens=True)
        result = _score(engine, chunk, rollouts, texts)
        totals.extend(result.total)
        for name, values in result.components.items():
            components.setdefault(name, []).extend(values)
        lengths.extend(s.action_count for s in rollouts.samples)
    metrics = {
        "eval/reward/mean": statistics.fmean(totals),
        "eval/response/length_mean": statistics.fmean(lengths),
        "eval/size": float(len(prompts)),
    }
    for name, values in components.items():
        metrics[f"eval/reward/{name}"] = statistics.fmean(values)
    for name in sorted({k for log in env_logs for k in log}):
        metrics[f"eval/env/{name}"] = statistics.fmean(log[name] for log in env_logs if name in log)
    return metrics


# --- the run -------------------------------------------------------------------------------------


def train(
    cfg: RunConfig, run_dir: Path, *, resume: Path | None = None, run_id: str | None = None, progress: bool = False
) -> dict[str, float]:
    """Runs (or resumes) a whole run into `run_dir`; returns the last metrics (eval ones included)."""
    configure_threads()
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    sink = EventLog(run_dir, run_id or os.environ.get("POSTTRAIN_RUN_ID") or run_dir.name)
    sender = sender_from_env(sink)  # the platform's run: POSTTRAIN_EVENTS_URL set, events POSTed in batches
    engine: Engine | None = None
    writer: RolloutWriter | None = None
    try:
        with Heartbeat(sink, cfg.logging.heartbeat_s) as heartbeat:
            sink.emit("status", {"state": "running", "resumed_from": str(resume) if resume else None})
            require_sandbox(cfg, sink)
            engine = build_engine(cfg, weights_from=resume)
            writer = rollout_writer(engine, run_dir, sink)
            try:
                return _run(engine, run_dir, sink, heartbeat, resume, progress, writer)
            finally:
                if writer is not None:
                    writer.close()  # every step's file written and announced before the final status
    except Preempted:
        raise  # its `preempted` status event is out: not a failure
    except BaseException as exc:
        reason = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"{type(exc).__name__}: {exc}"
        sink.emit("status", {"state": "failed", "reason": reason[:2000]})
        raise
    finally:
        try:
            if engine is not None:
                engine.close()
        finally:
            sink.close()
            if sender is not None:
                sender.finish()  # bounded wait until the platform acknowledged every event


def rollout_writer(engine: Engine, run_dir: Path, sink: EventLog) -> RolloutWriter | None:
    """The writer of the run's rollout files (`logging.rollouts_dir`, default `<run dir>/rollouts`), or
    None when the run records no rollouts (`logging.samples: none`)."""
    logging_cfg = engine.cfg.logging
    if logging_cfg.samples != "all":
        return None
    return RolloutWriter(
        sink,
        logging_cfg.rollouts_dir or str(run_dir / "rollouts"),
        logging_cfg.rollouts_keep,
        tokenizer=engine.tokenizer,
        metadata={"run": sink.run_id, "pad_token_id": str(engine.rollout.pad_id)},
    )


def runs_user_code(cfg: RunConfig) -> bool:
    """Python rewards, an installed package's scoring, an environment or an agent command: code that runs in
    the sandbox."""
    return (
        any(spec.type in ("python", "reasoning_gym", "verifiers") for spec in cfg.rewards)
        or cfg.environment is not None
        or bool(cfg.agent is not None and cfg.agent.command)
    )


def require_sandbox(cfg: RunConfig, sink: EventLog) -> None:
    """A run with user code starts only where a sandbox can be made (SandboxUnavailable says what to
    install), or where an admin allowed unsandboxed code, which the run's log then says."""
    if runs_user_code(cfg) and not sandbox.require():
        sink.emit(
            "log",
            {
                "level": "warning",
                "message": f"user code runs WITHOUT a sandbox ({sandbox.ALLOW_UNSANDBOXED_ENV} is set)",
            },
            step=0,
        )


def _run(
    engine: Engine,
    run_dir: Path,
    sink: EventLog,
    heartbeat: Heartbeat,
    resume: Path | None,
    progress: bool,
    writer: RolloutWriter | None = None,
) -> dict[str, float]:
    cfg = engine.cfg
    counters = {"progress/samples": 0.0, "progress/tokens": 0.0, "progress/train_time_s": 0.0}
    first_step = 1
    if resume is not None:
        state = load_engine_state(resume)
        engine.trainer.load_state_dict(state.trainer)
        engine.sampler.load_state_dict(state.sampler)
        restore_rng(state.rng)
        counters.update(state.metrics_so_far)
        first_step = state.step + 1
        if cfg.backends.async_rollout:
            resume_pending(engine, state)
    else:
        sink.emit("log", {"level": "info", "message": _describe(engine)}, step=0)

    eval_tokens = cfg.logging.eval_max_new_tokens or cfg.rollout.max_new_tokens
    eval_prompts = engine.data.eval[: cfg.logging.eval_size]
    if first_step == 1 and eval_prompts and cfg.logging.eval_every > 0:
        sink.emit("metrics", {**evaluate(engine, eval_prompts, eval_tokens), **counters}, step=0)

    last: dict[str, float] = {}
    steps = range(first_step, cfg.train.steps + 1)
    bar = _progress_bar(steps, progress, cfg.train.steps, first_step)
    for step in bar:
        heartbeat.step = step
        metrics, rollouts = run_step(engine, step)
        counters["progress/samples"] += len(rollouts.records)
        counters["progress/tokens"] += sum(r["length"] for r in rollouts.records)
        counters["progress/train_time_s"] += metrics["timing/step"]
        metrics.update(counters)
        metrics["progress/epoch"] = counters["progress/samples"] / (
            cfg.rollout.samples_per_prompt * len(engine.data.train)
        )
        metrics.update(engine.peak_memory())
        due_eval = cfg.logging.eval_every > 0 and (step % cfg.logging.eval_every == 0 or step == cfg.train.steps)
        if due_eval and eval_prompts:
            started = time.perf_counter()
            metrics.update(evaluate(engine, eval_prompts, eval_tokens))
            metrics["timing/eval"] = time.perf_counter() - started
        sink.emit("metrics", metrics, step=step)
        if writer is not None:
            writer.submit(rollouts)
        if hasattr(bar, "set_postfix"):
            bar.set_postfix(
                reward=f"{metrics['reward/mean']:.3f}",
                **({"eval": f"{metrics['eval/reward/mean']:.3f}"} if "eval/reward/mean" in metrics else {}),
            )
        due_ckpt = (cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0) or (
            step == cfg.train.steps and cfg.checkpoint.save_final
        )
        path = _checkpoint(engine, run_dir, sink, step, counters, writer) if due_ckpt else None
        last = metrics
        preempt = preemption_requested(run_dir) if step < cfg.train.steps else None
        if preempt is not None:
            # The scheduler needs the room: stop at this boundary with a checkpoint to resume from exactly.
            path = path or _checkpoint(engine, run_dir, sink, step, counters, writer)
            clear_request(run_dir)
            sink.emit(
                "status",
                {
                    "state": "preempted",
                    "reason": f"checkpointed after step {step} ({preempt})",
                    "checkpoint": str(path),
                },
                step=step,
            )
            raise Preempted(step, path)
        over = time_limit_reason(counters["progress/train_time_s"], cfg.train.max_wall_s, step)
        if over is not None and step < cfg.train.steps:
            path = path or _checkpoint(engine, run_dir, sink, step, counters, writer)
            sink.emit("status", {"state": "failed", "reason": over, "checkpoint": str(path)}, step=step)
            raise TimeLimitReached(step, path)
    if writer is not None:
        writer.flush()  # the last steps' files are announced before the final status, never after it
    sink.emit("status", {"state": "succeeded"}, step=cfg.train.steps)
    return last


def _checkpoint(
    engine: Engine,
    run_dir: Path,
    sink: EventLog,
    step: int,
    counters: dict[str, float],
    writer: RolloutWriter | None = None,
) -> Path:
    state = EngineState(
        step=step,
        trainer=engine.trainer.state_dict(),
        sampler=engine.sampler.state_dict(),
        rng=capture_rng(),
        metrics_so_far=dict(counters),
        pending=saved_pending(engine),
    )
    path = engine.save_checkpoint(run_dir, step, state)
    if writer is not None:
        # The rollout files of every step up to here are announced before the checkpoint: a run resumed
        # from it leaves no step without its file (the writer ran while the checkpoint was saved).
        writer.flush()
    sink.emit("checkpoint", {"path": str(path), "format": "hf"}, step=step)
    return path


def _describe(engine: Engine) -> str:
    data = engine.data
    policy = type(engine.model).__name__ if engine.model is not None else "policy"
    text = (
        f"policy {policy} with {engine.parameter_count():,} parameters; {len(data.train)} training prompts, "
        f"{len(data.eval)} held-out"
    )
    if engine.roles is not None:
        text += f"; {engine.roles.describe()}"
    if hasattr(engine.executor, "describe"):
        text += f"; {engine.executor.describe()}"
    if data.dropped_too_long:
        text += f"; dropped {data.dropped_too_long} prompts longer than data.max_prompt_tokens"
    return text


def _progress_bar(steps: range, enabled: bool, total: int, first: int):
    if not enabled:
        return steps
    from tqdm import tqdm

    return tqdm(steps, total=total, initial=first - 1, desc="train", unit="step")
