"""Score samples with reward components in a process of their own.

    python -m rl_engine.rewards score < request.json

Request (stdin, JSON): ``{"rewards": [spec, ...], "samples": [{"prompt", "response", "label",
"metadata"}, ...]}`` where each spec is a run config reward (``{"type": ..., **params}``, optional
``weight``). Result (the last line of stdout, JSON): ``{"scores": [...], "components": {name:
[...]}, "errors": [[...]], "extra_logs": {...}}``.

The platform's "try it" uses this for reward models, so torch loads here and never in the web
process. Exit code 2 and a message on stderr for a request that cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rl_engine.rewards.base import RewardBatch
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


def score(request: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(request, dict):
        raise ValueError("the request must be a JSON object with rewards and samples")
    specs = request.get("rewards")
    if not isinstance(specs, list) or not specs:
        raise ValueError("rewards: expected a non-empty list of reward specs")
    batch = _batch(request.get("samples"))
    with build_reward(specs) as composite:
        result = composite.score(batch)
    return {
        "scores": result.total,
        "components": result.components,
        "errors": result.errors,
        "extra_logs": result.extra_logs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl_engine.rewards", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["score"], help="score: read a request on stdin, print the result")
    parser.parse_args(argv)
    try:
        request = json.load(sys.stdin)
        result = score(request)
    except (ValueError, TypeError) as exc:  # json.JSONDecodeError is a ValueError
        print(f"rl_engine.rewards: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
