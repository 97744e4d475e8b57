"""Reads for comparing runs side by side: the runs named in a request, the prompts they all sampled
and what each run answered to one prompt. Metric curves come from posttrain.runs.series."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from django.db.models import Count, Max, QuerySet

from posttrain.core.errors import InvalidInput
from posttrain.runs.models import Run, Sample

MAX_PROMPTS = 50


def runs_in_order(raw: Iterable[str]) -> list[Run]:
    """The runs of a `runs` parameter (ids comma-separated and/or repeated), in the order given,
    each once. Not an id or not a run: InvalidInput naming `runs`."""
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
    found = {run.pk: run for run in Run.objects.filter(pk__in=ids).select_related("experiment")}
    unknown = [str(run_id) for run_id in ids if run_id not in found]
    if unknown:
        raise InvalidInput.one("runs", f"no run with id {', '.join(unknown[:5])}")
    return [found[run_id] for run_id in ids]


@dataclass(frozen=True)
class SharedPrompt:
    prompt: str
    counts: dict[str, int]  # run id -> samples of this prompt


def shared_prompts(runs: list[Run], q: str | None = None, limit: int = MAX_PROMPTS) -> list[SharedPrompt]:
    """Prompts every run sampled (containing `q` when given), the most recently stored first."""
    samples = Sample.objects.filter(run__in=runs)
    if q:
        samples = samples.filter(prompt__icontains=q)
    prompts = list(
        samples.values("prompt")
        .annotate(runs=Count("run", distinct=True), latest=Max("id"))
        .filter(runs=len(runs))
        .order_by("-latest")
        .values_list("prompt", flat=True)[:limit]
    )
    counts: dict[str, dict[str, int]] = {prompt: {} for prompt in prompts}
    per_run = (
        Sample.objects.filter(run__in=runs, prompt__in=prompts)
        .order_by()
        .values("prompt", "run")
        .annotate(n=Count("id"))
        .values_list("prompt", "run", "n")
    )
    for prompt, run_id, n in per_run:
        counts[prompt][str(run_id)] = n
    order = [str(run.pk) for run in runs]
    return [SharedPrompt(prompt, {run_id: counts[prompt].get(run_id, 0) for run_id in order}) for prompt in prompts]


@dataclass(frozen=True)
class PromptSamples:
    run: Run
    step: int | None  # the step shown; None when the run never sampled the prompt
    samples: QuerySet[Sample]


def samples_of_prompt(runs: list[Run], prompt: str, step: int | None = None) -> list[PromptSamples]:
    """Each run's samples of `prompt` at `step`, or, without a step, at the latest step where that run
    has the prompt (runs seldom sample a prompt at the same steps)."""
    out = []
    for run in runs:
        of_prompt = Sample.objects.filter(run=run, prompt=prompt)
        shown = step if step is not None else of_prompt.aggregate(latest=Max("step"))["latest"]
        samples = of_prompt.filter(step=shown).order_by("index") if shown is not None else Sample.objects.none()
        out.append(PromptSamples(run, shown, samples))
    return out
