"""Resume without loss, under real kills: bench/ledger_faults.py SIGKILLs the engine's process group at random
moments of a 2-epoch run and resumes it each time; the prompt ledger then shows no row skipped, none trained
twice, none left in flight, every row of both epochs accounted for as the unkilled run accounts for it, and the
staleness bound held on every trained row. Here in async mode with partial rollout (batches generated ahead are
kept in the checkpoint and restored with their rollouts); the bench runs every mode (bench/README.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.slow


def test_a_run_killed_and_resumed_accounts_for_every_row_of_every_epoch_once(tiny_demo, tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "bench/ledger_faults.py",
            *("--modes", "async4_partial"),
            *("--kills", "1", "--rows", "8", "--checkpoint-every", "1"),
            *("--demo-dir", str(tiny_demo), "--out", str(tmp_path)),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode in (0, 1), done.stderr[-3000:]
    document = json.loads((tmp_path / "results.json").read_text())
    for mode, result in document["modes"].items():
        assert result["lossless"], (mode, result)
        assert result["resumes"] >= 1 and len(result["kills"]) >= 1, (mode, result)
        for epoch in result["epochs"]:
            accounted = epoch["trained"] + sum(epoch["filtered"].values())
            assert accounted == epoch["rows"] == 8, (mode, epoch)
    assert document["all_lossless"] and done.returncode == 0
