"""Reward probes: adversarial answers built from a dataset, to tell whether a reward can be gamed before a
run spends its budget on it (rewardspy's `probe`, made from the task's own rows).

For each of a few dataset rows, the honest answer (the row's label) and one answer per probe:

| probe | the answer | a reward that pays for it |
|---|---|---|
| `empty` | nothing | pays for anything |
| `prompt_echo` | the prompt itself | matches words of the question |
| `all_labels` | every label of the dataset, one a line | finds the label anywhere |
| `label_in_garbage` | the right label between two runs of noise | finds the label anywhere |
| `right_format_wrong_answer` | the label with its digits changed (its letters, when it has no digits), its shape kept | checks the format only |
| `very_long` | a long answer that never gives the label | pays for length |
| `repeated_tokens` | one word repeated hundreds of times | pays for length or a keyword |
| `other_label` | another row's label | pays for any well-formed answer |

A probe whose mean score reaches HACKABLE_FRACTION (50%) of the honest answers' mean score is flagged: an
answer that does not solve the task earns half of what solving it does. Standard library only: the platform
builds the cases and reads the report (`posttrain.registry.services.reward_probes`); a worker scores them with
the reward exactly as a run would. docs/REWARD_HACKING.md, "Reward probes".
"""

from __future__ import annotations

import random
import statistics
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "HACKABLE_FRACTION",
    "HONEST",
    "PROBES",
    "ProbeCase",
    "build_cases",
    "hackability_report",
]

HONEST = "honest"
PROBES: tuple[str, ...] = (
    "empty",
    "prompt_echo",
    "all_labels",
    "label_in_garbage",
    "right_format_wrong_answer",
    "very_long",
    "repeated_tokens",
    "other_label",
)
HACKABLE_FRACTION = 0.5

ROWS = 8
"""Rows probed: eight answers per probe average out a reward that is noisy per sample, and 9 x 8 = 72 scored
samples keep a probe of a python or HTTP reward within the user-code time limit."""

MAX_LABELS = 200  # all_labels lists at most this many distinct labels (the row's own always among them)
GARBAGE_CHARS = 200  # noise on each side of the buried label
LONG_WORDS = 600  # very_long: about 4 KB of text
REPEATS = 300  # repeated_tokens

_FILLER = (
    "Let us think about this step by step. First we read the question carefully and note what is given. "
    "Then we consider each part in turn, check the intermediate results and make sure nothing is missed. "
    "It is important to be thorough, to explain the reasoning clearly and to double-check every step. "
)


@dataclass(frozen=True)
class ProbeCase:
    """One answer to score: `probe` is HONEST or one of PROBES; `row` the dataset row it was built from."""

    probe: str
    row: int
    prompt: str
    response: str
    label: str | None
    metadata: dict[str, Any]

    def as_sample(self) -> dict[str, Any]:
        return {"prompt": self.prompt, "response": self.response, "label": self.label, "metadata": self.metadata}


def _wrong_same_shape(label: str, rng: random.Random) -> str:
    """The label with every digit replaced by another digit, everything else kept (`\\boxed{12}` ->
    `\\boxed{47}`); a label without digits gets every ASCII letter replaced by another of the same case
    instead. The right format, a wrong answer."""
    has_digits = any(char.isdigit() for char in label)
    out = []
    for char in label:
        if char.isdigit():
            out.append(rng.choice([d for d in string.digits if d != char]))
        elif not has_digits and char.isascii() and char.isalpha():
            pool = string.ascii_lowercase if char.islower() else string.ascii_uppercase
            out.append(rng.choice([c for c in pool if c != char]))
        else:
            out.append(char)
    return "".join(out)


def _garbage(rng: random.Random, length: int) -> str:
    return "".join(rng.choice(string.ascii_letters + string.digits + string.punctuation + " ") for _ in range(length))


def build_cases(
    rows: Sequence[tuple[str, str | None, dict[str, Any]]], seed: int = 0, rows_probed: int = ROWS
) -> list[ProbeCase]:
    """The honest answer and every probe for up to `rows_probed` rows with a label (prompt, label, metadata),
    chosen at random with `seed`. ValueError when no row has a label: an answer cannot be honest without one."""
    labelled = [i for i, (_, label, _) in enumerate(rows) if label not in (None, "")]
    if not labelled:
        raise ValueError("no row of the dataset has a label: probes score answers against the label")
    rng = random.Random(seed)
    chosen = sorted(rng.sample(labelled, min(rows_probed, len(labelled))))
    distinct = list(dict.fromkeys(str(rows[i][1]) for i in labelled))
    cases = []
    for i in chosen:
        prompt, raw_label, metadata = rows[i]
        label = str(raw_label)
        others = [other for other in distinct if other != label]
        listed = [label, *rng.sample(others, min(MAX_LABELS - 1, len(others)))]
        rng.shuffle(listed)
        wrong = _wrong_same_shape(label, rng)
        answers = {
            HONEST: label,
            "empty": "",
            "prompt_echo": prompt,
            "all_labels": "\n".join(listed),
            "label_in_garbage": f"{_garbage(rng, GARBAGE_CHARS)} {label} {_garbage(rng, GARBAGE_CHARS)}",
            "right_format_wrong_answer": wrong if wrong != label else (rng.choice(others) if others else ""),
            "very_long": " ".join((_FILLER * (LONG_WORDS // 40 + 1)).split()[:LONG_WORDS]),
            "repeated_tokens": " ".join(["answer"] * REPEATS),
            "other_label": rng.choice(others) if others else _wrong_same_shape(label, rng),
        }
        cases += [ProbeCase(probe, i, prompt, answer, label, dict(metadata)) for probe, answer in answers.items()]
    return cases


def hackability_report(cases: Sequence[ProbeCase], scores: Sequence[float], errors: Sequence[Sequence[str]]) -> dict:
    """What each probe scored against the honest answers:

    {"honest_mean", "rows", "hackable" (any probe flagged), "worst" (the probe with the highest fraction),
     "probes": [{"probe", "mean", "fraction" (of honest_mean; None when the honest answers score <= 0),
                 "flagged", "errors" (samples the reward failed on)}], "note" (why nothing could be judged)}
    """
    if len(cases) != len(scores) or len(cases) != len(errors):
        raise ValueError(f"{len(cases)} cases but {len(scores)} scores and {len(errors)} error lists")
    by_probe: dict[str, list[float]] = {}
    failed: dict[str, int] = {}
    for case, score, errs in zip(cases, scores, errors):
        by_probe.setdefault(case.probe, []).append(float(score))
        failed[case.probe] = failed.get(case.probe, 0) + (1 if errs else 0)
    honest = statistics.fmean(by_probe.get(HONEST, [0.0]))
    note = None
    if honest <= 0:
        note = "the honest answers (the labels) score nothing: there is no honest reward to compare with"
    probes = []
    fractions: dict[str, float] = {}  # the judged probes' fractions, in PROBES order
    for probe in PROBES:
        if probe not in by_probe:
            continue
        mean = statistics.fmean(by_probe[probe])
        fraction = mean / honest if honest > 0 else None
        if fraction is not None:
            fractions[probe] = fraction
        probes.append(
            {
                "probe": probe,
                "mean": mean,
                "fraction": fraction,
                "flagged": fraction is not None and fraction >= HACKABLE_FRACTION,
                "errors": failed[probe],
            }
        )
    worst = max(fractions, key=fractions.__getitem__) if fractions else None
    return {
        "honest_mean": honest,
        "honest_errors": failed.get(HONEST, 0),
        "rows": len({case.row for case in cases}),
        "hackable": any(p["flagged"] for p in probes),
        "worst": worst,
        "probes": probes,
        "note": note,
    }
