import pytest

from rl_engine.rewards import (
    COMPONENT_TYPES,
    BoxedMath,
    ComponentResult,
    CompositeReward,
    ExactMatch,
    HttpReward,
    LengthPenalty,
    PythonFunctionReward,
    RegexReward,
    RewardBatch,
    RewardComponent,
    RewardModelReward,
    build_component,
    build_reward,
)
from rl_engine.rewards.base import MAX_EXTRA_LOGS, TOTAL
from rl_engine.rewards.loud import RewardsFailed, check_error_rates


class Fixed:
    """A component that returns whatever it was given."""

    def __init__(self, name, scores, errors=None, extra_logs=None):
        self.name = name
        self.result = ComponentResult(scores, errors or [None] * len(scores), extra_logs or {})
        self.closed = False

    def score(self, batch):
        return self.result

    def close(self):
        self.closed = True


class Raises:
    name = "broken"

    def score(self, batch):
        raise RuntimeError("server exploded")

    def close(self):
        raise OSError("close failed")


def make_batch(n=3):
    return RewardBatch.build(["p"] * n, ["r"] * n, ["l"] * n)


def test_total_is_the_weighted_sum_and_components_stay_unweighted():
    composite = CompositeReward([(Fixed("a", [1.0, 0.0, 1.0]), 1.0), (Fixed("b", [0.5, 0.5, -1.0]), 2.0)])
    result = composite.score(make_batch())
    assert result.total == [2.0, 1.0, -1.0]
    assert result.components == {"a": [1.0, 0.0, 1.0], "b": [0.5, 0.5, -1.0]}
    assert result.errors == [[], [], []]


def test_failed_sample_contributes_zero_and_its_error_is_recorded():
    failing = Fixed("judge", [5.0, 0.7, 0.0], errors=[None, None, "timeout after 30s"])
    composite = CompositeReward([(Fixed("fmt", [1.0, 1.0, 1.0]), 0.5), (failing, 1.0)])
    result = composite.score(make_batch())
    assert result.total == [5.5, 1.2, 0.5]
    assert result.errors == [[], [], ["judge: timeout after 30s"]]


def test_component_that_raises_fails_only_its_own_scores():
    composite = CompositeReward([(Fixed("ok", [1.0, 1.0]), 1.0), (Raises(), 1.0)])
    result = composite.score(make_batch(2))
    assert result.total == [1.0, 1.0]
    assert result.components["broken"] == [0.0, 0.0]
    assert result.errors == [["broken: RuntimeError: server exploded"]] * 2


def test_wrong_length_or_non_finite_scores_are_turned_into_errors():
    composite = CompositeReward([(Fixed("short", [1.0]), 1.0), (Fixed("nan", [float("nan"), 2.0]), 1.0)])
    result = composite.score(make_batch(2))
    assert result.total == [0.0, 2.0]
    assert result.errors[0] == [
        "short: component returned 1 scores and 1 errors for 2 samples",
        "nan: score is not finite: nan",
    ]
    assert result.errors[1] == ["short: component returned 1 scores and 1 errors for 2 samples"]


def test_extra_logs_are_prefixed_and_averaged():
    comp = Fixed("py", [0.0, 0.0], extra_logs={"acc": [1.0, 0.0], "lr": 3.0, "partial": [float("nan"), 4.0]})
    result = CompositeReward([(comp, 1.0)]).score(make_batch(2))
    assert result.extra_logs == {"py/acc": 0.5, "py/lr": 3.0, "py/partial": 4.0}


def test_a_total_that_overflows_is_a_per_sample_error_not_an_infinite_reward():
    # 1.7e308 is finite, and so is 1.0; 1.7e308 x 2 is not: that sample scores 0 with the reason recorded.
    composite = CompositeReward([(Fixed("huge", [1.7e308, 1.0]), 2.0)])
    result = composite.score(make_batch(2))
    assert result.total == [0.0, 2.0]
    assert result.errors[0] == [
        "weighted total: the weighted total of the components is not finite (a score too large for its weight)"
    ]
    assert result.errors[1] == []
    assert result.component_errors[TOTAL] == [result.errors[0][0].split(": ", 1)[1], None]


def test_extra_curves_are_bounded_per_component_and_named_safely():
    logs = {f"curve_{i}": float(i) for i in range(100_000)}
    logs = {"../../etc": 1.0, "x" * 65: 1.0, "spaced name": 1.0, "/lead": 1.0, **logs}
    result = CompositeReward([(Fixed("py", [0.0]), 1.0)]).score(make_batch(1))
    assert result.extra_logs == {}
    result = CompositeReward([(Fixed("py", [0.0], extra_logs=logs), 1.0)]).score(make_batch(1))
    # "../../etc" is a legal metric name below reward/py/ (it names nothing on disk); the rest are unusable names.
    assert list(result.extra_logs) == ["py/../../etc", *(f"py/curve_{i}" for i in range(MAX_EXTRA_LOGS - 1))]


def test_a_component_failing_on_more_than_its_max_error_rate_fails_the_step_with_its_first_error():
    flaky = Fixed("judge", [0.0] * 4, errors=[None, "HTTP 503 (a 0-byte answer)", "timed out", None])
    result = CompositeReward([(Fixed("fmt", [1.0] * 4), 1.0), (flaky, 1.0)]).score(make_batch(4))
    check_error_rates(result, {"fmt": 0.5, "judge": 0.5})  # 2 of 4 is not more than half: the step goes on
    with pytest.raises(RewardsFailed) as failed:
        check_error_rates(result, {"fmt": 0.5, "judge": 0.25})
    assert str(failed.value) == (
        "reward 'judge' failed on 2 of 4 samples of the step (50%, over its max_error_rate of 0.25); "
        "the first error: HTTP 503 (a 0-byte answer)"
    )
    always = Fixed("always", [0.0] * 4, errors=["boom"] * 4)
    tolerated = CompositeReward([(always, 1.0)]).score(make_batch(4))
    check_error_rates(tolerated, {"always": 1.0})  # 1 = never fail the run


def test_an_overflowing_total_on_most_samples_fails_the_step():
    result = CompositeReward([(Fixed("huge", [1.7e308] * 3), 2.0)]).score(make_batch(3))
    with pytest.raises(RewardsFailed, match=r"^the weighted total failed on 3 of 3 samples of the step"):
        check_error_rates(result, {"huge": 0.5})


def test_timings_are_recorded_per_component():
    composite = CompositeReward([(Fixed("a", [1.0]), 1.0), (RegexReward("r", name="fmt"), 1.0)])
    timings = composite.score(make_batch(1)).timings
    assert set(timings) == {"a", "fmt"} and all(t >= 0 for t in timings.values())


def test_zero_weight_component_is_scored_but_not_added():
    composite = CompositeReward([(Fixed("a", [1.0]), 1.0), (Fixed("watch", [9.0]), 0.0)])
    result = composite.score(make_batch(1))
    assert result.total == [1.0] and result.components["watch"] == [9.0]


def test_duplicate_component_names_are_rejected():
    with pytest.raises(ValueError, match="duplicate component name 'a'"):
        CompositeReward([(Fixed("a", [1.0]), 1.0), (Fixed("a", [1.0]), 1.0)])


def test_close_reaches_every_component_even_when_one_fails():
    good = Fixed("good", [1.0])
    composite = CompositeReward([(Raises(), 1.0), (good, 1.0)])
    with pytest.raises(OSError, match="close failed"):
        composite.close()
    assert good.closed


def test_batch_with_mismatched_lengths_is_rejected():
    with pytest.raises(ValueError, match="RewardBatch.responses has 1 items, prompts has 2"):
        RewardBatch(["a", "b"], ["x"], [None, None], ["ax", "bx"], ["stop", "stop"], [{}, {}])


# --- registry -----------------------------------------------------------------------------------


def test_build_component_maps_each_type_to_its_class(tmp_path):
    reward_file = tmp_path / "r.py"
    reward_file.write_text("def reward_func(queries, prompts, labels):\n    return [0.0] * len(queries)\n")
    model_dir = tmp_path / "rm"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    specs = {
        "exact_match": ({"numeric": False}, ExactMatch),
        "boxed_math": ({}, BoxedMath),
        "regex": ({"pattern": "x", "full_match": True}, RegexReward),
        "length_penalty": ({"max_chars": 100, "coef": 0.1}, LengthPenalty),
        "python": ({"path": str(reward_file), "timeout_s": 5}, PythonFunctionReward),
        "http": ({"url": "http://127.0.0.1:9/score", "batch_size": 4}, HttpReward),
        "reward_model": ({"path": str(model_dir), "dtype": "bfloat16"}, RewardModelReward),
        # the installed packages' scorers run as sandboxed python functions beside their adapters
        "reasoning_gym": ({"answer": "whole"}, PythonFunctionReward),
        "verifiers": ({}, PythonFunctionReward),
    }
    assert set(specs) == set(COMPONENT_TYPES)
    for kind, (params, cls) in specs.items():
        component = build_component({"type": kind, **params})
        assert isinstance(component, cls) and isinstance(component, RewardComponent)
        assert component.name == kind
        component.close()


def test_build_component_names_the_bad_field():
    with pytest.raises(ValueError, match="^type: unknown reward type 'nope'"):
        build_component({"type": "nope"})
    with pytest.raises(ValueError, match="^patern: not a parameter of reward type 'regex'"):
        build_component({"type": "regex", "patern": "x"})
    with pytest.raises(ValueError, match="^pattern: required for reward type 'regex'"):
        build_component({"type": "regex"})
    with pytest.raises(ValueError, match="^pattern: invalid regular expression"):
        build_component({"type": "regex", "pattern": "("})


def test_build_reward_reads_weights_and_scores_end_to_end():
    composite = build_reward(
        [
            {"type": "boxed_math", "weight": 1.0},
            {"type": "regex", "name": "has_box", "pattern": r"\\boxed", "weight": 0.1},
            {"type": "length_penalty", "max_chars": 20, "coef": 1.0, "weight": 0.5},
        ]
    )
    batch = RewardBatch.build(["q", "q"], [r"\boxed{4}", "four" * 10], ["4", "4"])
    result = composite.score(batch)
    assert result.components == {"boxed_math": [1.0, 0.0], "has_box": [1.0, 0.0], "length_penalty": [0.0, -1.0]}
    assert result.total == pytest.approx([1.1, -0.5])
    assert result.extra_logs["boxed_math/has_boxed"] == 0.5
    composite.close()


def test_every_reward_type_of_the_run_config_builds_through_the_registry(tmp_path):
    """The config's reward specs and the registry's constructors are one contract."""
    from rl_engine.config import validate_config

    reward_file = tmp_path / "reward.py"
    reward_file.write_text("def reward_func(queries, prompts, labels, **kw):\n    return [0.0] * len(queries)\n")
    (tmp_path / "config.json").write_text("{}")  # the reward model folder is only opened on first use
    specs = [
        {"type": "exact_match"},
        {"type": "boxed_math"},
        {"type": "regex", "pattern": "x"},
        {"type": "length_penalty", "max_chars": 10, "coef": 0.1},
        {"type": "python", "path": str(reward_file)},
        {"type": "http", "url": "http://127.0.0.1:9/score"},
        {"type": "reward_model", "path": str(tmp_path)},
        {"type": "reasoning_gym"},
        {"type": "verifiers"},
    ]
    cfg = validate_config({"name": "t", "model": {"path": "m"}, "data": {"path": "d.jsonl"}, "rewards": specs})
    assert {s.type for s in cfg.rewards} == set(COMPONENT_TYPES)
    reward = build_reward([spec.model_dump() for spec in cfg.rewards])
    try:
        assert [c.name for c, _ in reward.components] == [s.type for s in cfg.rewards]
    finally:
        reward.close()
