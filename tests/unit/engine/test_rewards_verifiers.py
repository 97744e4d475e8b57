import pytest

from rl_engine.rewards import BoxedMath, ExactMatch, LengthPenalty, RegexReward, RewardBatch


def batch(responses, labels=None):
    return RewardBatch.build(["q"] * len(responses), responses, labels)


# --- exact_match --------------------------------------------------------------------------------


@pytest.mark.parametrize("response", ["The answer is 12", "so 12.0", "= +12.", "x: 12.00 apples", "1e1 and then 12"])
def test_exact_match_compares_the_last_number_by_value(response):
    assert ExactMatch().score(batch([response], ["12"])).scores == [1.0]


def test_exact_match_handles_thousands_separators_on_both_sides():
    result = ExactMatch().score(batch(["total: 1,234,567", "1234567", "1,234"], ["1234567", "1,234,567", "1234"]))
    assert result.scores == [1.0, 1.0, 1.0]


def test_exact_match_uses_only_the_final_number():
    result = ExactMatch().score(batch(["12 apples minus 7 is 5", "12 apples minus 7 is 5"], ["5", "12"]))
    assert result.scores == [1.0, 0.0]


def test_exact_match_reads_negative_numbers_but_not_ranges():
    result = ExactMatch().score(batch(["it is -5", "pages 3-5"], ["-5", "5"]))
    assert result.scores == [1.0, 1.0]


def test_exact_match_scores_a_response_without_a_number_zero_without_error():
    result = ExactMatch().score(batch(["I don't know"], ["7"]))
    assert result.scores == [0.0]
    assert result.errors == [None]


def test_exact_match_takes_the_number_out_of_a_gsm8k_style_label():
    assert ExactMatch().score(batch(["so 72"], ["#### 72"])).scores == [1.0]


def test_exact_match_fails_a_sample_without_label():
    result = ExactMatch().score(batch(["12", "12"], [None, "12"]))
    assert result.scores == [0.0, 1.0]
    assert result.errors[0] == "no label to compare against"
    assert result.errors[1] is None


def test_exact_match_text_mode_normalises_case_space_and_trailing_period():
    responses = ["  Paris.  ", "PARIS", "New   York", "paris!"]
    labels = ["paris", "Paris", "new york", "paris"]
    assert ExactMatch(numeric=False).score(batch(responses, labels)).scores == [1.0, 1.0, 1.0, 0.0]


def test_exact_match_without_normalize_only_strips():
    result = ExactMatch(numeric=False, normalize=False).score(batch(["  Paris ", "paris"], ["Paris", "Paris"]))
    assert result.scores == [1.0, 0.0]


def test_exact_match_falls_back_to_text_when_the_label_has_no_number():
    assert ExactMatch().score(batch(["Blue.", "red"], ["blue", "blue"])).scores == [1.0, 0.0]


# --- boxed_math ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "response, label",
    [
        (r"so \boxed{\frac{1}{2}}", "0.5"),
        (r"so \boxed{0.5}", r"\frac{1}{2}"),
        (r"\boxed{1/2}", r"\dfrac{1}{2}"),
        (r"\boxed{\dfrac12}", "1/2"),
        (r"\boxed{-\frac{3}{4}}", "-0.75"),
        (r"$\boxed{ 1{,}000 }$.", "1000"),
        (r"\boxed{\left( 1, 2 \right)}", "(1,2)"),
        (r"\boxed{x = 5}", "5"),
        (r"\boxed{90^\circ}", "90"),
        (r"\boxed{\text{yes}}", "yes"),
        (r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt{3}}{2}"),
        (r"\boxed 7", "7"),
    ],
)
def test_boxed_math_accepts_equivalent_answers(response, label):
    assert BoxedMath().score(batch([response], [label])).scores == [1.0]


@pytest.mark.parametrize(
    "response, label",
    [
        (r"\boxed{\frac{1}{3}}", "0.33"),
        (r"\boxed{(1,2)}", "(2,1)"),
        (r"\boxed{12}", "13"),
    ],
)
def test_boxed_math_rejects_different_answers(response, label):
    assert BoxedMath().score(batch([response], [label])).scores == [0.0]


def test_boxed_math_uses_the_last_box_with_nested_braces():
    response = r"first \boxed{3}, finally \boxed{\frac{2}{\left(4\right)}}"
    assert BoxedMath().score(batch([response, response], ["0.5", "3"])).scores == [1.0, 0.0]


def test_boxed_math_without_a_box_scores_zero_and_is_tracked():
    result = BoxedMath().score(batch(["the answer is 4", r"\boxed{4}", r"\boxed{4"], ["4", "4", "4"]))
    assert result.scores == [0.0, 1.0, 0.0]
    assert result.errors == [None, None, None]
    assert result.extra_logs["has_boxed"] == [0.0, 1.0, 0.0]


def test_boxed_math_reads_a_boxed_label():
    assert BoxedMath().score(batch([r"\boxed{6}"], [r"so the total is \boxed{6}."])).scores == [1.0]


def test_boxed_math_fails_a_sample_without_label():
    assert BoxedMath().score(batch([r"\boxed{6}"], [None])).errors == ["no label to compare against"]


# --- regex --------------------------------------------------------------------------------------


def test_regex_searches_by_default_and_full_match_requires_the_whole_response():
    responses = ["<think>a</think><answer>1</answer>", "preamble <answer>1</answer>", "no tags"]
    pattern = r"<answer>.*</answer>"
    assert RegexReward(pattern).score(batch(responses)).scores == [1.0, 1.0, 0.0]
    full = RegexReward(r"<think>.*</think><answer>.*</answer>", full_match=True)
    assert full.score(batch(responses)).scores == [1.0, 0.0, 0.0]


def test_regex_uses_the_configured_scores():
    reward = RegexReward(r"^\d+$", score_match=0.5, score_miss=-1.0)
    assert reward.score(batch(["42", "forty-two"])).scores == [0.5, -1.0]


def test_regex_inline_flags_let_dot_cross_newlines():
    assert RegexReward(r"(?s)<think>.*</think>", full_match=True).score(batch(["<think>a\nb</think>"])).scores == [1.0]


def test_invalid_regex_is_rejected_naming_the_pattern_field():
    with pytest.raises(ValueError, match=r"^pattern: invalid regular expression"):
        RegexReward("(unclosed")


# --- length_penalty -----------------------------------------------------------------------------


def test_length_penalty_is_zero_up_to_the_limit_then_linear_in_overshoot():
    reward = LengthPenalty(max_chars=10, coef=0.5)
    result = reward.score(batch(["x" * 5, "x" * 10, "x" * 15, "x" * 20, "x" * 30]))
    assert result.scores == [0.0, 0.0, -0.25, -0.5, -1.0]
    assert result.extra_logs["over_limit"] == [0.0, 0.0, 1.0, 1.0, 1.0]


def test_length_penalty_converts_a_token_target_to_characters():
    reward = LengthPenalty(target_tokens=5, coef=1.0)
    assert reward.limit == 20
    assert reward.score(batch(["x" * 20, "x" * 40])).scores == [0.0, -1.0]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({}, "max_chars"),
        ({"max_chars": 5, "target_tokens": 5}, "max_chars"),
        ({"max_chars": 0}, "max_chars"),
        ({"max_chars": 5, "coef": -1}, "coef"),
    ],
)
def test_length_penalty_rejects_bad_limits(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        LengthPenalty(**kwargs)
