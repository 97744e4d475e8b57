"""Bytes the per-token view adds to a step's `samples` event (rl_engine/token_view.py): measured on a real
demo run, and computed for a run of 1,024-token responses.

    python bench/token_view_bytes.py [--demo-dir DIR] [--steps 2] [--tokens 1024] [--samples 256]

The demo part trains `--steps` steps of the demo run config (32 prompts x 8 samples, up to 6 new tokens;
`rollout_correction: metrics`, so the trainer's log-probs are recorded too) on the demo task in DIR (a
tiny one is built in a temporary folder when DIR is not given) and reads its events.jsonl: per step, the
JSON bytes of the samples event and of its `tokens` fields. The long part builds the view of `--samples`
responses of `--tokens` tokens each (random ids of the demo tokenizer; the four float16 arrays cost the
same whatever the values, the pieces' text depends on the tokenizer) and adds up their JSON. Prints one
JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def json_bytes(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":")).encode())


def demo_run_bytes(demo: Path, steps: int, run_dir: Path) -> list[dict[str, float]]:
    from posttrain_sdk.event_log import read_events
    from rl_engine.demo.run_config import demo_run_config
    from rl_engine.loop import train

    cfg = demo_run_config(
        demo,
        model={"path": str(demo / "model")},
        data={"path": str(demo / "data" / "train.jsonl"), "eval_path": str(demo / "data" / "test.jsonl")},
        train={"steps": steps},
        algorithm={"rollout_correction": {"method": "metrics"}},
        checkpoint={"every_steps": 0, "save_final": False},
        logging={"eval_every": 0},
    )
    train(cfg, run_dir)
    rows = []
    for event in read_events(run_dir / "events.jsonl"):
        if event["type"] != "samples":
            continue
        samples = event["data"]["samples"]
        rows.append(
            {
                "step": event["step"],
                "samples": len(samples),
                "tokens": sum(len(s["tokens"]["text"]) for s in samples),
                "event_bytes": json_bytes(event),
                "token_view_bytes": sum(json_bytes(s["tokens"]) for s in samples),
            }
        )
    return rows


def long_run_bytes(demo: Path, tokens: int, samples: int) -> dict[str, float]:
    from transformers import AutoTokenizer

    from rl_engine.token_view import FIELDS, token_view

    tokenizer = AutoTokenizer.from_pretrained(demo / "model")
    rng = random.Random(0)
    total = numbers = 0
    for _ in range(samples):
        ids = [rng.randrange(len(tokenizer)) for _ in range(tokens)]
        view = token_view(tokenizer.batch_decode([[i] for i in ids]), {name: [0.0] * tokens for name in FIELDS})
        total += json_bytes(view)
        numbers += sum(json_bytes(view[name]) for name in FIELDS)
    return {
        "samples": samples,
        "tokens_per_sample": tokens,
        "token_view_bytes_per_step": total,
        "float_arrays_bytes_per_step": numbers,
        "text_bytes_per_step": total - numbers,
        "bytes_per_token": total / (samples * tokens),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo-dir", type=Path, default=None)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--samples", type=int, default=256)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        demo = args.demo_dir
        if demo is None:
            from rl_engine.demo.build import build_demo

            demo = Path(tmp) / "demo"
            build_demo(demo, seed=0, model_size="tiny", sft_steps=10, progress=False)
        result = {
            "demo_steps": demo_run_bytes(demo, args.steps, Path(tmp) / "run"),
            "long_responses": long_run_bytes(demo, args.tokens, args.samples),
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
