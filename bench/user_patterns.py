"""What a user's regular expression costs: RE2 at the bounds (rl_engine/user_patterns.py), Python's backtracking
`re` on the pattern that held a worker, and the child process a builtin's "Try it" is scored in.

    .venv/bin/python bench/user_patterns.py [--chars 100000] [--repeats 5] [--re-max-n 24] [--starts 10]

- **RE2.** Per text of `--chars` random a/b characters (the bound is MAX_INPUT_CHARS), the median of `--repeats`
  matches, search and full match: a usual format pattern, and the slowest kind of pattern the bounds admit (an
  automaton too large for RE2's memory: `[ab]*a[ab]{999}...c`, near MAX_PROGRAM_SIZE instructions).
  `worst_ms_per_text` is what SECURITY.md's "User patterns" quotes.
- **Python's re.** `^(a+)+$` against n a's and a `!`, n = 16 up to `--re-max-n`: each further a doubles the time
  (`growth_per_char`); `extrapolated_31_chars_s` is the 31 characters of the attack (about a minute).
- **The child.** `python -m rl_engine.rewards score --cap-s 10` scoring one exact_match sample, as the worker starts
  it for a builtin: `--starts` times, the median (what a builtin "Try it" pays for its hard cap).

Prints one JSON document with the machine's load.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's root: `bench`, the engine, the SDK

from bench._machine import MachineLoad
from rl_engine.user_patterns import MAX_INPUT_CHARS, MAX_PROGRAM_SIZE, compile_user_pattern

REPO = Path(__file__).resolve().parents[1]
USUAL = r"(?s)^<think>.*</think>\s*<answer>.*</answer>$"
WORST = r"[ab]*a" + r"[ab]{999}" * 3 + r"[ab]{990}c"  # about MAX_PROGRAM_SIZE instructions, all alive at once
CATASTROPHIC = r"^(a+)+$"


def median_ms(run: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 3)


def match_costs(pattern: str, text: str, repeats: int) -> dict:
    compiled = compile_user_pattern(pattern)
    return {
        "instructions": compiled.program_size,
        "search_ms": median_ms(lambda: compiled.matches(text), repeats),
        "full_match_ms": median_ms(lambda: compiled.matches(text, whole=True), repeats),
    }


def re2_costs(chars: int, repeats: int) -> dict:
    rng = random.Random(0)
    text = "".join(rng.choice("ab") for _ in range(chars))
    out: dict = {"usual": match_costs(USUAL, text, repeats), "worst": match_costs(WORST, text, repeats)}
    out["worst_ms_per_text"] = max(out["worst"]["search_ms"], out["worst"]["full_match_ms"])
    return out


def backtracking_costs(max_n: int) -> dict:
    compiled = re.compile(CATASTROPHIC)
    seconds = {}
    for n in range(16, max_n + 1):
        started = time.perf_counter()
        compiled.match("a" * n + "!")
        seconds[n] = time.perf_counter() - started
    growth = statistics.median(seconds[n + 1] / seconds[n] for n in range(16, max_n) if seconds[n] > 0)
    return {
        "seconds_by_n": {str(n): round(s, 4) for n, s in seconds.items()},
        "growth_per_char": round(growth, 2),
        "extrapolated_31_chars_s": round(seconds[max_n] * growth ** (31 - max_n), 1),
    }


def child_start_ms(starts: int) -> float:
    request = json.dumps({"rewards": [{"type": "exact_match"}], "samples": [{"response": "4", "label": "4"}]})

    def once() -> None:
        done = subprocess.run(
            [sys.executable, "-m", "rl_engine.rewards", "score", "--cap-s", "10"],
            input=request,
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=120,
            check=True,
        )
        assert json.loads(done.stdout.splitlines()[-1])["scores"] == [1.0]

    return median_ms(once, starts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chars", type=int, default=MAX_INPUT_CHARS, help="characters per text (the bound)")
    parser.add_argument("--repeats", type=int, default=5, help="matches per figure (the median)")
    parser.add_argument("--re-max-n", type=int, default=24, help="longest run of a's for Python's re (doubles each)")
    parser.add_argument("--starts", type=int, default=10, help="scoring children started (the median)")
    args = parser.parse_args()
    machine = MachineLoad()
    report = {
        "bounds": {"max_input_chars": MAX_INPUT_CHARS, "max_program_size": MAX_PROGRAM_SIZE, "chars": args.chars},
        "re2": re2_costs(args.chars, args.repeats),
        "python_re": backtracking_costs(args.re_max_n),
        "child_start_ms": child_start_ms(args.starts),
    }
    report["machine"] = machine.report()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
