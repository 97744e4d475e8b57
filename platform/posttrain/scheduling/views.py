"""The queue page (/queue/): a template and its ES module, which reads the scheduling API."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from posttrain.accounts.decorators import researcher_required


@researcher_required
def queue_page(request: HttpRequest) -> HttpResponse:
    return render(request, "scheduling/queue.html")
