"""Writes of projects: a project and its members. The caller checked the actor's right to act
(posttrain.projects.access.require_manage); the rules of who may hold or grant which role are here."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import ProtectedError

from posttrain.core.errors import AssetInUse, Conflict, InvalidInput, NotFound, PermissionDenied
from posttrain.projects.access import AnyUser, forget_cached_project_roles, is_admin, role_in
from posttrain.projects.models import Membership, Project, ProjectRole, project_name_validator


def _clean_name(name: object) -> str:
    text = str(name or "").strip()
    try:
        project_name_validator(text)
    except ValidationError as exc:
        raise InvalidInput.one("name", exc.messages[0]) from None
    return text


@transaction.atomic
def project_create(name: object, *, description: str = "", user: User) -> Project:
    """A new project; its creator is its owner."""
    text = _clean_name(name)
    if Project.objects.filter(name__iexact=text).exists():
        raise InvalidInput.one("name", f"a project named {text!r} exists already")
    try:
        with transaction.atomic():
            project = Project.objects.create(name=text, description=description or "", created_by=user)
    except IntegrityError:
        raise InvalidInput.one("name", f"a project named {text!r} exists already") from None
    Membership.objects.create(project=project, user=user, role=ProjectRole.OWNER)
    forget_cached_project_roles(user)
    return project


def project_update(project: Project, *, description: str) -> Project:
    Project.objects.filter(pk=project.pk).update(description=description)
    project.description = description
    return project


def project_delete(project: Project) -> None:
    """Only an empty project goes: everything in it is someone's work."""
    try:
        project.delete()
    except ProtectedError:
        raise AssetInUse(
            f"project {project.name!r} still holds experiments, runs, registry objects or campaigns: delete or "
            "move them first"
        ) from None


def _owners(project: Project) -> int:
    return Membership.objects.filter(project=project, role=ProjectRole.OWNER).count()


def _member_user(username: object) -> User:
    user = get_user_model().objects.filter(username=str(username or ""), is_active=True).first()
    if user is None:
        raise NotFound(f"no active user named {username!r}", loc="username")
    return user


def _may_touch_owner(actor: AnyUser, project: Project) -> bool:
    """actor None: the platform's own command line (`manage.py project_member`), run by whoever runs the host."""
    return actor is None or is_admin(actor) or role_in(actor, project.pk) == ProjectRole.OWNER


@transaction.atomic
def membership_set(project: Project, username: object, role: object, *, actor: AnyUser) -> Membership:
    """Add a user to the project with `role`, or change their role. Only an owner (or an admin) makes or unmakes
    an owner; the last owner stays one."""
    if role not in ProjectRole.values:
        raise InvalidInput.one("role", f"unknown role {role!r}; expected one of: {', '.join(ProjectRole.values)}")
    user = _member_user(username)
    # Row lock on the project: two changes of its owners at once cannot both see a second owner.
    Project.objects.select_for_update().filter(pk=project.pk).first()
    current = Membership.objects.filter(project=project, user=user).first()
    touches_owner = role == ProjectRole.OWNER or (current is not None and current.role == ProjectRole.OWNER)
    if touches_owner and not _may_touch_owner(actor, project):
        raise PermissionDenied("only an owner of the project makes or unmakes an owner")
    demoted = current is not None and current.role == ProjectRole.OWNER and role != ProjectRole.OWNER
    if demoted and _owners(project) == 1:
        raise Conflict(f"{user.username} is the last owner of {project.name!r}: make someone else owner first")
    if current is None:
        current = Membership.objects.create(project=project, user=user, role=role)
    elif current.role != role:
        Membership.objects.filter(pk=current.pk).update(role=role)
        current.role = str(role)
    forget_cached_project_roles(user)
    return current


@transaction.atomic
def membership_remove(project: Project, username: object, *, actor: AnyUser) -> None:
    """Take a user out of the project (what they made stays in it). Anyone may leave; the last owner may not."""
    user = _member_user(username)
    Project.objects.select_for_update().filter(pk=project.pk).first()
    current = Membership.objects.filter(project=project, user=user).first()
    if current is None:
        raise NotFound(f"{user.username} is not a member of {project.name!r}", loc="username")
    leaving = actor is not None and actor.pk == user.pk
    if current.role == ProjectRole.OWNER and not (leaving or _may_touch_owner(actor, project)):
        raise PermissionDenied("only an owner of the project removes an owner")
    if current.role == ProjectRole.OWNER and _owners(project) == 1:
        raise Conflict(f"{user.username} is the last owner of {project.name!r}: make someone else owner first")
    current.delete()
    forget_cached_project_roles(user)
