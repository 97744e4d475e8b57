"""Installed environments (reasoning-gym, verifiers, TextArena, OpenEnv) in the registry: registering one has a
worker generate its rows in the engine's sandbox (the package never runs in the web process) and store them as
a dataset, with the reward (single-turn packages) or the engine's environment section (multi-turn) a run takes
from it; "Try it" plays one episode with typed moves on a worker; several environments' datasets mix by weight
into one, each row naming its environment (`env`, the run's per-environment curves)."""

from __future__ import annotations

import json
import random
from importlib import metadata
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User

from posttrain.core.job_runner import job_dispatch, job_run, job_wait
from posttrain.core.server_paths import resolve_user_path
from posttrain.projects.models import Project
from posttrain.registry.models import Dataset, Environment, EnvironmentTrial, RewardFunction
from posttrain.registry.reward_specs import RewardSpecError, component_name, validate_reward_spec
from posttrain.registry.services.common import (
    check_unique_name,
    clean_name,
    create_named,
    delete_unless_in_use,
    invalid,
    user_or_none,
)
from posttrain.registry.services.datasets import dataset_store_rows

# The distribution each package installs as (its version is read from the metadata: nothing is imported here).
DISTRIBUTIONS = {
    "reasoning_gym": "reasoning-gym",
    "verifiers": "verifiers",
    "textarena": "textarena",
    "openenv": "openenv-core",
}
SINGLE_TURN = ("reasoning_gym", "verifiers")
# A verifiers taskset with its own Env or with tools is played as episodes (its rows say so when generated).
VERIFIERS_TURNS = 4
VERIFIERS_OBSERVATION_TOKENS = 512  # the first observation lists the tools' JSON schemas
MAX_SIZE = 100_000
MAX_MOVES = 32


def environment_create(
    name: str,
    package: str,
    env_id: str,
    arguments: dict[str, Any] | None = None,
    *,
    size: int = 500,
    seed: int = 0,
    files: list[str] | None = None,
    project: Project,
    description: str = "",
    user: User | AnonymousUser | None = None,
) -> Environment:
    """Register an installed environment; a worker generates its rows after commit (state generating -> ready,
    or failed with the package's own message)."""
    name = clean_name(name)
    check_unique_name(Environment, name, "environment", project)
    if package not in DISTRIBUTIONS:
        raise invalid("package", f"unknown package {package!r}; expected one of: {', '.join(DISTRIBUTIONS)}")
    try:
        version = metadata.version(DISTRIBUTIONS[package])
    except metadata.PackageNotFoundError:
        raise invalid(
            "package", f"{DISTRIBUTIONS[package]} is not installed on this server (pip install '.[envs]')"
        ) from None
    env_id = (env_id or "").strip()
    if not env_id:
        raise invalid("env_id", "is required: the task, taskset, game or server app (module:attribute) to use")
    arguments = {} if arguments is None else arguments
    if not isinstance(arguments, dict):
        raise invalid("arguments", "must be an object of the package's settings")
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_SIZE:
        raise invalid("size", f"must be a whole number from 1 to {MAX_SIZE}")
    # Server files the environment reads: inside the admin's import roots, by a user allowed to name them.
    files = [str(resolve_user_path(f"files.{i}", path, user, "file")) for i, path in enumerate(files or [])]
    for field, value in (("description", description), ("env_id", env_id), ("arguments", arguments), ("files", files)):
        _refuse_nul(field, value)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**62:
        raise invalid("seed", "must be a whole number from 0 to 2**62")
    environment = create_named(
        Environment,
        "environment",
        project=project,
        name=name,
        description=description,
        package=package,
        env_id=env_id,
        arguments=arguments,
        files=files,
        version=version,
        size=size,
        seed=int(seed),
        run_environment=_run_environment(package, env_id, arguments, files),
        created_by=user_or_none(user),
    )
    _dispatch_generate(environment)
    return environment


def _dispatch_generate(environment: Environment) -> None:
    job_dispatch(environment)


def _refuse_nul(field: str, value: Any) -> None:
    """Postgres stores no NUL character in text or JSON: refused here with the field, not as a server error."""
    if _has_nul(value):
        raise invalid(field, "must not contain NUL characters")


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


def _run_environment(package: str, env_id: str, arguments: dict[str, Any], files: list[str]) -> dict | None:
    """The engine's `environment` section of a multi-turn package, checked by the engine's schema."""
    if package in SINGLE_TURN:
        return None
    from rl_engine.spec.config import ConfigError, EnvironmentConfig

    if package == "openenv" and ({"url", "base_url"} & set(arguments)):
        raise invalid("arguments", "a server at a URL is not reached: give the server's app, which runs in the sandbox")

    options = {"env_id": env_id, **arguments} if package == "textarena" else {"app": env_id, **arguments}
    section = {"package": package, "options": options, "files": files}
    try:
        EnvironmentConfig.model_validate(section)
    except (ConfigError, ValueError) as exc:
        raise invalid("arguments", str(exc)) from None
    return section


def environment_generate(environment_id: int | str) -> None:
    """The worker's side (posttrain.core.job_runner): the rows in the engine's sandbox, stored as a dataset; the
    reward of a single-turn package registered beside it. A failure is the environment's state, with the reason."""
    from rl_engine.spec.user_code import GenerationError

    # The engine's generators require the sandbox themselves; an OpenEnv server is not run here at all.
    job_run(Environment, environment_id, _generate, needs_sandbox=lambda env: False, expected=(GenerationError,))


def _generate(env: Environment) -> dict[str, Any]:
    rows = _generated_rows(env)
    for row in rows:
        row["env"] = component_name(env.name, env.package)
    dataset, _ = dataset_store_rows(
        env.name, rows, project=env.project, description=f"{env.package} {env.env_id}", user=env.created_by
    )
    run_environment = env.run_environment
    if env.package == "verifiers" and rows and (rows[0].get("extra_info") or {}).get("episode"):
        run_environment = _verifiers_episodes(env)
    reward = _reward_for(env) if run_environment is None else None
    return {"dataset": dataset, "reward": reward, "run_environment": run_environment}


def _generated_rows(env: Environment) -> list[dict[str, Any]]:
    from rl_engine.spec.user_code import generate_dataset, generate_games, generate_tasks

    if env.package == "reasoning_gym":
        return generate_dataset([{"name": env.env_id, "config": env.arguments}], env.size, env.seed)
    if env.package == "verifiers":
        return generate_tasks(env.env_id, env.size, env.seed, args=env.arguments, files=env.files)
    if env.package == "textarena":
        players = int(env.arguments.get("num_players", 1))
        return generate_games(env.env_id, env.size, env.seed, num_players=players)
    # openenv: the server resets each episode itself; rows only number the episodes
    return [
        {"prompt": f"{env.name} #{i}", "label": None, "data_source": f"openenv/{env.env_id}", "seed": env.seed + i}
        for i in range(env.size)
    ]


def _verifiers_episodes(env: Environment) -> dict[str, Any]:
    """The engine's `environment` section of a verifiers taskset played as episodes: the adapter ends the seat's
    turns where the engine would, so that the taskset's scoring runs on every episode."""
    options = {"taskset": env.env_id, "args": env.arguments, "max_turns": VERIFIERS_TURNS}
    return {
        "package": "verifiers",
        "options": options,
        "files": env.files,
        "max_turns": VERIFIERS_TURNS,
        "max_observation_tokens": VERIFIERS_OBSERVATION_TOKENS,
    }


def _reward_for(env: Environment) -> RewardFunction:
    spec: dict[str, Any] = {"type": env.package}
    if env.package == "verifiers" and env.files:
        spec["files"] = env.files
    taken = RewardFunction.objects.filter(project=env.project, name=env.name).exists()
    name = env.name if not taken else f"{env.name} ({env.package})"
    try:
        normalized = validate_reward_spec("builtin", spec, default_name=component_name(env.name, env.package))
    except RewardSpecError as exc:  # the schema and this module disagree: a bug, said plainly
        raise RuntimeError(f"the environment's reward spec is refused: {exc}") from None
    return create_named(
        RewardFunction,
        "reward",
        project=env.project,
        name=name,
        description=f"{env.package} {env.env_id}: the environment's own scoring",
        kind=RewardFunction.Kind.BUILTIN,
        spec=normalized,
        created_by=env.created_by,
    )


def environment_delete(environment: Environment) -> None:
    """The entry only: its dataset and reward stay registry objects of their own (runs may use them)."""
    delete_unless_in_use(environment, "environment")


# --- mixing ---------------------------------------------------------------------------------------


def environments_mix(
    name: str,
    parts: list[tuple[Environment, float]],
    *,
    size: int,
    seed: int = 0,
    project: Project,
    user: User | AnonymousUser | None = None,
) -> Dataset:
    """One dataset drawing each row from an environment chosen by weight (seeded), its rows keeping their `env`
    field; a run on it takes every part's reward, and keeps a curve per environment. Single-turn packages only:
    a run has one multi-turn environment. The caller checked that the user reads every part and creates in
    `project`."""
    if len(parts) < 2:
        raise invalid("environments", "give at least two environments to mix")
    for i, (env, weight) in enumerate(parts):
        if env.state != Environment.State.READY or env.dataset is None:
            raise invalid(f"environments.{i}", f"{env.name} is {env.state}, not ready")
        if env.run_environment is not None:
            raise invalid(f"environments.{i}", f"{env.name} is multi-turn ({env.package}): a run plays one such")
        if not weight > 0:
            raise invalid(f"environments.{i}.weight", "must be above 0")
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_SIZE:
        raise invalid("size", f"must be a whole number from 1 to {MAX_SIZE}")
    pools = [_rows(env.dataset) for env, _ in parts if env.dataset is not None]  # every part is ready (above)
    rng = random.Random(seed)
    picks = rng.choices(range(len(parts)), weights=[w for _, w in parts], k=size)
    cursors = [0] * len(parts)
    rows = []
    for part in picks:
        pool = pools[part]
        rows.append(pool[cursors[part] % len(pool)])
        cursors[part] += 1
    described = ", ".join(f"{env.name} ×{weight:g}" for env, weight in parts)
    dataset, _ = dataset_store_rows(name, rows, project=project, description=f"mix of {described}", user=user)
    return dataset


# --- "Try it" -------------------------------------------------------------------------------------


def environment_try(
    environment: Environment, moves: list[str], row: int = 0, user: User | AnonymousUser | None = None
) -> EnvironmentTrial:
    """Plays one episode of the environment on its dataset's row `row` with `moves` as the model's turns, on a
    worker; waits up to REWARD_TRY_WAIT_S and returns the trial, finished or still queued/running."""
    if environment.state != Environment.State.READY:
        raise invalid("environment", f"{environment.name} is {environment.state}: try it once it is ready")
    if not isinstance(moves, list) or not moves or not all(isinstance(m, str) for m in moves):
        raise invalid("moves", "give at least one move (the model's turns, as text)")
    if len(moves) > MAX_MOVES:
        raise invalid("moves", f"at most {MAX_MOVES} moves per try")
    _refuse_nul("moves", moves)
    assert environment.dataset is not None  # ready
    if not 0 <= row < environment.dataset.row_count:
        raise invalid("row", f"must be a row of the dataset (0 to {environment.dataset.row_count - 1})")
    trial = EnvironmentTrial.objects.create(
        environment=environment, row=row, moves=moves, created_by=user_or_none(user)
    )
    wait_s = float(settings.REWARD_TRY_WAIT_S)
    _dispatch_trial(trial, wait_s)
    return job_wait(trial, wait_s)


def _dispatch_trial(trial: EnvironmentTrial, wait_s: float) -> None:
    """It expires when nobody waits for it any more."""
    job_dispatch(trial, expires=wait_s)


def environment_trial_run(trial_id: Any) -> None:
    """The worker's side of "Try it" (posttrain.core.job_runner): play in the sandbox, store the outcome."""
    job_run(
        EnvironmentTrial,
        trial_id,
        lambda trial: {"result": _play(trial)},
        related=("environment__dataset", "environment__reward"),
    )


def _play(trial: EnvironmentTrial) -> dict[str, Any]:
    env = trial.environment
    assert env.dataset is not None
    row = _rows(env.dataset)[trial.row]
    if env.run_environment is not None:
        from rl_engine.spec.config import EnvironmentConfig
        from rl_engine.spec.user_code import play_episode

        cfg = EnvironmentConfig.model_validate({**env.run_environment, "max_turns": min(len(trial.moves), 64)})
        return {"prompt": row.get("prompt"), **play_episode(cfg, row, list(trial.moves))}
    return _score_single_turn(env, row, trial.moves[0])


def _score_single_turn(env: Environment, row: dict[str, Any], response: str) -> dict[str, Any]:
    from rl_engine.spec.user_code import CompositeReward, RewardBatch, build_component

    assert env.reward is not None
    spec = dict(env.reward.spec)
    metadata = {k: v for k, v in row.items() if k not in ("prompt", "label")}
    batch = RewardBatch.build([row["prompt"]], [response], [row.get("label")], metadata=[metadata])
    with CompositeReward([(build_component(spec), 1.0)]) as composite:
        scored = composite.score(batch)
    reward = scored.total[0]
    return {
        "prompt": row["prompt"],
        "turns": [{"role": "assistant", "text": response, "reward": reward}],
        "reward": reward,
        "done": True,
        "errors": scored.errors[0],
        "logs": {k: v for k, v in scored.extra_logs.items() if isinstance(v, (int, float))},
        "label": row.get("label"),
    }


def _rows(dataset: Dataset) -> list[dict[str, Any]]:
    """An environment's dataset, which this module wrote as JSONL."""
    with open(dataset.path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]
