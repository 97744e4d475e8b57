"""Reads for comparing runs side by side: the runs named in a request, the prompts they all sampled
and what each run answered to one prompt. Metric curves come from posttrain.telemetry.series."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from django.db.models import QuerySet

from posttrain.core.errors import InvalidInput
from posttrain.runs.models import Run
from posttrain.telemetry import rollout_index, rollouts

MAX_PROMPTS = 50


def runs_in_order(raw: Iterable[str], among: QuerySet[Run]) -> list[Run]:
    """The runs of a `runs` parameter (ids comma-separated and/or repeated), in the order given,
    each once, of the runs `among` (those the user reads). Not an id or not such a run: InvalidInput naming `runs`
    (a run the user may not read is answered as one that does not exist)."""
    ids: list[uuid.UUID] = []
    for item in raw:
        for text in item.split(","):
            text = text.strip()
            if not text:
                continue
            try:
                run_id = uuid.UUID(text)
            except ValueError:
                raise InvalidInput.one("runs", f"{text[:50]!r} is not a run id") from None
            if run_id not in ids:
                ids.append(run_id)
    if not ids:
        raise InvalidInput.one("runs", "required: one or more run ids, comma-separated")
    found = {run.pk: run for run in among.filter(pk__in=ids).select_related("experiment")}
    unknown = [str(run_id) for run_id in ids if run_id not in found]
    if unknown:
        raise InvalidInput.one("runs", f"no run with id {', '.join(unknown[:5])}")
    return [found[run_id] for run_id in ids]


@dataclass(frozen=True)
class SharedPrompt:
    prompt: str  # cut at rollouts.TEXT_CHARS, as every answer cuts texts
    counts: dict[str, int]  # run id -> samples of this prompt
    chars: int  # the prompt's full length

    @property
    def truncated(self) -> dict[str, int]:
        return {"prompt": self.chars} if self.chars > len(self.prompt) else {}


@dataclass
class SharedPrompts:
    prompts: list[SharedPrompt]
    gaps: list[rollouts.Gap]  # the files the query could not read


def shared_prompts(runs: list[Run], q: str | None = None, limit: int = MAX_PROMPTS) -> SharedPrompts:
    """Prompts every run sampled (containing `q`, any case, when given), the latest sampled first: one
    DuckDB pass over the prompt column of the runs' rollout files (with `q`, of the files its search index
    cannot rule out); the files it cannot read are left out, each a gap."""
    files = []
    for run in runs:
        present = rollouts.existing_names(run.pk)
        files += [f for f in rollouts.run_files([run.pk]) if f.name in present]
    if q:  # the files whose search index can hold the words (prompts are indexed with the responses)
        files = rollout_index.candidate_files(rollouts.connection(), files, q, None)
    run_of = {f.location: f.run_id for f in files}
    where, params = "TRUE", []
    if q:
        where, params = "contains(lower(prompt), lower(?))", [q]
    sql = (
        f"SELECT md5(prompt) AS key, substring(prompt, 1, {rollouts.TEXT_CHARS}) AS prompt, length(prompt) AS chars, "
        'filename, count(*) AS n, max(step::BIGINT * 4294967296 + "index") AS latest '
        "FROM read_parquet(?, filename = true) "
        f"WHERE {where} GROUP BY prompt, filename"
    )

    def query(part: list[rollouts.StoredFile]) -> Iterator[dict[str, Any]]:
        return rollouts.stream(sql, [[f.location for f in part], *params])

    gaps: list[rollouts.Gap] = []
    shown: dict[str, tuple[str, int]] = {}  # key -> (the prompt cut, its length)
    per_prompt: dict[str, dict[str, int]] = {}
    latest: dict[str, int] = {}
    for row in rollouts.readable_stream(files, query, ["prompt", "step", "index"], gaps):
        key = row["key"]
        shown[key] = (row["prompt"], row["chars"])
        counts = per_prompt.setdefault(key, {})
        run_id = run_of[row["filename"]]
        counts[run_id] = counts.get(run_id, 0) + row["n"]
        latest[key] = max(latest.get(key, -1), row["latest"])
    order = [str(run.pk) for run in runs]
    shared = [key for key, counts in per_prompt.items() if all(run_id in counts for run_id in order)]
    shared.sort(key=lambda key: (-latest[key], shown[key][0]))
    prompts = [
        SharedPrompt(shown[key][0], {run_id: per_prompt[key][run_id] for run_id in order}, shown[key][1])
        for key in shared[:limit]
    ]
    return SharedPrompts(prompts, rollouts.unique_gaps(gaps))


@dataclass(frozen=True)
class PromptSamples:
    run: Run
    step: int | None  # the step shown; None when the run never sampled the prompt
    samples: list[dict[str, Any]]


def samples_of_prompt(
    runs: list[Run], prompt: str, step: int | None = None, gaps: list[rollouts.Gap] | None = None
) -> list[PromptSamples]:
    """Each run's samples of `prompt` at `step`, or, without a step, at the latest step where that run
    has the prompt (runs seldom sample a prompt at the same steps). The files it cannot read are left
    out, each added to `gaps`."""
    out = []
    for run in runs:
        shown = step
        if shown is None:
            steps = rollouts.rollouts_query(
                [run.pk], filters=rollouts.RolloutFilter(prompt=prompt), columns=("step",), gaps=gaps
            )
            shown = max((row["step"] for row in steps), default=None)
        samples = []
        if shown is not None:
            filters = rollouts.RolloutFilter(steps=[shown], prompt=prompt)
            samples = list(rollouts.rollouts_query([run.pk], filters=filters, gaps=gaps))
        out.append(PromptSamples(run, shown, samples))
    return out
