"""Rule-based rewards: pure functions of the text, fast, in-process.

A wrong or missing answer is a score (0.0), not an error. Errors are kept for samples a rule
cannot judge at all, e.g. a missing label for a rule that compares against the label.
"""

from __future__ import annotations

import re
from fractions import Fraction

from rl_engine.rewards.base import ComponentResult, RewardBatch
from rl_engine.user_patterns import MAX_INPUT_CHARS, InputTooLong, UserPatternError, compile_user_pattern

NO_LABEL = "no label to compare against"
# A literal's exponent beyond this is no number to compare: Fraction("1e999999999") would build an integer
# of a billion digits (minutes and gigabytes), so a response could stall the reward with one short word.
MAX_EXPONENT = 1000

# A number as people and models write it: optional sign, thousands separators, decimals,
# exponent. The sign is only taken when it is not glued to a preceding word/number, so a
# range like "3-5" reads as 3 and 5, not 3 and -5.
_NUMBER = re.compile(
    r"""
    (?:(?<![\w.])[-+])?
    (?:
        \d{1,3}(?:,\d{3})+(?:\.\d+)?   # 1,234,567.89
      | \d+(?:\.\d+)?                  # 1234.5
      | \.\d+                          # .5
    )
    (?:[eE][-+]?\d+)?
    """,
    re.VERBOSE,
)


def parse_number(text: str) -> Fraction | None:
    """The exact value of a number literal like "12", "+12", "12.0", "1,234.5", "1e3"; else None."""
    text = text.strip()
    if not _NUMBER.fullmatch(text) or _exponent_too_large(text):
        return None
    try:
        return Fraction(text.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def _exponent_too_large(literal: str) -> bool:
    mantissa, e, exponent = literal.lower().partition("e")
    return bool(e) and abs(int(exponent)) > MAX_EXPONENT


def last_number(text: str) -> Fraction | None:
    """The value of the last number literal in ``text`` (None when there is none)."""
    matches = _NUMBER.findall(text)
    return parse_number(matches[-1]) if matches else None


def _normalize_text(text: str) -> str:
    text = " ".join(text.split()).casefold()
    return text.rstrip(".").strip()


class ExactMatch:
    """1.0 when the response's final answer equals the label, else 0.0.

    ``numeric=True``: the final answer is the last number in the response, compared by value
    with the label's number ("12", "12.0" and "+12" all equal 12; "1,200" equals 1200). The
    label is read whole, or else by its last number ("#### 72"). If the label holds no number,
    the text comparison below is used.
    ``numeric=False``: the whole stripped response is the answer, compared as text.
    ``normalize=True`` makes the text comparison ignore case, repeated whitespace and a
    trailing period; with ``normalize=False`` only surrounding whitespace is ignored.
    A sample without a label fails (the rule cannot judge it).
    """

    def __init__(self, name: str = "exact_match", normalize: bool = True, numeric: bool = True):
        self.name = name
        self.normalize = normalize
        self.numeric = numeric

    def _matches(self, response: str, label: str) -> bool:
        if self.numeric:
            expected = parse_number(label)
            if expected is None:
                expected = last_number(label)
            if expected is not None:
                return last_number(response) == expected
        if self.normalize:
            return _normalize_text(response) == _normalize_text(label)
        return response.strip() == label.strip()

    def score(self, batch: RewardBatch) -> ComponentResult:
        scores: list[float] = []
        errors: list[str | None] = []
        for response, label in zip(batch.responses, batch.labels):
            if label is None:
                scores.append(0.0)
                errors.append(NO_LABEL)
                continue
            scores.append(1.0 if self._matches(response, str(label)) else 0.0)
            errors.append(None)
        return ComponentResult(scores, errors, {})

    def close(self) -> None:
        pass


# --- boxed math ------------------------------------------------------------------------------

_BOXED = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])\s*")


def _read_group(text: str, start: int) -> tuple[str, int] | None:
    """Read a ``{...}`` group with balanced braces (or one bare character) at ``start``.

    Returns (content, index after the group), or None when the braces never close.
    """
    while start < len(text) and text[start] == " ":
        start += 1
    if start >= len(text):
        return None
    if text[start] != "{":
        return text[start], start + 1
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``, ``\\boxed 5``) in ``text``."""
    for match in reversed(list(_BOXED.finditer(text))):
        end = match.end()
        if end < len(text) and text[end] == "{":
            group = _read_group(text, end)
            if group is not None:
                return group[0]
        else:
            # "\boxed 5" form: the answer runs to the next "$" or whitespace.
            bare = re.match(r"[^\s${}]+", text[end:])
            if bare:
                return bare.group(0)
    return None


def _replace_fracs(text: str) -> str:
    r"""``\frac{a}{b}`` (and ``\frac12``) -> ``(a)/(b)``, innermost arguments first."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith("\\frac", i):
            num = _read_group(text, i + 5)
            den = _read_group(text, num[1]) if num else None
            if num and den:
                out.append(f"({_replace_fracs(num[0])})/({_replace_fracs(den[0])})")
                i = den[1]
                continue
        out.append(text[i])
        i += 1
    return "".join(out)


_TEXT_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_SPACING = re.compile(r"\\[,;:! ]|\\(?:quad|qquad|displaystyle)\b|\\left\b|\\right\b")


def normalize_math(text: str) -> str:
    """Canonical text of a simple LaTeX answer, so equal answers compare equal as strings."""
    text = text.strip()
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = _TEXT_WRAPPERS.sub(r"\1", text)
    text = _SPACING.sub("", text)
    text = text.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\%", "").replace("%", "")
    text = text.replace("{,}", ",").replace("$", "")
    text = _replace_fracs(text)
    text = "".join(text.split())
    text = text.rstrip(".")
    # "x=5" answers "5": drop a single-letter assignment in front.
    text = re.sub(r"^[A-Za-z]=(?=.)", "", text)
    # Drop redundant outer braces: "{5}" -> "5".
    while len(text) >= 2 and text[0] == "{" and text[-1] == "}" and _read_group(text, 0) == (text[1:-1], len(text)):
        text = text[1:-1]
    return text


def _math_value(text: str) -> Fraction | None:
    """Exact value of a normalised answer made of numbers, parentheses, a sign and ``/``."""
    parser = _FractionParser(text)
    try:
        value = parser.expression()
    except (ValueError, ZeroDivisionError):
        return None
    return value if parser.pos == len(text) else None


_PLAIN_NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+")


class _FractionParser:
    """expression := term ('/' term)* ; term := [+-] (number | '(' expression ')')"""

    def __init__(self, text: str):
        self.text = text
        self.pos = 0

    def expression(self) -> Fraction:
        value = self.term()
        while self.pos < len(self.text) and self.text[self.pos] == "/":
            self.pos += 1
            value = value / self.term()
        return value

    def term(self) -> Fraction:
        sign = 1
        if self.pos < len(self.text) and self.text[self.pos] in "+-":
            sign = -1 if self.text[self.pos] == "-" else 1
            self.pos += 1
        if self.pos < len(self.text) and self.text[self.pos] == "(":
            self.pos += 1
            value = self.expression()
            if self.pos >= len(self.text) or self.text[self.pos] != ")":
                raise ValueError("unbalanced parenthesis")
            self.pos += 1
            return sign * value
        match = _PLAIN_NUMBER.match(self.text, self.pos)
        if not match:
            raise ValueError("not a number")
        self.pos = match.end()
        return sign * Fraction(match.group(0).replace(",", ""))


def math_equal(answer: str, label: str) -> bool:
    """Equal after normalisation, or equal in value when both are plain numbers/fractions."""
    a, b = normalize_math(answer), normalize_math(label)
    if a == b:
        return True
    va, vb = _math_value(a), _math_value(b)
    return va is not None and vb is not None and va == vb


class BoxedMath:
    r"""1.0 when the last ``\boxed{...}`` in the response equals the label, else 0.0.

    Simple LaTeX is normalised (``\frac``/``\dfrac``/``\tfrac``, ``\left``/``\right``, spacing
    commands, spaces, ``$``, a trailing period, ``\text{}`` wrappers, degrees and percent signs)
    and answers are compared by value when both sides are numbers or fractions, so ``1/2``,
    ``0.5`` and ``\frac{1}{2}`` are all equal. A label that itself contains ``\boxed{}`` is
    reduced to its boxed content. A response without a box scores 0.0; the ``has_boxed`` curve
    tracks how often the model produced one.
    """

    def __init__(self, name: str = "boxed_math"):
        self.name = name

    def score(self, batch: RewardBatch) -> ComponentResult:
        scores: list[float] = []
        errors: list[str | None] = []
        has_boxed: list[float] = []
        for response, label in zip(batch.responses, batch.labels):
            answer = last_boxed(response)
            has_boxed.append(0.0 if answer is None else 1.0)
            if label is None:
                scores.append(0.0)
                errors.append(NO_LABEL)
                continue
            label = str(label)
            label = last_boxed(label) or label
            scores.append(1.0 if answer is not None and math_equal(answer, label) else 0.0)
            errors.append(None)
        return ComponentResult(scores, errors, {"has_boxed": has_boxed})

    def close(self) -> None:
        pass


# --- format and length -----------------------------------------------------------------------


class RegexReward:
    """Format reward: ``score_match`` when the response matches ``pattern``, else ``score_miss``.

    ``full_match=False`` searches anywhere in the response; ``True`` requires the whole response to
    match. The pattern is RE2 syntax, matched in time linear in the response whatever the pattern
    (``rl_engine.user_patterns``: no backreferences or lookaround; ``\\d``, ``\\w`` and ``\\b`` are ASCII),
    with no implicit flags: write ``(?s)`` to let ``.`` cross newlines, ``(?m)``/``(?i)`` as needed.
    A response longer than ``MAX_INPUT_CHARS`` is not matched: it scores ``score_miss``, and the
    ``too_long`` curve counts such responses.
    """

    def __init__(
        self,
        pattern: str,
        name: str = "regex",
        full_match: bool = False,
        score_match: float = 1.0,
        score_miss: float = 0.0,
    ):
        try:
            self._regex = compile_user_pattern(pattern)
        except UserPatternError as exc:
            raise ValueError(f"pattern: {exc}") from None
        self.name = name
        self.pattern = pattern
        self.full_match = full_match
        self.score_match = float(score_match)
        self.score_miss = float(score_miss)

    def score(self, batch: RewardBatch) -> ComponentResult:
        scores: list[float] = []
        too_long: list[float] = []
        for response in batch.responses:
            try:
                matched = self._regex.matches(response, whole=self.full_match)
            except InputTooLong:
                matched = False
            scores.append(self.score_match if matched else self.score_miss)
            too_long.append(1.0 if len(response) > MAX_INPUT_CHARS else 0.0)
        return ComponentResult.ok(scores, {"too_long": too_long})

    def close(self) -> None:
        pass


# No tokenizer here: a token target is turned into characters with this rough average for
# English text and code in BPE vocabularies. Use ``max_chars`` when you need an exact limit.
CHARS_PER_TOKEN = 4


class LengthPenalty:
    """Penalty for responses longer than a limit, counted in characters.

    Shape: ``score = -coef * max(0, chars - limit) / limit``. Zero up to the limit, then linear
    in the relative overshoot: a response twice the limit scores ``-coef``, three times
    ``-2 * coef``. It is unbounded below by design, but generation is capped by the sampler's
    max tokens, so in practice it stays bounded. Give exactly one of ``max_chars`` or
    ``target_tokens`` (converted with ``CHARS_PER_TOKEN`` characters per token).
    The ``over_limit`` curve is the fraction of responses past the limit.
    """

    def __init__(
        self,
        name: str = "length_penalty",
        target_tokens: int | None = None,
        max_chars: int | None = None,
        coef: float = 1.0,
    ):
        if target_tokens is not None and max_chars is None:
            chars = target_tokens * CHARS_PER_TOKEN
        elif max_chars is not None and target_tokens is None:
            chars = max_chars
        else:
            raise ValueError("max_chars: give exactly one of target_tokens or max_chars")
        if target_tokens is not None and target_tokens <= 0:
            raise ValueError("target_tokens: must be positive")
        if max_chars is not None and max_chars <= 0:
            raise ValueError("max_chars: must be positive")
        if coef < 0:
            raise ValueError("coef: must be >= 0 (it is the size of a penalty)")
        self.name = name
        self.limit = int(chars)
        self.coef = float(coef)

    def score(self, batch: RewardBatch) -> ComponentResult:
        scores: list[float] = []
        over: list[float] = []
        for response in batch.responses:
            excess = max(0, len(response) - self.limit)
            scores.append(-self.coef * excess / self.limit)
            over.append(1.0 if excess else 0.0)
        return ComponentResult.ok(scores, {"over_limit": over})

    def close(self) -> None:
        pass
