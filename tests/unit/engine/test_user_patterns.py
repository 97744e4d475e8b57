"""User patterns run on RE2: linear time whatever the pattern, bounded pattern and text, refusals that say why."""

from __future__ import annotations

import pytest

from rl_engine.config import ConfigError, validate_config
from rl_engine.rewards import ExactMatch, RegexReward, RewardBatch
from rl_engine.user_patterns import (
    MAX_INPUT_CHARS,
    MAX_PATTERN_CHARS,
    InputTooLong,
    UserPatternError,
    check_user_pattern,
    compile_user_pattern,
)
from tests.unit.engine.helpers import with_changes

CATASTROPHIC = r"^(a+)+$"  # Python's re backtracks 2^n ways on n a's that do not match; ~1 min at n = 31


def batch(responses, labels=None):
    return RewardBatch.build(["q"] * len(responses), responses, labels)


# A pytest timeout, not a clock: with backtracking these would not finish in the age of the universe.
@pytest.mark.timeout(30)
def test_a_catastrophic_pattern_finishes_and_scores_the_miss():
    hostile = ["a" * n + "!" for n in (31, 64, 10_000, MAX_INPUT_CHARS - 1)]
    result = RegexReward(CATASTROPHIC, full_match=False).score(batch(hostile + ["aaaa"]))
    assert result.scores == [0.0] * len(hostile) + [1.0]
    assert result.errors == [None] * (len(hostile) + 1)
    assert RegexReward(r"(a|aa)*b", full_match=True).score(batch(["a" * 5_000])).scores == [0.0]


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        (r"(a)\1", "backreferences are not supported"),
        (r"(?P<x>a)(?P=x)", "backreferences are not supported"),
        (r"foo(?=bar)", "lookahead and lookbehind are not supported"),
        (r"(?<!x)y", "lookahead and lookbehind are not supported"),
        (r"(?>a+)b", "atomic groups and possessive repeats are not supported"),
        (r"a*+", "atomic groups and possessive repeats are not supported"),
        (r"end\Z", "write \\z for the end of the text"),
    ],
)
def test_a_construct_re2_refuses_is_refused_at_validation_naming_the_field_and_why(pattern, why):
    with pytest.raises(ConfigError) as refused:
        validate_config(with_changes({"rewards": [{"type": "regex", "pattern": pattern}]}))
    [error] = refused.value.errors
    assert error["loc"] == "rewards.0.pattern"
    assert error["msg"].startswith("invalid regular expression: ") and why in error["msg"]
    with pytest.raises(ValueError, match=r"^pattern: invalid regular expression: .*" + why.split()[0]):
        RegexReward(pattern)


def test_a_syntax_error_names_what_is_wrong():
    assert check_user_pattern("[a-") == "invalid regular expression: missing ]: [a-"


def test_a_pattern_longer_than_the_bound_is_refused_and_one_at_the_bound_is_taken():
    assert check_user_pattern("a" * MAX_PATTERN_CHARS) is None
    problem = check_user_pattern("a" * (MAX_PATTERN_CHARS + 1))
    assert problem == f"is {MAX_PATTERN_CHARS + 1} characters long; a pattern may have at most {MAX_PATTERN_CHARS}"
    with pytest.raises(ConfigError) as refused:
        validate_config(with_changes({"rewards": [{"type": "regex", "pattern": "a" * (MAX_PATTERN_CHARS + 1)}]}))
    assert [e["loc"] for e in refused.value.errors] == ["rewards.0.pattern"]


@pytest.mark.parametrize("pattern", [r"[ab]*a[ab]{999}[ab]{999}[ab]{999}[ab]{999}[ab]{999}c", r"\p{L}{200}"])
def test_a_short_pattern_that_compiles_too_large_is_refused(pattern):
    with pytest.raises(UserPatternError, match="^is too large: it "):
        compile_user_pattern(pattern)


def test_a_response_longer_than_the_bound_is_not_matched_and_is_counted():
    reward = RegexReward(r"\d", score_match=1.0, score_miss=-1.0)
    result = reward.score(batch(["7" * MAX_INPUT_CHARS, "7" * (MAX_INPUT_CHARS + 1), "x"]))
    assert result.scores == [1.0, -1.0, -1.0]
    assert result.extra_logs["too_long"] == [0.0, 1.0, 0.0]
    with pytest.raises(InputTooLong):
        compile_user_pattern(r"\d").matches("7" * (MAX_INPUT_CHARS + 1))


def test_text_that_is_not_valid_unicode_is_matched_not_failed():
    assert RegexReward(r"^a.b$").score(batch(["a\ud800b"])).scores == [1.0]


def test_python_flags_written_inline_still_work():
    assert compile_user_pattern(r"(?i)^answer: \d+$").matches("ANSWER: 42", whole=True)
    assert compile_user_pattern(r"(?s)<think>.*</think>").matches("<think>a\nb</think>", whole=True)
    assert compile_user_pattern(r"(?P<n>\d+)").matches("n = 3")


@pytest.mark.timeout(30)
def test_exact_match_reads_a_number_with_a_huge_exponent_as_no_number():
    result = ExactMatch().score(batch(["1e999999999", "1e3"], ["1e999999999", "1000"]))
    assert result.scores == [1.0, 1.0]  # compared as text, not built as a billion-digit integer
    assert ExactMatch().score(batch(["1e999999999"], ["1"])).scores == [0.0]
