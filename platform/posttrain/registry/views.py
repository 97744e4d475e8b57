"""Server-rendered pages of the registry (models, datasets, rewards); the data comes from the REST API."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from posttrain.accounts.decorators import researcher_required


@researcher_required
def registry_page(request: HttpRequest) -> HttpResponse:
    return render(request, "registry/index.html")
