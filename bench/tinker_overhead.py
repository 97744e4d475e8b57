"""The Tinker service's per-call overhead: a `forward_backward` round trip through the official `tinker` SDK minus
the trainer's own compute for it (the service's record of the call), p50/p95; goal <= 20 ms on this box.

The server runs in its own process (`python -m rl_engine.tinker serve`) on the demo model (`.demo/assets`, built
if missing; `--model-size tiny` builds a tiny one in a temporary folder); the client is this process. Each call
is one datum of `--tokens` tokens with `cross_entropy`, awaited before the next (the SDK's sequential use). The
compute time comes from the server's log line per call, so the difference is HTTP, (de)serialisation, the
queue and the SDK's polling.

    .venv/bin/python bench/tinker_overhead.py [--calls 60] [--warmup 5] [--tokens 64] [--model-size demo]

Prints one JSON document on stdout.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._machine import MachineLoad
from bench._servers import REPO
from bench._tinker import KEY, tinker_server

_CALL_LINE = re.compile(r"tinker call forward_backward (\d+\.\d+) s")


def _model_folder(size: str, scratch: Path) -> Path:
    from rl_engine.demo.build import build_demo, existing_build

    folder = REPO / ".demo" / "assets" if size == "demo" else scratch / "demo"
    if existing_build(folder) is None:
        build_demo(folder, seed=0, model_size=size, progress=False)
    return folder / "model"


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--model-size", default="demo")
    args = parser.parse_args()
    machine = MachineLoad()
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        model = _model_folder(args.model_size, scratch)
        with (
            (scratch / "server.log").open("w") as log,
            tinker_server("demo", model, scratch, log, "--log-calls") as url,
        ):
            round_trips = _measure(url, args)
        computes = [float(m.group(1)) for m in _CALL_LINE.finditer((scratch / "server.log").read_text())]
    round_trips, computes = round_trips[args.warmup :], computes[args.warmup :]
    overhead_ms = [1000 * (rt - c) for rt, c in zip(round_trips, computes, strict=True)]
    print(
        json.dumps(
            {
                "bench": "tinker_overhead",
                "calls": len(overhead_ms),
                "tokens_per_call": args.tokens,
                "model_size": args.model_size,
                "round_trip_ms_p50": round(1000 * statistics.median(round_trips), 2),
                "compute_ms_p50": round(1000 * statistics.median(computes), 2),
                "overhead_ms_p50": round(statistics.median(overhead_ms), 2),
                "overhead_ms_p95": round(_percentile(overhead_ms, 0.95), 2),
                "goal_ms": 20,
                "machine": machine.report(),
            },
            indent=2,
        )
    )
    return 0


def _measure(url: str, args: argparse.Namespace) -> list[float]:
    import tinker
    from tinker import types

    client = tinker.ServiceClient(base_url=url, api_key=KEY)
    training = client.create_lora_training_client(base_model="demo", rank=8).result()
    tokens = [(7 * i) % 50 + 10 for i in range(args.tokens + 1)]
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": types.TensorData(data=tokens[1:], dtype="int64", shape=[args.tokens]),
            "weights": types.TensorData(data=[1.0] * args.tokens, dtype="float32", shape=[args.tokens]),
        },
    )
    times = []
    for _ in range(args.calls + args.warmup):
        started = time.perf_counter()
        training.forward_backward([datum], loss_fn="cross_entropy").result()
        times.append(time.perf_counter() - started)
    return times


if __name__ == "__main__":
    raise SystemExit(main())
