"""Server-rendered pages of runs (a run's own page, which shows what it reported, is posttrain.telemetry.views). Each page is a template plus one ES module in frontend/static/js/
that reads the REST API and the live stream; the views only resolve objects and embed initial data."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from posttrain.accounts.decorators import researcher_required
from rl_engine.spec.catalogues import catalogue_json


@researcher_required
def runs_page(request: HttpRequest) -> HttpResponse:
    return render(request, "runs/list.html")


@researcher_required
def compare_page(request: HttpRequest) -> HttpResponse:
    return render(request, "runs/compare.html", {"metric_catalogue": catalogue_json()})


@researcher_required
def launch_page(request: HttpRequest) -> HttpResponse:
    return render(request, "runs/launch.html")
