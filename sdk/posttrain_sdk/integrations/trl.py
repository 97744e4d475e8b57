"""TRL: stream a GRPOTrainer (or RLOOTrainer) run into Posttrain as an external run.

    from posttrain_sdk.integrations.trl import PosttrainCallback

    trainer = GRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(..., logging_steps=1), ...)
    trainer.add_callback(PosttrainCallback(trainer, experiment="gsm8k-grpo", project="math"))
    trainer.train()

`experiment` groups the runs (made on first use); `project` is the Posttrain project (default:
POSTTRAIN_PROJECT, else `posttrain projects use`'s, else the one you can create in).

Each of TRL's log calls becomes one metrics event at `state.global_step`, its names renamed to
Posttrain's (posttrain_sdk.metric_names.TRL: reward -> reward/mean, kl -> kl/mean, ...), so the run
page's panels and diagnostics read them. The completions TRL keeps for its own completions table
(the latest generation batch: prompt, completion, each reward function's score, advantage) become
the step's samples, with the weighted total as the reward and one group per prompt. Only the main
process logs. Importing this module needs transformers (TRL brings it).
"""

from __future__ import annotations

import math
from typing import Any

from transformers import TrainerCallback

from posttrain_sdk.metric_names import trl_name
from posttrain_sdk.tracking import TrackedRun, as_text, init

_NOT_METRICS = frozenset({"total_flos"})  # a count of operations, not a training curve


class PosttrainCallback(TrainerCallback):
    def __init__(
        self,
        trainer: Any = None,
        *,
        experiment: str,
        project: str | int | None = None,
        name: str | None = None,
        config: dict[str, Any] | None = None,
        log_samples: bool = True,
        **init_kwargs: Any,
    ):
        """`trainer` gives the callback TRL's logged completions (without it only metrics go);
        `init_kwargs` go to posttrain_sdk.init (url, token, tags, note, dir, heartbeat_s, ...)."""
        self.trainer = trainer
        self.experiment = experiment
        self.project = project
        self.name = name
        self.extra_config = config or {}
        self.send_samples = log_samples
        self.init_kwargs = {"engine": "trl", **init_kwargs}
        self.run: TrackedRun | None = None
        self._last_completions: list[Any] | None = None

    # -- the trainer's events -----------------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero or self.run is not None:
            return
        config = {**args.to_dict(), **self.extra_config}
        if self.trainer is not None:
            config.setdefault("trainer", type(self.trainer).__name__)
            model = getattr(self.trainer, "model", None)
            config.setdefault("model_name_or_path", getattr(getattr(model, "config", None), "_name_or_path", None))
        self.run = init(
            self.experiment,
            self.name or (args.run_name if args.run_name != args.output_dir else None),
            config,
            project=self.project,
            total_steps=state.max_steps or None,
            **self.init_kwargs,
        )

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if self.run is None or not logs:
            return
        metrics = {}
        for key, value in logs.items():
            if key in _NOT_METRICS or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue  # TRL logs a few strings and None for metrics with no valid value
            metrics[trl_name(key)] = value
        step = int(state.global_step)
        self.run.log(metrics, step=step)
        if self.send_samples and self.trainer is not None:
            self._log_completions(self.run, step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.run is not None:
            self.run.finish()

    # -- samples ------------------------------------------------------------------------------------

    def _log_completions(self, run: TrackedRun, step: int) -> None:
        logged = getattr(self.trainer, "_logs", None)  # what TRL sends W&B/Trackio as its completions table
        if not isinstance(logged, dict) or not logged.get("completion"):
            return
        completions = list(logged["completion"])
        if completions == self._last_completions:
            return  # no new generation since the last log (logging more often than generating)
        self._last_completions = completions
        prompts = list(logged["prompt"])
        rewards = {name: list(values) for name, values in logged.get("rewards", {}).items()}
        advantages = list(logged.get("advantages") or [])
        weights = self._reward_weights(list(rewards))
        group_size = max(1, int(getattr(self.trainer, "num_generations", 1) or 1))
        max_length = getattr(getattr(self.trainer, "args", None), "max_completion_length", None)
        texts = [as_text(c) for c in completions]
        lengths = self._token_counts(texts, max_length)
        rows = []
        for i, text in enumerate(texts):
            components = {name: values[i] for name, values in rewards.items() if i < len(values)}
            rows.append(
                {
                    "prompt": as_text(prompts[i]) if i < len(prompts) else "",
                    "response": text,
                    "reward": _weighted_total(components, weights),
                    "components": components,
                    "advantage": advantages[i] if i < len(advantages) else None,
                    "group": i // group_size,
                    "length": lengths[i],
                    "finish_reason": "length" if max_length and lengths[i] >= max_length else "stop",
                }
            )
        run.log_samples(rows, step=step)

    def _reward_weights(self, names: list[str]) -> dict[str, float]:
        weights = getattr(self.trainer, "reward_weights", None)
        if weights is None:
            return dict.fromkeys(names, 1.0)
        values = weights.tolist() if hasattr(weights, "tolist") else list(weights)
        return dict(zip(names, values, strict=False))

    def _token_counts(self, texts: list[str], max_length: int | None) -> list[int]:
        """Tokens of each completion, re-tokenized from its text: TRL logs no per-completion length. A
        text that re-tokenizes longer than the generation limit was cut at the limit."""
        tokenizer = getattr(self.trainer, "processing_class", None)
        tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor wraps its tokenizer
        if tokenizer is None or not callable(tokenizer):
            return [len(text) for text in texts]
        counts = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
        return [min(count, max_length) if max_length else count for count in counts]


def _weighted_total(components: dict[str, Any], weights: dict[str, float]) -> float | None:
    """TRL's reward: the weighted sum of the reward functions' scores, NaN (no score) counted as 0."""
    total, seen = 0.0, False
    for name, value in components.items():
        if isinstance(value, (int, float)) and not math.isnan(value):
            total += weights.get(name, 1.0) * value
            seen = True
    return total if seen else None
