"""The SDK's cost inside a TRL training loop: steps/s of the same GRPOTrainer run on the demo task with
and without Posttrain's callback (posttrain_sdk.integrations.trl), goal: at most 2% slower.

The server is ours (uvicorn, one worker, a fresh Postgres database, as bench/ingest.py starts it). Each
measurement is a fresh process running TRL's GRPOTrainer for `--steps` steps on the demo task (the
demo's policy and arithmetic data, built into `.demo/assets` if missing; `--model-size tiny` for a
quick check) with `logging_steps=1` and `log_completions` off on both sides, so the callback ships
every step's metrics and every completion as a sample. A timing callback, first in the list,
stamps each step's start; a step's time runs to the next step's start, so it includes the Posttrain
callback's on_log. The first `--warmup-steps` steps are left out. Runs with and without alternate,
`--repeats` each; the medians of steps/s are compared.

    .venv/bin/python bench/sdk_overhead.py [--steps 30] [--warmup-steps 3] [--repeats 3] [--model-size demo]
                                           [--demo-dir DIR] [--pg-url postgres://postgres@127.0.0.1:5432]

Prints one JSON document on stdout (progress on stderr). Run it on a quiet machine: a 2% effect is
below the noise of a busy one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's root: `bench`, the engine, the SDK

from bench import _servers, ingest  # our server and its database
from bench._machine import MachineLoad
from bench._servers import REPO

ingest.OURS_DB = ingest.bench_db("bench_sdk_overhead")

TRAIN = r"""
import json, sys, time, warnings
from pathlib import Path
warnings.simplefilter("ignore")
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from rl_engine.demo.task import read_jsonl

assets, out, steps, with_sdk = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
torch.set_num_threads(int(__import__("os").environ.get("OMP_NUM_THREADS", "1")))

def exact(prompts, completions, label, **_):
    return [float(c.strip() == str(answer)) for c, answer in zip(completions, label)]

class Clock(TrainerCallback):
    starts = []
    def on_step_begin(self, args, state, control, **kwargs):
        self.starts.append(time.perf_counter())
    def on_train_end(self, args, state, control, **kwargs):
        self.starts.append(time.perf_counter())

args = GRPOConfig(output_dir=str(out), use_cpu=True, seed=0, report_to=[], gradient_checkpointing=False,
                  learning_rate=1e-4, beta=0.04, num_generations=8, per_device_train_batch_size=64,
                  generation_batch_size=64, max_completion_length=8, max_steps=steps, logging_steps=1,
                  save_strategy="no", disable_tqdm=True, dataloader_num_workers=0, log_completions=False)
trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(assets / "model"), reward_funcs=exact, args=args,
                      train_dataset=Dataset.from_list(read_jsonl(assets / "data" / "train.jsonl")),
                      processing_class=AutoTokenizer.from_pretrained(assets / "model"), callbacks=[Clock()])
if with_sdk:
    from posttrain_sdk.integrations.trl import PosttrainCallback
    trainer.add_callback(PosttrainCallback(trainer, experiment="bench sdk overhead", url=sys.argv[5], token=sys.argv[6],
                                           dir=str(out / "posttrain-runs"), heartbeat_s=10))
trainer.train()
print(json.dumps({"step_s": [b - a for a, b in zip(Clock.starts, Clock.starts[1:])]}))
"""


def demo_assets(size: str, workdir: Path) -> Path:
    """The demo task (`make demo` builds it into .demo/assets); the tiny size goes to the bench's work folder."""
    if size == "demo" and (REPO / ".demo" / "assets" / "model").exists():
        return REPO / ".demo" / "assets"
    target = REPO / ".demo" / "assets" if size == "demo" else workdir / "tiny-demo"
    ingest.log(f"building the {size} demo task into {target}")
    py = str(ingest.OURS_BIN / "python")
    sft = ", sft_steps=10" if size == "tiny" else ""  # tiny: a smoke test of the bench, not a policy
    code = (
        "from pathlib import Path; from rl_engine.demo.build import build_demo; "
        f"build_demo(Path({str(target)!r}), model_size={size!r}, progress=False{sft})"
    )
    _servers.run_checked([py, "-c", code], f"the {size} demo build", cwd=REPO)
    return target


def train(assets: Path, workdir: Path, steps: int, with_sdk: bool, url: str, token: str) -> list[float]:
    out = Path(tempfile.mkdtemp(prefix="trl-", dir=workdir))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "sdk"), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"),
    }
    command = [
        str(ingest.OURS_BIN / "python"),
        "-c",
        TRAIN,
        str(assets),
        str(out),
        str(steps),
        "1" if with_sdk else "0",
    ]
    done = _servers.run_checked([*command, url, token], "the TRL run", env=env, cwd=REPO)
    return json.loads(done.stdout.strip().splitlines()[-1])["step_s"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup-steps", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--model-size", choices=["tiny", "demo"], default="demo")
    ap.add_argument("--demo-dir", type=Path, help="a demo build to use as it is (instead of --model-size's)")
    ap.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432"))
    args = ap.parse_args()
    if args.steps <= args.warmup_steps:
        ap.error("--steps must be larger than --warmup-steps")
    machine = MachineLoad()
    pg = ingest.Postgres(args.pg_url)
    workdir = Path(tempfile.mkdtemp(prefix="bench-sdk-overhead-"))
    server = None
    try:
        assets = args.demo_dir.resolve() if args.demo_dir else demo_assets(args.model_size, workdir)
        server, token = ingest.start_ours_for_a_researcher(pg, workdir)
        url = server.url
        runs: dict[str, list[dict[str, Any]]] = {"without": [], "with": []}
        for repeat in range(args.repeats):
            for variant in ("without", "with") if repeat % 2 == 0 else ("with", "without"):
                step_s = train(assets, workdir, args.steps, variant == "with", url, token)[args.warmup_steps :]
                result = {"steps_per_s": len(step_s) / sum(step_s), "step_s_median": statistics.median(step_s)}
                runs[variant].append(result)
                ingest.log(f"repeat {repeat} {variant} the callback: {result['steps_per_s']:.3f} steps/s")
        without = statistics.median(r["steps_per_s"] for r in runs["without"])
        with_sdk = statistics.median(r["steps_per_s"] for r in runs["with"])
        report = {
            "bench": "sdk_overhead",
            "model_size": json.loads((assets / "manifest.json").read_text()).get("model_size"),
            "steps": args.steps,
            "warmup_steps": args.warmup_steps,
            "repeats": args.repeats,
            "without_callback": {"steps_per_s_median": without, "per_repeat": runs["without"]},
            "with_callback": {"steps_per_s_median": with_sdk, "per_repeat": runs["with"]},
            "slowdown": 1 - with_sdk / without,
            "goal": "slowdown <= 0.02",
            "machine": machine.report(),
        }
        print(json.dumps(report, indent=2))
        return 0
    finally:
        if server is not None:
            server.stop()
        pg.drop(ingest.OURS_DB)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    _servers.run_bench(main)
