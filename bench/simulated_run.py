"""One simulated training run through the SDK (`posttrain_sdk.init`, the event log and sender the engine
uses): `steps` steps at `rate` steps/s, each a `metrics` event of `metrics` names and a `samples` event of
`samples` rollouts. Prints `{"run": id, "dir": …}` once registered and a summary line at the end.

    .venv/bin/python bench/simulated_run.py --url http://127.0.0.1:8000 --token T --dir DIR --steps 100 --rate 10

The load of bench/ingest_load.py and of the web-restart fault test (tests/faults/).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

# This checkout's SDK first (an editable install may point at another checkout of the project).
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "sdk")]


def step_metrics(step: int, names: int) -> dict[str, float]:
    return {f"load/m{i:03d}": math.sin(step * 0.01 + i) for i in range(names)}


def step_samples(step: int, count: int) -> list[dict]:
    return [
        {"prompt": f"{step} + {i} =", "response": str(step + i), "reward": float(i % 2), "group": i // 2}
        for i in range(count)
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--token", required=True, help="a researcher's API token")
    ap.add_argument("--dir", required=True, help="where the run folder goes")
    ap.add_argument("--name", default="simulated")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--rate", type=float, default=10.0, help="steps per second (0: as fast as possible)")
    ap.add_argument("--metrics", type=int, default=50)
    ap.add_argument("--samples", type=int, default=8, help="rollouts in each step's sample batch (0: none)")
    ap.add_argument("--flush-timeout", type=float, default=300.0)
    args = ap.parse_args(argv)

    import posttrain_sdk as posttrain

    run = posttrain.init(
        "simulated load", name=args.name, url=args.url, token=args.token, dir=args.dir, total_steps=args.steps
    )
    print(json.dumps({"run": run.id, "dir": str(run.dir)}), flush=True)
    started = time.monotonic()
    for step in range(1, args.steps + 1):
        run.log(step_metrics(step, args.metrics), step=step)
        if args.samples:
            run.log_samples(step_samples(step, args.samples), step=step)
        if args.rate > 0:
            time.sleep(max(0.0, started + step / args.rate - time.monotonic()))
    written_s = time.monotonic() - started
    delivered = run.finish(timeout_s=args.flush_timeout)
    summary = {"run": run.id, "delivered": delivered, "written_s": round(written_s, 3)}
    summary |= {"total_s": round(time.monotonic() - started, 3), "steps_per_s": round(args.steps / written_s, 2)}
    print(json.dumps(summary), flush=True)
    return 0 if delivered else 1


if __name__ == "__main__":
    sys.exit(main())
