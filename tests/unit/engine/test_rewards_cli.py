"""`python -m rl_engine.rewards score`: reward scoring in a process of its own (the platform's
"try it" for reward models uses it, so torch never loads in the web process)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]


def _score(payload: object, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rl_engine.rewards", "score", *options],
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


def test_a_cap_the_scoring_stays_within_changes_nothing():
    payload = {"rewards": [{"type": "regex", "pattern": "^(a+)+$"}], "samples": [{"response": "a" * 64 + "!"}]}
    proc = _score(payload, "--cap-s", "30")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["scores"] == [0.0]
    assert _score(payload, "--cap-s", "0").returncode == 2


@pytest.mark.timeout(60)
def test_the_cap_ends_the_process_inside_c_code_that_python_cannot_interrupt():
    # Python's own backtracking `re` on the catastrophic pattern: minutes of C code past the 0.2 s cap.
    code = (
        "import re; from rl_engine.rewards.__main__ import _end_this_process_after; "
        "_end_this_process_after(0.2); re.match(r'^(a+)+$', 'a' * 64 + '!')"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, timeout=60)
    assert proc.returncode == -signal.SIGALRM
