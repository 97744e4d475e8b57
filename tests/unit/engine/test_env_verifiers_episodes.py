"""verifiers environments played as episodes, in the sandbox, through the engine's environment executor: a tool
environment (a taskset whose tasks have a toolset) calls its tools and scores as the package's own `Task.score`
scores the same trace; a multi-turn environment (its own `Env.run` playing the user) runs unmodified, turn by turn,
with the engine's token ids across turns; a failing environment fails its episode with its error, not the run."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

import pytest

from rl_engine.config import EnvironmentConfig
from rl_engine.environments.installed import generate_tasks
from tests.unit.engine.helpers import play_scripted

vf = pytest.importorskip("verifiers.v1")

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "verifiers_envs"


def files(taskset: str) -> list[str]:
    return [str(FIXTURES / f"{taskset}.py")]


@pytest.fixture(scope="module")
def tokenizer(tiny_demo: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_demo / "model")


@pytest.fixture(scope="module", autouse=True)
def fixtures_importable():
    sys.path.insert(0, str(FIXTURES))
    yield
    sys.path.remove(str(FIXTURES))


def rows_of(taskset: str) -> list[dict]:
    rows = generate_tasks(taskset, size=10, seed=0, files=files(taskset))
    return sorted(rows, key=lambda r: r["extra_info"]["task"]["idx"])


def play(tokenizer, taskset: str, rows: list[dict], moves: list[list[str]], max_turns: int = 4):
    cfg = EnvironmentConfig(
        package="verifiers",
        options={"taskset": taskset, "max_turns": max_turns},
        files=files(taskset),
        max_turns=9,
        max_observation_tokens=4096,
    )
    return play_scripted(tokenizer, cfg, rows, moves)


def test_tasksets_with_their_own_env_or_tools_are_played_as_episodes():
    assert all(r["extra_info"]["episode"] for r in rows_of("vf_guess") + rows_of("vf_multiply_tools"))
    assert not any("episode" in r["extra_info"] for r in rows_of("vf_sums"))


def own_tool_trace_score(row: dict, call: dict, result: str, answer: str) -> tuple[float, dict]:
    """The package scoring the same exchange itself: prompt, a reply calling the tool, its result, the answer."""
    from verifiers.v1.graph import MessageNode
    from verifiers.v1.trace import AgentInfo, TraceTask
    from verifiers.v1.types import AssistantMessage, ToolCall, ToolMessage, UserMessage
    from verifiers.v1.utils.loaders import load_taskset, taskset_config_type

    tasks = list(load_taskset(taskset_config_type("vf_multiply_tools").model_validate({"id": "vf_multiply_tools"})))
    task = tasks[row["extra_info"]["task"]["idx"]]
    messages = [
        UserMessage(content=task.data.prompt_text),
        AssistantMessage(content="", tool_calls=[ToolCall(id="c0", name=call["name"], arguments="{}")]),
        ToolMessage(tool_call_id="c0", content=result),
        AssistantMessage(content=answer),
    ]
    nodes = [
        MessageNode(parent=i - 1 if i else None, message=m, sampled=m.role == "assistant")
        for i, m in enumerate(messages)
    ]
    trace = vf.Trace(
        task=TraceTask(type=type(task).__name__, data=task.data), agent=AgentInfo(config=vf.AgentConfig()), nodes=nodes
    )
    asyncio.run(task.score(trace))
    return trace.reward, {**{k: r.score for k, r in trace.rewards.items()}, **trace.metrics}


def test_a_tool_environment_calls_its_tools_and_scores_as_the_package_does(tokenizer):
    row = rows_of("vf_multiply_tools")[0]
    a, b = map(int, re.findall(r"\d+", row["prompt"])[:2])
    call = {"name": "calculator_multiply", "arguments": {"a": a, "b": b}}
    moves = [f"<tool_call>{json.dumps(call)}</tool_call>", str(a * b)]
    out, rollout = play(tokenizer, "vf_multiply_tools", [row], [[m] for m in moves])
    assert out.errors == [[]]
    turns = out.turns[0]
    assert [t["role"] for t in turns] == ["environment", "assistant", "environment", "assistant", "environment"]
    tools_note, tool_result = turns[0]["text"], turns[2]["text"]
    assert '"name": "calculator_multiply"' in tools_note and '"name": "calculator_add"' in tools_note
    assert tool_result == f"<tool_response>\n{a * b}\n</tool_response>"  # the tool ran
    reward, scores = own_tool_trace_score(row, call, str(a * b), str(a * b))
    assert out.env_rewards == [reward] == [1.0]
    assert out.logs[0]["correct"] == scores["correct"] and out.logs[0]["metric_tool_calls"] == scores["tool_calls"] == 1
    # Token ids across turns: the engine's ids for each reply; the tools and the result tokenised and masked.
    ids = rollout.ids
    sample = out.samples[0]
    assert sample.response_ids == ids(tools_note) + ids(moves[0]) + ids(tool_result) + ids(moves[1])
    assert sample.action_mask == (
        (0,) * len(ids(tools_note))
        + (1,) * len(ids(moves[0]))
        + (0,) * len(ids(tool_result))
        + (1,) * len(ids(moves[1]))
    )
    assert rollout.contexts[1][0] == ids(row["prompt"]) + ids(tools_note) + ids(moves[0]) + ids(tool_result)


def test_a_tool_call_the_tool_refuses_comes_back_as_its_error(tokenizer):
    row = rows_of("vf_multiply_tools")[0]
    moves = ['<tool_call>{"name": "calculator_multiply", "arguments": {"a": "x", "b": 2}}</tool_call>', "1"]
    out, _ = play(tokenizer, "vf_multiply_tools", [row], [[m] for m in moves])
    assert out.errors == [[]] and out.env_rewards == [0.0]
    assert out.turns[0][2]["text"].startswith("<tool_response>\nError: ") and "valid integer" in out.turns[0][2]["text"]


def test_a_multi_turn_environment_runs_its_own_run_turn_by_turn(tokenizer):
    row = next(r for r in rows_of("vf_guess") if r["extra_info"]["task"]["secret"] == 11)
    out, rollout = play(tokenizer, "vf_guess", [row], [["8"], ["twelve"], ["12"], ["11"]])
    assert out.errors == [[]]
    said = [t["text"] for t in out.turns[0] if t["role"] == "environment"]
    assert said == ["higher", "Answer with a number.", "lower", ""]
    # the env's own reward (solved) and the task's (1 / guesses, weight 0.1)
    assert out.env_rewards == [pytest.approx(1.0 + 0.1 / 4)]
    assert out.logs[0]["solved"] == 1.0 and out.logs[0]["few_guesses"] == 0.25
    ids = rollout.ids
    assert out.samples[0].response_ids == ids("8") + ids("higher") + ids("twelve") + ids("Answer with a number.") + ids(
        "12"
    ) + ids("lower") + ids("11")


def test_the_seats_turn_limit_ends_its_run_and_still_scores(tokenizer):
    row = next(r for r in rows_of("vf_guess") if r["extra_info"]["task"]["secret"] == 11)
    out, _ = play(tokenizer, "vf_guess", [row], [["1"], ["2"]], max_turns=2)
    assert out.errors == [[]] and out.env_rewards == [pytest.approx(0.1 * 0.5)]
    assert out.logs[0]["solved"] == 0.0


def test_an_environment_that_raises_fails_its_episode_with_its_error_not_the_run(tokenizer):
    rows = [r for r in rows_of("vf_guess") if r["extra_info"]["task"]["secret"] in (3, 11)]
    out, _ = play(tokenizer, "vf_guess", rows, [["-1", "5"], ["11"]])
    secrets = [r["extra_info"]["task"]["secret"] for r in rows]
    broken, played = secrets.index(3), secrets.index(11)
    assert out.env_rewards[broken] == 0.0 and "below the game's range" in out.errors[broken][0]
    assert out.errors[played] == [] and out.turns[played][1]["text"] == "higher"
    assert out.env_rewards[played] == pytest.approx(1.0 + 0.1 / 2)


def test_an_environment_with_two_seats_is_refused_naming_them(tokenizer):
    out, _ = play(tokenizer, "vf_interview", rows_of("vf_interview"), [])
    assert out.env_rewards == [0.0]
    assert "declares 2 agents (interviewer, candidate)" in out.errors[0][0]


def test_a_row_of_another_taskset_is_refused_naming_both(tokenizer):
    row = rows_of("vf_guess")[0]
    cfg = EnvironmentConfig(
        package="verifiers",
        options={"taskset": "vf_multiply_tools"},
        files=files("vf_guess") + files("vf_multiply_tools"),
    )
    out, _ = play_scripted(tokenizer, cfg, [row], [])
    assert out.env_rewards == [0.0]
    assert "a task of taskset 'vf_guess'; this environment plays 'vf_multiply_tools'" in out.errors[0][0]
