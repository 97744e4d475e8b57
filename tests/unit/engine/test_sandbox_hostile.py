"""Every hostile program of tests/hostile_programs.py, as a reward and as an environment, in the real
bubblewrap sandbox: each is contained twice in a row in the same sandbox (its sample fails with a clear
reason, or scores without effect), nothing on the host changes, and this process (the engine) keeps going."""

from __future__ import annotations

import pytest

from rl_engine import sandbox
from rl_engine.config import EnvironmentConfig
from rl_engine.environments import EnvironmentPool
from rl_engine.rewards import PythonFunctionReward, RewardBatch, python_fn
from tests.hostile_programs import PROGRAMS, HostileProgram, HostWorld

pytestmark = pytest.mark.skipif(not sandbox.status().available, reason=f"no sandbox here: {sandbox.status().detail}")

MAX_RELAYED_BYTES = 4 << 20  # what "print forever" may put on our stderr in its seconds


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with HostWorld(tmp_path_factory.mktemp("hostile")) as host:
        yield host


@pytest.fixture(autouse=True)
def quick_hard_kill(monkeypatch):
    monkeypatch.setattr(python_fn, "HARD_KILL_GRACE_S", 1.0)


def limits(program: HostileProgram) -> dict:
    return {"timeout_s": program.timeout_s, "memory_mb": program.memory_mb}


@pytest.mark.parametrize("program", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_a_hostile_reward_is_contained(program, world, tmp_path, capfd):
    path = tmp_path / "reward.py"
    path.write_text(world.reward_file(program))
    component = PythonFunctionReward(str(path), **limits(program))
    try:
        # The component keeps working after whatever the program did to its sandbox, and the second call
        # finds nothing the first one left running.
        results = [component.score(RewardBatch.build(["2+2="], ["4"], ["4"])) for _ in range(2)]
    finally:
        component.close()
    for call, result in enumerate(results, 1):
        score, error = result.scores[0], result.errors[0]
        assert program.contained(score, error), f"{program.name}, call {call}: score {score}, error {error!r}"
    out, err = capfd.readouterr()
    assert len(out) + len(err) < MAX_RELAYED_BYTES
    world.assert_untouched(program, [*(f"{r.errors} {r.extra_logs}" for r in results), out, err])


@pytest.mark.parametrize("program", PROGRAMS, ids=[p.name for p in PROGRAMS])
def test_a_hostile_environment_is_contained(program, world, tmp_path, capfd):
    path = tmp_path / "environment.py"
    path.write_text(world.environment_file(program))
    pool = EnvironmentPool(EnvironmentConfig(path=str(path), **limits(program)))
    values = []
    try:
        for episode in range(2):  # one after the other, in the same sandbox while it lasts
            reset = pool.call("reset", [(episode, {"prompt": "2+2=", "label": "4", "metadata": {}})])
            assert reset == {episode: (True, {"observation": None, "next_turn_trained": True})}
            values.append(pool.call("step", [(episode, "4")])[episode])
    finally:
        pool.close()
    for episode, (ok, value) in enumerate(values):
        score, error = (value["reward"], None) if ok else (0.0, value)
        assert program.contained(score, error), f"{program.name}, episode {episode}: score {score}, error {error!r}"
    out, err = capfd.readouterr()
    assert len(out) + len(err) < MAX_RELAYED_BYTES
    world.assert_untouched(program, [*(str(value) for _, value in values), out, err])


def test_the_table_has_at_least_fifty_programs():
    assert len(PROGRAMS) >= 50
    assert len({p.name for p in PROGRAMS}) == len(PROGRAMS)
