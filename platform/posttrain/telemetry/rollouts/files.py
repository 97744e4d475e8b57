"""The run's indexed rollout files (Postgres' RolloutFile rows), and which of them the store holds."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from posttrain.telemetry.models import RolloutFile
from posttrain.telemetry.rollouts.gaps import Gap
from posttrain.telemetry.rollouts.store import RunId, _query_path, existing_names, file_location


@dataclass(frozen=True)
class StoredFile:
    run_id: str
    step: int
    part: int
    name: str
    rows: int
    sha256: str = ""
    bytes: int = 0

    @property
    def location(self) -> str:
        return _query_path(file_location(self.run_id, self.name))


def run_files(run_ids: Sequence[RunId], steps: Sequence[int] | None = None) -> list[StoredFile]:
    """The indexed rollout files of the runs (in the order given), by step and part."""
    files = RolloutFile.objects.filter(run_id__in=list(run_ids))
    if steps is not None:
        files = files.filter(step__in=list(steps))
    by_run: dict[str, list[StoredFile]] = {}
    for run_id, step, part, name, rows, sha256, size in files.order_by("step", "part").values_list(
        "run_id", "step", "part", "name", "rows", "sha256", "bytes"
    ):
        by_run.setdefault(str(run_id), []).append(StoredFile(str(run_id), step, part, name, rows, sha256, size))
    return [f for run_id in dict.fromkeys(str(r) for r in run_ids) for f in by_run.get(run_id, [])]


def present_files(
    run_id: RunId,
    steps: Sequence[int] | None = None,
    step_range: tuple[int, int] | None = None,
    gaps: list[Gap] | None = None,
) -> list[StoredFile]:
    """The run's indexed files at `steps` (or within `step_range`) that the store holds, by step and part;
    each one it lacks is added to `gaps`."""
    files = run_files([run_id], steps)
    if step_range is not None:
        files = [f for f in files if step_range[0] <= f.step <= step_range[1]]
    present = existing_names(run_id)
    if gaps is not None:
        gaps += [
            Gap(f.step, f"its rollout file {f.name} is not in the store (never arrived, or removed)", f.name, f.run_id)
            for f in files
            if f.name not in present
        ]
    return [f for f in files if f.name in present]
