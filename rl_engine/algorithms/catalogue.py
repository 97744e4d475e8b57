"""The algorithms by name, with the traits the config and the loop need: torch-free.

Three kinds, each chosen by name in the run config:

* advantage estimators (`algorithm.name`): group or token level, whether they need a critic, where the
  KL penalty may go, whether they divide by a std by default;
* policy losses (`algorithm.policy_loss`): token or sequence level, their own clip range and
  aggregation (what "empty" means for `algorithm.clip_low` / `clip_high` / `loss_agg`);
* rollout corrections (`algorithm.rollout_correction.method`): which level they weigh at, their own
  thresholds, whether they change the loss.

The config schema takes its choices, help texts and cross-field rules from here; the functions are
registered under the same names next to their code (`rl_engine.algorithms.registry`), and a test checks
that both agree. Estimators and corrections are listed below. Policy losses are declared in their own
files, one per loss in `policy_losses/`: each file's `SPEC = PolicyLossSpec(...)` is *read from its
source* here (its values must be literals), never imported, so this module and the schema built from it
load no torch. Adding a loss is therefore one file in `policy_losses/` plus its test.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
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


# --- policy losses: read from their files ----------------------------------------------------------

DEFAULT_POLICY_LOSS = "ppo_clip"
POLICY_LOSS_FOLDER = Path(__file__).with_name("policy_losses")


def read_policy_loss_spec(path: Path) -> PolicyLossSpec:
    """The `SPEC = PolicyLossSpec(...)` a policy loss file declares, from its source (nothing is imported)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        target = node.targets[0]
        if not (isinstance(target, ast.Name) and target.id == "SPEC"):
            continue
        call = node.value
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "PolicyLossSpec"):
            break
        if call.args:
            raise CatalogueError(f"{path.name}: give PolicyLossSpec's values as keywords (name=..., level=...)")
        values = {}
        for keyword in call.keywords:
            if keyword.arg is None:
                raise CatalogueError(f"{path.name}: SPEC takes named literals, not **{ast.unparse(keyword.value)}")
            try:
                values[keyword.arg] = ast.literal_eval(keyword.value)
            except ValueError:
                raise CatalogueError(
                    f"{path.name}: SPEC.{keyword.arg} must be a literal (the catalogue reads it without importing torch)"
                ) from None
        try:
            return PolicyLossSpec(**values)
        except TypeError as exc:
            raise CatalogueError(f"{path.name}: {exc}") from None
    raise CatalogueError(f"{path.name}: every policy loss file declares `SPEC = PolicyLossSpec(...)` at module level")


def _read_policy_losses() -> dict[str, PolicyLossSpec]:
    specs: dict[str, PolicyLossSpec] = {}
    for path in sorted(POLICY_LOSS_FOLDER.glob("*.py")):
        if path.name.startswith("_"):
            continue
        spec = read_policy_loss_spec(path)
        if spec.name != path.stem:
            raise CatalogueError(
                f"{path.name}: SPEC.name is {spec.name!r}; name the file after the loss ({spec.name}.py)"
            )
        specs[spec.name] = spec
    if DEFAULT_POLICY_LOSS not in specs:
        raise CatalogueError(f"the default policy loss {DEFAULT_POLICY_LOSS!r} has no file in {POLICY_LOSS_FOLDER}")
    # The default first: it is what a form shows selected.
    return dict(sorted(specs.items(), key=lambda item: (item[0] != DEFAULT_POLICY_LOSS, item[0])))


POLICY_LOSSES: dict[str, PolicyLossSpec] = _read_policy_losses()
