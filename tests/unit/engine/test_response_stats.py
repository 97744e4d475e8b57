"""The responses' statistics behind the rollout filters and the hacking signals, against hand-computed values."""

from __future__ import annotations

import math
import zlib

import pytest

from rl_engine.response_stats import (
    compression_ratio,
    ngram_repetition_rate,
    nonprintable_share,
    normalized_surprisal,
    step_response_metrics,
    top_answer,
    top_answer_group_share,
)


def test_ngram_repetition_rate_counts_ngrams_seen_earlier_in_the_response():
    # bigrams of a b a b a: ab ba ab ba -> the last two repeat: 2 / 4
    assert ngram_repetition_rate(list("ababa"), n=2) == pytest.approx(0.5)
    # one token looped: 4-grams of 8 x "7" are 5, all but the first repeat
    assert ngram_repetition_rate([7] * 8) == pytest.approx(4 / 5)
    assert ngram_repetition_rate([1, 2, 3, 4, 5, 6]) == 0.0


def test_ngram_repetition_rate_of_a_response_too_short_for_two_ngrams_is_zero():
    assert ngram_repetition_rate([1, 2, 3, 4]) == 0.0
    assert ngram_repetition_rate([]) == 0.0
    with pytest.raises(ValueError, match="n must"):
        ngram_repetition_rate([1, 2], n=0)


def test_compression_ratio_is_raw_over_deflated_bytes_and_none_for_short_responses():
    text = "the answer is 42. " * 10
    raw = text.encode()
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    assert compression_ratio(text) == pytest.approx(len(raw) / len(packer.compress(raw) + packer.flush()))
    assert compression_ratio(text) > 4  # a loop compresses far better than prose
    assert compression_ratio("42") is None


def test_nonprintable_share_counts_controls_and_broken_bytes_but_not_newlines():
    assert nonprintable_share("ab\ncd\t") == 0.0
    assert nonprintable_share("a\x00b\ufffd") == pytest.approx(0.5)  # NUL and the replacement character
    assert nonprintable_share("\u200b" + "abc") == pytest.approx(0.25)  # a zero-width space is format (Cf)
    assert nonprintable_share("") == 0.0


def test_normalized_surprisal_is_mean_surprisal_over_a_uniform_draws():
    vocab = 256
    uniform = -math.log(vocab)
    assert normalized_surprisal([uniform] * 3, vocab) == pytest.approx(1.0)
    assert normalized_surprisal([uniform / 2, uniform / 4], vocab) == pytest.approx(0.375)
    assert normalized_surprisal([], vocab) is None
    with pytest.raises(ValueError, match="vocab_size"):
        normalized_surprisal([-1.0], 1)


def test_top_answer_is_the_answer_given_for_the_most_prompts_not_the_most_often():
    responses = ["12", "12", "12", "<answer>", "<ANSWER> ", "7"]
    groups = [0, 0, 0, 1, 2, 2]
    # "12" appears three times but for one prompt; "<answer>" for two.
    assert top_answer(responses, groups) == ("<answer>", 2)
    assert top_answer_group_share(responses, groups) == pytest.approx(2 / 3)
    assert top_answer([], []) is None and top_answer_group_share([], []) == 0.0


def test_step_response_metrics_are_means_over_the_steps_responses():
    texts = ["ab", "a\x00"]
    metrics = step_response_metrics(texts, [[1, 1, 1, 1, 1], [1, 2, 3, 4, 5]], [0, 1], [[-1.0], None], 4)
    assert metrics == {
        "response/repetition_rate": pytest.approx((1 / 2 + 0) / 2),
        "response/nonprintable_share": pytest.approx(0.25),
        "response/top_answer_group_share": pytest.approx(0.5),
        "response/normalized_surprisal": pytest.approx(1 / math.log(4)),
    }
    assert "response/compression_ratio" in step_response_metrics(["x" * 100], [[1]], [0])
