"""Researchers' code and what reaches out of the host, contained: the sandbox (`sandbox.require`, its
status and kernel limits), the outbound policy for HTTP, and what the platform's workers run inside that
containment: reward components (a "Try it", a judge), dataset rows, reward probes, installed
environments (dataset generation and one episode), and GGUF models converted into model folders."""

from rl_engine import sandbox
from rl_engine.data import DataError, read_rows
from rl_engine.environments.installed import (
    GenerationError,
    generate_dataset,
    generate_games,
    generate_tasks,
    play_episode,
)
from rl_engine.host_dtype import training_dtype
from rl_engine.models.gguf import PREAMBLE_BYTES as GGUF_PREAMBLE_BYTES
from rl_engine.models.gguf import GGUFError, check_preamble
from rl_engine.models.sandboxed import ConvertOptions, convert_gguf
from rl_engine.outbound import ALLOW_ENV, DENY_ENV, OutboundFailed, OutboundPolicy, OutboundRefused, post
from rl_engine.reward_probes import build_cases, hackability_report
from rl_engine.rewards import CompositeReward, RewardBatch, build_component, check_reward_file
from rl_engine.rewards.packages import ADAPTERS
from rl_engine.sandbox import ALLOW_UNSANDBOXED_ENV, SandboxUnavailable

# The engine's example environments and agents, and the installed packages' adapters: public code any
# researcher may name in a config (read-only).
BUILTIN_ENVIRONMENTS = ADAPTERS.parent

__all__ = [
    "ALLOW_ENV",
    "ALLOW_UNSANDBOXED_ENV",
    "BUILTIN_ENVIRONMENTS",
    "DENY_ENV",
    "GGUF_PREAMBLE_BYTES",
    "CompositeReward",
    "ConvertOptions",
    "DataError",
    "GGUFError",
    "GenerationError",
    "OutboundFailed",
    "OutboundPolicy",
    "OutboundRefused",
    "RewardBatch",
    "SandboxUnavailable",
    "build_cases",
    "build_component",
    "check_preamble",
    "check_reward_file",
    "convert_gguf",
    "generate_dataset",
    "generate_games",
    "generate_tasks",
    "hackability_report",
    "play_episode",
    "post",
    "read_rows",
    "sandbox",
    "training_dtype",
]
