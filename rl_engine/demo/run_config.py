"""The demo experiment: the built demo task plus a run config that learns it (`python -m rl_engine demo build DIR`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rl_engine.config import RunConfig, dump_config, validate_config

RUN_CONFIG = "run.yaml"


def demo_run_config(demo_dir: Path, **overrides: object) -> RunConfig:
    """GRPO on two-digit addition from the warm start. Paths are relative to `demo_dir` (the CLI resolves
    them against the config file's folder), so the folder can be moved or shared. An override is a section's
    fields (merged into it) or a top-level value (`seed=`)."""
    cfg: dict[str, Any] = {
        "name": "demo-addition-grpo",
        "description": "GRPO on two-digit addition from a weak supervised warm start (the offline demo task).",
        "seed": 0,
        # float32 whatever the host: a 1M-parameter model gains nothing from bf16, and its curves stay comparable.
        "model": {"path": "model", "dtype": "float32"},
        "data": {"path": "data/train.jsonl", "eval_path": "data/test.jsonl", "eval_size": 500},
        "rewards": [{"type": "exact_match", "name": "correct"}],
        "algorithm": {"name": "grpo", "clip_low": 0.2, "clip_high": 0.28},
        "rollout": {"prompts_per_step": 32, "samples_per_prompt": 8, "max_new_tokens": 6, "temperature": 1.0},
        # Cosine decay over the run: at a constant 1e-4 the greedy accuracy swung by 10-20 points between
        # evaluations once most groups were solved (bench/README.md, "The toy's stability").
        "train": {
            "steps": 600,
            "lr": 1e-4,
            "warmup_steps": 20,
            "lr_schedule": "cosine",
            "micro_batch_size": 256,
            "grad_clip": 1.0,
        },
        "checkpoint": {"every_steps": 50, "keep_last": 2},
        "logging": {"eval_every": 20, "eval_size": 500},
    }
    for section, values in overrides.items():
        cfg[section] = {**cfg.get(section, {}), **values} if isinstance(values, dict) else values
    return validate_config(cfg)


def build_demo_assets(demo_dir: Path, seed: int = 0, force: bool = False) -> Path:
    """Builds (or reuses) the demo task in `demo_dir` and writes its run config; returns the config path."""
    from rl_engine.demo.build import build_demo, existing_build

    manifest = None if force else existing_build(demo_dir)
    if manifest is None or manifest.get("seed") != seed or manifest.get("model_size") != "demo":
        build_demo(demo_dir, seed=seed)
    path = demo_dir / RUN_CONFIG
    path.write_text(dump_config(demo_run_config(demo_dir, seed=seed)))
    return path
