"""reasoning-gym tasks as a prompt dataset and its scorer as a reward, over the package's public API only
(`reasoning_gym.create_dataset`, a dataset's `score_answer`, `reasoning_gym.utils.extract_answer`).

This file runs in the sandbox (copied in alone, like a user's reward file): standard library and reasoning_gym.

Generation (`python reasoning_gym_tasks.py generate SPEC_JSON FD`): one JSON line per row on file descriptor FD:
    {"prompt": question, "label": answer, "data_source": "reasoning_gym/<task>",
     "extra_info": {"task": <task>, "config": {...}, "entry": {question, answer, metadata}}}
SPEC_JSON is {"tasks": [{"name", "weight", "config"}], "size", "seed"}: one task, or a weighted mix (the
package's own `composite` dataset, whose items name their task in `metadata.source_dataset`).

Scoring (verl's shape, what `rl_engine/rewards/python_fn.py` calls): `compute_score` reads the answer from the
response's last `<answer>...</answer>` (as reasoning-gym's own evaluation does), `compute_score_whole` takes
the whole response, `compute_score_last_number` the last number in it (for a model that answers in prose, as
lm-eval's flexible extraction does); each returns the task's own `score_answer(answer, entry)`.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any

_DATASETS: dict[str, Any] = {}  # one scorer per (task, config), built once per process


def _scorer(task: str, config: dict) -> Any:
    import reasoning_gym

    key = json.dumps([task, config], sort_keys=True)
    if key not in _DATASETS:
        # size/seed do not change how a task scores; a small dataset is cheap to build
        _DATASETS[key] = reasoning_gym.create_dataset(task, **{**config, "size": 1, "seed": 0})
    return _DATASETS[key]


def score(answer: str | None, extra_info: dict) -> float:
    entry = extra_info["entry"]
    return float(_scorer(extra_info["task"], extra_info.get("config") or {}).score_answer(answer, entry))


def compute_score(data_source: Any, solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> float:
    from reasoning_gym.utils import extract_answer

    if _foreign(data_source):
        return 0.0
    return score(extract_answer(solution_str), _info(extra_info))


def compute_score_whole(
    data_source: Any, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> float:
    if _foreign(data_source):
        return 0.0
    return score(solution_str.strip(), _info(extra_info))


def compute_score_last_number(
    data_source: Any, solution_str: str, ground_truth: Any, extra_info: dict | None = None
) -> float:
    if _foreign(data_source):
        return 0.0
    return score(last_number(solution_str), _info(extra_info))


# A signed integer or decimal, with thousands separators allowed ("1,024"), as lm-eval's flexible extraction reads.
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_number(text: str) -> str | None:
    """The response's last number, its thousands separators and a trailing period dropped; None without one."""
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "").rstrip(".") if found else None


def _foreign(data_source: Any) -> bool:
    """A row of another environment in a mixed run: not this reward's to score (0, no error)."""
    return isinstance(data_source, str) and "/" in data_source and not data_source.startswith("reasoning_gym/")


def _info(extra_info: dict | None) -> dict:
    if not isinstance(extra_info, dict) or "entry" not in extra_info or "task" not in extra_info:
        raise ValueError(
            "the row has no reasoning-gym entry (extra_info.task and extra_info.entry): not a generated row"
        )
    return extra_info


def _plain(value: Any) -> Any:
    """A JSON round trip of an entry keeps what score_answer reads (tuples become lists, as in any dataset file)."""
    return json.loads(json.dumps(value, default=str))


def generate(spec: dict) -> list[dict]:
    import reasoning_gym
    from reasoning_gym.composite import DatasetSpec

    tasks, size, seed = spec["tasks"], int(spec["size"]), int(spec["seed"])
    configs = {t["name"]: dict(t.get("config") or {}) for t in tasks}
    if len(tasks) == 1:
        dataset = reasoning_gym.create_dataset(tasks[0]["name"], size=size, seed=seed, **configs[tasks[0]["name"]])
    else:
        specs = [DatasetSpec(t["name"], float(t.get("weight", 1.0)), configs[t["name"]]) for t in tasks]
        dataset = reasoning_gym.create_dataset("composite", size=size, seed=seed, datasets=specs)
    rows = []
    for entry in dataset:
        task = entry["metadata"].get("source_dataset") or tasks[0]["name"]
        rows.append(
            {
                "prompt": entry["question"],
                "label": str(entry["answer"]),
                "data_source": f"reasoning_gym/{task}",
                "extra_info": {"task": task, "config": configs.get(task, {}), "entry": _plain(entry)},
            }
        )
    return rows


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] != "generate":
        print("usage: reasoning_gym_tasks.py generate SPEC_JSON FD", file=sys.stderr)
        return 2
    spec, fd = json.loads(argv[1]), int(argv[2])
    try:
        rows = generate(spec)
    except Exception as exc:  # the parent reads the reason from the same channel
        message = {"error": f"{type(exc).__name__}: {exc}"}
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(message) + "\n")
        return 1
    with os.fdopen(fd, "w") as out:
        for row in rows:
            out.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
