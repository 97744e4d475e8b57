"""TextArena games through the adapter, as multi-turn environments in the sandbox: a single-agent game and a
two-player game in self-play give the rewards and observations the package itself gives for the same moves,
trajectories keep the engine's token ids across turns, and a broken game fails its episodes, not the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_engine.config import EnvironmentConfig
from rl_engine.environments.installed import GenerationError, generate_games
from tests.unit.engine.helpers import play_scripted

textarena = pytest.importorskip("textarena")


@pytest.fixture(scope="module")
def tokenizer(tiny_demo: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_demo / "model")


def play(tokenizer, rows: list[dict], moves: list[list[str]], **options):
    cfg = EnvironmentConfig(package="textarena", options=options, max_turns=9, max_observation_tokens=4096)
    return play_scripted(tokenizer, cfg, rows, moves)


def own_game(env_id: str, seed: int, moves: list[str], players: int = 1):
    """The package playing the same game with the same moves: (rewards, observations after each move)."""
    game = textarena.make(env_id=env_id)
    game.reset(num_players=players, seed=seed)
    seen = []
    for move in moves:
        done, _ = game.step(move)
        if done:
            return game.close()[0], seen
        seen.append(str(game.get_observation()[1]))
    return None, seen


def test_generated_games_are_the_packages_first_observations():
    rows = generate_games("GuessTheNumber-v0", size=3, seed=40)
    for i, row in enumerate(rows):
        game = textarena.make(env_id="GuessTheNumber-v0")
        game.reset(num_players=1, seed=40 + i)
        assert row["prompt"] == str(game.get_observation()[1]) and row["seed"] == 40 + i
    assert generate_games("GuessTheNumber-v0", size=3, seed=40) == rows


def test_a_single_agent_game_rewards_and_answers_as_the_package_does(tokenizer):
    rows = generate_games("GuessTheNumber-v0", size=1, seed=7)
    target = textarena.make(env_id="GuessTheNumber-v0")
    target.reset(num_players=1, seed=7)
    secret = target.state.game_state["game_number"]
    guesses = [f"[{g}]" for g in (1 if secret != 1 else 2, secret)]
    out, rollout = play(tokenizer, rows, [[g] for g in guesses], env_id="GuessTheNumber-v0")
    rewards, seen = own_game("GuessTheNumber-v0", 7, guesses)
    assert out.env_rewards == [rewards[0]] == [1.0]
    assert out.errors == [[]]
    # The first observation was the prompt; after the wrong guess, only what the game added since.
    assert [t["role"] for t in out.turns[0]] == ["assistant", "environment", "assistant", "environment"]
    hint = out.turns[0][1]["text"]
    assert seen[0].endswith(hint) and ("higher" in hint or "lower" in hint)
    # Token ids across turns: the engine's ids for each guess, the hint tokenised and masked.
    ids = rollout.ids
    sample = out.samples[0]
    assert sample.response_ids == ids(guesses[0]) + ids(hint) + ids(guesses[1])
    assert sample.action_mask == (1,) * len(ids(guesses[0])) + (0,) * len(ids(hint)) + (1,) * len(ids(guesses[1]))
    assert rollout.contexts[1][0] == ids(rows[0]["prompt"]) + ids(guesses[0]) + ids(hint)
    assert out.logs[0]["won"] == 1.0 and out.logs[0]["moves"] == 2.0


def test_self_play_plays_both_seats_trains_the_chosen_seat_and_scores_it_as_the_package_does(tokenizer):
    rows = generate_games("TicTacToe-v0", size=1, seed=3, num_players=2)
    moves = ["[0]", "[3]", "[1]", "[4]", "[2]"]  # seat 0 takes the top row
    rewards, _ = own_game("TicTacToe-v0", 3, moves, players=2)
    for seat in (0, 1):
        out, rollout = play(tokenizer, rows, [[m] for m in moves], env_id="TicTacToe-v0", num_players=2, seat=seat)
        assert out.env_rewards == [rewards[seat]] == [[1.0, -1.0][seat]]
        model_turns = [t for t in out.turns[0] if t["role"] == "assistant"]
        # the seat's own moves are trained; the other seat's stay in the context, masked like observations
        assert [t.get("trained", True) for t in model_turns] == [(i % 2) == seat for i in range(5)]
        mask, turns = list(out.samples[0].action_mask), out.turns[0]
        expected = []
        for turn in turns[:-1]:  # the last observation (game over) is not in the trajectory
            trained = turn["role"] == "assistant" and turn.get("trained", True)
            expected += [int(trained)] * len(rollout.ids(turn["text"]))
        assert mask == expected
    assert "[You move for Player 1]" in out.turns[0][1]["text"]


def test_alternate_seats_follow_the_games_seed():
    import importlib.util

    from rl_engine.environments.installed import TEXTARENA
    from rl_engine.rewards._sandbox import reset_result

    spec = importlib.util.spec_from_file_location("textarena_games", TEXTARENA)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    env = module.TextArena("TicTacToe-v0", num_players=2, seat="alternate")
    for seed in (4, 5):
        first = reset_result(env.reset("play", None, {"seed": seed}))
        assert env.seat == seed % 2 and first["next_turn_trained"] == (seed % 2 == 0)


def test_an_unknown_game_fails_its_episodes_with_the_packages_error_not_the_run(tokenizer):
    rows = [{"prompt": "play", "seed": 1}]
    out, _ = play(tokenizer, rows, [], env_id="NoSuchGame-v0")
    assert out.env_rewards == [0.0]
    assert "NoSuchGame-v0" in out.errors[0][0] and out.errors[0][0].startswith("environment: reset()")


def test_an_unknown_game_is_refused_when_generating_with_the_packages_message():
    with pytest.raises(GenerationError, match="NoSuchGame"):
        generate_games("NoSuchGame-v0", size=1, seed=0)
