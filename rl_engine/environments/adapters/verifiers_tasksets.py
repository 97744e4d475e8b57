"""verifiers environments' tasks as prompt rows and their reward functions as the reward, over verifiers' public
API only (`verifiers.v1`: a taskset by id and arguments, its tasks' data, `Task.score` on a `Trace`).

This file runs in the sandbox (copied in alone, like a user's reward file, with the reward's `files` beside it):
standard library and verifiers. A taskset id is what verifiers itself resolves: a taskset bundled with verifiers,
an installed environment package, or a module of `files`.

Generation (`python verifiers_tasksets.py generate SPEC_JSON FD`), SPEC_JSON {"taskset", "args", "size", "seed"}:
one JSON line per task, at most `size` (a finite taskset shuffled with `seed` first):
    {"prompt": the task's system prompt and prompt, "label": null, "data_source": "verifiers/<taskset>",
     "extra_info": {"taskset", "args", "task": the task's data as verifiers serialises it}}

Scoring (verl's per-sample shape, what `rl_engine/rewards/python_fn.py` calls): the task is rebuilt from its data,
the response becomes the trace's one sampled assistant message, and `Task.score` runs every reward function and
metric of the task; the score is the trace's weighted reward, and each function's own score is returned beside it
(`reward/<component>/<function>` curves). Multi-turn and tool environments (an `Env.run` with harness programs)
are not played here.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the reward's files, beside this one

_TASKSETS: dict[str, Any] = {}


def _taskset_config(taskset: str, args: dict) -> Any:
    from verifiers.v1.utils.loaders import taskset_config_type

    key = json.dumps([taskset, args], sort_keys=True)
    if key not in _TASKSETS:
        _TASKSETS[key] = taskset_config_type(taskset).model_validate({**args, "id": taskset})
    return _TASKSETS[key]


def _prompt(data: Any) -> str:
    system = getattr(data, "system_prompt", None)
    return f"{system}\n\n{data.prompt_text}" if system else data.prompt_text


def generate(spec: dict) -> list[dict]:
    from verifiers.v1.utils.loaders import load_taskset

    taskset, args, size, seed = spec["taskset"], dict(spec.get("args") or {}), int(spec["size"]), int(spec["seed"])
    tasks = load_taskset(_taskset_config(taskset, args))
    view = tasks.shuffle(seed).take(size) if tasks.bounded else tasks.take(size)
    return [
        {
            "prompt": _prompt(task.data),
            "label": None,
            "data_source": f"verifiers/{taskset}",
            "extra_info": {"taskset": taskset, "args": args, "task": task.data.model_dump(mode="json")},
        }
        for task in view
    ]


def _trace(task: Any, response: str) -> Any:
    import verifiers.v1 as vf
    from verifiers.v1.graph import MessageNode
    from verifiers.v1.trace import AgentInfo, TraceTask
    from verifiers.v1.types import AssistantMessage, SystemMessage, UserMessage

    data = task.data
    messages = [SystemMessage(content=data.system_prompt)] if data.system_prompt else []
    messages += [UserMessage(content=data.prompt_text)]
    nodes = [MessageNode(parent=i - 1 if i else None, message=m) for i, m in enumerate(messages)]
    nodes.append(MessageNode(parent=len(nodes) - 1, message=AssistantMessage(content=response), sampled=True))
    return vf.Trace(
        task=TraceTask(type=type(task).__name__, data=data), agent=AgentInfo(config=vf.AgentConfig()), nodes=nodes
    )


def compute_score(data_source: Any, solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> dict:
    from verifiers.v1.utils.loaders import task_type

    if isinstance(data_source, str) and "/" in data_source and not data_source.startswith("verifiers/"):
        return {"score": 0.0}  # a row of another environment in a mixed run: not this reward's to score
    if not isinstance(extra_info, dict) or "taskset" not in extra_info or "task" not in extra_info:
        raise ValueError("the row has no verifiers task (extra_info.taskset and extra_info.task): not a generated row")
    config = _taskset_config(extra_info["taskset"], dict(extra_info.get("args") or {}))
    cls = task_type(extra_info["taskset"])
    task = cls(cls.data_type().model_validate(extra_info["task"]), config.task)
    trace = _trace(task, solution_str)
    asyncio.run(task.score(trace))
    scores = {name: reward.score for name, reward in trace.rewards.items() if reward is not None}
    metrics = {f"metric_{name}": value for name, value in trace.metrics.items() if value is not None}
    return {"score": trace.reward, **scores, **metrics}


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] != "generate":
        print("usage: verifiers_tasksets.py generate SPEC_JSON FD", file=sys.stderr)
        return 2
    spec, fd = json.loads(argv[1]), int(argv[2])
    with os.fdopen(fd, "w") as out:
        try:
            rows = generate(spec)
        except Exception as exc:  # the parent reads the reason from the same channel
            out.write(json.dumps({"error": f"{type(exc).__name__}: {exc}"}) + "\n")
            return 1
        for row in rows:
            out.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
