"""The training loop: generate → score → (reference / critic / old-policy forward) → advantages → update
→ weight sync, every phase timed and emitted as `timing/<phase>`; all rollout samples emitted per step.

One `Experience` record drives both the update and the logging. The loop is backend-agnostic: it
talks to a `RolloutBackend`, a trainer and a reward; this module wires the one-process ones, and
`rl_engine.distributed` the same calls onto Ray actors (several engines or ranks, `separate` placement).

Async mode (`backends.async_rollout`): the next batch is generated while this one is scored and
trained, from the weights before this update (staleness bounded by one step); the weight sync waits
for that batch to finish, so a sync never lands in a half-generated batch. The off-policy gap is
logged as `kl/rollout_vs_policy`.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch

from posttrain_sdk.event_log import EventLog, Heartbeat
from posttrain_sdk.event_sender import sender_from_env
from rl_engine import sandbox
from rl_engine.algorithms import (
    GROUP_ESTIMATORS,
    dynamic_sampling_keep,
    gae,
    grpo_advantages,
    kl_estimate,
    kl_penalized_rewards,
    masked_mean,
    masked_whiten,
    overlong_penalty,
    reinforce_pp_advantages,
)
from rl_engine.checkpoint import EngineState, capture_rng, load_engine_state, restore_rng, save_checkpoint
from rl_engine.config import RunConfig, check_runnable, dump_config
from rl_engine.data import Prompt, PromptData, PromptSampler
from rl_engine.rewards import CompositeReward, RewardBatch, build_reward
from rl_engine.rewards.base import RewardResult
from rl_engine.rollout import RolloutBackend, Sample, SamplingParams, TransformersRollout
from rl_engine.trainer import DTYPES, Experience, TokenBatch, TorchTrainer, ValueModel, rollout_logprob_gap


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
    trainer: Any  # TorchTrainer, or distributed.RayTrainer
    rollout: Any  # RolloutBackend, or distributed.RayRollout
    reward: Any  # CompositeReward, or distributed.RayReward
    data: PromptData
    sampler: PromptSampler
    roles: Any = None  # distributed.RayRoles when the roles are actors
    pending: Any = None  # async mode: the batch being generated for the next step
    executor: Any = None  # executors.SingleTurnExecutor / EnvironmentExecutor over `rollout`

    def __post_init__(self) -> None:
        if self.executor is None:
            self.executor = build_executor(self.cfg, self.rollout, self.tokenizer)

    def sync_weights(self) -> float:
        if self.roles is not None:
            return self.roles.sync_weights()
        with self.trainer.full_weights():  # whole weights even when ZeRO-3 partitions them
            return self.rollout.sync_weights(self.trainer.weights_view())

    def save_checkpoint(self, run_dir: Path, step: int, state: EngineState) -> Path:
        keep = self.cfg.checkpoint.keep_last
        if self.roles is not None:
            return self.trainer.save_checkpoint(run_dir, step, state, keep)
        return save_checkpoint(
            run_dir,
            step,
            self.model,
            self.tokenizer,
            state,
            keep,
            weights=self.trainer.full_state_dict(),
            adapter=self.trainer.adapter_state_dict(),
        )

    def peak_memory(self) -> dict[str, float]:
        """Peak resident GiB of each role's process (with its children, e.g. vLLM's engine core)."""
        from rl_engine.distributed.process_stats import peak_rss_gb

        # With actors, the driver's children are a local Ray's own processes: the driver alone then.
        memory = {"memory/driver_peak_gb": peak_rss_gb(children=self.roles is None)}
        if self.roles is not None:
            memory.update(self.roles.peak_memory_gb())
        return memory

    def parameter_count(self) -> int:
        if self.model is None:
            return self.trainer.parameter_count()
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


def build_executor(cfg: RunConfig, rollout: Any, tokenizer: Any) -> Any:
    from rl_engine.executors import EnvironmentExecutor, SingleTurnExecutor

    if cfg.agent is not None:
        from rl_engine.agent_endpoint import AgentExecutor

        return AgentExecutor(rollout, tokenizer, cfg)
    if cfg.environment is not None:
        return EnvironmentExecutor(rollout, tokenizer, cfg.environment)
    return SingleTurnExecutor(rollout)


def build_reward_or_none(cfg: RunConfig) -> CompositeReward | None:
    """The configured reward components; None when an environment gives the only reward."""
    return build_reward([spec.model_dump() for spec in cfg.rewards]) if cfg.rewards else None


def load_tokenizer(cfg: RunConfig) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        cfg.model.tokenizer_path or cfg.model.path, trust_remote_code=cfg.model.trust_remote_code
    )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_policy(path: str | Path, cfg: RunConfig) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=DTYPES[cfg.model.dtype], trust_remote_code=cfg.model.trust_remote_code
    )
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return model


def load_trainable_policy(cfg: RunConfig, weights_from: Path | None) -> torch.nn.Module:
    """The policy that trains: the model (or a checkpoint's weights), or with LoRA the base model with
    fresh adapters (or a checkpoint's adapter)."""
    from rl_engine import lora

    if not lora.enabled(cfg):
        return load_policy(weights_from or cfg.model.path, cfg)
    # On resume the base is still the model (a checkpoint's folder holds the merged weights).
    quantized = cfg.model.lora.quantize_base == "4bit"
    base = lora.load_quantized_base(cfg.model.path, cfg) if quantized else load_policy(cfg.model.path, cfg)
    model = lora.apply_lora(base, cfg)
    if weights_from is not None:
        lora.load_adapter(model, weights_from)
    return model


def build_engine(cfg: RunConfig, weights_from: Path | None = None) -> Engine:
    check_runnable(cfg)
    from rl_engine.lora import refuse_qlora_without_cuda

    refuse_qlora_without_cuda(cfg)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    tokenizer = load_tokenizer(cfg)
    from rl_engine.distributed import RayRoles, uses_actors

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
    with model_construction(cfg):
        model = load_trainable_policy(cfg, weights_from)
        ref_model = None
        if cfg.algorithm.kl.coef > 0:
            ref_model = load_policy(cfg.model.path, cfg).eval().requires_grad_(False)
        critic = None
        if cfg.algorithm.needs_critic:
            critic = ValueModel.from_pretrained(cfg.model.path, DTYPES[cfg.model.dtype], cfg.model.trust_remote_code)
    data = PromptData.load(cfg.data, tokenizer, cfg.seed)
    return Engine(
        cfg=cfg,
        tokenizer=tokenizer,
        model=model,
        trainer=trainer_class(cfg)(cfg, model, ref_model, critic),
        rollout=rollout_backend(cfg, tokenizer, model, weights_from),
        reward=build_reward_or_none(cfg),
        data=data,
        sampler=PromptSampler(len(data.train), cfg.seed, cfg.data.shuffle),
    )


def model_construction(cfg: RunConfig) -> AbstractContextManager[None]:
    """Where the models are loaded: partitioned as they load under DeepSpeed ZeRO-3."""
    if cfg.backends.training != "deepspeed":
        return nullcontext()
    from rl_engine.backends.deepspeed_trainer import model_construction  # deepspeed only when chosen

    return model_construction(cfg)


def trainer_class(cfg: RunConfig) -> type[TorchTrainer]:
    if cfg.backends.training == "deepspeed":
        from rl_engine.backends.deepspeed_trainer import DeepSpeedTrainer

        return DeepSpeedTrainer
    return TorchTrainer


def rollout_backend(
    cfg: RunConfig, tokenizer: Any, model: torch.nn.Module | None, weights_from: Path | None, engine_index: int = 0
) -> RolloutBackend:
    """The generation engine; `model` is the policy module (shared by the transformers backend), None
    in a rollout actor, which always runs vLLM through here (`engine_index` = the actor's place)."""
    if cfg.backends.rollout != "vllm":
        return TransformersRollout(model, tokenizer)
    from rl_engine.backends.vllm_rollout import VLLMRollout  # vllm only when chosen

    # Room for the longest prompt plus the longest response, within what the model's positions allow.
    response = max(cfg.rollout.max_new_tokens, cfg.logging.eval_max_new_tokens or 0)
    longest = cfg.data.max_prompt_tokens + response
    if cfg.environment is not None:  # every turn's action and observation stay in the context
        env = cfg.environment
        longest += (env.max_turns + 1) * (response + env.max_observation_tokens)
    if model is None:
        from transformers import AutoConfig

        model_config = AutoConfig.from_pretrained(
            str(weights_from or cfg.model.path), trust_remote_code=cfg.model.trust_remote_code
        )
    else:
        model_config = model.config
    positions = getattr(model_config, "max_position_embeddings", None) or longest
    # On resume the engine starts from the checkpoint's weights, as the policy does.
    return VLLMRollout(
        weights_from or cfg.model.path,
        tokenizer,
        tokenizer_path=cfg.model.tokenizer_path or cfg.model.path,
        dtype=cfg.model.dtype,
        seed=cfg.seed,
        max_model_len=min(longest, positions),
        kv_cache_gb=cfg.backends.vllm_kv_cache_gb,
        trust_remote_code=cfg.model.trust_remote_code,
        engine_index=engine_index,
        takes_turns=model is not None,
    )


# --- one step ------------------------------------------------------------------------------------


def _score(engine: Engine, prompts: list[Prompt], rollouts: Any, texts: list[str]) -> RewardResult:
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
        result.errors = [errors + env for errors, env in zip(result.errors, rollouts.errors)]
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


def _advantages(
    cfg: RunConfig,
    scores: torch.Tensor,
    mask: torch.Tensor,
    token_rewards: torch.Tensor | None,
    values: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    alg = cfg.algorithm
    group = cfg.rollout.samples_per_prompt
    if alg.name == "ppo":
        advantages, returns = gae(token_rewards, values, mask, alg.gamma, alg.lam)
        return masked_whiten(advantages, mask), returns
    if alg.name == "reinforce_pp":
        return reinforce_pp_advantages(token_rewards if token_rewards is not None else scores, mask, alg.gamma), None
    if alg.name == "grpo" and alg.normalize_advantage_std is not None:
        return grpo_advantages(scores, mask, group, normalize_std=alg.normalize_advantage_std), None
    return GROUP_ESTIMATORS[alg.name](scores, mask, group), None


def run_step(engine: Engine, step: int) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """One RL step. Returns its metrics and every rollout sample (for the `samples` event)."""
    cfg, tokenizer, trainer = engine.cfg, engine.tokenizer, engine.trainer
    alg, ro = cfg.algorithm, cfg.rollout
    timer = StepTimer()
    started = time.perf_counter()

    prompts, rollouts = _take_rollouts(engine, step, timer)
    samples = rollouts.samples
    texts = tokenizer.batch_decode([s.response_ids for s in samples], skip_special_tokens=True)
    lengths = torch.tensor([s.action_count for s in samples], dtype=torch.float32)

    with timer.phase("reward"):
        reward = _score(engine, prompts, rollouts, texts)
    task_scores = torch.tensor(reward.total, dtype=torch.float32)
    scores = task_scores.clone()
    if alg.overlong.enabled:
        scores = scores + overlong_penalty(lengths, ro.max_new_tokens, alg.overlong.buffer_tokens, alg.overlong.penalty)

    keep = torch.ones(len(samples), dtype=torch.bool)
    if alg.dynamic_sampling:
        keep = dynamic_sampling_keep(scores, ro.samples_per_prompt).repeat_interleave(ro.samples_per_prompt)

    metrics: dict[str, float] = {}
    advantages_per_sample = torch.zeros(len(samples))
    kept = keep.nonzero().squeeze(-1)
    if len(kept) > 0:
        batch = TokenBatch.build(
            [prompts[samples[i].prompt_index].token_ids for i in kept],
            [samples[i].response_ids for i in kept],
            engine.rollout.pad_id,
            [samples[i].action_mask for i in kept],
        )
        mask = batch.response_mask
        kept_scores = scores[kept]
        single_update = cfg.train.epochs_per_batch == 1 and (cfg.train.mini_batch_size or len(kept)) >= len(kept)
        kl_in_reward = alg.kl.coef > 0 and alg.kl.placement == "reward"
        ref = old = values = None
        if trainer.ref_model is not None:
            with timer.phase("forward_reference"):
                ref = trainer.forward(batch, "reference")
        with timer.phase("forward_policy"):
            # With one update per batch the old policy is the current one: its log-probs come free
            # from the training forward pass (ratio exactly 1), so the extra pass is skipped — except
            # in async mode, where they measure how far the samples' policy is behind.
            if not single_update or kl_in_reward or cfg.backends.async_rollout:
                old = trainer.forward(batch, "policy")
            engine_logprobs = _engine_logprobs([samples[i] for i in kept], mask)
            if engine_logprobs is not None and old is not None:
                metrics.update(rollout_logprob_gap(engine_logprobs, old, mask))
            elif engine_logprobs is not None and not trainer.exact_training_logprobs:
                # Dropout makes the training forward's log-probs differ from the engine's by design:
                # a few rows get an eval forward of their own.
                rows = slice(0, _GAP_SAMPLES)
                metrics.update(
                    rollout_logprob_gap(
                        engine_logprobs[rows], trainer.forward(batch.select(rows), "policy"), mask[rows]
                    )
                )
        if trainer.critic is not None:
            with timer.phase("forward_values"):
                values = trainer.forward(batch, "values")
        token_rewards = None
        if kl_in_reward:
            kl = kl_estimate(old, ref, alg.kl.estimator, mask)
            token_rewards = kl_penalized_rewards(kept_scores, kl, mask, alg.kl.coef)
            metrics["kl/mean"] = float(masked_mean(kl, mask))
        elif alg.name in ("ppo", "reinforce_pp"):
            token_rewards = kl_penalized_rewards(kept_scores, torch.zeros_like(mask), mask, 0.0)
        advantages, returns = _advantages(cfg, kept_scores, mask, token_rewards, values)
        advantages_per_sample[kept] = (advantages * mask).sum(1) / mask.sum(1).clamp(min=1)
        # Without old log-probs the engine's are checked against the training forward's, every row, free.
        experience = Experience(
            batch,
            advantages,
            old,
            ref if alg.kl.placement == "loss" else None,
            values,
            returns,
            engine_logprobs if old is None else None,
        )
        with timer.phase("train"):
            metrics.update(trainer.update(experience))
        if engine.pending is not None:
            # Async: the next batch finishes generating from the weights it started with before they change.
            with timer.phase("wait_rollout"):
                engine.pending.finish(engine.rollout)
        with timer.phase("weight_sync"):
            engine.sync_weights()
        if "kl/loss_term" in metrics:
            metrics["kl/mean"] = metrics.pop("kl/loss_term")
        metrics["advantages/mean"] = float(masked_mean(advantages, mask))
        metrics["advantages/abs_mean"] = float(masked_mean(advantages.abs(), mask))
        train_tokens = float(batch.attention_mask.sum())
        metrics["throughput/train_tokens_per_s"] = train_tokens / max(timer.timings["train"], 1e-9)

    generated_tokens = float(lengths.sum())
    metrics.update(_rollout_metrics(reward, task_scores, scores, lengths, samples, ro.samples_per_prompt))
    metrics["batch/kept_fraction"] = float(keep.float().mean())
    metrics.update(rollouts.metrics())
    generate_s = timer.timings["generate"] if timer.overlapped_generate is None else timer.overlapped_generate
    metrics["throughput/tokens_per_s"] = generated_tokens / max(generate_s, 1e-9)
    if timer.overlapped_generate is not None:
        metrics["rollout/overlapped_generate_s"] = timer.overlapped_generate
    for phase in (
        "generate",
        "environment",
        "reward",
        "forward_reference",
        "forward_policy",
        "forward_values",
        "train",
        "weight_sync",
        "wait_rollout",
    ):
        if phase in timer.timings or phase in ("reward", "forward_policy", "train", "weight_sync"):
            metrics[f"timing/{phase}"] = timer.timings.get(phase, 0.0)
    metrics["timing/step"] = time.perf_counter() - started

    records = [
        {
            "index": i,
            "group": s.prompt_index,
            "prompt": prompts[s.prompt_index].text,
            "response": texts[i],
            "label": prompts[s.prompt_index].label,
            "reward": float(scores[i]),
            "components": {name: values[i] for name, values in reward.components.items()},
            "advantage": float(advantages_per_sample[i]),
            "length": int(lengths[i]),
            "finish_reason": s.finish_reason,
            "errors": reward.errors[i],
            "kept": bool(keep[i]),
        }
        for i, s in enumerate(samples)
    ]
    if rollouts.turns is not None:
        for record, turns, logs in zip(records, rollouts.turns, rollouts.logs):
            record["turns"], record["env"] = turns, logs
    return metrics, records


def _sampling_params(cfg: RunConfig) -> SamplingParams:
    ro = cfg.rollout
    return SamplingParams(
        n=ro.samples_per_prompt,
        temperature=ro.temperature,
        top_p=ro.top_p,
        top_k=ro.top_k,
        max_new_tokens=ro.max_new_tokens,
        stop=tuple(ro.stop),
    )


@dataclass
class PendingRollout:
    """Async mode: a batch submitted to the rollout engines ahead of its step."""

    prompts: list[Prompt]
    handles: Any
    samples: list[Sample] | None = None
    seconds: float = 0.0

    def finish(self, rollout: Any) -> None:
        if self.samples is None:
            self.samples, self.seconds = rollout.collect(self.handles)


def _take_rollouts(engine: Engine, step: int, timer: StepTimer) -> tuple[list[Prompt], Any]:
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
        if rollouts.env_seconds:  # the environment's share of the turns, as a phase of its own
            timer.timings["generate"] -= rollouts.env_seconds
            timer.timings["environment"] = rollouts.env_seconds
        return prompts, rollouts

    def submit() -> PendingRollout:
        prompts = next_prompts()
        return PendingRollout(prompts, engine.rollout.submit([p.token_ids for p in prompts], _sampling_params(cfg)))

    current = engine.pending or submit()  # none ahead on the first step (or the first after a resume)
    engine.pending = None
    with timer.phase("wait_rollout"):
        current.finish(engine.rollout)
    # The engines' own time, overlapped with the previous step's work: not a phase of this step's critical
    # path (`timing/wait_rollout` is), reported as `rollout/overlapped_generate_s`.
    timer.overlapped_generate = current.seconds
    if step < cfg.train.steps:
        engine.pending = submit()
    from rl_engine.executors import Rollouts

    return current.prompts, Rollouts(current.samples)


# Rows whose log-probs get an eval forward of their own for `rollout/logprob_diff_*` when the training
# forward runs with dropout: a small no-grad pass (a few % of a step) is enough to watch for drift.
_GAP_SAMPLES = 16


def _engine_logprobs(samples: list[Sample], mask: torch.Tensor) -> torch.Tensor | None:
    """The rollout engine's log-probs of the sampled tokens as a `[B, T]` tensor shaped like `mask`; None
    when the backend reports none (transformers samples from the trained module itself)."""
    if not samples or any(s.logprobs is None for s in samples):
        return None
    engine = torch.zeros_like(mask)
    for row, sample in enumerate(samples):
        engine[row, : len(sample.logprobs)] = torch.tensor(sample.logprobs, dtype=mask.dtype)
    return engine


def _rollout_metrics(
    reward: Any,
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


def configure_threads() -> None:
    threads = int(os.environ.get("OMP_NUM_THREADS", "0") or 0)
    if threads > 0:
        torch.set_num_threads(threads)


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
    try:
        with Heartbeat(sink, cfg.logging.heartbeat_s) as heartbeat:
            sink.emit("status", {"state": "running", "resumed_from": str(resume) if resume else None})
            require_sandbox(cfg, sink)
            engine = build_engine(cfg, weights_from=resume)
            return _run(engine, run_dir, sink, heartbeat, resume, progress)
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


def runs_user_code(cfg: RunConfig) -> bool:
    """Python rewards, an environment or an agent command: code that runs in the sandbox."""
    return (
        any(spec.type == "python" for spec in cfg.rewards)
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
    engine: Engine, run_dir: Path, sink: EventLog, heartbeat: Heartbeat, resume: Path | None, progress: bool
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
        metrics, records = run_step(engine, step)
        counters["progress/samples"] += len(records)
        counters["progress/tokens"] += sum(r["length"] for r in records)
        counters["progress/train_time_s"] += metrics["timing/step"]
        metrics.update(counters)
        metrics.update(engine.peak_memory())
        due_eval = cfg.logging.eval_every > 0 and (step % cfg.logging.eval_every == 0 or step == cfg.train.steps)
        if due_eval and eval_prompts:
            started = time.perf_counter()
            metrics.update(evaluate(engine, eval_prompts, eval_tokens))
            metrics["timing/eval"] = time.perf_counter() - started
        sink.emit("metrics", metrics, step=step)
        if cfg.logging.samples == "all":
            sink.emit("samples", {"samples": records}, step=step)
        if hasattr(bar, "set_postfix"):
            bar.set_postfix(
                reward=f"{metrics['reward/mean']:.3f}",
                **({"eval": f"{metrics['eval/reward/mean']:.3f}"} if "eval/reward/mean" in metrics else {}),
            )
        due_ckpt = (cfg.checkpoint.every_steps and step % cfg.checkpoint.every_steps == 0) or (
            step == cfg.train.steps and cfg.checkpoint.save_final
        )
        if due_ckpt:
            state = EngineState(
                step=step,
                trainer=engine.trainer.state_dict(),
                sampler=engine.sampler.state_dict(),
                rng=capture_rng(),
                metrics_so_far=dict(counters),
            )
            path = engine.save_checkpoint(run_dir, step, state)
            sink.emit("checkpoint", {"path": str(path), "format": "hf"}, step=step)
        last = metrics
    sink.emit("status", {"state": "succeeded"}, step=cfg.train.steps)
    return last


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
