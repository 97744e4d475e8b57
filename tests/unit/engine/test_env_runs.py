"""Whole runs on the tiny demo model with installed environments: a TextArena game and a verifiers environment (its
own `Env.run`) as the multi-turn environment, and a dataset mixing two reasoning-gym tasks with the package's
scorer, whose curves are kept per environment; every metric they log is in the catalogue."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posttrain_sdk.event_log import read_events
from rl_engine.demo.run_config import demo_run_config
from rl_engine.environments.installed import generate_dataset, generate_games, generate_tasks
from rl_engine.metric_catalogue import lookup
from tests.unit.engine.helpers import step_rows

pytest.importorskip("reasoning_gym")
pytest.importorskip("textarena")


def write_rows(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def run(tiny_demo: Path, tmp_path: Path, data: str, **overrides) -> tuple[dict, list[dict]]:
    from rl_engine.loop import train

    cfg = demo_run_config(
        tiny_demo,
        model={"path": str(tiny_demo / "model")},
        data={"path": data, "eval_path": None, "eval_fraction": 0.25, "max_prompt_tokens": 96},
        rollout={"prompts_per_step": 4, "samples_per_prompt": 2, "max_new_tokens": 4},
        train={"steps": 2, "micro_batch_size": 8},
        checkpoint={"every_steps": 0, "save_final": False},
        logging={"eval_every": 2, "eval_size": 4},
        **overrides,
    )
    last = train(cfg, tmp_path / "run")
    return last, read_events(tmp_path / "run" / "events.jsonl")


def step_metrics(events: list[dict]) -> list[dict]:
    return [e["data"] for e in events if e["type"] == "metrics" and e["step"] > 0]


def test_a_run_plays_a_textarena_game_turn_by_turn(tiny_demo, tmp_path):
    rows = [{**row, "prompt": "guess 1-20:"} for row in generate_games("GuessTheNumber-v0", size=16, seed=0)]
    data = write_rows(tmp_path / "games.jsonl", rows)
    _, events = run(
        tiny_demo,
        tmp_path,
        data,
        rewards=[],
        environment={"package": "textarena", "options": {"env_id": "GuessTheNumber-v0"}, "max_turns": 2},
    )
    metrics = step_metrics(events)
    assert len(metrics) == 2 and all("reward/environment" in m and "env/turns" in m for m in metrics)
    assert all(lookup(name) is not None for m in metrics for name in m)
    samples = step_rows(tmp_path / "run", [e for e in events if e["type"] == "samples"][-1])
    # the short prompt is not the game's first observation, so the game's rules come first, then the model
    assert all([t["role"] for t in s["turns"][:2]] == ["environment", "assistant"] for s in samples)
    assert {e["data"]["state"] for e in events if e["type"] == "status"} >= {"running", "succeeded"}


def test_a_run_plays_a_verifiers_environments_own_run_turn_by_turn(tiny_demo, tmp_path):
    pytest.importorskip("verifiers.v1")
    fixture = str(Path(__file__).resolve().parents[2] / "fixtures" / "verifiers_envs" / "vf_guess.py")
    rows = generate_tasks("vf_guess", size=4, seed=0, files=[fixture])
    data = write_rows(tmp_path / "guesses.jsonl", rows * 4)
    environment = {
        "package": "verifiers",
        "options": {"taskset": "vf_guess", "max_turns": 2},
        "files": [fixture],
        "max_turns": 2,
    }
    _, events = run(tiny_demo, tmp_path, data, rewards=[], environment=environment)
    metrics = step_metrics(events)
    assert len(metrics) == 2 and all("reward/environment" in m and "env/solved" in m for m in metrics)
    assert all(lookup(name) is not None for m in metrics for name in m)
    samples = step_rows(tmp_path / "run", [e for e in events if e["type"] == "samples"][-1])
    assert all(s["turns"][0]["role"] == "assistant" and not s["errors"] for s in samples)
    # every episode was scored by the taskset (the turn limit ends the env's run()), so its reward has the task's part
    assert all(s["reward"] > 0 for s in samples)


def test_a_mixed_reasoning_gym_dataset_keeps_a_curve_per_environment(tiny_demo, tmp_path):
    arith = [{**r, "env": "arith"} for r in generate_dataset([{"name": "basic_arithmetic"}], size=8, seed=1)]
    spell = [{**r, "env": "spell"} for r in generate_dataset([{"name": "spell_backward"}], size=8, seed=2)]
    data = write_rows(tmp_path / "mix.jsonl", [row for pair in zip(arith, spell) for row in pair])
    _, events = run(tiny_demo, tmp_path, data, rewards=[{"type": "reasoning_gym", "name": "rg", "answer": "whole"}])
    metrics = step_metrics(events)
    assert len(metrics) == 2
    for m in metrics:
        assert "reward/rg" in m
        assert all(lookup(name) is not None for name in m)
    seen = {name for m in metrics for name in m if name.startswith("env/") and name.endswith("/reward/mean")}
    assert seen and seen <= {"env/arith/reward/mean", "env/spell/reward/mean"}
    assert sum(m.get("env/arith/samples", 0) + m.get("env/spell/samples", 0) for m in metrics) == 2 * 4 * 2
