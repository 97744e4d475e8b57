"""verifiers tasksets through the adapter, in the sandbox: two tasksets written with verifiers' public API
(tests/fixtures/verifiers_envs) become prompt rows, and the `verifiers` reward gives exactly what the tasks' own
`Task.score` gives for the same replies, with each reward function's score kept beside the total."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from rl_engine.environments.installed import GenerationError, generate_tasks
from rl_engine.rewards import CompositeReward, RewardBatch, build_component

vf = pytest.importorskip("verifiers.v1")

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "verifiers_envs"
FILES = {name: [str(FIXTURES / f"{name}.py")] for name in ("vf_sums", "vf_reverse")}


@pytest.fixture(scope="module", autouse=True)
def fixtures_importable():
    sys.path.insert(0, str(FIXTURES))
    yield
    sys.path.remove(str(FIXTURES))


def own_scores(taskset: str, replies: list[str]) -> list[dict]:
    """The package scoring the same replies itself: its tasks in their order, a trace each, Task.score."""
    from verifiers.v1.graph import MessageNode
    from verifiers.v1.trace import AgentInfo, TraceTask
    from verifiers.v1.types import AssistantMessage, UserMessage
    from verifiers.v1.utils.loaders import load_taskset, taskset_config_type

    tasks = list(load_taskset(taskset_config_type(taskset).model_validate({"id": taskset})))
    out = []
    for task, reply in zip(tasks, replies):
        trace = vf.Trace(
            task=TraceTask(type=type(task).__name__, data=task.data),
            agent=AgentInfo(config=vf.AgentConfig()),
            nodes=[
                MessageNode(message=UserMessage(content=task.data.prompt_text)),
                MessageNode(parent=0, message=AssistantMessage(content=reply), sampled=True),
            ],
        )
        asyncio.run(task.score(trace))
        out.append({"total": trace.reward, **{k: r.score for k, r in trace.rewards.items()}})
    return out


def score(taskset: str, rows: list[dict], replies: list[str]):
    component = build_component({"type": "verifiers", "name": "vf", "files": FILES[taskset]})
    batch = RewardBatch.build(
        [r["prompt"] for r in rows],
        replies,
        [r["label"] for r in rows],
        metadata=[{k: v for k, v in r.items() if k not in ("prompt", "label")} for r in rows],
    )
    with CompositeReward([(component, 1.0)]) as composite:
        return composite.score(batch)


def in_taskset_order(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: r["extra_info"]["task"]["idx"])


def test_a_tasksets_tasks_become_rows_with_their_prompts():
    rows = generate_tasks("vf_reverse", size=10, seed=0, files=FILES["vf_reverse"])
    assert len(rows) == 6  # the whole taskset: it has six tasks
    assert {r["data_source"] for r in rows} == {"verifiers/vf_reverse"}
    first = in_taskset_order(rows)[0]
    assert first["prompt"] == "Answer with the word only.\n\nSpell backward: apple"
    assert generate_tasks("vf_reverse", size=10, seed=0, files=FILES["vf_reverse"]) == rows  # seeded order
    assert len(generate_tasks("vf_sums", size=3, seed=1, args={"size": 5}, files=FILES["vf_sums"])) == 3


def test_single_reward_functions_score_as_the_package_scores_them():
    rows = in_taskset_order(generate_tasks("vf_sums", size=8, seed=0, files=FILES["vf_sums"]))
    answers = [r["extra_info"]["task"]["answer"] for r in rows]
    replies = [answers[0], "no idea", str(int(answers[2]) + 1), f" {answers[3]} ", *answers[4:]]
    own = own_scores("vf_sums", replies)
    result = score("vf_sums", rows, replies)
    assert result.errors == [[] for _ in rows]
    assert result.components["vf"] == pytest.approx([o["total"] for o in own])
    assert result.components["vf"][:3] == pytest.approx([1.2, 0.0, 0.2])
    # each reward function's own score, as a curve of this component
    assert result.extra_logs["vf/correct"] == pytest.approx(sum(o["correct"] for o in own) / len(own))
    assert result.extra_logs["vf/bare_number"] == pytest.approx(sum(o["bare_number"] for o in own) / len(own))


def test_a_reward_function_returning_several_rewards_keeps_each():
    rows = in_taskset_order(generate_tasks("vf_reverse", size=6, seed=0, files=FILES["vf_reverse"]))
    replies = ["elppa", "rxxxx", "nothing", "duolc", "", "regit"]
    own = own_scores("vf_reverse", replies)
    result = score("vf_reverse", rows, replies)
    assert result.components["vf"] == pytest.approx([o["total"] for o in own]) == [1.5, 0.5, 0.0, 1.5, 0.0, 1.5]
    assert result.extra_logs["vf/exact"] == pytest.approx(3 / 6)
    assert "vf/metric_reply_length" in result.extra_logs


def test_a_row_that_is_not_a_task_fails_its_sample_with_the_reason():
    component = build_component({"type": "verifiers", "name": "vf"})
    batch = RewardBatch.build(["2+2="], ["4"], [None], metadata=[{"extra_info": {"x": 1}}])
    with CompositeReward([(component, 1.0)]) as composite:
        result = composite.score(batch)
    assert result.total == [0.0] and "no verifiers task" in result.errors[0][0]


def test_an_unknown_taskset_is_refused_with_the_packages_message():
    with pytest.raises(GenerationError, match="no_such_taskset"):
        generate_tasks("no_such_taskset", size=2, seed=0)
