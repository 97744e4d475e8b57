"""The training loop, one file per concept:

- `engine.py`: the wiring. `Engine` (everything a run holds between steps) and `build_engine` (the one-process
  roles, or the same calls onto Ray actors from `rl_engine.distributed`).
- `stages.py`: one step as flat stages, each timed and emitted as `timing/<stage>`: collect (generate) → score
  (reward) → reference/values (the no-grad forward passes) → advantages → correction → update (train) → sync
  (weight sync) → record.
- `prefetch.py`: where a step's rollouts come from; async mode's batches generated ahead.
- `records.py`: the record stage's metrics and sample records.
- `evaluation.py`: held-out evaluation.
- `lifecycle.py`: a run's life (resume, eval cadence, checkpoints, preemption, time limit, status).
- `timing.py`: the step's phase timer.

The sandbox gate a run passes before it starts lives with the sandbox (`rl_engine.sandbox.require_sandbox`).

The algorithms are chosen by name (`rl_engine.algorithms.catalogue`): the estimator in the advantages stage,
the rollout correction in the correction stage, the policy loss inside the trainer's update. The loop is
backend-agnostic: it talks to the roles of `rl_engine.interfaces` (a rollout, a trainer, a reward, an
executor), built from `rl_engine.components`.

Async mode (`backends.async_rollout`): up to `backends.max_staleness` batches are generated ahead while this
one is scored and trained. The engines run their calls in order, so a weight sync queued after this step's
update lands after the batches submitted before it: the batch a step trains on is at most `max_staleness`
updates behind. With `backends.partial_rollout` the sync instead lands between two segments of the batch
generating (`rl_engine.partial_rollout`). Every sample records the policy versions it was generated under
(`Sample.segments`), logged as the `staleness/*` distribution; the off-policy gap as `kl/rollout_vs_policy`
and the rollout correction's metrics. A checkpoint keeps the batches generated ahead (`pending`), so a
resumed run trains on exactly what it would have. See docs/ARCHITECTURE.md, "Async mode".
"""

from rl_engine.loop.engine import Engine, build_engine
from rl_engine.loop.evaluation import evaluate
from rl_engine.loop.lifecycle import train
from rl_engine.loop.records import environment_metrics
from rl_engine.loop.stages import TrainingBatch, experience_for, ratio_denominator, run_step

__all__ = [
    "Engine",
    "TrainingBatch",
    "build_engine",
    "environment_metrics",
    "evaluate",
    "experience_for",
    "ratio_denominator",
    "run_step",
    "train",
]
