"""OpenEnv environments through the adapter: the run starts the environment's server inside the environment's
sandbox and plays each episode as a session of the package's own client. Two environments written with
OpenEnv's public API (tests/fixtures/openenv_envs) give the rewards and observations they give when played
directly; token ids stay the engine's across turns; a server that cannot start fails its episodes, not the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_engine.config import EnvironmentConfig
from tests.unit.engine.helpers import play_scripted

pytest.importorskip("openenv")

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "openenv_envs"


@pytest.fixture(scope="module")
def tokenizer(tiny_demo: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_demo / "model")


def play(tokenizer, module: str, rows: list[dict], moves: list[list[str]], **options):
    cfg = EnvironmentConfig(
        package="openenv",
        options={"app": f"{module}:app", **options},
        files=[str(FIXTURES / f"{module}.py")],
        max_turns=5,
        timeout_s=30,
    )
    return play_scripted(tokenizer, cfg, rows, moves)


def test_the_echo_environment_rewards_each_turn_as_it_does_when_played_directly(tokenizer):
    import sys

    sys.path.insert(0, str(FIXTURES))
    try:
        from echo_server import EchoAction, EchoEnvironment
    finally:
        sys.path.remove(str(FIXTURES))
    moves = ["hi", "hello", "hey you"]
    direct = EchoEnvironment()
    direct.reset()
    own = [direct.step(EchoAction(message=m)) for m in moves]

    out, rollout = play(
        tokenizer,
        "echo_server",
        [{"prompt": "talk:"}],
        [[m] for m in moves],
        action_field="message",
        observation_field="echoed_message",
    )
    assert out.errors == [[]]
    assert out.env_rewards == [pytest.approx(sum(o.reward for o in own))]
    turns = [(t["role"], t["text"], t["reward"]) for t in out.turns[0]]
    assert turns[0] == ("environment", "say something", None)
    assert turns[1:] == [
        ("assistant", "hi", None),
        ("environment", "hi", pytest.approx(own[0].reward)),
        ("assistant", "hello", None),
        ("environment", "hello", pytest.approx(own[1].reward)),
        ("assistant", "hey you", None),
        ("environment", "hey you", pytest.approx(own[2].reward)),
    ]
    ids = rollout.ids
    sample = out.samples[0]
    assert sample.response_ids == ids("say something") + ids("hi") + ids("hi") + ids("hello") + ids("hello") + ids(
        "hey you"
    )
    assert rollout.contexts[2][0] == ids("talk:") + ids("say something") + ids("hi") + ids("hi") + ids("hello") + ids(
        "hello"
    )


def test_the_countdown_environment_takes_the_rows_seed_and_ends_when_it_says_done(tokenizer):
    rows = [{"prompt": "count:", "seed": 1}, {"prompt": "count:", "seed": 2}]  # targets 11 and 12
    moves = [["3", "3"], ["3", "3"], ["3", "3"], ["2", "3"]]
    out, _ = play(tokenizer, "countdown_server", rows, moves, action_field="move")
    assert out.errors == [[], []]
    assert out.env_rewards == [1.0, 1.0]  # 3+3+3+2 = 11, 3+3+3+3 = 12
    assert out.turns[0][0]["text"] == '{"text": "reach 11", "total": 0}'
    out, _ = play(tokenizer, "countdown_server", rows[:1], [["3"], ["9"]], action_field="move")
    assert out.env_rewards == [-1.0] and out.turns[0][-1]["text"] == '{"text": "lost", "total": 3}'


def test_an_app_that_does_not_exist_fails_its_episodes_with_the_reason_not_the_run(tokenizer):
    out, _ = play(tokenizer, "echo_server", [{"prompt": "x"}], [], app="echo_server:no_such_app")
    assert out.env_rewards == [0.0]
    assert "no_such_app" in out.errors[0][0]


def test_a_server_at_a_url_is_refused_nothing_leaves_the_sandbox(tokenizer):
    out, _ = play(tokenizer, "echo_server", [{"prompt": "x"}], [], url="http://10.0.0.1:8000")
    assert out.env_rewards == [0.0] and "not reached" in out.errors[0][0]
