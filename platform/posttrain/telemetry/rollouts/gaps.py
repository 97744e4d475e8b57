"""Gaps: rollouts a page cannot show (a step whose file is missing or unreadable), and a run's file list
with its gaps."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from posttrain.telemetry.models import RolloutFile
from posttrain.telemetry.rollouts.store import existing_names


@dataclass(frozen=True)
class Gap:
    """Rollouts a page cannot show: a step whose file is missing or unreadable (`file` names it)."""

    step: int
    reason: str
    file: str | None = None
    run: str | None = None


def unique_gaps(gaps: Sequence[Gap]) -> list[Gap]:
    """Each gap once (two queries of one request meet the same unreadable file), by run and step."""
    seen = {(g.run, g.step, g.file, g.reason): g for g in gaps}
    return sorted(seen.values(), key=lambda g: (g.run or "", g.step, g.file or ""))


def gaps_payload(gaps: Sequence[Gap], *, with_run: bool = False) -> list[dict[str, Any]]:
    """Gaps as the APIs answer them: {step, reason, file} (and `run` where an answer spans runs)."""
    return [{"step": g.step, "reason": g.reason, "file": g.file, **({"run": g.run} if with_run else {})} for g in gaps]


@dataclass
class RolloutFiles:
    """A run's rollout files as the page lists them."""

    files: list[dict[str, Any]] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)


def run_rollout_files(run: Any) -> RolloutFiles:
    """The run's indexed files (with whether the store still holds each), and its gaps: a file the index
    names that the store lacks, and a step the engine trained without announcing its file (every
    earlier step than the latest announced one, for a native run that records every step's rollouts)."""
    present = existing_names(run.pk)
    out = RolloutFiles()
    indexed_steps: set[int] = set()
    rows = RolloutFile.objects.filter(run=run).order_by("step", "part")
    for values in rows.values("step", "part", "name", "rows", "bytes", "sha256", "stats"):
        item: dict[str, Any] = {**values, "available": values["name"] in present}
        out.files.append(item)
        indexed_steps.add(item["step"])
        if not item["available"]:
            out.gaps.append(
                Gap(
                    item["step"],
                    "its rollout file never arrived in the store (or was removed)",
                    file=item["name"],
                    run=str(run.pk),
                )
            )
    config: dict[str, Any] = run.resolved_config if isinstance(run.resolved_config, dict) else {}
    logging_cfg: dict[str, Any] = config["logging"] if isinstance(config.get("logging"), dict) else {}
    if not run.is_external and logging_cfg.get("samples", "all") == "all" and indexed_steps:
        keep = str(logging_cfg.get("rollouts_keep") or "all")
        expected = _expected_steps(keep, 1, max(indexed_steps))
        for step in sorted(expected - indexed_steps):
            out.gaps.append(
                Gap(step, "the engine trained this step but its rollout file was never announced", run=str(run.pk))
            )
    out.gaps.sort(key=lambda gap: gap.step)
    return out


def _expected_steps(keep: str, first: int, last: int) -> set[int]:
    mode, _, n = keep.partition(" ")
    if mode == "every" and n.isdigit():
        return {s for s in range(first, last + 1) if s % int(n) == 0}
    if mode == "last" and n.isdigit():
        return set(range(max(first, last - int(n) + 1), last + 1))
    return set(range(first, last + 1))
