"""The runs section: launching, the queue, a run's metrics, samples, files and logs, and its live stream."""

from __future__ import annotations

import builtins
import string
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx

from posttrain_sdk.client.responses import _download, _error_for
from posttrain_sdk.client.sections import ProjectRef, _Section
from posttrain_sdk.errors import FieldError, NotFound, PosttrainError
from posttrain_sdk.sse import Message, read_stream
from posttrain_sdk.types import Run, Sample

AMBIGUOUS_SHOWN = 10  # runs an ambiguous id prefix names
RECONNECT_DELAY_S = 1.0  # what EventSource waits (the stream's `retry:`)


class Runs(_Section):
    # In this class body `list` is the method below: annotations after it name the builtin `builtins.list`.
    def list(
        self,
        *,
        state: str | list[str] | None = None,
        experiment: int | None = None,
        tag: str | None = None,
        kind: str | None = None,
        search: str | None = None,
        limit: int | None = 50,
    ) -> list[Run]:
        params: dict[str, Any] = {"experiment": experiment, "tag": tag, "kind": kind, "search": search}
        if state:
            params["state"] = [state] if isinstance(state, str) else list(state)
        return [Run.from_api(item) for item in self.client.pages("/api/runs/", limit=limit, **params)]

    def get(self, run_id: str) -> Run:
        return Run.from_api(self.client.get(f"/api/runs/{run_id}/"))

    def resolve_id(self, id_or_prefix: str) -> str:
        """The whole id of the one run whose id starts with `id_or_prefix` (a short id as tables show it, taken as
        git and docker take one; dashes optional); a whole id comes back as it is. The server finds the matches
        (`?id_prefix=`). No run: NotFound; several: PosttrainError naming them."""
        text = id_or_prefix.strip()
        digits = text.replace("-", "")
        if len(digits) == 32:
            return text
        if not digits or any(c not in string.hexdigits for c in digits):
            raise PosttrainError(f"run: {id_or_prefix!r} is not a run id nor the start of one (hex digits)")
        page = self.client.get("/api/runs/", id_prefix=text, limit=AMBIGUOUS_SHOWN + 1, ordering="-created_at")
        matches = [r for r in page["results"] if r["id"].replace("-", "").startswith(digits.lower())]
        if not matches:
            raise NotFound(404, [FieldError("run", f"no run id starts with {text!r}")])
        if len(matches) > 1:
            shown = ", ".join(f"{r['id']} ({r['name']}, {r['state']})" for r in matches[:AMBIGUOUS_SHOWN])
            more = page.get("count", len(matches)) - min(len(matches), AMBIGUOUS_SHOWN)
            raise PosttrainError(
                f"run: {text!r} is the start of {page.get('count', len(matches))} run ids; give more of the one "
                f"you mean: {shown}" + (f" and {more} more" if more > 0 else "")
            )
        return matches[0]["id"]

    def launch(
        self,
        experiment: int,
        *,
        seed: int | None = None,
        tags: builtins.list[str] | None = None,
        note: str = "",
        priority: str | None = None,
    ) -> Run:
        """A new run; `priority` low, normal (the default), high, or urgent (admins)."""
        body: dict[str, Any] = {
            "seed": seed,
            "tags": tags or [],
            "note": note,
            **({"priority": priority} if priority else {}),
        }
        return Run.from_api(self.client.post(f"/api/experiments/{int(experiment)}/launch/", body))

    def set_priority(self, run_id: str, priority: str) -> Run:
        return Run.from_api(self.client.post(f"/api/runs/{run_id}/priority/", {"priority": priority}))

    def queue(self) -> dict[str, Any]:
        """The scheduler's queue: `waiting` runs in order, `running` runs with grants, the `cluster`."""
        return self.client.get("/api/queue/")

    def cancel(self, run_id: str) -> Run:
        return Run.from_api(self.client.post(f"/api/runs/{run_id}/cancel/", {}))

    def clone(
        self,
        run_id: str,
        *,
        seed: int | None = None,
        tags: builtins.list[str] | None = None,
        note: str = "",
        project: ProjectRef | None = None,
    ) -> Run:
        """A new run with the run's config; into `project` (its experiment and assets copied there) when named,
        else beside the source (the client's project is not used: a clone stays put unless told)."""
        body: dict[str, Any] = {"seed": seed, "tags": tags, "note": note}
        if project is not None:
            body["project"] = str(project)
        return Run.from_api(self.client.post(f"/api/runs/{run_id}/clone/", body))

    def resume(self, run_id: str, checkpoint: int | None = None) -> Run:
        """A new run continuing this one from a checkpoint (default: its latest one still on disk)."""
        if checkpoint is None:
            available = [c for c in self.checkpoints(run_id) if c.get("available")]
            if not available:
                raise PosttrainError(f"checkpoint: run {run_id} has no checkpoint left to resume from")
            checkpoint = available[-1]["id"]
        return Run.from_api(self.client.post(f"/api/runs/{run_id}/resume/", {"checkpoint": checkpoint}))

    def checkpoints(self, run_id: str) -> builtins.list[dict[str, Any]]:
        return self.client.get(f"/api/runs/{run_id}/checkpoints/")

    def transitions(self, run_id: str) -> builtins.list[dict[str, Any]]:
        return self.client.get(f"/api/runs/{run_id}/transitions/")

    def metrics(
        self,
        run_id: str,
        names: builtins.list[str] | None = None,
        *,
        step_min: int | None = None,
        step_max: int | None = None,
    ) -> dict[str, dict[str, builtins.list]]:
        """Every stored point: {name: {"steps": [...], "values": [...]}} (non-finite values as None)."""
        answer = self.client.get(
            f"/api/runs/{run_id}/metrics/",
            names=",".join(names) if names else None,
            step_min=step_min,
            step_max=step_max,
        )
        return answer["series"]

    def series(
        self, run_id: str, names: builtins.list[str] | None = None, *, x: str = "step", max_points: int | None = None
    ) -> dict[str, Any]:
        """Chart series, downsampled on the server (M4) past `max_points`."""
        return self.client.get(
            f"/api/runs/{run_id}/series/", names=",".join(names) if names else None, x=x, max_points=max_points
        )

    def samples(
        self,
        run_id: str,
        *,
        step: int | None = None,
        min_reward: float | None = None,
        max_reward: float | None = None,
        min_advantage: float | None = None,
        max_advantage: float | None = None,
        min_length: int | None = None,
        max_length: int | None = None,
        q: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[Sample]:
        items = self.client.pages(
            f"/api/runs/{run_id}/samples/",
            limit=limit,
            scoped=False,
            step=step,
            min_reward=min_reward,
            max_reward=max_reward,
            min_advantage=min_advantage,
            max_advantage=max_advantage,
            min_length=min_length,
            max_length=max_length,
            q=q,
        )
        return [Sample.from_api(item) for item in items]

    def rollouts(
        self, run_id: str, directory: str | Path, *, steps: Iterable[int] | None = None
    ) -> builtins.list[Path]:
        """The run's rollout files (Parquet, one per step; `steps` narrows them) into `directory`, as
        stored: `datasets.load_dataset("parquet", data_files=...)`, pandas or DuckDB read them as they are."""
        wanted = None if steps is None else set(steps)
        listing = self.client.get(f"/api/runs/{run_id}/rollouts/")
        target = Path(directory)
        target.mkdir(parents=True, exist_ok=True)
        written = []
        for item in listing["files"]:
            if not item["available"] or (wanted is not None and item["step"] not in wanted):
                continue
            written.append(
                _download(self.client, f"/api/runs/{run_id}/rollouts/{item['name']}", {}, target / item["name"])
            )
        return written

    def ledger(self, run_id: str) -> dict[str, Any]:
        """The run's prompt ledger summed per epoch (trained; filtered and dropped by reason; in flight; not
        drawn; skipped and duplicates, both 0 when nothing was lost) and its resumes."""
        return self.client.get(f"/api/runs/{run_id}/ledger/")

    def ledger_file(self, run_id: str, path: str | Path) -> Path:
        """The whole ledger (Parquet, a row per (epoch, row) with its fate, step, samples and policy versions)."""
        return _download(self.client, f"/api/runs/{run_id}/ledger/file", {}, Path(path))

    def logs(self, run_id: str, *, tail: int | None = None) -> str:
        return self.client.get(f"/api/runs/{run_id}/logs/", tail=tail)["logs"]

    def export(self, run_id: str, path: str | Path, *, format: str = "csv") -> Path:
        """Every raw metric point to a CSV or JSONL file."""
        return _download(self.client, f"/api/runs/{run_id}/export/", {"format": format}, Path(path))

    def follow(self, run_id: str, *, after_seq: int = 0) -> Iterator[Message]:
        """The run's live stream: `state`, `metrics`, `samples`, `log`, `checkpoint` messages, ending
        after `end` (the run finished and everything was sent). Reconnects from the last seq seen."""
        last = after_seq
        while True:
            headers = {"Accept": "text/event-stream", "Last-Event-ID": str(last)}
            try:
                with self.client._http.stream(
                    "GET", f"/api/runs/{run_id}/stream/", headers=headers, timeout=httpx.Timeout(30.0, read=None)
                ) as response:
                    if response.status_code >= 400:
                        response.read()
                        raise _error_for(response)
                    for message in read_stream(response.iter_lines()):
                        if message.id is not None:
                            last = message.id
                        yield message
                        if message.event == "end":
                            return
            except httpx.TransportError:
                pass  # the server restarted or the stream timed out: reconnect from `last`
            _pause_before_reconnect()

    def track(self, experiment: str, name: str | None = None, **kwargs: Any) -> Any:
        """An external run in `experiment` (see posttrain_sdk.tracking.init) on this client's server, token and
        project (`project=` names another)."""
        from posttrain_sdk.tracking import init

        kwargs.setdefault("project", self.client.project if self.client.project is not None else "")
        return init(experiment, name, url=self.client.url, token=self.client.token, **kwargs)


def _pause_before_reconnect() -> None:
    time.sleep(RECONNECT_DELAY_S)
