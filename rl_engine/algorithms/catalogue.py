"""The algorithms by name, with the traits the config and the loop need: torch-free.

Three kinds, each chosen by name in the run config:

* advantage estimators (`algorithm.name`): group or token level, whether they need a critic, where the
  KL penalty may go, whether they divide by a std by default;
* policy losses (`algorithm.policy_loss`): token or sequence level, their own clip range and
  aggregation (what "empty" means for `algorithm.clip_low` / `clip_high` / `loss_agg`);
* rollout corrections (`algorithm.rollout_correction.method`): which level they weigh at, their own
  thresholds, whether they change the loss.

All three are declared the same way, as specs listed below; the functions are registered under the same
names next to their code (`rl_engine.algorithms.registry`: `advantages.py`, `policy_losses/<name>.py`,
`corrections.py`), and a test checks that both agree. The config schema takes its choices, help texts and
cross-field rules from here, so this module (and the schema built from it) loads no torch. Adding a loss is
its spec here, its file in `policy_losses/`, and its test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "CORRECTIONS",
    "DEFAULT_CORRECTION",
    "DEFAULT_ESTIMATOR",
    "DEFAULT_POLICY_LOSS",
    "ESTIMATORS",
    "POLICY_LOSSES",
    "AGGREGATION_MODES",
    "CatalogueError",
    "CorrectionSpec",
    "EstimatorSpec",
    "PolicyLossSpec",
    "RolloutData",
    "policy_loss_table",
]

#: What a step may have to produce for an algorithm: the rollout engine's log-probs of the sampled
#: tokens, the trainer's log-probs of them before the update (one extra forward pass unless the step
#: computes them anyway), the critic's values, several samples per prompt.
RolloutData = Literal["rollout_logprobs", "old_logprobs", "values", "groups"]

AGGREGATION_MODES: tuple[str, ...] = (
    "token_mean",
    "seq_mean_token_sum",
    "seq_mean_token_mean",
    "seq_mean_token_sum_norm",
)


class CatalogueError(RuntimeError):
    """A policy loss file whose declaration cannot be read; names the file."""


@dataclass(frozen=True)
class EstimatorSpec:
    name: str
    level: Literal["group", "token"]  # group: compares the samples of one prompt; token: token-level returns
    kl_placements: tuple[Literal["loss", "reward"], ...]  # where the KL penalty may go
    normalize_std: bool  # `algorithm.normalize_advantage_std` when it is empty
    help: str
    paper: str
    needs: frozenset[RolloutData] = frozenset()
    # A group whose samples all scored the same gets exactly zero advantage on every token (a group-mean
    # baseline, no whitening over the batch): its rows add no policy gradient (the zero-advantage filter).
    zero_advantage_on_ties: bool = False

    @property
    def needs_critic(self) -> bool:
        return "values" in self.needs


@dataclass(frozen=True)
class PolicyLossSpec:
    name: str
    level: Literal["token", "sequence"]  # where the importance ratio is taken
    clip_low: float  # `algorithm.clip_low` when it is empty
    clip_high: float  # `algorithm.clip_high` when it is empty
    loss_agg: str  # `algorithm.loss_agg` when it is empty
    dual_clip: bool  # whether `algorithm.dual_clip` applies
    help: str
    paper: str
    # The loss weighs each token by the behaviour importance ratio pi_proximal / pi_behaviour itself
    # (decoupled PPO): the rollout correction's weights become that ratio instead of multiplying on top.
    behaviour_weighted: bool = False

    def __post_init__(self) -> None:
        if self.loss_agg not in AGGREGATION_MODES:
            raise CatalogueError(
                f"policy loss {self.name!r}: loss_agg {self.loss_agg!r} is not one of {AGGREGATION_MODES}"
            )


@dataclass(frozen=True)
class CorrectionSpec:
    name: str
    level: Literal["token", "sequence"] | None  # None: nothing is weighed
    changes_loss: bool  # False: off, or metrics only
    low: float | None  # `rollout_correction.low` when it is empty (None: no lower bound)
    high: float | None  # `rollout_correction.high` when it is empty (None: no upper bound)
    help: str
    paper: str
    needs: frozenset[RolloutData] = field(default_factory=frozenset)


# --- advantage estimators --------------------------------------------------------------------------

DEFAULT_ESTIMATOR = "grpo"

_ESTIMATORS = (
    EstimatorSpec(
        name="grpo",
        level="group",
        kl_placements=("loss",),
        normalize_std=True,
        help="GRPO: reward minus its group's mean, divided by the group's std.",
        paper="Shao et al. 2024, DeepSeekMath, arXiv:2402.03300",
        needs=frozenset({"groups"}),
        zero_advantage_on_ties=True,
    ),
    EstimatorSpec(
        name="ppo",
        level="token",
        kl_placements=("loss", "reward"),
        normalize_std=True,
        help="PPO: a critic learns values; GAE advantages, whitened over the batch's tokens.",
        paper="Schulman et al. 2017, arXiv:1707.06347; GAE: Schulman et al. 2015, arXiv:1506.02438",
        needs=frozenset({"values"}),
    ),
    EstimatorSpec(
        name="dr_grpo",
        level="group",
        kl_placements=("loss",),
        normalize_std=False,
        help="Dr. GRPO: reward minus its group's mean, not divided by the std (no difficulty bias).",
        paper="Liu et al. 2025, Understanding R1-Zero-Like Training, arXiv:2503.20783",
        needs=frozenset({"groups"}),
        zero_advantage_on_ties=True,
    ),
    EstimatorSpec(
        name="rloo",
        level="group",
        kl_placements=("loss",),
        normalize_std=False,
        help="RLOO: reward minus the mean of the other samples of its prompt.",
        paper="Ahmadian et al. 2024, Back to Basics, arXiv:2402.14740",
        needs=frozenset({"groups"}),
        zero_advantage_on_ties=True,
    ),
    EstimatorSpec(
        name="reinforce_pp",
        level="token",
        kl_placements=("loss", "reward"),
        normalize_std=True,
        help="REINFORCE++: discounted return whitened over the batch's tokens; no critic, no groups.",
        paper="Hu 2025, REINFORCE++, arXiv:2501.03262",
    ),
    EstimatorSpec(
        name="reinforce_pp_baseline",
        level="group",
        kl_placements=("loss",),
        normalize_std=True,
        help="REINFORCE++-baseline: reward minus its group's mean, whitened over the batch's tokens.",
        paper="Hu 2025, REINFORCE++, arXiv:2501.03262",
        needs=frozenset({"groups"}),
    ),
)
ESTIMATORS: dict[str, EstimatorSpec] = {spec.name: spec for spec in _ESTIMATORS}


# --- rollout corrections ---------------------------------------------------------------------------

DEFAULT_CORRECTION = "none"
_TIS = "Yao et al. 2025, Your Efficient RL Framework Secretly Brings You Off-Policy RL Training (fengyao.notion.site/off-policy-rl)"
_MIS = "Liu et al. 2025, When Speed Kills Stability: the training-inference mismatch (richardli.xyz/rl-collapse)"
_BOTH: frozenset[RolloutData] = frozenset({"rollout_logprobs", "old_logprobs"})

_CORRECTIONS = (
    CorrectionSpec(
        name="none",
        level=None,
        changes_loss=False,
        low=None,
        high=None,
        help="Off: no correction and no rollout_corr/* metrics (no extra forward pass).",
        paper="",
    ),
    CorrectionSpec(
        name="metrics",
        level=None,
        changes_loss=False,
        low=None,
        high=None,
        help="Measure only: log the rollout_corr/* mismatch metrics, leave the loss unchanged.",
        paper=_MIS,
        needs=_BOTH,
    ),
    CorrectionSpec(
        name="token_tis",
        level="token",
        changes_loss=True,
        low=None,
        high=2.0,
        help="Token TIS: weigh each token by its ratio trainer/rollout, truncated to [low, high].",
        paper=_TIS,
        needs=_BOTH,
    ),
    CorrectionSpec(
        name="sequence_tis",
        level="sequence",
        changes_loss=True,
        low=None,
        high=2.0,
        help="Sequence TIS: weigh each sequence by the product of its token ratios, truncated to [low, high].",
        paper=_MIS,
        needs=_BOTH,
    ),
    CorrectionSpec(
        name="token_mis",
        level="token",
        changes_loss=True,
        low=None,
        high=2.0,
        help="Token MIS: weigh each token by its ratio, and drop the tokens whose ratio is outside [low, high].",
        paper=_MIS,
        needs=_BOTH,
    ),
    CorrectionSpec(
        name="sequence_mis",
        level="sequence",
        changes_loss=True,
        low=None,
        high=2.0,
        help="Sequence MIS: weigh each sequence by its ratio, and drop those whose ratio is outside [low, high].",
        paper=_MIS,
        needs=_BOTH,
    ),
    CorrectionSpec(
        name="icepop",
        level="token",
        changes_loss=True,
        low=0.5,
        high=5.0,
        help="IcePop: token MIS on the two-sided interval [0.5, 5] of its paper.",
        paper="Ling Team 2025, Every Step Evolves (Ring-1T), IcePop, arXiv:2510.18855",
        needs=_BOTH,
    ),
    CorrectionSpec(
        name="geo_mask",
        level="sequence",
        changes_loss=True,
        low=0.999,
        high=1.001,
        help="Geometric mask: drop sequences whose geometric-mean ratio is outside [low, high]; no weighting.",
        paper=_MIS,
        needs=_BOTH,
    ),
)
CORRECTIONS: dict[str, CorrectionSpec] = {spec.name: spec for spec in _CORRECTIONS}


# --- policy losses ------------------------------------------------------------------------------

DEFAULT_POLICY_LOSS = "ppo_clip"
_POLICY_LOSSES = (
    PolicyLossSpec(
        name="ppo_clip",
        level="token",
        clip_low=0.2,
        clip_high=0.2,
        loss_agg="token_mean",
        dual_clip=True,
        help="PPO's clipped surrogate per token; clip_high > clip_low is DAPO's clip-higher; dual_clip caps |A| losses.",
        paper="Schulman et al. 2017, arXiv:1707.06347; clip-higher: Yu et al. 2025 (DAPO), arXiv:2503.14476",
    ),
    PolicyLossSpec(
        name="decoupled_ppo",
        level="token",
        clip_low=0.2,
        clip_high=0.2,
        loss_agg="token_mean",
        dual_clip=True,
        help="Decoupled PPO (async): clip against the weights before this update, weigh by proximal / behaviour "
        "(the rollout correction truncates or masks that weight); its clip engages only from a second mini-batch "
        "or epoch on.",
        paper="Hilton et al. 2022, arXiv:2110.00641; AReaL, Fu et al. 2025, arXiv:2505.24298",
        behaviour_weighted=True,
    ),
    PolicyLossSpec(
        name="gspo",
        level="sequence",
        clip_low=3e-4,
        clip_high=4e-4,
        loss_agg="seq_mean_token_mean",
        dual_clip=False,
        help="GSPO: one ratio per sequence (geometric mean of its token ratios), clipped at the sequence level.",
        paper="Zheng et al. 2025, Group Sequence Policy Optimization, arXiv:2507.18071",
    ),
    PolicyLossSpec(
        name="gmpo",
        level="sequence",
        clip_low=0.4,
        clip_high=0.4,
        loss_agg="seq_mean_token_mean",
        dual_clip=False,
        help="GMPO: each sequence's geometric mean of token ratios, clipped per token in log space to [-clip_low, clip_high].",
        paper="Zhao et al. 2025, Geometric-Mean Policy Optimization, arXiv:2507.20673",
    ),
    PolicyLossSpec(
        name="cispo",
        level="token",
        clip_low=1.0,
        clip_high=4.0,
        loss_agg="token_mean",
        dual_clip=False,
        help="CISPO: REINFORCE on each token weighted by its ratio, the weight (not the gradient) clipped to 1 + clip_high.",
        paper="MiniMax 2025, MiniMax-M1, arXiv:2506.13585",
    ),
)
# The default first: it is what a form shows selected.
POLICY_LOSSES: dict[str, PolicyLossSpec] = {spec.name: spec for spec in _POLICY_LOSSES}


def policy_loss_table() -> str:
    """rl_engine/README.md's table of the policy losses, one row per spec (scripts/metric_table.py writes it)."""
    rows = [
        "| `policy_loss` | ratio | what it does | default clip (`clip_low`, `clip_high`) | default `loss_agg` | paper |",
        "|---|---|---|---|---|---|",
    ]
    for spec in POLICY_LOSSES.values():
        cell = spec.help.replace("|", "\\|")
        rows.append(
            f"| `{spec.name}` | {spec.level} | {cell} | {spec.clip_low:g}, {spec.clip_high:g} | `{spec.loss_agg}` "
            f"| {spec.paper} |"
        )
    return "\n".join(rows) + "\n"
