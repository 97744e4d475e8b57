"""The algorithm section: advantage estimator, policy loss, KL, overlong penalty and rollout correction,
its choices read from the algorithm catalogue."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import Field, GetPydanticSchema, model_validator

from rl_engine.algorithms import catalogue
from rl_engine.config.errors import FieldErrors
from rl_engine.config.schema.base import _Section


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
