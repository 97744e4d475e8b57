"""The metric catalogue (every metric's name, unit and panel; `require` fails at import on a renamed
one) and the response statistics the engine logs and the platform's hacking signals recompute."""

from rl_engine.metric_catalogue import RESERVED_REWARD_NAMES, catalogue_json, require
from rl_engine.response_stats import (
    compression_ratio,
    ngram_repetition_rate,
    nonprintable_share,
    normalized_answer,
    top_answer,
)

__all__ = [
    "RESERVED_REWARD_NAMES",
    "catalogue_json",
    "compression_ratio",
    "ngram_repetition_rate",
    "nonprintable_share",
    "normalized_answer",
    "require",
    "top_answer",
]
