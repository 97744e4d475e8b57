"""posttrain.projects.access applied to requests: the DRF permission class every viewset of project objects
carries, the queryset scoping of its reads, and the project a request lists or creates in.

A request names its project with `project` (an id or a name) in the body or the query; without one, a browser
session uses the project chosen in the page's switcher (`SESSION_KEY`), and a token client the one project it
may create in, if it has exactly one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db.models import Model, QuerySet
from rest_framework.generics import GenericAPIView
from rest_framework.permissions import SAFE_METHODS, BasePermission
from rest_framework.request import Request
from rest_framework.views import APIView

from posttrain.core.errors import InvalidInput, NotFound
from posttrain.projects import access
from posttrain.projects.access import Access, AnyUser
from posttrain.projects.models import Project
from posttrain.projects.selectors import project_list, project_named

SESSION_KEY = "posttrain_project"


def required_access(view: APIView, method: str) -> Access:
    """What the request does to the view's object: a read for a safe method; for every other a write, unless the
    view's `project_access` names its action as less (a clone only reads its source; a Try it creates a trial in
    the reward's project)."""
    if method in SAFE_METHODS:
        return Access.READ
    declared: Mapping[str, Access] = getattr(view, "project_access", {})
    return declared.get(getattr(view, "action", None) or "", Access.WRITE)


class ProjectAccess(BasePermission):
    """Object permission: the rule of posttrain.projects.access for what the request does to the object."""

    def has_object_permission(self, request: Request, view: APIView, obj: Any) -> bool:
        access.check(request.user, obj, required_access(view, request.method or "GET"))
        return True


def object_for(request: Request, queryset: QuerySet, needed: Access, field: str = "project", **lookup: Any) -> Any:
    """One object of `queryset` for a view that is not a viewset: a 404 where it does not exist or the user
    may not read it, a 403 where they may not do `needed` to it."""
    found = access.readable(queryset, request.user, field).filter(**lookup).first()
    if found is None:
        raise NotFound(f"no such {queryset.model._meta.verbose_name}")
    if needed is not Access.READ:
        access.check(request.user, found, needed)
    return found


def session_project(request: Request) -> Project | None:
    """The project the browser's switcher chose (None: all projects, or one the user no longer reads)."""
    session = getattr(request, "session", None)
    chosen = session.get(SESSION_KEY) if session is not None else None
    if chosen is None:
        return None
    return project_list(request.user).filter(pk=chosen).first()


def _named(request: Request, *, body: bool = True) -> Any:
    """The `project` the request names, in its body (a JSON object or a form) or its query; None without one."""
    data = request.data if body else None
    if isinstance(data, Mapping) and data.get("project") not in (None, ""):
        return data.get("project")
    value = request.query_params.get("project")
    return value if value not in (None, "") else None


def listed_project(request: Request) -> Project | None:
    """The project a list is filtered to: `?project=`, else the switcher's; None lists every project read."""
    named = _named(request, body=False)
    if named is not None:
        return project_named(named, request.user)
    return session_project(request)


def target_project(request: Request) -> Project:
    """The project a request creates in, checked: the user must be a member, maintainer or owner there."""
    named = _named(request)
    if named is not None:
        return access.require_create(request.user, project_named(named, request.user))
    chosen = session_project(request)
    if chosen is not None:
        return access.require_create(request.user, chosen)
    creatable = [p for p in project_list(request.user) if access.allows(request.user, Access.CREATE, p.pk)]
    if len(creatable) == 1:
        return creatable[0]
    if not creatable:
        raise InvalidInput.one("project", "you are in no project you can create in: ask a project's owner to add you")
    names = ", ".join(p.name for p in creatable[:20])
    raise InvalidInput.one("project", f"name the project to create in (you can create in: {names})")


class ProjectScopedMixin(GenericAPIView):
    """For viewsets of project objects: reads see only rows of projects the user reads, a list only the chosen
    project's; every object it hands out passes ProjectAccess. Subclasses give `base_queryset()`, and
    `project_field` where the row's project is not its own `project`."""

    project_field = "project"

    def base_queryset(self) -> QuerySet:
        raise NotImplementedError

    def get_queryset(self) -> QuerySet:
        queryset = access.readable(self.base_queryset(), self.request.user, self.project_field)
        if getattr(self, "action", None) == "list":
            chosen = listed_project(self.request)
            if chosen is not None:
                queryset = queryset.filter(**{self.project_field: chosen})
        return queryset


def copy_target(request: Request, source: Model) -> Project:
    """Where a copy of `source` goes: the named project, else the source's own (checked for creating)."""
    if _named(request) is not None:
        return target_project(request)
    project: Project = source.project  # type: ignore[attr-defined]
    return access.require_create(request.user, project)


def require_same_project(loc: str, obj: Any, project: Project) -> None:
    """Objects refer only to objects of their own project: another project's is copied in first."""
    if obj.project_id != project.pk:
        kind = obj._meta.verbose_name
        raise InvalidInput.one(
            loc, f"{kind} {getattr(obj, 'name', obj.pk)!r} is in another project: copy it into {project.name!r} first"
        )


def user_may(user: AnyUser, needed: Access, obj: Any) -> bool:
    """For serializers and pages that show what a user may do (buttons), never for enforcing it."""
    return access.allows(user, needed, obj.project_id, getattr(obj, "created_by_id", None))
