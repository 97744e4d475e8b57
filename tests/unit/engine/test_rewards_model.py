"""RewardModelReward with a tiny randomly initialised Llama classifier saved to a temp folder.

(Llama rather than Qwen2: transformers 5 forces its Qwen2 tokenizer class on a qwen2 folder,
which cannot read the small word-level tokenizer built here.)"""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tokenizers import Tokenizer, models, pre_tokenizers, trainers  # noqa: E402

from rl_engine.rewards import RewardBatch, RewardModelReward  # noqa: E402

CORPUS = [
    "what is two plus two ? the answer is four",
    "name a colour of the sky . blue",
    "count to three : one two three",
    "is water wet ? yes it is",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_rm")
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(CORPUS, trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]", "[EOS]"]))
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", eos_token="[EOS]"
    )
    tokenizer.save_pretrained(folder)
    assert tokenizer("blue")["input_ids"], "the test tokenizer must know the corpus words"
    config = transformers.LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    transformers.LlamaForSequenceClassification(config).eval().save_pretrained(folder)
    return str(folder)


def queries_batch(queries):
    return RewardBatch.build([""] * len(queries), queries)


QUERIES = [
    "what is two plus two ? the answer is four",
    "blue",
    "count to three : one two three [EOS]",
    "is water wet ? yes",
    "name a colour of the sky . blue",
]


def test_scores_are_deterministic_and_do_not_depend_on_batch_size(model_dir):
    batch = queries_batch(QUERIES)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    assert all(tokenizer(q)["input_ids"] for q in QUERIES)  # the reward model reads real tokens
    reference = RewardModelReward(model_dir, batch_size=1).score(batch)
    assert reference.errors == [None] * len(QUERIES)
    assert len(set(reference.scores)) == len(QUERIES)  # a real signal, not a constant

    for batch_size in (2, 8):
        other = RewardModelReward(model_dir, batch_size=batch_size).score(batch)
        assert other.scores == pytest.approx(reference.scores, abs=1e-5)
    again = RewardModelReward(model_dir, batch_size=1).score(batch)
    assert again.scores == reference.scores


def test_score_is_the_models_own_logit_for_an_unpadded_sequence(model_dir):
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1).eval()
    expected = []
    with torch.inference_mode():
        for text in QUERIES[:2]:
            ids = tokenizer(text, return_tensors="pt")["input_ids"]
            expected.append(float(model(input_ids=ids).logits[0, 0]))

    scores = RewardModelReward(model_dir, batch_size=2).score(queries_batch(QUERIES[:2])).scores

    assert scores == pytest.approx(expected, abs=1e-5)


def test_model_is_loaded_lazily_and_only_once(model_dir):
    reward = RewardModelReward(model_dir)
    assert reward._model is None
    reward.score(queries_batch(QUERIES[:1]))
    loaded = reward._model
    reward.score(queries_batch(QUERIES[:2]))
    assert loaded is not None and reward._model is loaded
    reward.close()
    assert reward._model is None


def test_long_query_is_cut_from_the_left_and_flagged(model_dir):
    long_text = "count to three : one two three"
    cut = RewardModelReward(model_dir, max_length=3).score(queries_batch([long_text, "blue"]))
    tail = RewardModelReward(model_dir).score(queries_batch(["one two three"]))
    assert cut.scores[0] == pytest.approx(tail.scores[0], abs=1e-5)
    assert cut.extra_logs["truncated"] == [1.0, 0.0]


def test_folder_without_a_model_is_rejected_naming_the_path_field(tmp_path):
    with pytest.raises(ValueError, match="^path:"):
        RewardModelReward(str(tmp_path))


def test_unknown_dtype_is_rejected_naming_the_dtype_field(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="^dtype:"):
        RewardModelReward(str(tmp_path), dtype="int8")
