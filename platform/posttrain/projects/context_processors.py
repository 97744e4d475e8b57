"""What every page's header needs of projects: the switcher's choices and the session's project."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from posttrain.accounts.roles import Role
from posttrain.accounts.selectors import user_roles
from posttrain.projects.access import role_in
from posttrain.projects.models import Project
from posttrain.projects.permissions import SESSION_KEY
from posttrain.projects.selectors import project_list


def project_switcher(request: HttpRequest) -> dict[str, Any]:
    """`project_switcher`: None where the user has no research pages; else the projects they read (with their role)
    and the one this session works in (None: every project)."""
    user = getattr(request, "user", None)
    if not user_roles(user) & {Role.RESEARCHER, Role.ADMIN}:
        return {"project_switcher": None}
    projects: list[Project] = list(project_list(user).only("id", "name"))
    chosen = request.session.get(SESSION_KEY)
    current = next((p for p in projects if p.pk == chosen), None)
    return {
        "project_switcher": {
            "projects": [{"id": p.pk, "name": p.name, "role": role_in(user, p.pk)} for p in projects],
            "current": current,
        }
    }
