"""The driver's side: the placement group, the role actors, and the Ray* wrappers that give the loop the
same `generate` / `forward` / `update` calls as the one-process engine."""

from __future__ import annotations

import math
import os
import time
from contextlib import nullcontext, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from rl_engine.config import RunConfig
from rl_engine.distributed.placement import PlacementUnavailable, plan_placement, threads_for
from rl_engine.distributed.roles import ReferenceWorker, RewardWorker, RolloutWorker, TrainerWorker
from rl_engine.rollout import Sample, SamplingParams
from rl_engine.trainer import Experience, TokenBatch, combine_metric

# The rollout engines' concurrency group for staging weights while a batch generates.
_STAGING = "staging"


class RoleDied(RuntimeError):
    """A role's actor died; the run cannot go on."""


# --- the driver's side ---------------------------------------------------------------------------


@dataclass
class _Actor:
    role: str
    handle: Any
    pid: int = 0


class RayRoles:
    """Places the roles, and gives the loop `rollout` (a RolloutBackend), `trainer` (the TorchTrainer
    calls it makes) and `reward` objects backed by them."""

    def __init__(self, cfg: RunConfig, weights_from: Path | None = None, *, ready_timeout_s: float = 600.0):
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.cfg = cfg
        self._started_ray = False
        if not ray.is_initialized():
            # The Ray job's cluster (RAY_ADDRESS is set for a job's entrypoint), else a local one.
            ray.init(
                address=os.environ.get("RAY_ADDRESS"),
                include_dashboard=False,
                log_to_driver=True,
                configure_logging=False,
            )
            self._started_ray = not os.environ.get("RAY_ADDRESS")
        self._loading: list[tuple[dict[str, Any], str]] = []  # async weight loads in flight, and their file
        self.plan = plan_placement(cfg)
        self.group = placement_group(self.plan.bundles, strategy="PACK")
        self._remove_group = remove_placement_group
        self.actors: dict[str, _Actor] = {}
        try:
            try:
                ray.get(self.group.ready(), timeout=min(ready_timeout_s, 120.0))
            except ray.exceptions.GetTimeoutError:
                need = {k: sum(b.get(k, 0) for b in self.plan.bundles) for k in ("CPU", "GPU")}
                raise PlacementUnavailable(
                    f"placement: the run needs bundles {self.plan.bundles} ({need['CPU']:g} CPU, {need['GPU']:g} GPU "
                    f"in all), the Ray cluster has {ray.available_resources()} free; lower placement.cpus_per_* or "
                    f"the counts, or use a larger cluster"
                ) from None

            def place(role: str, cls: type, *args: Any) -> None:
                """Starts `role`'s actor in its bundle; the role learns its GPUs (its device) last."""
                slot = self.plan.roles[role]
                options = dict(
                    num_cpus=slot.cpus,
                    num_gpus=slot.gpus,
                    # The job's environment carries the driver's thread count; each actor uses its own grant.
                    runtime_env={"env_vars": {"OMP_NUM_THREADS": str(threads_for(slot.cpus))}},
                    max_restarts=0,
                    max_concurrency=1,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        self.group, placement_group_bundle_index=slot.bundle
                    ),
                )
                # A rollout engine stages weights in a group of its own while a batch generates (partial rollout).
                # Only then: a concurrency group makes the actor threaded, and Ray runs a threaded actor's calls
                # in no guaranteed order, while async mode's weight load must land after the batches submitted
                # before it (a batch generated ahead of it would be one update staler than max_staleness).
                staging = cls is RolloutWorker and cfg.backends.partial_rollout
                groups = {"concurrency_groups": {_STAGING: 1}} if staging else {}
                actor_class = ray.remote(**groups)(cls) if groups else ray.remote(cls)
                self.actors[role] = _Actor(role, actor_class.options(**options).remote(*args, slot.gpus))

            weights = str(weights_from) if weights_from else None
            from rl_engine.backends.deepspeed_trainer import free_port

            port = free_port()
            pl = cfg.placement
            for rank in range(pl.trainer_ranks):
                place(f"trainer_{rank}", TrainerWorker, cfg, weights, rank, pl.trainer_ranks, port)
            for index in range(pl.rollout_engines):
                place(f"rollout_{index}", RolloutWorker, cfg, weights, index)
            if "reference" in self.plan.roles:
                place("reference", ReferenceWorker, cfg)
            if "reward" in self.plan.roles:
                place("reward", RewardWorker, cfg)
            pids = self._get({role: a.handle.ready.remote() for role, a in self.actors.items()}, ready_timeout_s)
            for role, pid in pids.items():
                self.actors[role].pid = pid
            self.engines = [self.actors[f"rollout_{i}"] for i in range(pl.rollout_engines)]
            self.ranks = [self.actors[f"trainer_{i}"] for i in range(pl.trainer_ranks)]
            self.transfer = self._connect_engines()
        except BaseException:
            self.close()
            raise
        self.rollout = RayRollout(self)
        self.trainer = RayTrainer(self)
        self.reward = RayReward(self) if "reward" in self.actors else None

    # --- calls -----------------------------------------------------------------------------------

    def _get(self, refs: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """Results by role; a dead role fails the run naming it instead of hanging the loop."""
        import ray

        try:
            values = ray.get(list(refs.values()), timeout=timeout)
        except ray.exceptions.RayActorError as exc:
            raise RoleDied(self._death_message(exc, list(refs))) from None
        return dict(zip(refs, values))

    def _death_message(self, exc: Exception, roles: list[str]) -> str:
        import ray

        dead = []
        for role in roles:
            actor = self.actors[role]
            try:
                ray.get(actor.handle.ready.remote(), timeout=10)
            except Exception:  # any failure to answer means this one is gone
                dead.append(f"{role} (pid {actor.pid})" if actor.pid else role)
        cause = str(exc).strip().splitlines()
        reason = next(
            (line for line in cause if "killed" in line.lower() or "exit" in line.lower()), cause[0] if cause else ""
        )
        return f"the run's {', '.join(dead) or ' / '.join(roles)} actor died: {reason.strip()}"

    def call(self, roles: list[str], method: str, *args: Any) -> dict[str, Any]:
        return self._get({role: getattr(self.actors[role].handle, method).remote(*args) for role in roles})

    def submit(self, role: str, method: str, *args: Any) -> Any:
        return getattr(self.actors[role].handle, method).remote(*args)

    def _connect_engines(self) -> str:
        """The weight sync's transfer ("file", or vLLM's "ipc" / "nccl" between GPUs); sets up the GPU ones."""
        import torch

        from rl_engine.devices import weight_transfer

        rollout_gpus = self.plan.roles[self.engines[0].role].gpus
        device = torch.device("cuda" if rollout_gpus > 0 and self.cfg.placement.device != "cpu" else "cpu")
        transfer = weight_transfer(self.cfg, device)
        if transfer != "file":
            self.call([a.role for a in self.ranks], "connect_engines", [a.handle for a in self.engines], transfer)
        return transfer

    def sync_weights(self) -> float:
        """Trainer ranks send the policy once; every engine takes it in place (GPU to GPU through vLLM's
        weight transfer, or a file every engine loads). Seconds, end to end."""
        started = time.perf_counter()
        if self.transfer != "file":
            self.call([a.role for a in self.ranks], "send_weights")
            return time.perf_counter() - started
        written = self.call([a.role for a in self.ranks], "write_weights_file")
        path = written[self.ranks[0].role]
        try:
            self.call([a.role for a in self.engines], "load_weights_file", path)
        finally:
            os.unlink(path)
        return time.perf_counter() - started

    def queue_weights(self, version: int) -> float:
        """Async mode's weight sync, which the driver does not wait for: the trainer ranks write the policy
        (`version`: updates in it), then each engine takes it after the batches submitted before (its calls
        run in order), or, with partial rollout, stages it to apply at its next segment boundary. A GPU
        transfer (ipc / nccl) cannot be queued: it waits for the engines' batches ahead, then the version
        follows. Seconds the driver spent."""
        started = time.perf_counter()
        engines = [a.role for a in self.engines]
        if self.transfer != "file":
            self.call([a.role for a in self.ranks], "send_weights")
            self.call(engines, "set_policy_version", version)
            return time.perf_counter() - started
        path = self.call([a.role for a in self.ranks], "write_weights_file")[self.ranks[0].role]
        if self.cfg.backends.partial_rollout:
            staged = {
                role: self.actors[role].handle.stage_weights.options(concurrency_group=_STAGING) for role in engines
            }
            try:
                self._get({role: method.remote(path, version) for role, method in staged.items()})
            finally:
                os.unlink(path)
        else:
            self._loading.append(
                ({role: self.submit(role, "load_weights_file", path, version) for role in engines}, path)
            )
        self._settle_loads(wait=False)
        return time.perf_counter() - started

    def _settle_loads(self, wait: bool) -> None:
        """Removes the files of the queued weight loads that finished (all of them with `wait`); a load that
        failed fails the run here."""
        import ray

        pending = []
        for refs, path in self._loading:
            done, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=None if wait else 0)
            if len(done) < len(refs):
                pending.append((refs, path))
                continue
            try:
                self._get(refs)
            finally:
                os.unlink(path)
        self._loading = pending

    def peak_memory_gb(self) -> dict[str, float]:
        """Each role's `memory/<role>_peak_gb`, and `memory/<role>_gpu_peak_gb` for those on a GPU."""
        refs = {role: a.handle.memory_metrics.remote(role) for role, a in self.actors.items()}
        return {name: value for metrics in self._get(refs).values() for name, value in metrics.items()}

    def describe(self) -> str:
        parts = [
            f"{role} pid {a.pid} (bundle {self.plan.roles[role].bundle}, {self.plan.roles[role].cpus:g} CPU"
            + (f", {self.plan.roles[role].gpus:g} GPU" if self.plan.roles[role].gpus else "")
            + ")"
            for role, a in self.actors.items()
        ]
        return f"placement {self.cfg.placement.mode}, bundles {self.plan.bundles}: " + "; ".join(parts)

    def close(self) -> None:
        import ray

        for _, path in self._loading:
            Path(path).unlink(missing_ok=True)
        self._loading = []
        for actor in self.actors.values():
            if actor.role.startswith(("rollout_", "reward")):
                # vLLM's engine core and the reward sandboxes are child processes: stop them first; a dead
                # or stuck actor is killed below all the same.
                with suppress(Exception):
                    ray.get(actor.handle.close.remote(), timeout=60)
        for actor in self.actors.values():
            ray.kill(actor.handle, no_restart=True)
        self.actors = {}
        with suppress(Exception):  # the cluster may already be gone
            self._remove_group(self.group)
        if self._started_ray:
            ray.shutdown()


class RayRollout:
    """The rollout engines as one backend: prompts split into contiguous shards, one per engine,
    samples returned prompt-major as the one-process backends return them."""

    def __init__(self, roles: RayRoles):
        self.roles = roles
        self.pad_id = roles.call([roles.engines[0].role], "pad_id")[roles.engines[0].role]

    def submit(self, prompts: list[list[int]], params: SamplingParams) -> list[tuple[str, int, Any]]:
        shards = _shards(len(prompts), len(self.roles.engines))
        return [
            (engine.role, start, self.roles.submit(engine.role, "generate", prompts[start:stop], params))
            for engine, (start, stop) in zip(self.roles.engines, shards)
            if stop > start
        ]

    def collect(self, pending: list[tuple[str, int, Any]]) -> tuple[list[Sample], float]:
        """The samples and the engines' generation seconds (the slowest engine's)."""
        results = self.roles._get({role: ref for role, _, ref in pending})
        samples: list[Sample] = []
        seconds = 0.0
        for role, start, _ in pending:
            shard, took = results[role]
            seconds = max(seconds, took)
            samples.extend(replace(s, prompt_index=s.prompt_index + start) for s in shard)
        return samples, seconds

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Sample]:
        return self.collect(self.submit(prompts, params))[0]

    def sync_weights(self, model: Any = None) -> float:
        return self.roles.sync_weights()

    def queue_weights(self, version: int) -> float:
        return self.roles.queue_weights(version)

    def set_policy_version(self, version: int) -> None:
        self.roles.call([a.role for a in self.roles.engines], "set_policy_version", version)

    def sleep(self) -> None:
        """Colocated engines on a GPU give its memory to their bundle's trainer rank until the sync."""
        if self.roles.cfg.placement.mode == "colocate":
            self.roles.call([a.role for a in self.roles.engines], "sleep")

    def close(self) -> None:
        pass  # RayRoles.close stops the engines


class RayTrainer:
    """The calls the loop makes of a trainer, on the trainer ranks (and the reference worker)."""

    def __init__(self, roles: RayRoles):
        self.roles = roles
        self.ranks = [a.role for a in roles.ranks]
        self.ref_model = "reference" if "reference" in roles.actors else None  # the loop asks "is there one"
        self.critic = "critic" if roles.cfg.algorithm.needs_critic else None
        self.exact_training_logprobs = bool(roles.call(self.ranks[:1], "exact_training_logprobs")[self.ranks[0]])

    def forward(self, batch: TokenBatch, which: str) -> torch.Tensor:
        if which == "reference":
            return self.roles.call(["reference"], "forward", batch)["reference"]
        # Rows split over the ranks, padded to equal shards: under ZeRO-3 every forward is a collective.
        world = len(self.ranks)
        size = math.ceil(len(batch) / world)
        padded = torch.cat([torch.arange(len(batch)), torch.zeros(size * world - len(batch), dtype=torch.long)])
        parts = self.roles._get(
            {
                rank: self.roles.submit(rank, "forward", batch.select(padded[i * size : (i + 1) * size]), which)
                for i, rank in enumerate(self.ranks)
            }
        )
        return torch.cat([parts[rank] for rank in self.ranks])[: len(batch)]

    def update(self, exp: Experience) -> dict[str, float]:
        import ray

        shared = ray.put(exp)  # one copy in the object store for all ranks
        per_rank = self.roles._get({rank: self.roles.submit(rank, "update", shared) for rank in self.ranks})
        names = per_rank[self.ranks[0]].keys()
        return {name: combine_metric(name, [m[name] for m in per_rank.values()]) for name in names}

    def full_weights(self) -> Any:
        return nullcontext()  # the ranks gather for themselves when asked to write

    def state_dict(self) -> dict[str, Any]:
        # Every rank's own (ZeRO partitions the optimizer state), restored rank by rank.
        states = self.roles.call(self.ranks, "state_dict")
        return {"ranks": [states[rank] for rank in self.ranks]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ranks = state.get("ranks")
        if ranks is None or len(ranks) != len(self.ranks):
            found = "one process" if ranks is None else f"{len(ranks)} trainer ranks"
            raise ValueError(
                f"the checkpoint's trainer state is from {found}, this run has "
                f"{len(self.ranks)} (placement): resume with the placement it was written with"
            )
        self.roles._get({rank: self.roles.submit(rank, "load_state_dict", s) for rank, s in zip(self.ranks, ranks)})

    def save_checkpoint(self, run_dir: Path, step: int, state: Any, keep_last: int) -> Path:
        paths = self.roles.call(self.ranks, "save_checkpoint", str(run_dir), step, state, keep_last)
        return Path(paths[self.ranks[0]])

    def parameter_count(self) -> int:
        return self.roles.call(self.ranks[:1], "parameter_count")[self.ranks[0]]


class RayReward:
    def __init__(self, roles: RayRoles):
        self.roles = roles

    def score(self, batch: Any) -> Any:
        return self.roles.call(["reward"], "score", batch)["reward"]

    def close(self) -> None:
        pass  # RayRoles.close stops the worker


def _shards(count: int, parts: int) -> list[tuple[int, int]]:
    """`parts` contiguous [start, stop) ranges covering `count` items, sizes differing by at most one."""
    base, extra = divmod(count, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds
