"""Bytes the per-token view adds to a step's rollout file (the Parquet file the engine writes per step,
`rl_engine/rollout_store.py`): measured on a real demo run, and computed for a step of 1,024-token responses.

    .venv/bin/python bench/token_view_bytes.py [--demo-dir DIR] [--steps 2] [--tokens 1024] [--samples 256]

The demo part trains `--steps` steps of the demo run config (32 prompts x 8 samples, up to 6 new tokens;
`rollout_correction: metrics`, so the trainer's log-probs are recorded too) on the demo task in DIR (a tiny
one is built in a temporary folder when DIR is not given) and reads each step's file: its bytes, and the
bytes of the same rows written without the per-token columns (token ids, pieces, log-probs, entropy,
advantages, IS weights, masks); the difference is what the view costs. The long part builds a step of
`--samples` responses of `--tokens` tokens each (random ids of the demo tokenizer and their pieces; random
log-probs, entropies and advantages, which compress worse than a real run's) and encodes it the same two
ways. Prints one JSON document.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's root: `bench`, the engine, the SDK

from bench import _servers
from bench._machine import MachineLoad

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def file_bytes(table: Any) -> dict[str, int]:
    """The table's Parquet bytes with and without its per-token columns (as the engine encodes a step)."""
    import pyarrow as pa

    from posttrain_sdk.rollout_files import TOKEN_COLUMNS, encode

    with_view = len(encode(table))
    without = table
    for name in TOKEN_COLUMNS:
        index = without.schema.get_field_index(name)
        without = without.set_column(index, name, pa.nulls(without.num_rows, type=without.schema.field(name).type))
    without_view = len(encode(without))
    return {"file_bytes": with_view, "without_view_bytes": without_view, "token_view_bytes": with_view - without_view}


def demo_run_bytes(demo: Path, steps: int, run_dir: Path) -> list[dict[str, Any]]:
    from posttrain_sdk.event_log import read_events
    from posttrain_sdk.rollout_files import read_table
    from rl_engine.demo.run_config import demo_run_config
    from rl_engine.loop import train

    cfg = demo_run_config(
        demo,
        model={"path": str(demo / "model")},
        data={"path": str(demo / "data" / "train.jsonl"), "eval_path": str(demo / "data" / "test.jsonl")},
        train={"steps": steps},
        algorithm={"rollout_correction": {"method": "metrics"}},
        checkpoint={"every_steps": 0, "save_final": False},
        logging={"eval_every": 0, "token_view_every": 1},
    )
    train(cfg, run_dir)
    rows = []
    for event in read_events(run_dir / "events.jsonl"):
        if event["type"] != "samples":
            continue
        table = read_table(run_dir / "rollouts" / event["data"]["file"])
        tokens = sum(len(ids) for ids in table.column("token_ids").to_pylist() if ids is not None)
        sizes = file_bytes(table)
        rows.append(
            {
                "step": event["step"],
                "samples": table.num_rows,
                "tokens": tokens,
                "stored_file_bytes": event["data"]["bytes"],
                **sizes,
                "token_view_bytes_per_token": round(sizes["token_view_bytes"] / max(tokens, 1), 2),
            }
        )
    return rows


def long_run_bytes(demo: Path, tokens: int, samples: int) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from posttrain_sdk.rollout_files import rows_table

    tokenizer = AutoTokenizer.from_pretrained(demo / "model")
    rng = random.Random(0)
    records, columns = [], {name: [] for name in ("token_ids", "token_text", "prompt_token_ids")}
    floats = ("rollout_logprob", "trainer_logprob", "ref_logprob", "entropy", "token_advantage", "is_weight")
    columns.update({name: [] for name in floats})
    for i in range(samples):
        ids = [rng.randrange(len(tokenizer)) for _ in range(tokens)]
        text = tokenizer.batch_decode([[t] for t in ids])
        records.append(
            {"index": i, "group": i // 8, "prompt": f"prompt {i // 8}", "response": "".join(text), "length": tokens}
        )
        columns["token_ids"].append(ids)
        columns["token_text"].append(text)
        columns["prompt_token_ids"].append([rng.randrange(len(tokenizer)) for _ in range(32)])
        advantage = rng.gauss(0, 1)
        for name in floats:
            if name == "token_advantage":
                columns[name].append([advantage] * tokens)  # GRPO: the sequence's advantage on every token
            elif name == "is_weight":
                columns[name].append([min(2.0, rng.lognormvariate(0, 0.05)) for _ in range(tokens)])
            elif name == "entropy":
                columns[name].append([rng.uniform(0, 4) for _ in range(tokens)])
            else:
                columns[name].append([-rng.expovariate(1.0) for _ in range(tokens)])
    sizes = file_bytes(rows_table(records, 1, columns))
    return {
        "samples": samples,
        "tokens_per_sample": tokens,
        **sizes,
        "token_view_bytes_per_token": round(sizes["token_view_bytes"] / (samples * tokens), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo-dir", type=Path, default=None)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--samples", type=int, default=256)
    args = parser.parse_args()
    machine = MachineLoad()
    with tempfile.TemporaryDirectory() as tmp:
        demo = args.demo_dir
        if demo is None:
            from rl_engine.demo.build import build_demo

            demo = Path(tmp) / "demo"
            build_demo(demo, seed=0, model_size="tiny", sft_steps=10, progress=False)
        result = {
            "demo_steps": demo_run_bytes(demo, args.steps, Path(tmp) / "run"),
            "long_responses": long_run_bytes(demo, args.tokens, args.samples),
            "machine": machine.report(),
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    _servers.run_bench(main)
