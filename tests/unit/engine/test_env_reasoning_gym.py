"""reasoning-gym through its adapter, in the sandbox: rows generated from a seed are the package's own items,
and the `reasoning_gym` reward scores exactly what the task's own `score_answer` gives for the same answers."""

from __future__ import annotations

import pytest

from rl_engine.environments.installed import GenerationError, generate_dataset
from rl_engine.rewards import CompositeReward, RewardBatch, build_component

reasoning_gym = pytest.importorskip("reasoning_gym")

TASKS = ("basic_arithmetic", "spell_backward")


def _rows(task: str, size: int = 6, seed: int = 11) -> list[dict]:
    return generate_dataset([{"name": task}], size=size, seed=seed)


def _score(rows: list[dict], responses: list[str], answer: str = "whole") -> list[float]:
    component = build_component({"type": "reasoning_gym", "name": "rg", "answer": answer})
    batch = RewardBatch.build(
        [r["prompt"] for r in rows],
        responses,
        [r["label"] for r in rows],
        metadata=[{k: v for k, v in r.items() if k not in ("prompt", "label")} for r in rows],
    )
    with CompositeReward([(component, 1.0)]) as composite:
        result = composite.score(batch)
    assert result.errors == [[] for _ in rows], result.errors
    return result.components["rg"]


@pytest.mark.parametrize("task", TASKS)
def test_generated_rows_are_the_packages_own_items_for_the_seed(task):
    rows = _rows(task)
    own = reasoning_gym.create_dataset(task, size=6, seed=11)
    assert [r["prompt"] for r in rows] == [own[i]["question"] for i in range(6)]
    assert [r["label"] for r in rows] == [str(own[i]["answer"]) for i in range(6)]
    assert {r["data_source"] for r in rows} == {f"reasoning_gym/{task}"}
    assert _rows(task) == rows  # the same seed, the same rows


@pytest.mark.parametrize("task", TASKS)
def test_reward_equals_the_tasks_own_score_answer(task):
    rows = _rows(task)
    own = reasoning_gym.create_dataset(task, size=6, seed=11)
    # right answers, wrong ones, answers with extra text around them (partial credit where the task gives it)
    responses = [
        rows[0]["label"],
        "nonsense",
        f"{rows[2]['label']} is it",
        rows[3]["label"][::-1],
        "",
        f" {rows[5]['label']} ",
    ]
    expected = [own.score_answer(resp.strip(), own[i]) for i, resp in enumerate(responses)]
    assert _score(rows, responses) == pytest.approx(expected)
    assert expected[0] == 1.0 and expected[1] == 0.0


def test_tag_mode_scores_the_last_answer_tag_like_the_packages_evaluation():
    from reasoning_gym.utils import extract_answer

    rows = _rows("basic_arithmetic", size=3)
    own = reasoning_gym.create_dataset("basic_arithmetic", size=3, seed=11)
    responses = [
        f"<think>easy</think><answer>{rows[0]['label']}</answer>",
        f"<answer>1</answer> no, <answer>{rows[1]['label']}</answer>",
        rows[2]["label"],  # no tag: no answer
    ]
    expected = [own.score_answer(extract_answer(r), own[i]) for i, r in enumerate(responses)]
    assert _score(rows, responses, answer="tag") == expected == [1.0, 1.0, 0.0]


def test_last_number_mode_scores_the_responses_last_number_with_the_tasks_own_scorer():
    spec = {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2, "operators": ["+"]}
    rows = generate_dataset([{"name": "basic_arithmetic", "config": spec}], size=4, seed=3)
    labels = [r["label"] for r in rows]
    responses = [
        f"The two numbers add up: 12 + 30 = 42, so the answer is {labels[0]}.",  # prose, the answer last
        f"{labels[1]}",
        f"{labels[2]} is wrong, it is 7",  # the last number is the answer read
        "I cannot say.",  # no number: no answer
    ]
    assert _score(rows, responses, answer="last_number") == [1.0, 1.0, 0.0, 0.0]


def test_a_weighted_mix_draws_from_each_task_and_scores_each_with_its_own_scorer():
    tasks = [{"name": "basic_arithmetic", "weight": 3}, {"name": "spell_backward", "weight": 1}]
    rows = generate_dataset(tasks, size=24, seed=5)
    sources = [r["data_source"] for r in rows]
    assert set(sources) == {"reasoning_gym/basic_arithmetic", "reasoning_gym/spell_backward"}
    assert sources.count("reasoning_gym/basic_arithmetic") > sources.count("reasoning_gym/spell_backward")
    assert _score(rows, [r["label"] for r in rows]) == [1.0] * 24


def test_a_row_without_an_entry_fails_its_sample_with_the_reason():
    component = build_component({"type": "reasoning_gym", "name": "rg", "answer": "whole"})
    batch = RewardBatch.build(["2+2="], ["4"], ["4"], metadata=[{"extra_info": {"x": 1}}])
    with CompositeReward([(component, 1.0)]) as composite:
        result = composite.score(batch)
    assert result.total == [0.0]
    assert "no reasoning-gym entry" in result.errors[0][0]


def test_an_unknown_task_is_refused_with_the_packages_message():
    with pytest.raises(GenerationError, match="not registered"):
        generate_dataset([{"name": "no_such_task"}], size=2, seed=0)


@pytest.mark.parametrize(
    ("tasks", "size", "field"),
    [([], 2, "tasks"), ([{"name": "x", "weight": 0}], 2, r"tasks\[0\].weight"), ([{"name": "x"}], 0, "size")],
)
def test_bad_generation_requests_name_the_field(tasks, size, field):
    with pytest.raises(GenerationError, match=field):
        generate_dataset(tasks, size=size, seed=0)


def test_another_environments_row_in_a_mixed_run_scores_zero_without_an_error():
    component = build_component({"type": "reasoning_gym", "name": "rg", "answer": "whole"})
    batch = RewardBatch.build(["2+2="], ["4"], [None], metadata=[{"data_source": "verifiers/vf_sums"}])
    with CompositeReward([(component, 1.0)]) as composite:
        result = composite.score(batch)
    assert result.total == [0.0] and result.errors == [[]]
