"""Helpers of the engine tests that are not fixtures (the shared `tiny_demo` task is in tests/conftest.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path


def stop_at_first_checkpoint(straight: Path, stopped: Path, step: int) -> None:
    """Makes `stopped` the run folder `straight` was when its step-`step` checkpoint (its first) was
    written: that checkpoint, the events up to it and the rollout files they announce, as a run killed
    right after it would leave."""
    shutil.copytree(straight / "checkpoints" / f"step_{step}", stopped / "checkpoints" / f"step_{step}")
    lines = (straight / "events.jsonl").read_text().splitlines(keepends=True)
    upto = next(i for i, line in enumerate(lines) if json.loads(line)["type"] == "checkpoint")
    (stopped / "events.jsonl").write_text("".join(lines[: upto + 1]))
    for event in map(json.loads, lines[: upto + 1]):
        if event["type"] == "samples":
            (stopped / "rollouts").mkdir(exist_ok=True)
            name = event["data"]["file"]
            shutil.copy2(straight / "rollouts" / name, stopped / "rollouts" / name)


def step_rows(run_dir: Path, samples_event: dict) -> list[dict]:
    """The rows of the rollout file a `samples` event announces, as dicts (`posttrain_sdk.rollout_files`)."""
    from posttrain_sdk.rollout_files import read_table

    return read_table(Path(run_dir) / "rollouts" / samples_event["data"]["file"]).to_pylist()


def rollouts_by_step(run_dir: Path) -> dict[int, list[dict]]:
    """Every step's rollouts as the run's `samples` events announce them: the rows of each announced
    file, in step order, with the JSON-text columns (`components`, `env`) decoded."""
    from posttrain_sdk.event_log import read_events

    out: dict[int, list[dict]] = {}
    for event in read_events(Path(run_dir) / "events.jsonl"):
        if event["type"] != "samples":
            continue
        rows = step_rows(run_dir, event)
        for row in rows:
            row["components"], row["env"] = json.loads(row["components"]), json.loads(row["env"])
        out.setdefault(event["step"], []).extend(rows)
    return out


class ScriptedRollout:
    """A rollout backend that answers each call with the next scripted texts (one per context), so an
    environment executor's token layout can be checked exactly; the contexts it was given are kept."""

    def __init__(self, tokenizer, turns: list[list[str]]):
        self.tokenizer, self.turns, self.contexts = tokenizer, list(turns), []

    def generate(self, prompts: list[list[int]], params):
        from rl_engine.rollout import Sample

        assert params.n == 1
        self.contexts.append([list(p) for p in prompts])
        texts = self.turns.pop(0)
        return [Sample(i, self.ids(t), "stop", tuple(-0.5 for _ in self.ids(t))) for i, t in enumerate(texts)]

    def ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]
