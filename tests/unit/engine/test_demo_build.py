"""The offline demo task builder (`rl_engine.demo`), exercised on the tiny model size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rl_engine.demo import task
from rl_engine.demo.__main__ import main
from rl_engine.demo.build import build_demo, existing_build
from rl_engine.demo.evaluate import evaluate_greedy, greedy_completions

SPLITS = ("train", "test", "sft", "sft_val")


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    """Two tiny builds with the same seed, and the first one's manifest."""
    first = tmp_path_factory.mktemp("demo-a")
    second = tmp_path_factory.mktemp("demo-b")
    manifest = build_demo(first, seed=0, model_size="tiny", progress=False)
    build_demo(second, seed=0, model_size="tiny", progress=False)
    return first, second, manifest


@pytest.fixture(scope="module")
def loaded(builds):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, _, _ = builds
    return AutoModelForCausalLM.from_pretrained(out / "model"), AutoTokenizer.from_pretrained(out / "model")


def rows(out: Path, split: str) -> list[dict]:
    return task.read_jsonl(out / "data" / f"{split}.jsonl")


def test_build_writes_a_checkpoint_the_auto_classes_load(builds, loaded):
    out, _, manifest = builds
    model, tokenizer = loaded
    assert (out / "model" / "model.safetensors").is_file()
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.config.model_type == "qwen2" and model.config.tie_word_embeddings
    assert model.config.vocab_size == len(tokenizer) == manifest["tokenizer"]["vocab_size"]
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert manifest["model"]["parameters"] == sum(p.numel() for p in model.parameters())
    assert existing_build(out) == json.loads((out / "manifest.json").read_text())


def test_manifest_reports_seed_sizes_accuracy_timing_and_versions(builds):
    _, _, manifest = builds
    assert manifest["seed"] == 0 and manifest["model_size"] == "tiny"
    assert {k: v["rows"] for k, v in manifest["data"].items()} == {
        "train": 5000,
        "test": 1000,
        "sft": 1600,
        "sft_val": 500,
    }
    assert 0.0 <= manifest["warm_start"]["test_accuracy"] <= 1.0
    assert manifest["warm_start"]["eval_rows"] == 1000
    assert manifest["build_seconds"] > 0
    assert manifest["versions"]["torch"] == torch.__version__
    assert "transformers" in manifest["versions"]


def test_loaded_tokenizer_is_the_trained_one_and_digits_are_single_tokens(builds, loaded):
    from transformers import PreTrainedTokenizerFast

    out, _, _ = builds
    _, tokenizer = loaded
    # AutoTokenizer rebuilds qwen2 tokenizers as Qwen2Tokenizer; it must match tokenizer.json.
    raw = PreTrainedTokenizerFast(tokenizer_file=str(out / "model" / "tokenizer.json"))
    for text in ["37+48=85", " 3 7 + 4 8 = ", "héllo 12\n"]:
        assert tokenizer(text)["input_ids"] == raw(text)["input_ids"]
    digit_ids = [tokenizer(str(d), add_special_tokens=False)["input_ids"] for d in range(10)]
    assert all(len(ids) == 1 for ids in digit_ids)
    assert len({ids[0] for ids in digit_ids}) == 10
    ids = tokenizer("37+48=", add_special_tokens=False)["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids) == ["3", "7", "+", "4", "8", "="]


def test_chat_template_wraps_the_prompt_in_role_markers(loaded):
    _, tokenizer = loaded
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "37+48="}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|user|>37+48=<|assistant|>"


def test_splits_are_disjoint_correct_and_cover_only_two_digit_pairs(builds):
    out, _, _ = builds
    prompts = {s: [r["prompt"] for r in rows(out, s)] for s in SPLITS}
    for split, ps in prompts.items():
        assert len(ps) == len(set(ps)), split
    for i, a in enumerate(SPLITS):
        for b in SPLITS[i + 1 :]:
            assert not set(prompts[a]) & set(prompts[b]), (a, b)
    for r in rows(out, "test") + rows(out, "sft"):
        a, b = (int(x) for x in r["prompt"].removesuffix("=").split("+"))
        assert 10 <= a <= 99 and 10 <= b <= 99 and r["label"] == str(a + b)


def test_same_seed_gives_identical_data_files_and_weights(builds):
    first, second, _ = builds
    for split in SPLITS:
        path = Path("data") / f"{split}.jsonl"
        assert (first / path).read_bytes() == (second / path).read_bytes()
    from safetensors.torch import load_file

    a = load_file(first / "model" / "model.safetensors")
    b = load_file(second / "model" / "model.safetensors")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_another_seed_gives_another_split():
    s0, s1 = task.split_pairs(0, 5000, 1000, 1600, 500), task.split_pairs(1, 5000, 1000, 1600, 500)
    assert s0.test != s1.test
    assert s0 == task.split_pairs(0, 5000, 1000, 1600, 500)


def test_building_leaves_the_callers_torch_settings_alone(tmp_path):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    assert not torch.are_deterministic_algorithms_enabled()
    build_demo(tmp_path, seed=5, model_size="tiny", sft_steps=2, progress=False)
    assert not torch.are_deterministic_algorithms_enabled()
    assert torch.equal(torch.rand(3), expected)


def test_model_answers_a_prompt_with_digits_then_eos(loaded):
    model, tokenizer = loaded
    texts, ended = greedy_completions(model, tokenizer, ["37+48=", "10+10=", "99+99="], max_new_tokens=4)
    assert all(ended)
    assert all(t.isdigit() for t in texts)


def test_left_padded_batches_give_the_same_answers_as_one_prompt_at_a_time(builds, loaded):
    out, _, _ = builds
    model, tokenizer = loaded
    # Leading spaces vary the prompt lengths, forcing padding within a batch; the caller's
    # right padding must not leak into generation, and is restored afterwards.
    prompts = [" " * (i % 3) + r["prompt"] for i, r in enumerate(rows(out, "test")[:48])]
    tokenizer.padding_side = "right"
    try:
        batched, _ = greedy_completions(model, tokenizer, prompts, batch_size=48)
        assert tokenizer.padding_side == "right"
    finally:
        tokenizer.padding_side = "left"
    single = [greedy_completions(model, tokenizer, [p], batch_size=1)[0][0] for p in prompts]
    assert batched == single


def test_evaluate_greedy_scores_exact_answers(builds, loaded):
    out, _, manifest = builds
    model, tokenizer = loaded
    test_rows = rows(out, "test")
    assert evaluate_greedy(model, tokenizer, test_rows) == manifest["warm_start"]["test_accuracy"]
    # Relabel every row with the model's own answer: all exact matches.
    texts, _ = greedy_completions(model, tokenizer, [r["prompt"] for r in test_rows[:50]])
    relabelled = [{"prompt": r["prompt"], "label": t} for r, t in zip(test_rows[:50], texts)]
    assert evaluate_greedy(model, tokenizer, relabelled, batch_size=16) == 1.0


def test_cli_reuses_a_complete_build_without_force(builds, capsys):
    out, _, _ = builds
    assert main(["build", str(out), "--size", "tiny"]) == 0
    assert "reusing existing build" in capsys.readouterr().out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--seed", "7", "--size", "tiny"], "holds a build with seed 0"),
        (["--seed", "-1"], "--seed must be in"),
        (["--seed", "x"], "invalid int value"),
    ],
)
def test_cli_bad_input_ends_with_one_clear_line(builds, capsys, args, message):
    out, _, _ = builds
    with pytest.raises(SystemExit) as exc:
        main(["build", str(out), *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_cli_refuses_a_non_empty_directory_without_a_build(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit):
        main(["build", str(tmp_path)])
    assert "holds no complete demo build" in capsys.readouterr().err
    assert (tmp_path / "notes.txt").read_text() == "mine"
