"""Multi-turn execution: trajectories keep the engine's token ids with observations masked out of the
loss, the shipped environments (calculator tool use, guess the number) behave as documented inside
the sandbox, failures end one episode with a reason, and whole runs complete on the demo model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from posttrain_sdk.event_log import read_events
from rl_engine.config import EnvironmentConfig, validate_config
from rl_engine.data import Prompt
from rl_engine.demo.run_config import demo_run_config
from rl_engine.environments import EXAMPLES, EnvironmentLoadError
from rl_engine.executors import EnvironmentExecutor
from rl_engine.rollout import SamplingParams
from tests.unit.engine.helpers import ScriptedRollout, rollouts_by_step


@pytest.fixture(scope="module")
def tokenizer(tiny_demo: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_demo / "model")


def prompt(tokenizer, text: str, label: str | None) -> Prompt:
    return Prompt(
        text=text, raw=text, token_ids=tokenizer(text, add_special_tokens=False)["input_ids"], label=label, metadata={}
    )


def executor(tokenizer, script: list[list[str]], **env) -> tuple[EnvironmentExecutor, ScriptedRollout]:
    rollout = ScriptedRollout(tokenizer, script)
    return EnvironmentExecutor(rollout, tokenizer, EnvironmentConfig(**env)), rollout


def test_a_tool_call_trajectory_interleaves_actions_and_masked_observations(tokenizer):
    run, rollout = executor(
        tokenizer, [["37+48", "12"], ["85", "13"]], path=str(EXAMPLES / "calculator.py"), name="Calculator", max_turns=3
    )
    try:
        out = run.run([prompt(tokenizer, "37+48=", "85"), prompt(tokenizer, "10+3=", "13")], SamplingParams(n=1))
    finally:
        run.close()
    ids = rollout.ids
    first, second = out.samples
    # Actions are the engine's own ids; only the observation text "=85" was tokenised.
    assert first.response_ids == ids("37+48") + ids("=85") + ids("85")
    assert first.action_mask == (1,) * len(ids("37+48")) + (0,) * len(ids("=85")) + (1,) * len(ids("85"))
    assert first.logprobs == (-0.5,) * len(ids("37+48")) + (0.0,) * len(ids("=85")) + (-0.5,) * len(ids("85"))
    # The second turn saw the whole context as ids: prompt, action, observation.
    assert rollout.contexts[1][0] == ids("37+48=") + ids("37+48") + ids("=85")
    assert out.env_rewards == [pytest.approx(0.95), 0.0]  # 1 for the answer minus one call; "12" is wrong
    assert second.response_ids == ids("12") and second.action_mask == (1,) * len(ids("12"))
    assert len(rollout.contexts[1]) == 1  # the finished episode is not generated for again
    assert [t["role"] for t in out.turns[0]] == ["assistant", "environment", "assistant", "environment"]
    assert out.turns[0][1] == {"role": "environment", "text": "=85", "reward": -0.05}
    assert out.logs[0] == {"calls": 1.0, "correct": 1.0, "turns": 2.0}
    assert out.final_texts == ["85", "12"]


def test_guess_the_number_answers_higher_or_lower_until_found(tokenizer):
    import zlib

    secret = 10 + zlib.crc32(b"any prompt") % 90
    run, _ = executor(
        tokenizer,
        [["10"], [str(secret)]],
        path=str(EXAMPLES / "guess_number.py"),
        name="GuessNumber",
        max_turns=4,
        options={"low": 10, "high": 99},
    )
    try:
        out = run.run([prompt(tokenizer, "any prompt", None)], SamplingParams(n=1))
    finally:
        run.close()
    texts = [(t["role"], t["text"]) for t in out.turns[0]]
    assert texts == [
        ("environment", " guess 10-99:"),
        ("assistant", "10"),
        ("environment", " higher:" if secret > 10 else ""),
        ("assistant", str(secret)),
        ("environment", ""),
    ]
    assert out.env_rewards == [pytest.approx(1.0 - 0.1)]
    assert out.logs[0]["solved"] == 1.0 and out.logs[0]["guesses"] == 2.0


def test_an_episode_out_of_turns_ends_as_truncated(tokenizer):
    run, _ = executor(
        tokenizer,
        [["1+1"], ["2+2"]],
        path=str(EXAMPLES / "calculator.py"),
        name="Calculator",
        max_turns=2,
        options={"max_calls": 5},
    )
    try:
        out = run.run([prompt(tokenizer, "1+1=", "2")], SamplingParams(n=1))
    finally:
        run.close()
    assert out.samples[0].finish_reason == "length"
    # The last observation is not appended: a trajectory ends with the policy's action.
    assert out.samples[0].action_mask[-1] == 1


def write(tmp_path: Path, source: str) -> str:
    path = tmp_path / "env.py"
    path.write_text(source)
    return str(path)


def test_a_failing_step_ends_that_episode_with_the_reason_and_line(tokenizer, tmp_path):
    path = write(
        tmp_path,
        "class Environment:\n    def reset(self, prompt, label, metadata):\n        return None\n"
        "    def step(self, action):\n        return 1 / 0\n",
    )
    run, _ = executor(tokenizer, [["7"]], path=path)
    try:
        out = run.run([prompt(tokenizer, "1+1=", "2")], SamplingParams(n=1))
    finally:
        run.close()
    assert out.env_rewards == [0.0]
    assert out.errors[0] == ["environment: step(): ZeroDivisionError: division by zero (line 5)"]


def test_a_step_over_its_time_limit_ends_the_episode_and_the_next_batch_still_runs(tokenizer, tmp_path):
    path = write(
        tmp_path,
        "import time\nclass Environment:\n    def reset(self, prompt, label, metadata):\n"
        "        return None\n    def step(self, action):\n        time.sleep(5 if action == 'slow' else 0)\n"
        "        return None, 1.0, True\n",
    )
    run, _ = executor(tokenizer, [["slow"], ["fast"]], path=path, timeout_s=0.5)
    try:
        slow = run.run([prompt(tokenizer, "a", None)], SamplingParams(n=1))
        fast = run.run([prompt(tokenizer, "b", None)], SamplingParams(n=1))
    finally:
        run.close()
    assert slow.errors[0] == ["environment: step() timed out after 0.5s"]
    assert fast.env_rewards == [1.0] and fast.errors == [[]]


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("class Other:\n    pass\n", "no class named 'Environment'"),
        (
            "class Environment:\n    def reset(self, prompt, label, metadata):\n        return None\n",
            "has no step method",
        ),
        ("class Environment(\n", "syntax error at line 1"),
    ],
)
def test_a_broken_environment_file_is_refused_at_start_naming_the_field(tokenizer, tmp_path, source, problem):
    with pytest.raises(EnvironmentLoadError) as refused:
        executor(tokenizer, [], path=write(tmp_path, source))
    assert str(refused.value).startswith("environment.path: ") and problem in str(refused.value)


def test_observation_tokens_get_no_gradient_from_any_loss_term(tiny_demo):
    """Policy loss, entropy bonus and KL term all aggregate over `response_mask`: the logits that
    predict observation tokens receive exactly zero gradient, the actions' do not."""
    from transformers import AutoModelForCausalLM

    from rl_engine.trainer import Experience, TokenBatch, TorchTrainer

    cfg = validate_config(
        {
            "name": "mask",
            "model": {"path": str(tiny_demo / "model")},
            "data": {"path": "d.jsonl"},
            "rewards": [{"type": "exact_match"}],
            "rollout": {"samples_per_prompt": 2},
            "algorithm": {"entropy_coef": 0.01, "kl": {"coef": 0.1, "placement": "loss"}},
            "train": {"micro_batch_size": 2},
        }
    )
    model = AutoModelForCausalLM.from_pretrained(tiny_demo / "model")
    trainer = TorchTrainer(cfg, model, None, None)
    mask = (1, 1, 0, 0, 0, 1)  # action, action, three observation tokens, action
    batch = TokenBatch.build([[5, 6, 7], [8, 9]], [[10, 11, 12, 13, 14, 15], [16, 17, 18]], 0, [mask, None])
    assert batch.response_mask.tolist() == [[1, 1, 0, 0, 0, 1], [1, 1, 1, 0, 0, 0]]
    captured = {}

    def keep_logits(module, inputs, output):
        output.retain_grad()
        captured["logits"] = output

    model.lm_head.register_forward_hook(keep_logits)
    exp = Experience(
        batch, torch.ones_like(batch.response_mask), None, torch.full(batch.response_mask.shape, -3.0)
    )  # a reference, so the KL term is live
    trainer._micro_step(exp, 1.0)
    grad = captured["logits"].grad[:, batch.prompt_width - 1 : -1].abs().sum(-1)  # per response position
    assert torch.all(grad[0, 2:5] == 0), "observation tokens must get no gradient"
    assert torch.all(grad[0, [0, 1, 5]] > 0) and torch.all(grad[1, :3] > 0)


def test_async_rollout_with_an_environment_is_refused_naming_the_field():
    from rl_engine.config import ConfigError, check_runnable

    cfg = validate_config(
        {
            "name": "x",
            "model": {"path": "m"},
            "data": {"path": "d.jsonl"},
            "environment": {"path": "env.py"},
            "backends": {"async_rollout": True},
            "placement": {"mode": "separate"},
        }
    )
    with pytest.raises(ConfigError) as refused:
        check_runnable(cfg)
    assert [e["loc"] for e in refused.value.errors] == ["backends.async_rollout"]


@pytest.mark.parametrize(
    "env",
    [
        pytest.param({"path": str(EXAMPLES / "calculator.py"), "name": "Calculator", "max_turns": 3}, id="tool-use"),
        pytest.param(
            {
                "path": str(EXAMPLES / "guess_number.py"),
                "name": "GuessNumber",
                "max_turns": 3,
                "options": {"low": 10, "high": 20},
            },
            id="guess-the-number",
        ),
    ],
)
def test_a_multi_turn_run_completes_on_the_demo_model_with_turns_recorded(tiny_demo, tmp_path, env):
    from rl_engine.loop import train

    cfg = demo_run_config(
        tiny_demo,
        model={"path": str(tiny_demo / "model")},
        data={
            "path": str(tiny_demo / "data" / "train.jsonl"),
            "eval_path": str(tiny_demo / "data" / "test.jsonl"),
            "eval_size": 8,
        },
        rewards=[{"type": "regex", "name": "digit", "pattern": r"\d", "weight": 0.5}],  # varies within groups
        rollout={"prompts_per_step": 4, "samples_per_prompt": 4, "max_new_tokens": 4},
        train={"steps": 2, "micro_batch_size": 16},
        checkpoint={"every_steps": 0, "save_final": False},
        logging={"eval_every": 2, "eval_size": 8},
        environment=env,
    )
    last = train(cfg, tmp_path)
    events = read_events(tmp_path / "events.jsonl")
    metrics = [e["data"] for e in events if e["type"] == "metrics" and e["step"] > 0]
    assert len(metrics) == 2
    for m in metrics:
        assert {"reward/mean", "reward/environment", "reward/digit", "env/turns", "timing/environment"} <= set(m)
        assert 1 <= m["env/turns"] <= 3
    assert "eval/reward/environment" in last
    samples = rollouts_by_step(tmp_path)[2]
    for sample in samples:
        assert sample["turns"][0]["role"] in ("assistant", "environment")
        assert sample["components"]["environment"] == pytest.approx(
            sum(t["reward"] for t in sample["turns"] if t["reward"] is not None)
        )
        assistant_turns = sum(t["role"] == "assistant" for t in sample["turns"])
        assert sample["length"] <= 4 * assistant_turns  # the policy's tokens only, observations left out
    assert json.dumps(samples)  # the file's rows read back as plain values (turns as objects)


def test_a_turn_for_another_seat_stays_in_the_context_masked_out_of_the_loss(tokenizer, tmp_path):
    path = write(
        tmp_path,
        "class Environment:\n"
        "    def reset(self, prompt, label, metadata):\n"
        "        return {'observation': None, 'next_turn_trained': False}\n"
        "    def step(self, action):\n"
        "        if action == 'bad':\n"
        "            return {'observation': 'x', 'reward': 0.0, 'done': False, 'next_turn_trained': 'no'}\n"
        "        return {'observation': ' ok', 'reward': 0.5, 'done': action == 'mine', 'next_turn_trained': True}\n",
    )
    run, rollout = executor(tokenizer, [["theirs", "bad"], ["mine"]], path=path, max_turns=3)
    try:
        out = run.run([prompt(tokenizer, "p", None), prompt(tokenizer, "q", None)], SamplingParams(n=1))
    finally:
        run.close()
    ids = rollout.ids
    first = out.samples[0]
    assert first.response_ids == ids("theirs") + ids(" ok") + ids("mine")
    assert first.action_mask == (0,) * len(ids("theirs")) + (0,) * len(ids(" ok")) + (1,) * len(ids("mine"))
    assert out.turns[0][0] == {"role": "assistant", "text": "theirs", "reward": None, "trained": False}
    assert out.final_texts[0] == "mine" and out.env_rewards[0] == pytest.approx(1.0)
    assert "next_turn_trained must be True or False" in out.errors[1][0]
