"""The python reward sandbox, with real child processes."""

import textwrap
import time

import pytest

from rl_engine.rewards import PythonFunctionReward, RewardBatch, check_reward_file, python_fn


def write(tmp_path, source, name="reward.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source).lstrip())
    return str(path)


def make_batch(responses, labels=None, metadata=None):
    n = len(responses)
    return RewardBatch.build([f"Q{i}: " for i in range(n)], responses, labels or ["4"] * n, metadata=metadata)


@pytest.fixture
def reward():
    """Build components whose children are always stopped at the end of the test."""
    made = []

    def make(path, **kwargs):
        component = PythonFunctionReward(path, **kwargs)
        made.append(component)
        return component

    yield make
    for component in made:
        component.close()


OPENRLHF_FILE = """
import sys

def reward_func(queries, prompts, labels, **kwargs):
    print("user code may print freely")
    rewards = [1.0 if r.strip() == l else 0.0 for r, l in zip(kwargs["responses"], labels)]
    return {
        "rewards": rewards,
        "scores": [2 * r for r in rewards],
        "extra_logs": {
            "query_chars": [float(len(q)) for q in queries],
            "torch_loaded": float("torch" in sys.modules),
            "first_source": kwargs["metadata"][0].get("data_source") == "gsm8k",
        },
    }
"""


def test_openrlhf_reward_func_scores_the_batch_and_reports_extra_logs(tmp_path, reward):
    component = reward(write(tmp_path, OPENRLHF_FILE))
    batch = make_batch(["4", "5", " 4 "], metadata=[{"data_source": "gsm8k"}, {}, {}])

    result = component.score(batch)

    assert result.scores == [1.0, 0.0, 1.0]
    assert result.errors == [None, None, None]
    assert result.extra_logs["scores"] == [2.0, 0.0, 2.0]
    assert result.extra_logs["query_chars"] == [float(len(q)) for q in batch.queries]
    assert result.extra_logs["first_source"] == 1.0


def test_child_does_not_import_torch_unless_the_user_code_does(tmp_path, reward):
    component = reward(write(tmp_path, OPENRLHF_FILE))
    assert component.score(make_batch(["4"])).extra_logs["torch_loaded"] == 0.0


def test_worker_process_is_reused_across_batches(tmp_path, reward):
    component = reward(write(tmp_path, OPENRLHF_FILE))
    component.score(make_batch(["4"]))
    pid = component.worker_pid
    component.score(make_batch(["4", "4"]))
    assert pid is not None and component.worker_pid == pid


def test_function_with_only_three_parameters_and_a_bare_list_return_works(tmp_path, reward):
    path = write(
        tmp_path,
        """
        def reward_func(queries, prompts, labels):
            return [float(len(p)) for p in prompts]
    """,
    )
    assert reward(path).score(make_batch(["a", "b"])).scores == [4.0, 4.0]


def test_named_function_is_called_with_its_declared_shape(tmp_path, reward):
    path = write(
        tmp_path,
        """
        def my_batched(queries, prompts, labels):
            return [1.0] * len(queries)

        def my_single(data_source, solution_str, ground_truth, extra_info=None):
            return 0.5
    """,
    )
    assert reward(path, function="my_batched").score(make_batch(["a", "b"])).scores == [1.0, 1.0]
    assert reward(path, function="my_single").score(make_batch(["a", "b"])).scores == [0.5, 0.5]


VERL_FILE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "boom":
        return 1 / 0
    if solution_str == "hang":
        while True:
            pass
    if solution_str == "text":
        return "not a number"
    if solution_str == "nodict":
        return {"acc": 1.0}
    correct = solution_str.strip() == ground_truth
    return {"score": float(correct), "acc": float(correct), "source_ok": data_source == "math", "index": extra_info["index"]}
"""


def test_verl_compute_score_is_called_per_sample_with_metadata(tmp_path, reward):
    component = reward(write(tmp_path, VERL_FILE))
    metadata = [{"data_source": "math", "extra_info": {"index": i}} for i in range(3)]

    result = component.score(make_batch(["4", "3", "4"], metadata=metadata))

    assert result.scores == [1.0, 0.0, 1.0]
    assert result.errors == [None, None, None]
    assert result.extra_logs["acc"] == [1.0, 0.0, 1.0]
    assert result.extra_logs["source_ok"] == [1.0, 1.0, 1.0]
    assert result.extra_logs["index"] == [0.0, 1.0, 2.0]


def test_verl_failures_fail_only_their_samples(tmp_path, reward):
    component = reward(write(tmp_path, VERL_FILE), timeout_s=1)
    metadata = [{"data_source": "math", "extra_info": {"index": 0}}]

    started = time.monotonic()
    result = component.score(make_batch(["4", "boom", "hang", "text", "nodict", "4"], metadata=metadata * 6))

    assert time.monotonic() - started < 5
    assert result.scores == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert result.errors[0] is None and result.errors[5] is None
    assert result.errors[1] == "ZeroDivisionError: division by zero (line 3)"
    assert result.errors[2] == "timeout after 1s"
    assert result.errors[3] == "score is not a number: 'not a number'"
    assert result.errors[4] == "returned a dict without 'score' (keys: ['acc'])"


def test_sample_stuck_where_the_alarm_cannot_reach_is_killed_and_the_rest_still_scored(tmp_path, reward, monkeypatch):
    # The user code disables SIGALRM (as some libraries do) and spins: only the parent's hard
    # deadline can stop it. The child is replaced and the later samples still get scores.
    monkeypatch.setattr(python_fn, "HARD_KILL_GRACE_S", 0.5)
    path = write(
        tmp_path,
        """
        import signal

        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            if solution_str == "stuck":
                signal.signal(signal.SIGALRM, signal.SIG_IGN)
                while True:
                    pass
            return 1.0
    """,
    )
    component = reward(path, timeout_s=0.5)
    component.score(make_batch(["ok"]))
    first_pid = component.worker_pid

    result = component.score(make_batch(["ok", "stuck", "ok", "ok"]))

    assert result.scores == [1.0, 0.0, 1.0, 1.0]
    assert result.errors == [None, "timeout after 0.5s", None, None]
    assert component.worker_pid not in (None, first_pid)


def test_sample_that_crashes_the_interpreter_fails_alone(tmp_path, reward):
    path = write(
        tmp_path,
        """
        import os, signal

        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            if solution_str == "crash":
                os.kill(os.getpid(), signal.SIGSEGV)
            return 1.0
    """,
    )
    result = reward(path).score(make_batch(["ok", "crash", "ok"]))
    assert result.scores == [1.0, 0.0, 1.0]
    assert result.errors[1] == "worker process died from signal SIGSEGV"


def test_exception_in_batched_function_fails_the_batch_with_its_line(tmp_path, reward):
    path = write(
        tmp_path,
        """
        def helper(x):
            return x

        def reward_func(queries, prompts, labels, **kwargs):
            if len(queries) > 1:
                return [helper(1 / 0)]
            return [1.0]
    """,
    )
    component = reward(path)

    result = component.score(make_batch(["a", "b"]))
    assert result.scores == [0.0, 0.0]
    assert result.errors == ["ZeroDivisionError: division by zero (line 6)"] * 2
    # The worker survives an ordinary exception and keeps scoring.
    assert component.score(make_batch(["a"])).scores == [1.0]


def test_infinite_loop_times_out_and_the_worker_recovers(tmp_path, reward):
    path = write(
        tmp_path,
        """
        def reward_func(queries, prompts, labels, **kwargs):
            if queries[0].endswith("spin"):
                while True:
                    pass
            return [1.0] * len(queries)
    """,
    )
    component = reward(path, timeout_s=1)

    started = time.monotonic()
    result = component.score(make_batch(["spin", "x"]))
    assert time.monotonic() - started < 4
    assert result.errors == ["timeout after 1s"] * 2
    assert component.score(make_batch(["x"])).scores == [1.0]


def test_runaway_allocation_hits_the_memory_limit_and_the_worker_is_replaced(tmp_path, reward):
    path = write(
        tmp_path,
        """
        def reward_func(queries, prompts, labels, **kwargs):
            if queries[0].endswith("big"):
                block = bytearray(4 * 1024 ** 3)
            return [1.0] * len(queries)
    """,
    )
    component = reward(path, memory_mb=256)
    component.score(make_batch(["x"]))
    first_pid = component.worker_pid

    result = component.score(make_batch(["big", "x"]))

    assert result.scores == [0.0, 0.0]
    assert result.errors == ["MemoryError (line 3)"] * 2
    assert component.score(make_batch(["x"])).scores == [1.0]
    assert component.worker_pid != first_pid


def test_wrong_number_of_scores_fails_the_batch(tmp_path, reward):
    path = write(
        tmp_path,
        """
        def reward_func(queries, prompts, labels, **kwargs):
            return [1.0, 1.0, 1.0]
    """,
    )
    result = reward(path).score(make_batch(["a", "b", "c", "d"]))
    assert result.errors == ["returned 3 scores for 4 samples"] * 4


def test_non_numeric_entry_fails_only_its_sample(tmp_path, reward):
    path = write(
        tmp_path,
        """
        def reward_func(queries, prompts, labels, **kwargs):
            return {"rewards": [1.0, None, float("nan")]}
    """,
    )
    result = reward(path).score(make_batch(["a", "b", "c"]))
    assert result.scores == [1.0, 0.0, 0.0]
    assert result.errors == [None, "score is not a number: None", "score is not finite: nan"]


def test_syntax_error_is_reported_with_its_line(tmp_path):
    path = write(
        tmp_path,
        """
        def reward_func(queries, prompts, labels):
            x = 1
            return [x for q in queries
    """,
    )
    with pytest.raises(ValueError, match=r"^path: syntax error at line 3"):
        PythonFunctionReward(path)
    assert check_reward_file(path)[0].startswith("syntax error at line 3")


def test_error_while_importing_the_file_fails_the_batch_with_the_reason(tmp_path, reward):
    path = write(
        tmp_path,
        """
        import no_such_module_here

        def reward_func(queries, prompts, labels):
            return [1.0]
    """,
    )
    result = reward(path).score(make_batch(["a"]))
    assert result.errors[0].startswith("loading reward.py failed: importing the file failed: ModuleNotFoundError")
    assert "(line 1)" in result.errors[0]


@pytest.mark.parametrize(
    "source, problem",
    [
        ("def something_else(x):\n    return 1\n", "the file defines neither reward_func"),
        ("def reward_func(queries):\n    return [1]\n", "cannot be called as reward_func(queries, prompts, labels"),
        (
            "def compute_score(solution_str):\n    return 1\n",
            "cannot be called as compute_score(data_source, solution_str",
        ),
        ("reward_func = 3\n", "'reward_func' is not a function"),
        ("raise RuntimeError('bad config')\n", "importing the file failed: RuntimeError: bad config (line 1)"),
    ],
)
def test_check_reward_file_reports_problems(tmp_path, source, problem):
    path = tmp_path / "reward.py"
    path.write_text(source)
    problems = check_reward_file(path)
    assert len(problems) == 1 and problem in problems[0]


def test_check_reward_file_accepts_both_shapes_and_reports_a_missing_file(tmp_path):
    assert check_reward_file(write(tmp_path, OPENRLHF_FILE, "a.py")) == []
    assert check_reward_file(write(tmp_path, VERL_FILE, "b.py")) == []
    assert check_reward_file(tmp_path / "missing.py") == [f"file not found: {tmp_path / 'missing.py'}"]
    assert "no function named 'nope'" in check_reward_file(write(tmp_path, VERL_FILE, "c.py"), function="nope")[0]


def test_start_raises_on_a_file_that_cannot_be_used(tmp_path):
    component = PythonFunctionReward(write(tmp_path, "def f(x):\n    return 1\n"))
    with pytest.raises(ValueError, match="^path: the file defines neither"):
        component.start()
    component.close()
