"""The filters between scoring and training (`rollout.filters`): which scored samples stay out of the
update, and what each filter dropped this step (`filter/<name>/dropped`, samples).

In order: `gibberish` (responses that are not text, or written as if drawing tokens blindly) and
`repetition` (responses caught in a loop), both off by default; then `zero_advantage` (prompt groups whose
samples all scored the same), on by default wherever dropping them changes no gradient. A filter counts only
the samples it dropped itself, so a group two filters flag counts once, for the first. A filter that is off
logs nothing, which tells "off" from "on, dropped nothing". Under a group estimator a flagged sample takes
its group with it (`rl_engine.algorithms.filters.drop_flagged`). docs/REWARD_HACKING.md, "Filters".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from rl_engine.algorithms.filters import drop_flagged, dynamic_sampling_keep
from rl_engine.config import RunConfig
from rl_engine.config.schema import GibberishFilterConfig, RepetitionFilterConfig
from rl_engine.response_stats import ngram_repetition_rate, nonprintable_share, normalized_surprisal

if TYPE_CHECKING:
    from rl_engine.rollout import Sample

__all__ = [
    "FilterOutcome",
    "apply_filters",
    "gibberish_flags",
    "note_dropped",
    "repetition_flags",
    "zero_advantage_enabled",
]


@dataclass(frozen=True)
class FilterOutcome:
    keep: torch.Tensor  # [N] bool: the rows that train
    metrics: dict[str, float]  # filter/<name>/dropped for each filter that is on
    reasons: list[str | None]  # [N] the first filter that dropped each row (the ledger's reason); None: kept


def zero_advantage_enabled(cfg: RunConfig) -> bool:
    """The zero-advantage filter's setting, its default resolved: on where the dropped rows would add no
    gradient at all, i.e. the estimator gives a tied group exactly zero advantage and no other loss term
    (a KL in the loss, an entropy bonus) reaches those rows. The loss's normaliser still changes (a
    token mean over fewer tokens), as with DAPO's dynamic sampling."""
    setting = cfg.rollout.filters.zero_advantage
    alg = cfg.algorithm
    if setting is not None:
        return setting
    kl_in_loss = alg.kl.coef > 0 and alg.kl.placement == "loss"
    return alg.estimator.zero_advantage_on_ties and not kl_in_loss and alg.entropy_coef == 0


def gibberish_flags(
    texts: Sequence[str], logprobs: Sequence[Sequence[float] | None], vocab_size: int, settings: GibberishFilterConfig
) -> list[bool]:
    """Per response: at least `max_nonprintable_share` of its characters are not text, or (with the rollout
    engine's log-probs) its normalized surprisal is at least `max_normalized_surprisal`."""
    flags = []
    for text, lps in zip(texts, logprobs, strict=True):
        surprisal = normalized_surprisal(lps, vocab_size) if lps else None
        flags.append(
            nonprintable_share(text) >= settings.max_nonprintable_share
            or (surprisal is not None and surprisal >= settings.max_normalized_surprisal)
        )
    return flags


def repetition_flags(token_ids: Sequence[Sequence[int]], settings: RepetitionFilterConfig) -> list[bool]:
    """Per response: at least `max_repetition_rate` of its token n-grams repeat an earlier one."""
    return [ngram_repetition_rate(ids, settings.ngram) >= settings.max_repetition_rate for ids in token_ids]


def apply_filters(
    cfg: RunConfig,
    texts: Sequence[str],
    samples: Sequence[Sample],
    scores: torch.Tensor,
    keep: torch.Tensor,
    vocab_size: int,
    reasons: list[str | None] | None = None,
) -> FilterOutcome:
    """The configured filters over the step's scored samples (`scores`: what the advantages see), after
    whatever `keep` already dropped (dynamic sampling, with its `reasons`)."""
    reasons = list(reasons) if reasons is not None else [None] * len(keep)
    settings = cfg.rollout.filters
    group = cfg.rollout.samples_per_prompt if cfg.algorithm.is_group_estimator else None
    metrics: dict[str, float] = {}
    flagged: list[tuple[str, list[bool]]] = []
    if settings.gibberish.enabled:
        flagged.append(
            ("gibberish", gibberish_flags(texts, [s.logprobs for s in samples], vocab_size, settings.gibberish))
        )
    if settings.repetition.enabled:
        flagged.append(("repetition", repetition_flags([s.response_ids for s in samples], settings.repetition)))
    for name, flags in flagged:
        kept = drop_flagged(keep, torch.tensor(flags, dtype=torch.bool), group)
        metrics[f"filter/{name}/dropped"] = float(note_dropped(keep, kept, name, reasons))
        keep = kept
    if zero_advantage_enabled(cfg):
        size = cfg.rollout.samples_per_prompt
        kept = keep & dynamic_sampling_keep(scores, size).repeat_interleave(size)
        metrics["filter/zero_advantage/dropped"] = float(note_dropped(keep, kept, "zero_advantage", reasons))
        keep = kept
    return FilterOutcome(keep, metrics, reasons)


def note_dropped(before: torch.Tensor, after: torch.Tensor, reason: str, reasons: list[str | None]) -> int:
    """Marks the rows `reason` dropped (kept `before`, not `after`); returns how many."""
    dropped = (before & ~after).nonzero().squeeze(-1).tolist()
    for row in dropped:
        reasons[row] = reason
    return len(dropped)
