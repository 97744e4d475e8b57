"""Who may do what to which object: the one rule every read and write of the platform goes through.

    read     see it                                   any role in its project
    create   make new objects in a project            owner, maintainer, member
    write    change or delete it                      owner, maintainer; a member what they created
    manage   a project's members and settings         owner, maintainer

Admins (the site role) may do everything everywhere. A user with no role in the object's project is told it
does not exist (404), as if it did not, so ids of other projects' objects reveal nothing; a user who may read
it but not do what they asked is told why (403). Copying into another project (clone a run into it, register a
checkpoint there, copy a dataset, model or reward) reads the source and creates in the target.

Views apply it through posttrain.projects.permissions (the DRF permission class and the queryset scoping);
services that create objects take a project their caller checked with `require_create`."""

from __future__ import annotations

import enum
from typing import Any, Protocol

from django.contrib.auth.models import AnonymousUser, User
from django.db.models import Model, QuerySet

from posttrain.accounts.roles import Role
from posttrain.accounts.selectors import user_roles
from posttrain.core.errors import NotFound, PermissionDenied
from posttrain.projects.models import Membership, Project, ProjectRole

AnyUser = User | AnonymousUser | None

# Cached on the user object for the request (a list view checks every row's project).
_CACHE_ATTR = "_posttrain_project_roles"

WRITERS = frozenset({ProjectRole.OWNER, ProjectRole.MAINTAINER})
CREATORS = frozenset({ProjectRole.OWNER, ProjectRole.MAINTAINER, ProjectRole.MEMBER})


class Access(enum.Enum):
    READ = "read"
    CREATE = "create"
    WRITE = "write"
    MANAGE = "manage"


class Owned(Protocol):
    """An object that belongs to a project (every model with a `project` foreign key and a `created_by`)."""

    project_id: int
    created_by_id: int | None


def is_admin(user: AnyUser) -> bool:
    return Role.ADMIN in user_roles(user)


def project_roles(user: AnyUser) -> dict[int, str]:
    """{project id: the user's role there} for every project the user belongs to."""
    if user is None or not user.is_authenticated or not user.is_active:
        return {}
    cached = getattr(user, _CACHE_ATTR, None)
    if cached is None:
        cached = dict(Membership.objects.filter(user_id=user.pk).values_list("project_id", "role"))
        setattr(user, _CACHE_ATTR, cached)
    return cached


def forget_cached_project_roles(user: Any) -> None:
    if hasattr(user, _CACHE_ATTR):
        delattr(user, _CACHE_ATTR)


def role_in(user: AnyUser, project_id: int | None) -> str | None:
    return project_roles(user).get(project_id) if project_id is not None else None


def allows(user: AnyUser, access: Access, project_id: int | None, created_by_id: int | None = None) -> bool:
    """The rule (see the module's docstring)."""
    if user is None or not user.is_authenticated:
        return False
    if is_admin(user):
        return True
    role = role_in(user, project_id)
    if role is None:
        return False
    if access is Access.READ:
        return True
    if access is Access.CREATE:
        return role in CREATORS
    if access is Access.WRITE:
        return role in WRITERS or (
            role == ProjectRole.MEMBER and created_by_id is not None and created_by_id == user.pk
        )
    return role in WRITERS  # MANAGE


def _kind(obj: Model) -> str:
    return str(obj._meta.verbose_name)


def _refusal(user: AnyUser, access: Access, project: Project | None, project_id: int, what: str) -> str:
    name = project.name if project is not None else str(project_id)
    role = role_in(user, project_id)
    if access is Access.CREATE:
        return f"you are a {role} of project {name!r}: only its members, maintainers and owners create there"
    if access is Access.MANAGE:
        return f"you are a {role} of project {name!r}: only its maintainers and owners manage it"
    if role == ProjectRole.VIEWER:
        return f"you are a viewer of project {name!r}: viewers change nothing"
    return f"only its creator or a maintainer or owner of project {name!r} may change this {what}; you are a {role}"


def check(user: AnyUser, obj: Owned | Model, access: Access) -> None:
    """Raises NotFound where the user may not read `obj` (a 404 as for a wrong id), PermissionDenied (403) where
    they may read it but not do `access` to it."""
    project_id: int = obj.project_id  # type: ignore[union-attr]
    created_by_id = getattr(obj, "created_by_id", None)
    what = _kind(obj) if isinstance(obj, Model) else "object"
    if not allows(user, Access.READ, project_id):
        raise NotFound(f"no such {what}")
    if access is not Access.READ and not allows(user, access, project_id, created_by_id):
        raise PermissionDenied(_refusal(user, access, getattr(obj, "project", None), project_id, what))


def _require(user: AnyUser, project: Project, access: Access) -> Project:
    if not allows(user, Access.READ, project.pk):
        raise NotFound(f"no project named {project.name!r}", loc="project")
    if not allows(user, access, project.pk):
        raise PermissionDenied(_refusal(user, access, project, project.pk, "project"))
    return project


def require_create(user: AnyUser, project: Project) -> Project:
    """The project, where the user may create objects in it (NotFound where they may not even read it)."""
    return _require(user, project, Access.CREATE)


def require_manage(user: AnyUser, project: Project) -> Project:
    """The project, where the user may manage its members and settings (NotFound where they may not read it)."""
    return _require(user, project, Access.MANAGE)


def readable_project_ids(user: AnyUser) -> set[int] | None:
    """The projects the user reads; None for an admin (every project)."""
    if is_admin(user):
        return None
    return set(project_roles(user))


def readable(queryset: QuerySet, user: AnyUser, field: str = "project") -> QuerySet:
    """The rows of `queryset` the user may read (`field`: the path to the row's project, e.g. `run__project`)."""
    ids = readable_project_ids(user)
    return queryset if ids is None else queryset.filter(**{f"{field}__in": ids})
