"""The rollout section: how responses are generated each step, and the filters between scoring and
training."""

from __future__ import annotations

from pydantic import Field, field_validator

from posttrain_sdk import rollout_files
from rl_engine.config.schema.base import _Section


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
