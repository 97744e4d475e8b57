"""Environments people install rather than write: reasoning-gym, TextArena, verifiers and OpenEnv.

Each package is reached through a small adapter file in `adapters/`, written against the package's public
API only, which runs in the sandbox like a user's file (`rl_engine/sandbox/`: copied in alone; the package
itself is read-only there, with the rest of site-packages). The engine never imports these packages.

- reasoning-gym: `generate_dataset` writes a task (or a weighted mix) as prompt rows with the entry each needs
  to be scored, from a seed; the `reasoning_gym` reward type scores with the task's own `score_answer`.
- verifiers: `generate_tasks` writes a taskset's tasks as prompt rows; the `verifiers` reward type scores each
  with its task's own reward functions; `environment.package: verifiers` plays a taskset with its own `Env` or
  with tools as a multi-turn environment (its `run()` unmodified, the policy as its agent, tools called in-process).
- TextArena: `environment.package: textarena` plays a game (`options.env_id`) as a multi-turn environment;
  `generate_games` writes seeded games as prompt rows.
- OpenEnv: `environment.package: openenv` starts an environment's server inside the environment's sandbox and
  plays episodes through the package's own client.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rl_engine.rewards.packages import ADAPTERS, REASONING_GYM, VERIFIERS
from rl_engine.sandbox import Limits, ReportTooLarge, Sandbox, run_reporting

if TYPE_CHECKING:
    from rl_engine.config import EnvironmentConfig

TEXTARENA = ADAPTERS / "textarena_games.py"
OPENENV = ADAPTERS / "openenv_servers.py"
# environment.package -> (the adapter file, its environment class)
PACKAGE_ENVIRONMENTS: dict[str, tuple[Path, str]] = {
    "textarena": (TEXTARENA, "TextArena"),
    "openenv": (OPENENV, "OpenEnv"),
    "verifiers": (VERIFIERS, "Verifiers"),
}
GENERATE_TIMEOUT_S = 300.0
GENERATE_MAX_BYTES = 256 << 20
EXIT_GRACE_S = 15.0


def environment_source(cfg: EnvironmentConfig) -> tuple[str, str]:
    """(file, class) of a run's environment: the user's file, or the adapter of an installed package."""
    if cfg.package is not None:
        path, name = PACKAGE_ENVIRONMENTS[cfg.package]
        return str(path), name
    assert cfg.path is not None  # the config allows one or the other
    return cfg.path, cfg.name


class GenerationError(ValueError):
    """A dataset could not be generated; the message says why (the package's own error included)."""


def reasoning_gym_spec(tasks: list[dict[str, Any]], size: int, seed: int) -> dict[str, Any]:
    """The generation request, checked: tasks [{"name", "weight", "config"}], at least one, names unique."""
    if not isinstance(tasks, list) or not tasks:
        raise GenerationError('tasks: give at least one task, e.g. [{"name": "basic_arithmetic"}]')
    clean = []
    for i, task in enumerate(tasks):
        if not isinstance(task, dict) or not isinstance(task.get("name"), str) or not task["name"]:
            raise GenerationError(f"tasks[{i}].name: a reasoning-gym task name is required")
        weight = task.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight <= 0:
            raise GenerationError(f"tasks[{i}].weight: must be a number above 0")
        config = task.get("config") or {}
        if not isinstance(config, dict):
            raise GenerationError(f"tasks[{i}].config: must be an object of the task's settings")
        clean.append({"name": task["name"], "weight": float(weight), "config": config})
    names = [t["name"] for t in clean]
    if len(set(names)) != len(names):
        raise GenerationError("tasks: each task may appear once (give it one weight)")
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= 1_000_000:
        raise GenerationError("size: must be a whole number from 1 to 1000000")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise GenerationError("seed: must be a whole number")
    return {"tasks": clean, "size": size, "seed": seed}


def generate_dataset(
    tasks: list[dict[str, Any]], size: int, seed: int, *, timeout_s: float = GENERATE_TIMEOUT_S, memory_mb: float = 2048
) -> list[dict[str, Any]]:
    """reasoning-gym rows (see `adapters/reasoning_gym_tasks.py`), generated in a sandbox. The same tasks,
    size and seed give the same rows."""
    return generate_rows(REASONING_GYM, reasoning_gym_spec(tasks, size, seed), timeout_s=timeout_s, memory_mb=memory_mb)


def generate_games(
    env_id: str, size: int, seed: int, num_players: int = 1, *, timeout_s: float = GENERATE_TIMEOUT_S
) -> list[dict[str, Any]]:
    """TextArena rows: game `seed + i`'s first observation as the prompt, the seed beside it
    (see `adapters/textarena_games.py`), generated in a sandbox."""
    if not isinstance(env_id, str) or not env_id:
        raise GenerationError("env_id: a TextArena game id is required, e.g. GuessTheNumber-v0")
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= 100_000:
        raise GenerationError("size: must be a whole number from 1 to 100000")
    spec = {"env_id": env_id, "size": size, "seed": int(seed), "num_players": int(num_players)}
    return generate_rows(TEXTARENA, spec, timeout_s=timeout_s)


def generate_tasks(
    taskset: str,
    size: int,
    seed: int,
    args: dict[str, Any] | None = None,
    files: list[str] | None = None,
    *,
    timeout_s: float = GENERATE_TIMEOUT_S,
) -> list[dict[str, Any]]:
    """A verifiers taskset's tasks as rows (at most `size`; see `adapters/verifiers_tasksets.py`), generated in a
    sandbox that shows `files` (modules the taskset is) beside the adapter."""
    if not isinstance(taskset, str) or not taskset:
        raise GenerationError("taskset: a verifiers taskset id is required")
    if args is not None and not isinstance(args, dict):
        raise GenerationError("args: must be an object of the taskset's settings")
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= 1_000_000:
        raise GenerationError("size: must be a whole number from 1 to 1000000")
    spec = {"taskset": taskset, "args": args or {}, "size": size, "seed": int(seed)}
    return generate_rows(VERIFIERS, spec, timeout_s=timeout_s, files=files, exact=False)


def generate_rows(
    adapter: Path,
    spec: dict[str, Any],
    *,
    files: list[str] | None = None,
    exact: bool = True,
    timeout_s: float = GENERATE_TIMEOUT_S,
    memory_mb: float = 2048,
    max_bytes: int = GENERATE_MAX_BYTES,
) -> list[dict[str, Any]]:
    """Runs `adapter generate SPEC FD` in a sandbox and reads its rows (JSON lines) from FD, under a deadline
    and a size cap; GenerationError with the package's own message when it fails. `exact`: `spec["size"]` rows,
    else between 1 and that many."""
    box = Sandbox.create(Limits(memory_mb=memory_mb, cpu_s=int(timeout_s) + 5))
    for extra in files or ():
        box.add_file(extra)
    inside = box.add_file(adapter)
    try:
        # The rows are whole once the adapter closed its end; a package slow to shut down is not waited for long.
        done = run_reporting(
            box,
            lambda fd: [sys.executable, "-I", inside, "generate", json.dumps(spec), str(fd)],
            timeout_s=timeout_s,
            max_bytes=max_bytes,
            label=adapter.name,
            exit_grace_s=EXIT_GRACE_S,
        )
    except TimeoutError:
        raise GenerationError("generation did not finish in time") from None
    except ReportTooLarge:
        raise GenerationError(f"the generated dataset is over {max_bytes >> 20} MiB") from None
    data, lingered = done.data, done.lingered
    rows = [json.loads(line) for line in data.decode().splitlines() if line.strip()]
    if len(rows) == 1 and "error" in rows[0]:
        raise GenerationError(f"{adapter.stem}: {rows[0]['error']}")
    counted = len(rows) == spec["size"] if exact else 1 <= len(rows) <= spec["size"]
    if not counted or (done.returncode != 0 and not lingered):
        tail = done.tail
        raise GenerationError(
            f"generation failed (exit code {done.returncode}, {len(rows)} of {spec['size']} rows)"
            + (f": {tail}" if tail else "")
        )
    return rows


def play_episode(cfg: EnvironmentConfig, row: dict[str, Any], moves: list[str]) -> dict[str, Any]:
    """One episode of a multi-turn environment with the given moves as the model's turns, in its sandbox as a run
    plays it (a registry environment's "Try it"): {"turns": [{"role", "text", "reward"}], "reward", "done",
    "errors", "logs"}. Moves left when the episode ends are not played; an episode still open when they run out
    ends there (done False)."""
    from rl_engine.environments import EnvironmentPool  # the package imports this module

    metadata = {k: v for k, v in row.items() if k not in ("prompt", "label")}
    turns: list[dict[str, Any]] = []
    out: dict[str, Any] = {"turns": turns, "reward": 0.0, "done": False, "errors": [], "logs": {}}
    pool = EnvironmentPool(cfg)
    try:
        replies = pool.call(
            "reset", [(0, {"prompt": row.get("prompt"), "label": row.get("label"), "metadata": metadata})]
        )
        ok, value = replies[0]
        if not ok:
            out["errors"].append(f"environment: {value}")
            return out
        if value["observation"]:
            turns.append({"role": "environment", "text": value["observation"], "reward": None})
        trained = value["next_turn_trained"]
        for move in moves[: cfg.max_turns]:
            turn = {"role": "assistant", "text": move, "reward": None}
            turns.append(turn if trained else {**turn, "trained": False})
            ok, value = pool.call("step", [(0, move)])[0]
            if not ok:
                out["errors"].append(f"environment: {value}")
                return out
            out["reward"] += value["reward"]
            out["logs"].update(value["logs"])
            turns.append({"role": "environment", "text": value["observation"] or "", "reward": value["reward"]})
            trained = value["next_turn_trained"]
            if value["done"]:
                out["done"] = True
                break
        pool.call("end", [(0, None)])
        return out
    finally:
        pool.close()
