"""`python -m rl_engine.rewards score`: reward scoring in a process of its own (the platform's
"try it" for reward models uses it, so torch never loads in the web process)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]


def _score(payload: object) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rl_engine.rewards", "score"],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
    )


def test_score_prints_the_composite_result_as_the_last_line():
    proc = _score(
        {
            "rewards": [{"type": "exact_match", "name": "em"}, {"type": "regex", "pattern": "\\d", "weight": 0.5}],
            "samples": [
                {"prompt": "1+1=", "response": "2", "label": "2"},
                {"prompt": "x", "response": "y", "label": 3},
            ],
        }
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["scores"] == [1.5, 0.0]
    assert result["components"] == {"em": [1.0, 0.0], "regex": [1.0, 0.0]}
    assert result["errors"] == [[], []]


def test_a_request_without_rewards_exits_2_with_a_message():
    proc = _score({"samples": []})
    assert proc.returncode == 2
    assert "rewards: expected a non-empty list" in proc.stderr
