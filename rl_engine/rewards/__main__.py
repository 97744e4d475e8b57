"""Score samples with reward components in a process of their own.

    python -m rl_engine.rewards score [--cap-s SECONDS] < request.json

Request (stdin, JSON): ``{"rewards": [spec, ...], "samples": [{"prompt", "response", "label",
"metadata"}, ...]}`` where each spec is a run config reward (``{"type": ..., **params}``, optional
``weight``). Result (the last line of stdout, JSON): ``{"scores": [...], "components": {name:
[...]}, "errors": [[...]], "extra_logs": {...}}``.

The platform scores builtin rewards and reward models off a run ("Try it", probes, judges) this way:
torch loads here and never in the web process or the worker, and ``--cap-s`` bounds the scoring by the
kernel. Components are loaded first (a reward model's weights); then SIGALRM, left at its default
action, ends the process ``cap_s`` seconds later wherever it is, C code included (a Python-level
timeout cannot stop a C loop). The parent reads that as the exit status ``-SIGALRM``. Exit code 2 and a
message on stderr for a request that cannot be read.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
from typing import Any

from rl_engine.rewards.base import CompositeReward, RewardBatch
from rl_engine.rewards.registry import build_reward


def _batch(samples: Any) -> RewardBatch:
    if not isinstance(samples, list) or not all(isinstance(s, dict) for s in samples):
        raise ValueError("samples: expected a list of objects")
    return RewardBatch.build(
        [str(s.get("prompt", "")) for s in samples],
        [str(s.get("response", "")) for s in samples],
        [None if s.get("label") is None else str(s["label"]) for s in samples],
        metadata=[s.get("metadata") or {} for s in samples],
    )


def score(request: dict[str, Any], *, end_process_after_s: float | None = None) -> dict[str, Any]:
    """The request's samples scored. `end_process_after_s` (for a process of its own: the CLI's `--cap-s`)
    ends this process that long after the components loaded, if scoring has not finished by then."""
    if not isinstance(request, dict):
        raise ValueError("the request must be a JSON object with rewards and samples")
    specs = request.get("rewards")
    if not isinstance(specs, list) or not specs:
        raise ValueError("rewards: expected a non-empty list of reward specs")
    batch = _batch(request.get("samples"))
    with build_reward(specs) as composite:
        _load(composite)
        if end_process_after_s is not None:
            _end_this_process_after(end_process_after_s)
        result = composite.score(batch)
        if end_process_after_s is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
    return {
        "scores": result.total,
        "components": result.components,
        "errors": result.errors,
        "extra_logs": result.extra_logs,
    }


def _load(composite: CompositeReward) -> None:
    """Load what the components load lazily (a reward model's weights), so the cap counts scoring only. A
    failure is left for scoring to meet again: the composite reports it per sample."""
    for component, _ in composite.components:
        load = getattr(component, "load", None)
        if callable(load):
            with contextlib.suppress(Exception):
                load()


def _end_this_process_after(seconds: float) -> None:
    signal.signal(signal.SIGALRM, signal.SIG_DFL)  # the default action of SIGALRM ends the process
    signal.setitimer(signal.ITIMER_REAL, seconds)


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl_engine.rewards", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["score"], help="score: read a request on stdin, print the result")
    parser.add_argument("--cap-s", type=_positive, help="end the process this long after loading (seconds)")
    args = parser.parse_args(argv)
    try:
        request = json.load(sys.stdin)
        result = score(request, end_process_after_s=args.cap_s)
    except (ValueError, TypeError) as exc:  # json.JSONDecodeError is a ValueError
        print(f"rl_engine.rewards: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
