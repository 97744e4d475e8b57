"""Installed environments, measured: equality of our evaluation with each package's own, and learning on a
reasoning-gym task the demo policy was not warm-started on.

    python bench/environments.py [--smoke] [--demo-dir .demo/assets] [--seeds 20] [--steps 200] [--out DIR]

Equality. A checkpoint (the demo policy) answers `--seeds` items of each environment, greedy: two reasoning-gym
tasks (`basic_arithmetic`, `spell_backward`), a verifiers taskset (tests/fixtures/verifiers_envs/vf_sums.py, a
module written with verifiers' public API: the tasksets bundled with verifiers need the network), a verifiers tool
environment played as episodes (vf_multiply_tools.py: a calculator toolset, the model's tool calls run by the
engine's adapter) and a TextArena game (GuessTheNumber-v0); episodes go through the engine's multi-turn executor.
Our evaluation scores them through the adapters in the sandbox, as a run does; the package's own evaluation scores
the same answers in this process with its own API (`score_answer`, `Task.score` on a trace whose tool results the
toolset's own methods computed, TextArena replaying the same moves). A checkpoint this small is mostly wrong, so
the single-turn environments and the tool environment are also answered by a reference policy that is right (the
package's answer; a tool call then the tool's result), so that equality is checked on full scores as well as
zeros. Reported per environment and policy: items, answers whose two scores are equal, our mean and theirs.

Learning. GRPO from the demo's warm start on reasoning-gym `basic_arithmetic` at a difficulty the demo never
saw (three terms of one or two digits, addition: the warm start knows two-term sums), rows generated with
seeds apart for training and held-out evaluation, scored by the task's own `score_answer` (the reasoning_gym
reward, whole response). Reported: held-out accuracy (eval/reward/mean) at each evaluation, from step 0.

Prints one JSON document (also OUT/results.json). `--smoke` runs the smallest sizes (a tiny model, 2 seeds, 2
steps) to show the bench works; its figures mean nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

VERIFIERS_FIXTURE = REPO / "tests" / "fixtures" / "verifiers_envs" / "vf_sums.py"
VERIFIERS_TOOLS = VERIFIERS_FIXTURE.parent / "vf_multiply_tools.py"
LEARNING_TASK = {
    "name": "basic_arithmetic",
    "config": {
        "min_terms": 3,
        "max_terms": 3,
        "min_digits": 1,
        "max_digits": 2,
        "operators": ["+"],
        "allow_parentheses": False,
        "allow_negation": False,
        "whitespace": "no_space",
    },
}


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def ensure_demo(demo_dir: Path, size: str) -> None:
    from rl_engine.demo.build import build_demo, existing_build
    from rl_engine.demo.run_config import build_demo_assets

    if size == "demo":
        build_demo_assets(demo_dir)
    elif (existing_build(demo_dir) or {}).get("model_size") != size:
        build_demo(demo_dir, seed=0, model_size=size, progress=False)


# --- equality ---------------------------------------------------------------------------------------------


def _policy(model_dir: Path) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rl_engine.rollout import TransformersRollout

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    return TransformersRollout(model, tokenizer), tokenizer


def _answers(rollout: Any, tokenizer: Any, prompts: list[str], max_new_tokens: int) -> list[str]:
    from rl_engine.rollout import SamplingParams

    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    samples = rollout.generate(ids, SamplingParams(n=1, max_new_tokens=max_new_tokens, greedy=True))
    return tokenizer.batch_decode([s.response_ids for s in samples], skip_special_tokens=True)


def _ours(spec: dict, rows: list[dict], answers: list[str]) -> list[float]:
    from rl_engine.rewards import CompositeReward, RewardBatch, build_component

    batch = RewardBatch.build(
        [r["prompt"] for r in rows],
        answers,
        [r.get("label") for r in rows],
        metadata=[{k: v for k, v in r.items() if k not in ("prompt", "label")} for r in rows],
    )
    with CompositeReward([(build_component(spec), 1.0)]) as composite:
        return composite.score(batch).total


def _summary(name: str, ours: list[float], theirs: list[float], policy: str = "checkpoint") -> dict[str, Any]:
    return {
        "environment": name,
        "policy": policy,
        "items": len(ours),
        "equal": sum(1 for a, b in zip(ours, theirs) if abs(a - b) < 1e-9),
        "ours_mean": statistics.fmean(ours) if ours else None,
        "package_mean": statistics.fmean(theirs) if theirs else None,
    }


def equality(model_dir: Path, seeds: int, max_new_tokens: int) -> list[dict[str, Any]]:
    import reasoning_gym

    from rl_engine.environments.installed import generate_dataset, generate_games, generate_tasks

    rollout, tokenizer = _policy(model_dir)
    results = []
    for task in ("basic_arithmetic", "spell_backward"):
        _log(f"equality: reasoning-gym {task}")
        rows = generate_dataset([{"name": task}], size=seeds, seed=1234)
        own = reasoning_gym.create_dataset(task, size=seeds, seed=1234)
        answers = _answers(rollout, tokenizer, [r["prompt"] for r in rows], max_new_tokens)
        for policy, given in (("checkpoint", answers), ("reference", [str(own[i]["answer"]) for i in range(seeds)])):
            ours = _ours({"type": "reasoning_gym", "name": "rg", "answer": "whole"}, rows, given)
            theirs = [float(own.score_answer(a.strip(), own[i])) for i, a in enumerate(given)]
            results.append(_summary(f"reasoning_gym/{task}", ours, theirs, policy))

    _log("equality: verifiers vf_sums")
    rows = generate_tasks("vf_sums", size=seeds, seed=0, args={"size": seeds}, files=[str(VERIFIERS_FIXTURE)])
    answers = _answers(rollout, tokenizer, [r["prompt"] for r in rows], max_new_tokens)
    for policy, given in (("checkpoint", answers), ("reference", [r["extra_info"]["task"]["answer"] for r in rows])):
        ours = _ours({"type": "verifiers", "name": "vf", "files": [str(VERIFIERS_FIXTURE)]}, rows, given)
        theirs = [_verifiers_own(row, answer) for row, answer in zip(rows, given)]
        results.append(_summary("verifiers/vf_sums", ours, theirs, policy))

    _log("equality: verifiers vf_multiply_tools (episodes)")
    rows = generate_tasks("vf_multiply_tools", size=seeds, seed=0, args={"size": seeds}, files=[str(VERIFIERS_TOOLS)])
    for policy, player in (("checkpoint", rollout), ("reference", _ReferencePlayer(tokenizer))):
        ours, theirs = _verifiers_tools(player, tokenizer, rows, max_new_tokens)
        results.append(_summary("verifiers/vf_multiply_tools", ours, theirs, policy))

    _log("equality: textarena GuessTheNumber-v0")
    rows = generate_games("GuessTheNumber-v0", size=seeds, seed=500)
    ours, theirs = _textarena(rollout, tokenizer, rows, max_new_tokens)
    results.append(_summary("textarena/GuessTheNumber-v0", ours, theirs))
    return results


def _verifiers_own(row: dict, answer: str) -> float:
    import asyncio

    sys.path.insert(0, str(VERIFIERS_FIXTURE.parent))
    import verifiers.v1 as vf
    from verifiers.v1.graph import MessageNode
    from verifiers.v1.trace import AgentInfo, TraceTask
    from verifiers.v1.types import AssistantMessage, UserMessage
    from verifiers.v1.utils.loaders import task_type, taskset_config_type

    info = row["extra_info"]
    config = taskset_config_type(info["taskset"]).model_validate({**info["args"], "id": info["taskset"]})
    cls = task_type(info["taskset"])
    task = cls(cls.data_type().model_validate(info["task"]), config.task)
    trace = vf.Trace(
        task=TraceTask(type=type(task).__name__, data=task.data),
        agent=AgentInfo(config=vf.AgentConfig()),
        nodes=[
            MessageNode(message=UserMessage(content=task.data.prompt_text)),
            MessageNode(parent=0, message=AssistantMessage(content=answer), sampled=True),
        ],
    )
    asyncio.run(task.score(trace))
    return trace.reward


def _episodes(rollout: Any, tokenizer: Any, cfg: Any, rows: list[dict], max_new_tokens: int) -> Any:
    """The rows' episodes through the engine's multi-turn executor, greedy, as a run plays them."""
    from rl_engine.data import Prompt
    from rl_engine.executors import EnvironmentExecutor
    from rl_engine.rollout import SamplingParams

    prompts = [
        Prompt(
            text=r["prompt"],
            raw=r["prompt"],
            token_ids=tokenizer(r["prompt"], add_special_tokens=False)["input_ids"][-400:],
            label=None,
            metadata={k: v for k, v in r.items() if k not in ("prompt", "label")},
        )
        for r in rows
    ]
    executor = EnvironmentExecutor(rollout, tokenizer, cfg)
    try:
        return executor.run(prompts, SamplingParams(n=1, max_new_tokens=max_new_tokens, greedy=True))
    finally:
        executor.close()


class _ReferencePlayer:
    """A right player of vf_multiply_tools: calls the calculator's multiply on the prompt's two numbers, then
    answers with the number the tool gave back (a rollout backend, as the executor drives one)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def generate(self, prompts: list[list[int]], params: Any) -> list[Any]:
        import re

        from rl_engine.rollout import Sample

        out = []
        for i, ids in enumerate(prompts):
            context = self.tokenizer.decode(ids)
            results = re.findall(r"<tool_response>\s*(-?\d+)\s*</tool_response>", context)
            if results:
                text = results[-1]
            else:
                a, b = re.findall(r"What is (\d+)\*(\d+)\?", context)[0]
                call = {"name": "calculator_multiply", "arguments": {"a": int(a), "b": int(b)}}
                text = f"<tool_call>{json.dumps(call)}</tool_call>"
            response = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            out.append(Sample(i, response, "stop", tuple(0.0 for _ in response)))
        return out


def _verifiers_tools(player: Any, tokenizer: Any, rows: list[dict], max_new_tokens: int) -> tuple[list, list]:
    """Our episodes' rewards, and the package's own: `Task.score` on the same replies, with each tool call's result
    computed by the toolset's own method."""
    from rl_engine.config import EnvironmentConfig

    cfg = EnvironmentConfig(
        package="verifiers",
        options={"taskset": "vf_multiply_tools", "args": {"size": len(rows)}, "max_turns": 3},
        files=[str(VERIFIERS_TOOLS)],
        max_turns=3,
        max_observation_tokens=512,
    )
    out = _episodes(player, tokenizer, cfg, rows, max(max_new_tokens, 48))
    theirs = [_verifiers_tools_own(row, turns) for row, turns in zip(rows, out.turns or [])]
    return list(out.env_rewards or []), theirs


def _verifiers_tools_own(row: dict, turns: list[dict]) -> float:
    import asyncio
    import re

    sys.path.insert(0, str(VERIFIERS_TOOLS.parent))
    import verifiers.v1 as vf
    from verifiers.v1.graph import MessageNode
    from verifiers.v1.trace import AgentInfo, TraceTask
    from verifiers.v1.types import AssistantMessage, ToolCall, ToolMessage, UserMessage
    from verifiers.v1.utils.loaders import task_type, taskset_config_type

    info = row["extra_info"]
    config = taskset_config_type(info["taskset"]).model_validate({**info["args"], "id": info["taskset"]})
    cls = task_type(info["taskset"])
    task = cls(cls.data_type().model_validate(info["task"]), config.task)
    (toolset,) = cls.toolsets(config.task)
    messages: list[Any] = [UserMessage(content=task.data.prompt_text)]
    for turn in (t for t in turns if t["role"] == "assistant"):
        calls = [json.loads(body) for body in re.findall(r"<tool_call>(.*?)</tool_call>", turn["text"], re.DOTALL)]
        if not calls:
            messages.append(AssistantMessage(content=turn["text"]))
            break
        ids = [f"c{len(messages)}-{i}" for i in range(len(calls))]
        tool_calls = [ToolCall(id=i, name=c["name"], arguments=json.dumps(c["arguments"])) for i, c in zip(ids, calls)]
        messages.append(AssistantMessage(content="", tool_calls=tool_calls))
        for call_id, call in zip(ids, calls):
            method = getattr(toolset, call["name"].removeprefix(f"{toolset.server_name}_"))
            messages.append(ToolMessage(tool_call_id=call_id, content=str(asyncio.run(method(**call["arguments"])))))
    nodes = [
        MessageNode(parent=i - 1 if i else None, message=m, sampled=m.role == "assistant")
        for i, m in enumerate(messages)
    ]
    trace = vf.Trace(
        task=TraceTask(type=type(task).__name__, data=task.data), agent=AgentInfo(config=vf.AgentConfig()), nodes=nodes
    )
    asyncio.run(task.score(trace))
    return trace.reward


def _textarena(rollout: Any, tokenizer: Any, rows: list[dict], max_new_tokens: int) -> tuple[list[float], list[float]]:
    import textarena

    from rl_engine.config import EnvironmentConfig

    cfg = EnvironmentConfig(
        package="textarena", options={"env_id": "GuessTheNumber-v0"}, max_turns=6, max_observation_tokens=512
    )
    out = _episodes(rollout, tokenizer, cfg, rows, max_new_tokens)
    theirs = []
    for row, turns in zip(rows, out.turns or []):
        game = textarena.make(env_id="GuessTheNumber-v0")
        game.reset(num_players=1, seed=row["seed"])
        reward = 0.0
        for move in [t["text"] for t in turns if t["role"] == "assistant"]:
            done, _ = game.step(move)
            if done:
                reward = float(game.close()[0].get(0, 0.0))
                break
        theirs.append(reward)
    return list(out.env_rewards or []), theirs


# --- learning ---------------------------------------------------------------------------------------------


def learning(demo_dir: Path, out: Path, steps: int, smoke: bool) -> dict[str, Any]:
    from posttrain_sdk.event_log import read_events
    from rl_engine.config import validate_config
    from rl_engine.environments.installed import generate_dataset
    from rl_engine.loop import train

    data = out / "learning-data"
    data.mkdir(parents=True, exist_ok=True)
    train_size, eval_size = (64, 16) if smoke else (20_000, 500)
    for name, size, seed in (("train", train_size, 1), ("test", eval_size, 2)):
        rows = generate_dataset([LEARNING_TASK], size=size, seed=seed)
        with (data / f"{name}.jsonl").open("w") as handle:
            handle.writelines(json.dumps(row) + "\n" for row in rows)
    per_step = (4, 4) if smoke else (32, 8)
    cfg = validate_config(
        {
            "name": "reasoning-gym-basic-arithmetic-3-terms",
            "seed": 0,
            "model": {"path": str(demo_dir / "model")},
            "data": {"path": str(data / "train.jsonl"), "eval_path": str(data / "test.jsonl"), "eval_size": eval_size},
            "rewards": [{"type": "reasoning_gym", "name": "correct", "answer": "whole"}],
            "algorithm": {"name": "grpo", "clip_low": 0.2, "clip_high": 0.28},
            "rollout": {
                "prompts_per_step": per_step[0],
                "samples_per_prompt": per_step[1],
                "max_new_tokens": 6,
                "temperature": 1.0,
            },
            "train": {"steps": steps, "lr": 1e-4, "micro_batch_size": per_step[0] * per_step[1], "grad_clip": 1.0},
            "checkpoint": {"every_steps": 0},
            "logging": {"eval_every": max(1, steps // 10), "eval_size": eval_size},
        }
    )
    run_dir = out / "learning-run"
    started = time.monotonic()
    train(cfg, run_dir)
    curve = [
        {"step": e["step"], "accuracy": e["data"]["eval/reward/mean"]}
        for e in read_events(run_dir / "events.jsonl")
        if e["type"] == "metrics" and "eval/reward/mean" in e["data"]
    ]
    return {
        "task": LEARNING_TASK,
        "train_rows": train_size,
        "eval_rows": eval_size,
        "steps": steps,
        "seconds": round(time.monotonic() - started, 1),
        "curve": curve,
        "warm_start_accuracy": curve[0]["accuracy"] if curve else None,
        "final_accuracy": curve[-1]["accuracy"] if curve else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="smallest sizes: shows the bench runs, measures nothing")
    parser.add_argument("--demo-dir", type=Path, default=None, help="default .demo/assets (--smoke: a new tiny one)")
    parser.add_argument("--seeds", type=int, default=20, help="items per environment in the equality check")
    parser.add_argument("--steps", type=int, default=200, help="GRPO steps of the learning run")
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--skip", choices=["equality", "learning"], action="append", default=[])
    args = parser.parse_args()
    if args.smoke:
        args.seeds, args.steps = 2, 2
        args.demo_dir = args.demo_dir or Path(tempfile.mkdtemp(prefix="bench-environments-")) / "demo"
    demo_dir: Path = args.demo_dir or REPO / ".demo" / "assets"
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-environments-out-"))
    out.mkdir(parents=True, exist_ok=True)
    from bench._machine import MachineLoad

    machine = MachineLoad()
    ensure_demo(demo_dir, "tiny" if args.smoke else "demo")
    results: dict[str, Any] = {"smoke": args.smoke, "seeds": args.seeds}
    if "equality" not in args.skip:
        results["equality"] = equality(demo_dir / "model", args.seeds, args.max_new_tokens)
    if "learning" not in args.skip:
        results["learning"] = learning(demo_dir, out, args.steps, args.smoke)
    results["machine"] = machine.report()
    (out / "results.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
