"""Typed views of the REST API's objects. Each keeps the server's whole answer in `raw`, so a field
added on the server is readable before the SDK names it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T", bound="ApiObject")


@dataclass(frozen=True)
class ApiObject:
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_api(cls: type[T], data: dict[str, Any]) -> T:
        names = {f.name for f in dataclasses.fields(cls)} - {"raw"}
        return cls(raw=data, **{name: data.get(name) for name in names})


@dataclass(frozen=True)
class InProject(ApiObject):
    """An object that belongs to a project: its id and its name."""

    project: int
    project_name: str


@dataclass(frozen=True)
class Run(InProject):
    id: str
    name: str
    state: str
    state_reason: str
    kind: str | None  # "native" (our engine, a Ray job) or "external" (tracked from another engine)
    engine: str | None
    experiment: int
    experiment_name: str | None
    algorithm: str | None
    model_name: str | None
    dataset_name: str | None
    tags: list[str]
    last_step: int | None
    total_steps: int | None
    summary: dict[str, Any]
    created_at: str
    finished_at: str | None

    def metric(self, name: str) -> float | None:
        """The last value of a metric from the run's summary (None when never logged or not finite)."""
        entry = (self.summary or {}).get(name)
        return entry.get("last") if isinstance(entry, dict) else None


@dataclass(frozen=True)
class Experiment(InProject):
    id: int
    name: str
    description: str
    model: int | None
    dataset: int | None
    config: dict[str, Any]
    run_count: int


@dataclass(frozen=True)
class Dataset(InProject):
    id: int
    name: str
    format: str
    sha256: str
    row_count: int
    prompt_field: str
    label_field: str
    path: str


@dataclass(frozen=True)
class Reward(InProject):
    id: int
    name: str
    kind: str
    spec: dict[str, Any]


@dataclass(frozen=True)
class Model(InProject):
    id: int
    name: str
    path: str
    architecture: str
    parameter_count: int | None


@dataclass(frozen=True)
class Sample(ApiObject):
    step: int
    index: int
    group: int
    prompt: str
    response: str
    label: str | None
    reward: float | None
    components: dict[str, Any]
    advantage: float | None
    length: int
    finish_reason: str


@dataclass(frozen=True)
class Campaign(InProject):
    id: int
    name: str
    state: str


@dataclass(frozen=True)
class Project(ApiObject):
    id: int
    name: str
    description: str
    role: str | None  # yours: owner, maintainer, member, viewer (None: you read it as an admin)
    member_count: int
    created_by: str | None
    created_at: str


@dataclass(frozen=True)
class Member(ApiObject):
    username: str
    role: str
    added_at: str
