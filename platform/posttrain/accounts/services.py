"""Writes of the accounts app: users and their role."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission, User
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import transaction
from rest_framework.authtoken.models import Token

from posttrain.accounts.roles import ROLE_NAMES, Role
from posttrain.accounts.selectors import forget_cached_roles


def _check_role(role: str) -> str:
    if role not in ROLE_NAMES:
        raise ValidationError({"role": f"unknown role {role!r}; expected one of: {', '.join(ROLE_NAMES)}"})
    return role


@transaction.atomic
def user_create(username: str, password: str, role: str, *, email: str = "") -> User:
    """A new user with one role. The password must pass the project's password validators."""
    _check_role(role)
    user_model = get_user_model()
    username = (username or "").strip()
    if not username:
        raise ValidationError({"username": "is required"})
    if user_model.objects.filter(username=username).exists():
        raise ValidationError({"username": f"a user named {username!r} already exists"})
    user = user_model(username=username, email=email)
    try:
        validate_password(password, user)
    except ValidationError as exc:
        raise ValidationError({"password": exc.messages}) from None
    user.set_password(password)
    user.save()
    return user_set_role(user, role)


@transaction.atomic
def user_set_role(user: User, role: str) -> User:
    """Give the user exactly this role (the other role groups are removed; other groups stay).

    Admins manage users and settings through Django's admin site, so the admin role also makes
    the user staff and superuser; the other roles take both away.
    """
    _check_role(role)
    group, _ = Group.objects.get_or_create(name=role)
    user.groups.remove(*Group.objects.filter(name__in=ROLE_NAMES).exclude(pk=group.pk))
    user.groups.add(group)
    is_admin = role == Role.ADMIN
    if user.is_staff != is_admin or user.is_superuser != is_admin:
        user.is_staff = user.is_superuser = is_admin
        user.save(update_fields=["is_staff", "is_superuser"])
    forget_cached_roles(user)
    return user


def token_get_or_create(user: User) -> Token:
    """The user's API token for scripts and the CLI (one per user, created on first request)."""
    token, _ = Token.objects.get_or_create(user=user)
    return token


def user_set_server_paths(user: User, allowed: bool) -> User:
    """Grant (or take back) the permission to name files on the server (posttrain.core.server_paths): register
    a dataset, model or reward file by its path, and name run files. A group can hold it too (Django admin)."""
    app_label, codename = "registry", "import_server_paths"
    permission = Permission.objects.get(content_type__app_label=app_label, codename=codename)
    if allowed:
        user.user_permissions.add(permission)
    else:
        user.user_permissions.remove(permission)
    # Django caches a user's permissions on the instance: the next check must see the change.
    for cache in ("_perm_cache", "_user_perm_cache", "_group_perm_cache"):
        user.__dict__.pop(cache, None)
    return user
