"""The run's roles as Ray actors in one placement group: rollout engines, trainer ranks, the reference
model and the reward worker. The driver (the Ray job's entrypoint, or `python -m rl_engine train`,
which starts a local Ray) keeps the loop; these classes give it the same `generate` / `forward` /
`update` calls as the one-process engine.

Placement (`placement.mode`):
- `colocate` (hybrid engine): bundle i holds trainer rank i and rollout engine i, which share its CPUs
  and GPUs and take turns (the loop never runs them at once); bundle 0 also holds the reference and
  reward workers. With one engine and one rank all roles stay in the driver process itself — the same
  sharing without an actor hop, and a weight sync that costs nothing with the transformers backend.
- `separate`: every rollout engine and every trainer rank has a bundle of its own (`cpus_per_*`,
  `gpus_per_*`); the reference and reward workers share trainer rank 0's (they run between generation
  and the update, as the trainer does). Needed for async mode, where generation runs during training.

Weight sync: trainer ranks write the whole policy (gathered under ZeRO-3: every rank takes part) to a
safetensors file in /dev/shm, which every engine loads in place (vLLM's reload path, then a prefix-cache
reset); on GPU hosts the same calls, the file stays on the node. A role that dies (OOM kill, crash) fails
the run with `RoleDied` naming it, its pid and Ray's reason, at the next call that needs it.

Where things are: `placement.py` the placement plan (pure: it imports neither torch nor ray, so the
platform can read a run's resource needs from it); `process_stats.py` memory facts of a process;
`roles.py` the role classes that run inside the actors; `driver.py` the driver's side (the placement
group, the actors, and the Ray* wrappers the loop calls). Names import lazily from here, so importing
the placement plan never loads torch.
"""

from __future__ import annotations

from rl_engine.lazy import lazy_exports

_EXPORTS = {
    "RoleSlot": "placement",
    "PlacementPlan": "placement",
    "PlacementUnavailable": "placement",
    "plan_placement": "placement",
    "uses_actors": "placement",
    "driver_gpus": "placement",
    "driver_cpus": "placement",
    "resource_needs": "placement",
    "peak_rss_gb": "process_stats",
    "RolloutWorker": "roles",
    "TrainerWorker": "roles",
    "ReferenceWorker": "roles",
    "RewardWorker": "roles",
    "RoleDied": "driver",
    "RayRoles": "driver",
    "RayRollout": "driver",
    "RayTrainer": "driver",
    "RayReward": "driver",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
