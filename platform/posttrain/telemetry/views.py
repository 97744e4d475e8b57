"""The run's page: a run and what it reported (its log lines up to the live stream's start, its summary), with its
resource needs. A template plus one ES module in frontend/static/js/ that reads the REST API and the live stream;
the view only resolves the run and embeds initial data."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from posttrain.accounts.decorators import researcher_required
from posttrain.projects.access import readable
from posttrain.runs import selectors
from posttrain.runs.resources import describe, total_of
from posttrain.telemetry import selectors as telemetry_selectors
from rl_engine.spec.catalogues import catalogue_json


@researcher_required
def run_page(request: HttpRequest, run_id) -> HttpResponse:
    runs = readable(selectors.run_list(), request.user)
    run = get_object_or_404(runs.select_related("experiment__model", "experiment__dataset"), pk=run_id)
    # The live stream resumes after this seq: everything up to it is in the page (logs) or in what the
    # page reads next (series, samples), read after this point, so nothing falls between the two.
    stream_from_seq = run.last_seq
    config = run.resolved_config or {}
    page_data = {
        "id": str(run.pk),
        "name": run.name or str(run.pk),
        "state": run.state,
        "state_reason": run.state_reason,
        "last_step": run.last_step,
        "stream_from_seq": stream_from_seq,
        "total_steps": run.planned_steps,
        "reward_names": [r.get("name") for r in config.get("rewards") or [] if isinstance(r, dict)],
        "summary": run.summary,
        "config": config,
        "logs": telemetry_selectors.run_log_entries(run, upto_seq=stream_from_seq),
    }
    return render(
        request,
        "runs/detail.html",
        {
            "run": run,
            "config": config,
            "page_data": page_data,
            "metric_catalogue": catalogue_json(),
            "algorithm": (config.get("algorithm") or {}).get("name") if not run.is_external else None,
            "resources_text": "" if run.is_external else describe(total_of(run)),
            "probes": [] if run.is_external else selectors.experiment_probe_summaries(run.experiment),
        },
    )
