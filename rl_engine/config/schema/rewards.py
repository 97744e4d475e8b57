"""The reward components of a run: one section per reward `type`, and `RewardSpec` choosing by it."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, get_args
from urllib.parse import urlparse

from pydantic import Field, field_validator, model_validator

from rl_engine.config.schema.base import Dtype, _Section
from rl_engine.metric_catalogue import RESERVED_REWARD_NAMES
from rl_engine.user_patterns import MAX_INPUT_CHARS, MAX_PATTERN_CHARS, check_user_pattern

# Reward names become metric names (`reward/<name>`), so no spaces or slashes.
_REWARD_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")


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
