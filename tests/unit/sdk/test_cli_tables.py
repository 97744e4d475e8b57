"""`posttrain runs ls` in an 80-column terminal: short ids (as git and docker show them), one line per run, long
names cut with an ellipsis; `--wide` shows whole ids and every column."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from posttrain_sdk.cli import common
from posttrain_sdk.cli.runs import _run_rows
from posttrain_sdk.types import Run

RUNS = [
    {
        "id": "3f2a1b9c-5d6e-4f70-8a9b-0c1d2e3f4a5b",
        "name": "demo-addition-grpo+backends.rollout=vllm+train.steps=40 #12",
        "state": "cancelling",
        "kind": "native",
        "algorithm": "reinforce_pp",
        "experiment_name": "demo-addition-grpo+backends.rollout=vllm+train.steps=40",
        "last_step": 1000,
        "total_steps": 1000,
        "summary": {"reward/mean": {"last": -0.00012345}},
        "created_at": "2026-12-02T07:03:12.123456+00:00",
    },
    {
        "id": "9e8d7c6b-0000-4000-8000-000000000001",
        "name": "baseline",
        "state": "succeeded",
        "kind": "external",
        "engine": "openrlhf",
        "experiment_name": "gsm8k-openrlhf",
        "last_step": 99,
        "total_steps": 100,
        "summary": {"reward/mean": {"last": 0.8125}},
        "created_at": "2026-12-02T08:15:00+00:00",
    },
]


@pytest.fixture
def terminal(monkeypatch) -> io.StringIO:
    """The CLI's console as an 80-column terminal (what a console that is no terminal assumes, too)."""
    screen = io.StringIO()
    monkeypatch.setattr(common, "out", Console(file=screen, width=80, soft_wrap=True, color_system=None))
    return screen


def runs_ls(wide: bool) -> list[str]:
    runs = [Run.from_api(r) for r in RUNS]
    columns = ["id", "name", "state", "algorithm", *(["experiment"] if wide else []), "step", "reward", "created"]
    common.out.print(common._table(columns, _run_rows(runs, wide), shorten=() if wide else ("name",)))
    return common.out.file.getvalue().rstrip("\n").splitlines()


def test_runs_fit_an_80_column_terminal_one_line_each_with_short_ids(terminal):
    header, *rows = runs_ls(wide=False)
    assert len(rows) == len(RUNS), rows
    assert all(len(line) <= 80 for line in [header, *rows]), [header, *rows]
    assert header.split()[:3] == ["id", "name", "state"]
    assert [row.split()[0] for row in rows] == ["3f2a1b9c", "9e8d7c6b"]
    assert "…" in rows[0] and "12-02 07:03" in rows[0]  # the long name cut, the time to the minute
    assert rows[1].split()[1] == "baseline" and "openrlhf" in rows[1] and "99/100" in rows[1]


def test_wide_shows_whole_ids_the_experiment_and_the_whole_time(monkeypatch):
    screen = io.StringIO()
    monkeypatch.setattr(common, "out", Console(file=screen, width=300, soft_wrap=True, color_system=None))
    header, *rows = runs_ls(wide=True)
    assert "experiment" in header.split()
    assert rows[0].startswith(RUNS[0]["id"]) and RUNS[0]["name"] in rows[0] and RUNS[0]["experiment_name"] in rows[0]
    assert "2026-12-02 07:03:12" in rows[0]
