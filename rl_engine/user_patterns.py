"""Regular expressions that users give (a `regex` reward's `pattern`), matched in time linear in the text.

Python's `re` backtracks: `^(a+)+$` against 31 characters takes about a minute, and a pattern can be written
to take longer than any run. User patterns therefore go through RE2 (the `google-re2` package), whose
matching time is linear in the text whatever the pattern, within a bounded memory for its automata. RE2
refuses the constructs that need backtracking (backreferences, lookahead and lookbehind, atomic groups,
possessive repeats); such a pattern is refused where the spec is validated, with the reason.

Both sides are bounded, because linear is a factor of both: RE2's worst case (a pattern whose automaton
does not fit its memory, such as `[ab]*a[ab]{999}c`) costs about the text's length times the pattern's
compiled size. A pattern has at most `MAX_PATTERN_CHARS` characters and compiles to at most
`MAX_PROGRAM_SIZE` RE2 instructions (counted repeats are what makes a short pattern large; RE2 itself
refuses one above 1000), and it is matched against texts of at most `MAX_INPUT_CHARS` characters
(`InputTooLong` past it: the caller decides what a longer text scores). At these bounds one text costs at
most about 2.5 s of one core (measured on a shared 2-core machine); a usual format pattern (a few dozen
instructions) reads 100,000 characters in about a millisecond.

Differences from Python's `re` that a pattern may meet: `\\d`, `\\w`, `\\s` and `\\b` are ASCII only (use
`\\p{L}`, `\\p{N}` for letters and digits of any script); `$` is the end of the text only (Python's also
matches before a final newline; `(?m)$` ends every line); `\\z` is the end of the text (Python's `\\Z`).
Flags are written inline: `(?i)`, `(?s)`, `(?m)`. Standard library and `re2` only; no Django.
"""

from __future__ import annotations

import re
from typing import Any

MAX_PATTERN_CHARS = 1_000
MAX_PROGRAM_SIZE = 4_000  # RE2 instructions: `(?s)^<think>.*</think>\s*<answer>.*</answer>$` has 46, `\p{L}` 1200
MAX_INPUT_CHARS = 100_000  # about 25k tokens: past a run's usual response length
MAX_PROGRAM_BYTES = 8 << 20  # RE2's memory for one compiled pattern and its automata (its default budget)

# RE2's error messages for the constructs it has no linear-time way to run, and what to say about them.
_BACKREFERENCE = re.compile(r"invalid escape sequence: \\[1-9g]|invalid perl operator: \(\?P(?:=|$)")
_LOOKAROUND = re.compile(r"invalid perl operator: \(\?<?[=!]")
_BACKTRACKING_ONLY = re.compile(r"invalid perl operator: \(\?>|bad repetition operator: [*+?}]\+")
_END_OF_TEXT = "invalid escape sequence: \\Z"


class UserPatternError(ValueError):
    """The pattern cannot be used; the message says why (without naming the field: callers do)."""


class InputTooLong(ValueError):
    """The text is longer than `MAX_INPUT_CHARS`: it was not matched."""


class UserPattern:
    """A compiled user pattern: `matches(text, whole=...)` searches the text (or matches all of it)."""

    def __init__(self, pattern: str, compiled: Any, program_size: int):
        self.pattern = pattern
        self.program_size = program_size  # RE2 instructions, the larger of its forward and reverse programs
        self._compiled = compiled

    def matches(self, text: str, *, whole: bool = False) -> bool:
        """Whether the pattern is found in `text` (`whole`: matches all of it). Raises InputTooLong past
        MAX_INPUT_CHARS. Text that is not valid Unicode (a lone surrogate from JSON) is matched with those
        characters replaced, so no text makes it fail."""
        if len(text) > MAX_INPUT_CHARS:
            raise InputTooLong(f"the text has {len(text)} characters; patterns match at most {MAX_INPUT_CHARS}")
        data = text.encode("utf-8", errors="replace")
        found = self._compiled.fullmatch(data) if whole else self._compiled.search(data)
        return found is not None


def compile_user_pattern(pattern: Any) -> UserPattern:
    """The pattern compiled by RE2, or UserPatternError saying what is wrong with it."""
    if not isinstance(pattern, str):
        raise UserPatternError(f"must be a string, got {type(pattern).__name__}")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise UserPatternError(f"is {len(pattern)} characters long; a pattern may have at most {MAX_PATTERN_CHARS}")
    import re2  # google-re2: imported here so that the reward package stays standard library at import time

    options = re2.Options()
    options.max_mem = MAX_PROGRAM_BYTES
    options.log_errors = False  # the error comes back to the caller; RE2's own log line would only be noise
    try:
        compiled = re2.compile(pattern, options=options)
    except re2.error as exc:
        raise UserPatternError(_explain(_message(exc))) from None
    size = max(compiled.programsize, compiled.reverseprogramsize)
    if size > MAX_PROGRAM_SIZE:
        raise UserPatternError(_too_large(f"compiles to {size} RE2 instructions, more than {MAX_PROGRAM_SIZE}"))
    return UserPattern(pattern, compiled, size)


def check_user_pattern(pattern: Any) -> str | None:
    """What is wrong with the pattern, or None when it can be used."""
    try:
        compile_user_pattern(pattern)
    except UserPatternError as exc:
        return str(exc)
    return None


def _message(exc: Exception) -> str:
    detail = exc.args[0] if exc.args else str(exc)
    return detail.decode("utf-8", errors="replace") if isinstance(detail, bytes) else str(detail)


def _explain(message: str) -> str:
    """RE2's message, with the reason where it refuses a construct Python's `re` has."""
    if _BACKREFERENCE.search(message):
        why = "backreferences are not supported (patterns run on RE2, which matches in linear time)"
    elif _LOOKAROUND.search(message):
        why = "lookahead and lookbehind are not supported (patterns run on RE2, which matches in linear time)"
    elif _BACKTRACKING_ONLY.search(message):
        why = "atomic groups and possessive repeats are not supported (patterns run on RE2)"
    elif message == _END_OF_TEXT:
        why = "write \\z for the end of the text"
    elif "pattern too large" in message:
        return _too_large(f"does not compile within {MAX_PROGRAM_BYTES >> 20} MiB")
    else:
        return f"invalid regular expression: {message}"
    return f"invalid regular expression: {message}: {why}"


def _too_large(what: str) -> str:
    return (
        f"is too large: it {what} (counted repeats such as {{999}} and classes such as \\p{{L}} make a pattern large)"
    )
