"""The placement plan: which bundle of the run's placement group holds each role, with its CPUs and
GPUs. Pure (no torch, no ray): the platform reads a run's resource needs from it (`resource_needs`),
admits the run when they fit and hands them to Ray to enforce (docs/ARCHITECTURE.md, "The scheduler")."""

from __future__ import annotations

from dataclasses import dataclass

from rl_engine.config import RunConfig


class PlacementUnavailable(RuntimeError):
    """The Ray cluster cannot hold the run's placement group."""


# --- placement plan (pure) -----------------------------------------------------------------------


@dataclass(frozen=True)
class RoleSlot:
    bundle: int
    cpus: float
    gpus: float


@dataclass(frozen=True)
class PlacementPlan:
    bundles: list[dict[str, float]]
    roles: dict[str, RoleSlot]  # "rollout_0", "trainer_0", "reference", "reward"


def uses_actors(cfg: RunConfig) -> bool:
    """Whether the roles run as Ray actors (otherwise all of them share the driver process)."""
    pl = cfg.placement
    return pl.mode == "separate" or pl.rollout_engines > 1 or pl.trainer_ranks > 1


def driver_gpus(cfg: RunConfig) -> float:
    """GPUs the driver process itself needs: the one-process (hybrid) engine's, whose trainer and rollout
    engine share one bundle; none when the roles are actors (their placement group holds the GPUs)."""
    pl = cfg.placement
    return 0.0 if uses_actors(cfg) else max(pl.gpus_per_trainer, pl.gpus_per_rollout_engine)


def plan_placement(cfg: RunConfig) -> PlacementPlan:
    """Bundles and each role's share of its bundle: the actors of one bundle split its resources evenly."""
    pl = cfg.placement
    engines = [f"rollout_{i}" for i in range(pl.rollout_engines)]
    ranks = [f"trainer_{i}" for i in range(pl.trainer_ranks)]
    aux = (["reference"] if cfg.algorithm.kl.coef > 0 else []) + (["reward"] if cfg.rewards else [])
    reward_model = any(r.type == "reward_model" for r in cfg.rewards)
    members: list[list[str]] = []
    resources: list[tuple[float, float]] = []
    if pl.mode == "colocate":
        for i in range(max(len(engines), len(ranks))):
            members.append(([ranks[i]] if i < len(ranks) else []) + ([engines[i]] if i < len(engines) else []))
            resources.append(
                (
                    max(pl.cpus_per_trainer, pl.cpus_per_rollout_engine),
                    max(pl.gpus_per_trainer, pl.gpus_per_rollout_engine),
                )
            )
    else:
        for rank in ranks:
            members.append([rank])
            resources.append((pl.cpus_per_trainer, pl.gpus_per_trainer))
        for engine in engines:
            members.append([engine])
            resources.append((pl.cpus_per_rollout_engine, pl.gpus_per_rollout_engine))
    members[0].extend(aux)
    bundles: list[dict[str, float]] = []
    roles: dict[str, RoleSlot] = {}
    for index, ((cpus, gpus), names) in enumerate(zip(resources, members)):
        bundle = {k: v for k, v in (("CPU", cpus), ("GPU", gpus)) if v > 0}
        if not bundle:
            raise PlacementUnavailable(
                "placement.cpus_per_trainer / cpus_per_rollout_engine: a bundle needs some "
                "CPU or GPU; all of them are 0"
            )
        bundles.append(bundle)
        for name in names:
            roles[name] = RoleSlot(index, cpus / len(names), _gpu_share(gpus, names, name, reward_model))
    return PlacementPlan(bundles, roles)


def _gpu_share(gpus: float, names: list[str], name: str, reward_model: bool) -> float:
    """GPUs go to the trainer ranks, engines and reference of a bundle, and to the reward worker only when
    it runs a reward model."""
    users = [n for n in names if n != "reward" or reward_model]
    return gpus / len(users) if gpus and name in users else 0.0


# --- what a run needs of the cluster (pure) ------------------------------------------------------


def driver_cpus(cfg: RunConfig) -> float:
    """CPUs the driver process itself needs: the one-process (hybrid) engine does all the work there;
    with actors the driver only coordinates them (their placement group holds the CPUs)."""
    pl = cfg.placement
    return 0.0 if uses_actors(cfg) else max(pl.cpus_per_trainer, pl.cpus_per_rollout_engine)


def threads_for(cpus: float) -> int:
    """torch/OpenMP threads of a process granted `cpus` CPUs: as many as it holds (at least one), so a
    run never spins more threads than its grant and slows its neighbours."""
    return max(1, int(cpus))


def resource_needs(cfg: RunConfig) -> dict:
    """What the run holds on the cluster while it runs, in Ray's resource names: the driver (the Ray
    job's entrypoint resources), the bundles of its placement group (none for the hybrid engine), and
    their sum. The one source for admission and for what Ray is asked to reserve."""
    driver = {"CPU": driver_cpus(cfg), "GPU": driver_gpus(cfg)}
    bundles = plan_placement(cfg).bundles if uses_actors(cfg) else []
    total = {key: driver[key] + sum(b.get(key, 0.0) for b in bundles) for key in ("CPU", "GPU")}
    return {"driver": driver, "bundles": [dict(b) for b in bundles], "total": total}
