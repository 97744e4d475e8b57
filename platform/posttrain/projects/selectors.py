"""Reads of projects: the projects a user reads, one by id or name, its members."""

from __future__ import annotations

import re

from django.db.models import Count, QuerySet

from posttrain.core.errors import NotFound
from posttrain.projects.access import AnyUser, readable
from posttrain.projects.models import PROJECT_NAME_PATTERN, Membership, Project


def project_list(user: AnyUser) -> QuerySet[Project]:
    """Every project the user reads (an admin: all), with its member count."""
    # Ordered here: Django leaves a model's Meta.ordering out of a query that groups (the count).
    return readable(Project.objects.annotate(member_count=Count("memberships")), user, field="pk").order_by("name")


def project_named(value: object, user: AnyUser, loc: str = "project") -> Project:
    """A project the user reads, by id or by name; one they do not read is answered as one that does not exist."""
    text = str(value).strip() if value is not None else ""
    projects = project_list(user)
    found = None
    # Only what could be a name or an id reaches the query (a NUL or a 30-digit number is no project).
    if re.fullmatch(PROJECT_NAME_PATTERN, text):
        found = projects.filter(name=text).first()
    elif text.isascii() and text.isdigit() and len(text) <= 18:
        found = projects.filter(pk=int(text)).first()
    if found is None:
        raise NotFound(f"no project named {text[:100]!r}", loc=loc)
    return found


def project_members(project: Project) -> QuerySet[Membership]:
    return Membership.objects.filter(project=project).select_related("user").order_by("user__username")
