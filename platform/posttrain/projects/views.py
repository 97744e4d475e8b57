"""The projects page: the user's projects, their members and roles (the page's JS reads /api/projects/)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from posttrain.accounts.decorators import researcher_required
from posttrain.projects.access import is_admin
from posttrain.projects.models import ProjectRole


@researcher_required
def projects_page(request: HttpRequest) -> HttpResponse:
    page_data = {"username": request.user.get_username(), "admin": is_admin(request.user), "roles": ProjectRole.values}
    return render(request, "projects/index.html", {"page_data": page_data})
