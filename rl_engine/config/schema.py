"""The run config's typed schema: one pydantic model per section, and `RunConfig` over them.

Every model forbids unknown keys (a typo is an error naming the field, not a silently ignored
setting) and every field carries a `description`, which the browser form shows as help text.
Rules that span sections live in `rules.py`; reading, writing and validating in `yaml_io.py`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Annotated, Any, Literal, get_args
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, GetPydanticSchema, field_validator, model_validator

from posttrain_sdk import rollout_files
from rl_engine.algorithms import catalogue
from rl_engine.config.errors import FieldErrors
from rl_engine.config.rules import cross_field_errors
from rl_engine.metric_catalogue import RESERVED_REWARD_NAMES
from rl_engine.user_patterns import MAX_INPUT_CHARS, MAX_PATTERN_CHARS, check_user_pattern

SCHEMA_VERSION = 1

Dtype = Literal["float32", "bfloat16", "float16"]
PolicyDtype = Literal["auto", "float32", "bfloat16", "float16"]

_RUN_NAME_RE = re.compile(r"^[A-Za-z0-9_.\- ]+$")
# Reward names become metric names (`reward/<name>`), so no spaces or slashes.
_REWARD_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")


# --------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------


class _Section(BaseModel):
    # Note for descriptions: pydantic leaves a section field's description out of the JSON schema
    # when it equals the section class's docstring, so keep the two worded differently (a test
    # checks that every property carries a description).
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class LoraConfig(_Section):
    """LoRA adapters on the policy (peft): only the adapters train; the reference is the base model."""

    enabled: bool = Field(default=False, description="Train LoRA adapters instead of every weight.")
    rank: int = Field(default=16, ge=1, description="Adapter rank r.")
    alpha: float = Field(default=32.0, gt=0, description="Adapter scaling numerator (scale = alpha / rank).")
    dropout: float = Field(default=0.0, ge=0, lt=1, description="Dropout on the adapter input.")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        min_length=1,
        description="Names of the linear layers that get adapters ('all-linear' alone = every one "
        "but the output head; tied embeddings cannot take one).",
    )
    quantize_base: Literal["none", "4bit"] = Field(
        default="none",
        description="QLoRA: keep the frozen base in 4-bit (bitsandbytes; CUDA GPUs only, refused elsewhere).",
    )


class ModelConfig(_Section):
    """The policy model: a local Hugging Face folder."""

    path: str = Field(min_length=1, description="Local Hugging Face model folder (weights, config and tokenizer).")
    tokenizer_path: str | None = Field(
        default=None, description="Tokenizer folder, if not the model folder. Empty = use the model path."
    )
    dtype: PolicyDtype = Field(
        default="auto",
        description="Weight and compute dtype of the policy; auto = bfloat16 where the device computes in it "
        "natively (CUDA GPUs since Ampere, CPUs with AVX512-BF16 or AMX), float32 elsewhere.",
    )
    trust_remote_code: bool = Field(
        default=False, description="Allow custom modelling code shipped inside the model folder."
    )
    gradient_checkpointing: bool = Field(
        default=False, description="Recompute activations in the backward pass: less memory, ~30% slower."
    )
    lora: LoraConfig = Field(default_factory=LoraConfig, description="LoRA / QLoRA adapters on the policy.")


class DataConfig(_Section):
    """The prompt dataset and how prompts are built from it."""

    path: str = Field(
        min_length=1, description="Prompt dataset: a JSONL, Parquet or CSV file, or a `save_to_disk` folder."
    )
    format: Literal["auto", "jsonl", "parquet", "csv", "hf_disk"] = Field(
        default="auto", description="Dataset format; auto = decide from the file extension or folder."
    )
    prompt_field: str = Field(default="prompt", min_length=1, description="Column holding the prompt text.")
    label_field: str | None = Field(
        default="label", description="Column holding the reference answer passed to rewards; empty = none."
    )
    eval_path: str | None = Field(
        default=None, description="Separate held-out dataset for evaluation (same format rules as path)."
    )
    eval_fraction: float = Field(
        default=0.0, ge=0.0, le=0.5, description="Fraction of the dataset held out for evaluation (0 = none)."
    )
    eval_size: int | None = Field(
        default=None, ge=1, description="Cap on the number of held-out prompts; empty = no cap."
    )
    apply_chat_template: bool = Field(
        default=False, description="Wrap each prompt in the tokenizer's chat template as a user message."
    )
    system_prompt: str | None = Field(
        default=None, description="System message prepended when the chat template is applied."
    )
    max_prompt_tokens: int = Field(
        default=512, ge=1, le=rollout_files.MAX_PROMPT_TOKENS, description="Maximum prompt length in tokens."
    )
    shuffle: bool = Field(default=True, description="Shuffle the prompt order (seeded by the run seed).")

    @model_validator(mode="after")
    def _one_eval_source(self) -> DataConfig:
        if self.eval_path is not None and self.eval_fraction > 0:
            raise FieldErrors([("eval_fraction", "set either eval_path or eval_fraction, not both")])
        return self


# --- rewards ---------------------------------------------------------------------------------


class _RewardBase(_Section):
    # Declared here (and narrowed to a Literal in each subclass) so `type` comes first in dumps.
    type: str = Field(description="Reward kind.")
    name: str = Field(
        default="",
        description="Component name, used in metrics as reward/<name>. Empty = the reward type.",
    )
    weight: float = Field(default=1.0, description="Weight of this component in the summed reward.")
    max_error_rate: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="The run fails, with the first error, when this component fails on more than this share of "
        "a step's samples (0 = on any error, 1 = never).",
    )

    @field_validator("name")
    @classmethod
    def _check_name(cls, v: str) -> str:
        if v and not _REWARD_NAME_RE.match(v):
            raise ValueError("may contain only letters, digits and - _ . (no spaces or slashes)")
        if v in RESERVED_REWARD_NAMES:
            raise ValueError(
                f"{v!r} is reserved: reward/{v} is one of the engine's own curves "
                f"({', '.join(sorted(RESERVED_REWARD_NAMES))}); give the component another name"
            )
        return v

    @model_validator(mode="after")
    def _default_name(self) -> _RewardBase:
        if not self.name:
            self.name = self.type
        return self

    def to_component_kwargs(self) -> dict[str, Any]:
        """`type` plus the constructor kwargs (name included) for `rewards.registry.build_component`."""
        return self.model_dump(exclude={"weight", "max_error_rate"})


class ExactMatchReward(_RewardBase):
    """1 if the answer equals the label, else 0."""

    type: Literal["exact_match"] = Field(default="exact_match", description="Exact match against the label.")
    normalize: bool = Field(
        default=True, description="Normalise answer and label (case, spacing, punctuation) before comparing."
    )
    numeric: bool = Field(default=True, description='Compare numbers by value ("3.0" equals "3").')


class BoxedMathReward(_RewardBase):
    """1 if the last \\boxed{...} answer equals the label mathematically, else 0."""

    type: Literal["boxed_math"] = Field(
        default="boxed_math", description="Math answer in \\boxed{...} compared with the label."
    )


class RegexReward(_RewardBase):
    """A fixed score for responses that match a regular expression."""

    type: Literal["regex"] = Field(default="regex", description="Regular expression match on the response.")
    pattern: str = Field(
        description=f"Regular expression in RE2 syntax, matched in linear time (at most {MAX_PATTERN_CHARS} "
        "characters; no backreferences or lookaround; \\d, \\w and \\b are ASCII; flags inline: (?s), (?i), (?m))."
    )
    full_match: bool = Field(
        default=False,
        description=f"Require the whole response to match (else search). A response over {MAX_INPUT_CHARS} "
        "characters is not matched.",
    )
    score_match: float = Field(default=1.0, description="Score when the pattern matches.")
    score_miss: float = Field(default=0.0, description="Score when it does not.")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, v: str) -> str:
        problem = check_user_pattern(v)
        if problem:
            raise ValueError(problem)
        return v


class LengthPenaltyReward(_RewardBase):
    """A penalty that grows with the characters beyond a length budget."""

    type: Literal["length_penalty"] = Field(
        default="length_penalty", description="Penalty for responses longer than max_chars."
    )
    max_chars: int = Field(ge=1, description="Length budget in characters; no penalty up to it.")
    coef: float = Field(description="Penalty per character beyond max_chars.")


class PythonReward(_RewardBase):
    """User reward code: OpenRLHF `reward_func` or verl `compute_score`, run in a sandbox."""

    type: Literal["python"] = Field(default="python", description="Your own Python reward function.")
    path: str = Field(min_length=1, description="Python file defining the reward function.")
    function: str | None = Field(default=None, description="Function name; empty = find reward_func or compute_score.")
    timeout_s: float = Field(default=30.0, gt=0, description="Seconds one call may take before it is killed.")
    memory_mb: int = Field(
        default=1024, ge=64, description="Memory cap of the sandbox, in MB (its processes and /tmp together)."
    )
    batch: bool | None = Field(
        default=None,
        description="Call once per batch (OpenRLHF shape) or per sample (verl shape); empty = decide from the function.",
    )


class HttpReward(_RewardBase):
    """A remote reward server speaking OpenRLHF's protocol."""

    type: Literal["http"] = Field(default="http", description="Remote reward server (OpenRLHF protocol).")
    url: str = Field(description="Server URL (http or https).")
    timeout_s: float = Field(default=10.0, gt=0, description="Seconds to wait for one response.")
    retries: int = Field(default=3, ge=0, description="Retries after a failed request.")
    backoff_s: float = Field(default=0.5, ge=0, description="Base delay between retries, in seconds.")
    batch_size: int = Field(default=64, ge=1, description="Samples per request.")
    headers: dict[str, str] = Field(default_factory=dict, description="Extra HTTP headers (e.g. Authorization).")

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        parsed = urlparse(v)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError("must be an http:// or https:// URL with a host")
        return v


class RewardModelReward(_RewardBase):
    """A sequence-classification reward model scoring prompt + response."""

    type: Literal["reward_model"] = Field(
        default="reward_model", description="Learned reward model (sequence classifier)."
    )
    path: str = Field(min_length=1, description="Local Hugging Face reward model folder.")
    batch_size: int = Field(default=16, ge=1, description="Samples per forward pass.")
    max_length: int = Field(default=1024, ge=1, description="Prompt + response tokens kept (truncated beyond).")
    dtype: Dtype = Field(default="float32", description="Dtype of the reward model.")


class ReasoningGymReward(_RewardBase):
    """A reasoning-gym task's own scorer (`score_answer`) on rows generated from the package."""

    type: Literal["reasoning_gym"] = Field(
        default="reasoning_gym", description="reasoning-gym's score_answer on its generated rows."
    )
    answer: Literal["tag", "whole", "last_number"] = Field(
        default="tag",
        description="Where the answer is: the last <answer>...</answer> (reasoning-gym's own evaluation), "
        "the whole response, or the last number in it (lm-eval's flexible extraction, for models that "
        "answer in prose).",
    )
    timeout_s: float = Field(default=10.0, gt=0, description="Seconds one sample's scoring may take.")
    memory_mb: int = Field(default=2048, ge=256, description="Memory cap of the scorer's sandbox, in MB.")


class VerifiersReward(_RewardBase):
    """A verifiers environment's own reward functions on rows generated from its taskset."""

    type: Literal["verifiers"] = Field(
        default="verifiers", description="A verifiers taskset's reward functions (Task.score) on its rows."
    )
    files: list[str] = Field(
        default_factory=list,
        description="Modules the taskset is, when it is not an installed package (shown read-only in the sandbox).",
    )
    timeout_s: float = Field(default=30.0, gt=0, description="Seconds one sample's scoring may take.")
    memory_mb: int = Field(default=3072, ge=256, description="Memory cap of the scorer's sandbox, in MB.")


# One reward of the config, by its `type`; the schema and the error messages list the types in this order.
RewardSpec = Annotated[
    ExactMatchReward
    | BoxedMathReward
    | RegexReward
    | LengthPenaltyReward
    | PythonReward
    | HttpReward
    | RewardModelReward
    | ReasoningGymReward
    | VerifiersReward,
    Field(discriminator="type"),
]
_REWARD_CLASSES: tuple[type[_RewardBase], ...] = get_args(get_args(RewardSpec)[0])
REWARD_TYPES: tuple[str, ...] = tuple(c.model_fields["type"].default for c in _REWARD_CLASSES)


# --- algorithm -------------------------------------------------------------------------------


class KLConfig(_Section):
    """KL penalty against the reference policy."""

    coef: float = Field(default=0.0, ge=0, description="KL coefficient (0 = no reference model needed).")
    estimator: Literal["k1", "k2", "k3"] = Field(
        default="k3",
        description="KL estimator: k1 = log ratio, k2 = squared log ratio / 2, k3 = unbiased, low variance.",
    )
    placement: Literal["loss", "reward"] = Field(
        default="loss",
        description="Add the KL term to the loss, or subtract it from token rewards (ppo, reinforce_pp).",
    )


class OverlongConfig(_Section):
    """DAPO's soft penalty for responses that run into the token limit."""

    enabled: bool = Field(default=False, description="Penalise responses near max_new_tokens.")
    buffer_tokens: int = Field(
        default=4, ge=0, description="The penalty ramps up over this many tokens before max_new_tokens."
    )
    penalty: float = Field(default=1.0, ge=0, description="Penalty reached at max_new_tokens.")


def _one_of(names: Iterable[str]) -> GetPydanticSchema:
    """A catalogue's names as a str field's only values: pydantic validates it as a Literal of them (the JSON
    schema's enum in the catalogue's order, the error naming them), while type checkers read the str, as a
    Literal built at runtime from a registry is no static type."""
    choices = tuple(names)
    return GetPydanticSchema(lambda _source, handler: handler.generate_schema(Literal[choices]))


def _choice_help(specs: dict[str, Any]) -> dict[str, Any]:
    """Each choice's help text beside the enum (`enumDescriptions`, as VS Code's JSON schemas write it);
    the launch form shows the chosen one's under the field."""
    return {"enumDescriptions": [spec.help for spec in specs.values()]}


EstimatorName = Annotated[str, _one_of(catalogue.ESTIMATORS)]
PolicyLossName = Annotated[str, _one_of(catalogue.POLICY_LOSSES)]
CorrectionName = Annotated[str, _one_of(catalogue.CORRECTIONS)]
AggregationName = Annotated[str, _one_of(catalogue.AGGREGATION_MODES)]


class RolloutCorrectionConfig(_Section):
    """Importance weights between the trainer's policy and the policy that sampled (rollout mismatch)."""

    method: CorrectionName = Field(
        default=catalogue.DEFAULT_CORRECTION,
        description="How the ratio trainer / rollout engine of each sampled token corrects the loss "
        "(every method but none logs the rollout_corr/* metrics; all but none cost one forward pass).",
        json_schema_extra=_choice_help(catalogue.CORRECTIONS),
    )
    low: float | None = Field(
        default=None,
        ge=0,
        description="Lower threshold on the ratio (truncate or drop below); empty = the method's default.",
    )
    high: float | None = Field(
        default=None,
        gt=0,
        description="Upper threshold on the ratio (truncate or drop above); empty = the method's default.",
    )

    @property
    def spec(self) -> catalogue.CorrectionSpec:
        return catalogue.CORRECTIONS[self.method]

    @property
    def thresholds(self) -> tuple[float | None, float | None]:
        """(low, high) with the method's defaults where empty."""
        return (self.spec.low if self.low is None else self.low, self.spec.high if self.high is None else self.high)

    @model_validator(mode="after")
    def _ordered(self) -> RolloutCorrectionConfig:
        low, high = self.thresholds
        if self.spec.changes_loss and low is not None and high is not None and low >= high:
            where = "high" if self.high is not None else "low"
            raise FieldErrors([(where, f"low ({low:g}) must be below high ({high:g}) for method {self.method!r}")])
        return self


class AlgorithmConfig(_Section):
    """Advantage estimator, policy loss and rollout correction."""

    name: EstimatorName = Field(
        default=catalogue.DEFAULT_ESTIMATOR,
        description="Advantage estimator; ppo trains a critic, the group estimators need several samples per prompt.",
        json_schema_extra=_choice_help(catalogue.ESTIMATORS),
    )
    policy_loss: PolicyLossName = Field(
        default=catalogue.DEFAULT_POLICY_LOSS,
        description="Policy loss: where the importance ratio is taken and how it is clipped.",
        json_schema_extra=_choice_help(catalogue.POLICY_LOSSES),
    )
    ratio_against: Literal["auto", "behaviour", "proximal"] = Field(
        default="auto",
        description="The policy loss's importance ratio pi_theta / pi_old, whose clip is PPO's trust region: "
        "behaviour = the log-probs the rollout engine sampled with (the trust region stays around the policy that "
        "generated the batch, however stale); proximal = the trainer's log-probs before this update (with one "
        "update per batch the ratio starts at 1 and the clip never engages); auto = behaviour in async mode, "
        "unless the loss or the rollout correction weighs by proximal / behaviour itself, else proximal.",
    )
    gamma: float = Field(default=1.0, ge=0, le=1, description="Discount factor for token-level returns.")
    lam: float = Field(default=0.95, ge=0, le=1, description="GAE lambda (ppo).")
    clip_low: float | None = Field(
        default=None,
        ge=0,
        description="Lower ratio clip: ratio >= 1 - clip_low (gmpo: log-ratio >= -clip_low); "
        "empty = the policy loss's default.",
    )
    clip_high: float | None = Field(
        default=None,
        ge=0,
        description="Upper ratio clip: ratio <= 1 + clip_high (above clip_low = clip-higher; gmpo: on the log-ratio); "
        "empty = the policy loss's default.",
    )
    dual_clip: float | None = Field(
        default=None, gt=1, description="Dual-clip bound for negative advantages (> 1, ppo_clip); empty = off."
    )
    entropy_coef: float = Field(default=0.0, ge=0, description="Entropy bonus coefficient.")
    kl: KLConfig = Field(
        default_factory=KLConfig, description="KL regularisation towards the initial (reference) model."
    )
    loss_agg: AggregationName | None = Field(
        default=None,
        description="How token losses are averaged into the batch loss; empty = the policy loss's default.",
    )
    normalize_advantage_std: bool | None = Field(
        default=None, description="Divide advantages by their std; empty = the estimator's own default."
    )
    value_clip: float | None = Field(
        default=0.2, gt=0, description="Value-function clip range (ppo); empty = unclipped."
    )
    value_coef: float = Field(default=0.5, ge=0, description="Value loss coefficient (ppo).")
    critic_lr: float | None = Field(default=None, gt=0, description="Critic learning rate (ppo); empty = train.lr.")
    dynamic_sampling: bool = Field(
        default=False, description="Drop prompt groups whose samples all got the same reward (DAPO)."
    )
    overlong: OverlongConfig = Field(
        default_factory=OverlongConfig, description="Soft penalty for over-long responses (DAPO)."
    )
    rollout_correction: RolloutCorrectionConfig = Field(
        default_factory=RolloutCorrectionConfig,
        description="Correct for the gap between the rollout engine's policy and the trainer's (TIS, MIS, IcePop).",
    )

    @property
    def estimator(self) -> catalogue.EstimatorSpec:
        return catalogue.ESTIMATORS[self.name]

    @property
    def loss(self) -> catalogue.PolicyLossSpec:
        return catalogue.POLICY_LOSSES[self.policy_loss]

    @property
    def is_group_estimator(self) -> bool:
        return self.estimator.level == "group"

    @property
    def needs_critic(self) -> bool:
        return self.estimator.needs_critic

    @property
    def clip_range(self) -> tuple[float, float]:
        """(clip_low, clip_high) with the policy loss's defaults where empty."""
        low = self.loss.clip_low if self.clip_low is None else self.clip_low
        return low, self.loss.clip_high if self.clip_high is None else self.clip_high

    @property
    def aggregation(self) -> str:
        return self.loss.loss_agg if self.loss_agg is None else self.loss_agg

    @property
    def normalizes_advantage_std(self) -> bool:
        return self.estimator.normalize_std if self.normalize_advantage_std is None else self.normalize_advantage_std


# --- rollout, training, infrastructure -------------------------------------------------------


class GibberishFilterConfig(_Section):
    """Drop responses that are not text, or that the policy wrote as if drawing tokens blindly."""

    enabled: bool = Field(default=False, description="Drop gibberish responses from training.")
    max_nonprintable_share: float = Field(
        default=0.1,
        gt=0,
        le=1,
        description="A response with at least this share of characters that are not text (controls, "
        "broken bytes decoded as U+FFFD, unassigned code points) is gibberish.",
    )
    max_normalized_surprisal: float = Field(
        default=0.6,
        gt=0,
        le=1,
        description="A response whose tokens' mean -log-prob is at least this fraction of a uniform draw's "
        "(log vocabulary size) is gibberish (needs the rollout engine's log-probs).",
    )


class RepetitionFilterConfig(_Section):
    """Drop responses caught in a loop."""

    enabled: bool = Field(default=False, description="Drop repetitive responses from training.")
    ngram: int = Field(default=4, ge=1, description="Length of the token n-grams counted as repeats.")
    max_repetition_rate: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="A response with at least this share of its n-grams repeating an earlier one is a loop.",
    )


class FiltersConfig(_Section):
    """Which scored samples are kept out of the update, each logged per step as filter/<name>/dropped."""

    gibberish: GibberishFilterConfig = Field(
        default_factory=GibberishFilterConfig, description="Responses that are not text (off by default)."
    )
    repetition: RepetitionFilterConfig = Field(
        default_factory=RepetitionFilterConfig, description="Responses caught in a loop (off by default)."
    )
    zero_advantage: bool | None = Field(
        default=None,
        description="Drop prompt groups whose samples all scored the same, which a group-mean estimator "
        "(grpo, dr_grpo, rloo) gives zero advantage; empty = on where they add no gradient (such an estimator, "
        "no KL in the loss, no entropy bonus), off elsewhere.",
    )


class RolloutConfig(_Section):
    """Generation of responses each step."""

    prompts_per_step: int = Field(default=32, ge=1, description="Prompts drawn per training step.")
    samples_per_prompt: int = Field(default=8, ge=1, description="Responses generated per prompt (group size).")
    temperature: float = Field(default=1.0, gt=0, description="Sampling temperature.")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling threshold (1 = off).")
    top_k: int = Field(default=-1, description="Sample among the k most likely tokens (-1 = off).")
    max_new_tokens: int = Field(
        default=16, ge=1, le=rollout_files.MAX_NEW_TOKENS, description="Maximum response length in tokens."
    )
    stop: list[str] = Field(default_factory=list, description="Strings that end a response.")
    filters: FiltersConfig = Field(
        default_factory=FiltersConfig,
        description="Filters between scoring and training: gibberish, repetition, zero-advantage groups.",
    )

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int) -> int:
        if v != -1 and v < 1:
            raise ValueError("must be -1 (off) or at least 1")
        return v

    @field_validator("stop")
    @classmethod
    def _stop_nonempty(cls, v: list[str]) -> list[str]:
        if any(s == "" for s in v):
            raise ValueError("stop strings must not be empty")
        return v


class TrainConfig(_Section):
    """Optimisation of the policy."""

    steps: int = Field(default=100, ge=1, description="Training steps (one rollout batch each).")
    lr: float = Field(default=1e-5, gt=0, description="Policy learning rate (AdamW).")
    weight_decay: float = Field(default=0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field(default=(0.9, 0.999), description="AdamW betas.")
    warmup_steps: int = Field(default=0, ge=0, description="Linear learning-rate warm-up steps.")
    lr_schedule: Literal["constant", "cosine", "linear"] = Field(
        default="constant", description="Learning-rate decay after warm-up."
    )
    epochs_per_batch: int = Field(default=1, ge=1, description="Passes over each rollout batch.")
    mini_batch_size: int | None = Field(
        default=None, ge=1, description="Samples per optimizer step; empty = all samples of the step."
    )
    micro_batch_size: int = Field(
        default=8, ge=1, description="Samples per forward/backward pass (gradients accumulate)."
    )
    grad_clip: float | None = Field(default=1.0, gt=0, description="Gradient-norm clip; empty = off.")
    max_wall_s: float | None = Field(
        default=None,
        gt=0,
        description="Stop with a checkpoint once the run's steps took this many seconds (progress/train_time_s, "
        "summed over resumes); empty = no limit. The scheduler also takes it as the run's longest length.",
    )

    @field_validator("betas")
    @classmethod
    def _betas(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= b < 1 for b in v):
            raise ValueError("each beta must be in [0, 1)")
        return v


class BackendConfig(_Section):
    """Which engines generate and train."""

    rollout: Literal["transformers", "vllm"] = Field(default="transformers", description="Generation engine.")
    training: Literal["torch", "deepspeed"] = Field(default="torch", description="Training engine.")
    zero_stage: Literal[0, 1, 2, 3] = Field(default=0, description="DeepSpeed ZeRO stage (0 = off).")
    offload: bool = Field(default=False, description="Offload optimizer state to CPU memory (DeepSpeed ZeRO).")
    vllm_kv_cache_gb: float = Field(default=1.0, gt=0, description="KV cache size per vLLM engine, in GB.")
    async_rollout: bool = Field(
        default=False, description="Generate the next batches while training (up to max_staleness updates behind)."
    )
    max_staleness: int = Field(
        default=1,
        ge=1,
        le=16,
        description="Async rollout: batches generated ahead of training, so a sample's policy is at most this "
        "many updates behind the trainer (1 = one batch ahead).",
    )
    partial_rollout: bool = Field(
        default=False,
        description="Async rollout: a weight sync interrupts the responses being generated, which continue "
        "under the new weights (each segment records its policy version); transformers rollout only.",
    )
    partial_rollout_tokens: int = Field(
        default=16, ge=1, description="Partial rollout: tokens generated between two chances to take new weights."
    )


class PlacementConfig(_Section):
    """How the run's actors are placed on Ray."""

    mode: Literal["colocate", "separate"] = Field(
        default="colocate", description="Share resources between rollout and training, or keep them apart."
    )
    rollout_engines: int = Field(default=1, ge=1, description="Number of rollout engines.")
    trainer_ranks: int = Field(default=1, ge=1, description="Number of training processes.")
    cpus_per_rollout_engine: float = Field(default=1, ge=0, description="CPUs reserved per rollout engine.")
    cpus_per_trainer: float = Field(default=1, ge=0, description="CPUs reserved per training process.")
    gpus_per_rollout_engine: float = Field(default=0, ge=0, description="GPUs reserved per rollout engine.")
    gpus_per_trainer: float = Field(default=0, ge=0, description="GPUs reserved per training process.")
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto",
        description="Where the models run: auto = on CUDA for each role that placement gives a GPU "
        "(gpus_per_*), on the CPU for the others.",
    )
    device_peak_tflops: float | None = Field(
        default=None,
        gt=0,
        description="Peak TFLOP/s of one device in the compute dtype, for throughput/train_mfu; empty = "
        "the GPU's datasheet figure (known GPUs only).",
    )


class CheckpointConfig(_Section):
    """When checkpoints are written."""

    every_steps: int = Field(default=0, ge=0, description="Save every N steps (0 = only at the end).")
    keep_last: int = Field(default=2, ge=1, description="Keep this many most recent checkpoints.")
    save_final: bool = Field(default=True, description="Save a checkpoint when the run finishes.")


class LoggingConfig(_Section):
    """Evaluation, samples and run-directory output."""

    run_dir: str | None = Field(default=None, description="Output folder; empty = ./runs/<name>-<timestamp>.")
    eval_every: int = Field(default=10, ge=0, description="Evaluate every N steps (0 = never).")
    eval_size: int = Field(default=500, ge=1, description="Held-out prompts used per evaluation.")
    eval_max_new_tokens: int | None = Field(
        default=None,
        ge=1,
        le=rollout_files.MAX_NEW_TOKENS,
        description="Response limit during evaluation; empty = rollout.max_new_tokens.",
    )
    samples: Literal["all", "none"] = Field(
        default="all", description="Record each step's rollouts as a Parquet file (all) or not (none)."
    )
    token_view_every: int = Field(
        default=1,
        ge=0,
        description="Record the per-token view (token ids and text, log-probs, entropy, advantage, IS weight per "
        "token) in the rollout file of every N-th step (0 = never).",
    )
    rollouts_keep: str = Field(
        default="all",
        pattern=r"^(all|every [1-9][0-9]*|last [1-9][0-9]*)$",
        description="Which steps' rollout files to keep: all, 'every K' (steps divisible by K) or 'last N'.",
    )
    rollouts_dir: str | None = Field(
        default=None,
        description="Where each step's rollout file goes (a folder or an fsspec URL such as s3://bucket/prefix); "
        "empty = <run_dir>/rollouts.",
    )
    heartbeat_s: float = Field(default=10, gt=0, description="Seconds between heartbeat events.")


class EnvironmentConfig(_Section):
    """A multi-turn environment from a Python file (see rl_engine/environments): the model acts, the
    environment answers with an observation and a reward, until it says done or the turns run out."""

    package: Literal["textarena", "openenv", "verifiers"] | None = Field(
        default=None,
        description="An installed environment package, through the adapter the engine ships for it "
        "(rl_engine/environments/adapters); empty = your own file at path.",
    )
    path: str | None = Field(
        default=None, min_length=1, description="Python file defining the environment class (not with package)."
    )
    name: str = Field(default="Environment", min_length=1, description="Name of the class in the file.")
    options: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments for the class (a package's: its game or server)."
    )
    files: list[str] = Field(
        default_factory=list,
        description="Files the environment imports (modules, data), shown read-only beside it in its sandbox.",
    )
    max_turns: int = Field(default=4, ge=1, le=64, description="Most model turns per episode.")
    max_observation_tokens: int = Field(
        default=64, ge=1, description="An observation longer than this is cut to its first tokens."
    )
    timeout_s: float = Field(default=5.0, gt=0, description="Time limit of each reset/step call.")
    memory_mb: float = Field(
        default=1024, gt=0, description="Memory cap of the environment's sandbox, in MB (processes and /tmp)."
    )

    @model_validator(mode="after")
    def _one_source(self) -> EnvironmentConfig:
        if self.package is None and self.path is None:
            raise FieldErrors([("path", "give the environment's file, or an installed package in package")])
        if self.package is not None and self.path is not None:
            raise FieldErrors([("path", f"leave it out with package {self.package!r}: the engine ships its adapter")])
        return self


class AgentConfig(_Section):
    """An external agent program as the executor, through an OpenAI-compatible endpoint the engine
    serves while the run trains (see rl_engine/agent_endpoint.py)."""

    host: str = Field(default="127.0.0.1", min_length=1, description="Interface the endpoint listens on.")
    port: int = Field(default=0, ge=0, le=65535, description="Port of the endpoint (0 = any free port).")
    command: str | None = Field(
        default=None,
        description="Agent command the engine starts itself in the sandbox, with POSTTRAIN_AGENT_URL set (optional).",
    )
    files: list[str] = Field(
        default_factory=list,
        description="Files the command needs (its script, its data), shown read-only in its sandbox at the same paths.",
    )
    memory_mb: float = Field(
        default=4096, ge=64, description="Memory cap of the agent's sandbox, in MB (all its processes and /tmp)."
    )
    max_turns: int = Field(default=8, ge=1, le=256, description="Most chat completions per session.")
    step_timeout_s: float = Field(
        default=600.0, gt=0, description="Sessions still open this long after a step began end with reward 0."
    )


# --------------------------------------------------------------------------------------------
# The run config
# --------------------------------------------------------------------------------------------


class RunConfig(_Section):
    """A complete, self-contained description of one post-training run."""

    schema_version: Literal[1] = Field(default=1, description="Version of this config schema.")
    name: str = Field(min_length=1, max_length=100, description="Run name: letters, digits, spaces and - _ .")
    seed: int = Field(default=0, description="Random seed for data order, sampling and initialisation.")
    description: str = Field(default="", description="Free-text notes about the run.")
    model: ModelConfig = Field(description="The policy model.")
    data: DataConfig = Field(description="The prompt dataset.")
    rewards: list[RewardSpec] = Field(
        default_factory=list,
        description="Reward components; the reward is their weighted sum (plus the environment's, if any).",
    )
    environment: EnvironmentConfig | None = Field(
        default=None, description="Multi-turn environment (none = one response per prompt)."
    )
    agent: AgentConfig | None = Field(
        default=None, description="External agent executor over an OpenAI-compatible endpoint (none = off)."
    )
    algorithm: AlgorithmConfig = Field(
        default_factory=AlgorithmConfig, description="RL algorithm: advantage estimator, policy loss, KL."
    )
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Response generation.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="Policy optimisation.")
    backends: BackendConfig = Field(default_factory=BackendConfig, description="Generation and training engines.")
    placement: PlacementConfig = Field(default_factory=PlacementConfig, description="Ray resource placement.")
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="Checkpointing.")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="Evaluation and logging.")

    @field_validator("schema_version", mode="before")
    @classmethod
    def _known_version(cls, v: Any) -> Any:
        if v != SCHEMA_VERSION:
            raise ValueError(f"unsupported schema_version {v!r}; this engine reads version {SCHEMA_VERSION}")
        return v

    @field_validator("name")
    @classmethod
    def _slug(cls, v: str) -> str:
        if not _RUN_NAME_RE.match(v) or not v.strip():
            raise ValueError("may contain only letters, digits, spaces and - _ .")
        return v

    @property
    def samples_per_step(self) -> int:
        return self.rollout.prompts_per_step * self.rollout.samples_per_prompt

    @property
    def ratio_against_behaviour(self) -> bool:
        """Whether the policy loss's ratio is taken against the rollout engine's log-probs (the behaviour
        policy) rather than the trainer's before the update (`algorithm.ratio_against`, `auto` resolved)."""
        alg = self.algorithm
        if alg.ratio_against != "auto":
            return alg.ratio_against == "behaviour"
        weighs_itself = alg.loss.behaviour_weighted or alg.rollout_correction.spec.changes_loss
        return self.backends.async_rollout and not weighs_itself

    @model_validator(mode="after")
    def _cross_field(self) -> RunConfig:
        errors = cross_field_errors(self)
        if errors:
            raise FieldErrors(errors)
        return self
