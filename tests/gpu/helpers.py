"""Helpers of the GPU tests that are not fixtures (the `tiny_demo` task they train is tests/conftest.py's)."""

from __future__ import annotations

from pathlib import Path


def gpu_config(demo: Path, **sections) -> dict:
    cfg = {
        "name": "gpu",
        "seed": 3,
        "model": {"path": str(demo / "model")},
        "data": {"path": str(demo / "data" / "train.jsonl")},
        "rewards": [{"type": "regex", "name": "two_digits", "pattern": r"^\d\d"}],
        "algorithm": {"name": "ppo", "kl": {"coef": 0.05, "placement": "loss"}},
        "rollout": {"prompts_per_step": 4, "samples_per_prompt": 2, "max_new_tokens": 4},
        "train": {"steps": 2, "lr": 3e-3, "micro_batch_size": 4},
        "placement": {"device": "cuda", "gpus_per_trainer": 1},
        "checkpoint": {"save_final": False},
        "logging": {"eval_every": 0, "heartbeat_s": 60},
    }
    for section, values in sections.items():
        cfg[section] = {**cfg.get(section, {}), **values} if isinstance(values, dict) else values
    return cfg
