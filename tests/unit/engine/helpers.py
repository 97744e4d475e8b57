"""Helpers of the engine tests that are not fixtures (the shared `tiny_demo` task is in tests/conftest.py):
run configs (the tiny demo run's, the minimal one with dotted-path changes), metrics and events compared
between runs, run folders and their rollouts, a random tiny policy and a scripted rollout backend."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

# --- run configs --------------------------------------------------------------------------------------------


def tiny_config(demo: Path, **sections) -> dict:
    """A short run on the tiny demo task in `demo`; each of `sections` is merged into its section (a dict) or
    replaces it."""
    cfg = {
        "name": "tiny",
        "seed": 3,
        "model": {"path": str(demo / "model")},
        "data": {
            "path": str(demo / "data" / "train.jsonl"),
            "eval_path": str(demo / "data" / "test.jsonl"),
            "eval_size": 16,
        },
        # exact match alone is ~always 0 for a barely trained model; the format reward gives signal.
        "rewards": [
            {"type": "exact_match"},
            {"type": "regex", "name": "two_digits", "pattern": r"^\d\d", "weight": 0.5},
        ],
        "algorithm": {"name": "grpo"},
        "rollout": {"prompts_per_step": 4, "samples_per_prompt": 4, "max_new_tokens": 4, "temperature": 1.0},
        "train": {"steps": 2, "lr": 3e-3, "micro_batch_size": 8},
        "logging": {"eval_every": 2, "heartbeat_s": 60},
    }
    for section, values in sections.items():
        cfg[section] = {**cfg.get(section, {}), **values} if isinstance(values, dict) else values
    return cfg


DELETE = object()  # a with_changes value: delete that key


def minimal() -> dict[str, Any]:
    """The smallest valid run config."""
    return {
        "name": "test-run",
        "model": {"path": "models/tiny"},
        "data": {"path": "data/train.jsonl"},
        "rewards": [{"type": "exact_match"}],
    }


def with_changes(changes: dict[str, Any]) -> dict[str, Any]:
    """The minimal config with dotted-path changes applied ("rewards.0.pattern": ...)."""
    cfg = copy.deepcopy(minimal())
    for path, value in changes.items():
        *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
        node: Any = cfg
        for part in parents:
            node = node.setdefault(part, {}) if isinstance(node, dict) else node[part]
        if value is DELETE:
            del node[last]
        else:
            node[last] = value
    return cfg


# --- events and metrics -------------------------------------------------------------------------------------


def by_type(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["type"] == kind]


def comparable(metrics: dict) -> dict:
    """Metrics that must be identical between equal runs (wall-clock ones excluded)."""
    return {
        k: v
        for k, v in metrics.items()
        if not k.startswith(("timing/", "throughput/", "memory/")) and k != "progress/train_time_s"
    }


# --- run folders --------------------------------------------------------------------------------------------


def stop_at_first_checkpoint(straight: Path, stopped: Path, step: int) -> None:
    """Makes `stopped` the run folder `straight` was when its step-`step` checkpoint (its first) was
    written: that checkpoint, the events up to it and the rollout files they announce, as a run killed
    right after it would leave."""
    shutil.copytree(straight / "checkpoints" / f"step_{step}", stopped / "checkpoints" / f"step_{step}")
    lines = (straight / "events.jsonl").read_text().splitlines(keepends=True)
    upto = next(i for i, line in enumerate(lines) if json.loads(line)["type"] == "checkpoint")
    (stopped / "events.jsonl").write_text("".join(lines[: upto + 1]))
    for event in map(json.loads, lines[: upto + 1]):
        if event["type"] == "samples":
            (stopped / "rollouts").mkdir(exist_ok=True)
            name = event["data"]["file"]
            shutil.copy2(straight / "rollouts" / name, stopped / "rollouts" / name)


def step_rows(run_dir: Path, samples_event: dict) -> list[dict]:
    """The rows of the rollout file a `samples` event announces, as dicts (`posttrain_sdk.rollout_files`)."""
    from posttrain_sdk.rollout_files import read_table

    return read_table(Path(run_dir) / "rollouts" / samples_event["data"]["file"]).to_pylist()


def rollouts_by_step(run_dir: Path) -> dict[int, list[dict]]:
    """Every step's rollouts as the run's `samples` events announce them: the rows of each announced
    file, in step order, with the JSON-text columns (`components`, `env`) decoded."""
    from posttrain_sdk.event_log import read_events

    out: dict[int, list[dict]] = {}
    for event in read_events(Path(run_dir) / "events.jsonl"):
        if event["type"] != "samples":
            continue
        rows = step_rows(run_dir, event)
        for row in rows:
            row["components"], row["env"] = json.loads(row["components"]), json.loads(row["env"])
        out.setdefault(event["step"], []).extend(rows)
    return out


# --- rollout backends ---------------------------------------------------------------------------------------


def random_policy(tokenizer):
    """A randomly initialised one-layer Qwen2 over `tokenizer`'s vocabulary (seeded: the same one each call)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


class ScriptedRollout:
    """A rollout backend that answers each call with the next scripted texts (one per context), so an
    environment executor's token layout can be checked exactly; the contexts it was given are kept."""

    def __init__(self, tokenizer, turns: list[list[str]]):
        self.tokenizer, self.turns, self.contexts = tokenizer, list(turns), []

    def generate(self, prompts: list[list[int]], params):
        from rl_engine.rollout import Sample

        assert params.n == 1
        self.contexts.append([list(p) for p in prompts])
        texts = self.turns.pop(0)
        return [Sample(i, self.ids(t), "stop", tuple(-0.5 for _ in self.ids(t))) for i, t in enumerate(texts)]

    def ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]


def play_scripted(tokenizer, cfg, rows: list[dict], moves: list[list[str]]):
    """The rows' episodes of environment `cfg` through the engine's executor, the model's turns scripted (one list
    of texts per call, one text per open episode): (the executor's rollouts, the scripted backend)."""
    from rl_engine.data import Prompt
    from rl_engine.executors import EnvironmentExecutor
    from rl_engine.rollout import SamplingParams

    rollout = ScriptedRollout(tokenizer, moves)
    prompts = [
        Prompt(
            text=r["prompt"],
            raw=r["prompt"],
            token_ids=rollout.ids(r["prompt"]),
            label=None,
            metadata={k: v for k, v in r.items() if k not in ("prompt", "label")},
        )
        for r in rows
    ]
    run = EnvironmentExecutor(rollout, tokenizer, cfg)
    try:
        return run.run(prompts, SamplingParams(n=1)), rollout
    finally:
        run.close()
