"""Conditions on a run's rollouts (RolloutFilter), as a DuckDB WHERE clause."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_KEY_STEP = 1 << 32  # (step, index) as one number: step * _KEY_STEP + index


@dataclass
class RolloutFilter:
    """Conditions on a run's rollouts; every one optional."""

    steps: Sequence[int] | None = None
    step_range: tuple[int, int] | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    min_advantage: float | None = None
    max_advantage: float | None = None
    min_length: int | None = None  # response tokens
    max_length: int | None = None
    finish_reason: str | None = None
    q: str | None = None  # a case-insensitive substring of the prompt, the response or the label
    prompt: str | None = None  # the exact prompt
    group: int | None = None
    kept: bool | None = None
    index: int | None = None
    keys: Sequence[tuple[int, int]] | None = None  # exactly these (step, index)

    def where(self) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        params: list[Any] = []
        if self.step_range is not None:
            clauses.append("step BETWEEN ? AND ?")
            params += list(self.step_range)
        self._add_bounds(clauses, params)
        self._add_equalities(clauses, params)
        if self.keys is not None:
            clauses.append(f'list_contains(?, step::BIGINT * {_KEY_STEP} + "index")')
            params.append(sorted({int(step) * _KEY_STEP + int(index) for step, index in self.keys}))
        if self.q:
            # The search index (rollout_index) lower-cases with the same DuckDB `lower`.
            clauses.append(
                "(contains(lower(response), lower(?)) OR contains(lower(prompt), lower(?))"
                " OR contains(lower(coalesce(label, '')), lower(?)))"
            )
            params += [self.q] * 3
        return (" AND ".join(clauses) or "TRUE"), params

    def _add_bounds(self, clauses: list[str], params: list[Any]) -> None:
        """The minimum and maximum reward, advantage and length, each where set."""
        for column, low, high in (
            ("reward", self.min_reward, self.max_reward),
            ("advantage", self.min_advantage, self.max_advantage),
            ("length", self.min_length, self.max_length),
        ):
            if low is not None:
                clauses.append(f"{_quoted(column)} >= ?")
                params.append(low)
            if high is not None:
                clauses.append(f"{_quoted(column)} <= ?")
                params.append(high)

    def _add_equalities(self, clauses: list[str], params: list[Any]) -> None:
        """The columns that must equal a value: the finish reason (where not empty), then the prompt,
        the group, kept and the index (where set)."""
        if self.finish_reason:
            clauses.append("finish_reason = ?")
            params.append(self.finish_reason)
        for clause, value in (
            ("prompt = ?", self.prompt),
            ('"group" = ?', self.group),
            ("kept = ?", self.kept),
            ('"index" = ?', self.index),
        ):
            if value is not None:
                clauses.append(clause)
                params.append(value)

    @property
    def only_steps(self) -> bool:
        """Nothing but steps: a count comes from the index, without reading a file."""
        return not any(
            v is not None and v != ""
            for v in (
                self.step_range,
                self.min_reward,
                self.max_reward,
                self.min_advantage,
                self.max_advantage,
                self.min_length,
                self.max_length,
                self.finish_reason,
                self.q,
                self.prompt,
                self.group,
                self.kept,
                self.index,
                self.keys,
            )
        )


def _quoted(column: str) -> str:
    return '"' + column.replace('"', '""') + '"'
