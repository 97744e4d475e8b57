"""Where a step's rollouts come from. Sync: generated at the step. Async (`backends.async_rollout`): up to
`backends.max_staleness` batches are generated ahead while this one is scored and trained; the engines run
their calls in order, so a weight sync queued after this step's update lands after the batches submitted
before it. A checkpoint keeps the batches generated ahead (`saved_pending`), so a resumed run trains on
exactly what it would have (`resume_pending`)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, cast

from rl_engine.checkpoint import EngineState
from rl_engine.config import RunConfig
from rl_engine.data import Prompt
from rl_engine.executors import Rollouts
from rl_engine.interfaces import AsyncRolloutRole
from rl_engine.ledger import Draw
from rl_engine.loop.engine import Engine
from rl_engine.loop.timing import StepTimer
from rl_engine.partial_rollout import mixed_seed
from rl_engine.rollout import Sample, SamplingParams


def sampling_params(cfg: RunConfig, seed: int | None = None) -> SamplingParams:
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
    epochs: list[int] | None = None  # each index's epoch (None in checkpoints from before the ledger)

    def finish(self, rollout: AsyncRolloutRole) -> list[Sample]:
        """The batch's samples, waited for if they are not in yet."""
        if self.samples is None:
            self.samples, self.seconds = rollout.collect(self.handles)
            self.handles = None
        return self.samples

    def saved(self) -> dict[str, Any]:
        """What a checkpoint keeps of a finished batch."""
        return {
            "step": self.step,
            "indices": self.indices,
            "samples": self.samples,
            "seconds": self.seconds,
            "epochs": self.epochs,
        }

    def draws(self, ledger_epoch: int) -> list[Draw]:
        epochs = self.epochs if self.epochs is not None else [ledger_epoch] * len(self.indices)
        return [Draw(epoch, row) for epoch, row in zip(epochs, self.indices, strict=True)]


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


def draw_prompts(engine: Engine, for_step: int) -> list[Draw]:
    """The next batch's rows from the sampler, in flight in the ledger until step `for_step` resolves them."""
    draws = engine.sampler.draw(engine.cfg.rollout.prompts_per_step)
    engine.ledger.draw(for_step, draws)
    return draws


def take_rollouts(engine: Engine, step: int, timer: StepTimer) -> tuple[list[Draw], list[Prompt], Rollouts]:
    """This step's rows, prompts and `Rollouts`. Sync: generated now. Async: the batch submitted during the
    previous step (finished before the last weight sync), and the next one submitted now, to be
    generated from the current weights while this one is scored and trained."""
    cfg = engine.cfg
    if not cfg.backends.async_rollout:
        draws = draw_prompts(engine, step)
        prompts = [engine.data.train[d.row] for d in draws]
        with timer.phase("generate"):
            rollouts = engine.executor.run(prompts, sampling_params(cfg))
            # A colocated engine gives its GPU memory back to the trainer until the weight sync.
            engine.rollout.sleep()
        if rollouts.env_seconds:  # the environment's share of the turns, as a phase of its own
            timer.timings["generate"] -= rollouts.env_seconds
            timer.timings["environment"] = rollouts.env_seconds
        return draws, prompts, rollouts

    rollout = cast(AsyncRolloutRole, engine.rollout)

    def submit(for_step: int) -> PendingRollout:
        draws = draw_prompts(engine, for_step)
        indices = [d.row for d in draws]
        # Each batch its own seed: what it draws depends on its step and weights, not on when it ran.
        params = sampling_params(cfg, mixed_seed(cfg.seed, for_step))
        handles = rollout.submit([engine.data.train[i].token_ids for i in indices], params)
        return PendingRollout(for_step, indices, handles, epochs=[d.epoch for d in draws])

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
    draws = current.draws(engine.sampler.epoch)
    return draws, [engine.data.train[d.row] for d in draws], Rollouts(samples)
