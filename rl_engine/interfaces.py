"""The roles a training step talks to, as Protocols.

The one-process classes (`TorchTrainer`, `TransformersRollout` / `VLLMRollout`, `CompositeReward`, the
executors) and the Ray wrappers (`rl_engine.distributed.RayTrainer`, `RayRollout`, `RayReward`) both
satisfy them, so the loop is written once against these.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Literal, Protocol

from rl_engine.rollout import RolloutBackend

if TYPE_CHECKING:
    import torch

    from rl_engine.data import Prompt
    from rl_engine.executors import Rollouts
    from rl_engine.rewards import RewardBatch
    from rl_engine.rewards.base import RewardResult
    from rl_engine.rollout import Sample, SamplingParams
    from rl_engine.trainer import Experience, TokenBatch

ForwardKind = Literal["policy", "reference", "values"]


class TrainerRole(Protocol):
    """The policy (and critic) being trained, and the frozen reference."""

    # Read-only here (properties), so a trainer may hold them as its own types (a module, a role's name).
    @property
    def ref_model(self) -> object | None:
        """Set when there is a reference model (KL)."""
        ...

    @property
    def critic(self) -> object | None:
        """Set when a critic trains (ppo)."""
        ...

    # True when the training forward pass is deterministic (no dropout): its log-probs are then the
    # policy's before the update, free.
    exact_training_logprobs: bool

    def forward(self, batch: TokenBatch, which: ForwardKind) -> torch.Tensor:
        """No-grad log-probs `[B, T]` of the response tokens (`policy`, `reference`) or the critic's values."""
        ...

    def update(self, exp: Experience) -> dict[str, float]: ...

    def full_weights(self) -> AbstractContextManager[None]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class LocalTrainer(TrainerRole, Protocol):
    """A trainer in this process: the weight sync and checkpoints read its weights directly."""

    def weights_view(self) -> Any: ...

    def full_state_dict(self) -> dict[str, torch.Tensor]: ...

    def adapter_state_dict(self) -> dict[str, torch.Tensor] | None: ...


class RolloutRole(RolloutBackend, Protocol):
    """The generation engine(s): a rollout backend, or the Ray engines behind one."""

    pad_id: int


class AsyncRolloutRole(RolloutRole, Protocol):
    """Engines that generate in the background (`backends.async_rollout`)."""

    def submit(self, prompts: list[list[int]], params: SamplingParams) -> Any: ...

    def collect(self, handles: Any) -> tuple[list[Sample], float]: ...

    def queue_weights(self, version: int) -> float:
        """A weight sync the caller does not wait for: it lands after the batches submitted before it
        (or, with partial rollout, between two segments of the one generating)."""
        ...

    def set_policy_version(self, version: int) -> None:
        """The version the engines' weights are (a resumed run's: its checkpoint's step)."""
        ...


class RewardRole(Protocol):
    def score(self, batch: RewardBatch) -> RewardResult: ...

    def close(self) -> None: ...


class ExecutorRole(Protocol):
    """Turns a step's prompts into trajectories (single turn, an environment, an agent)."""

    def run(self, prompts: list[Prompt], params: SamplingParams) -> Rollouts: ...

    def close(self) -> None: ...
