"""Reads of the accounts app: which roles a user has."""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser, User

from posttrain.accounts.roles import ROLE_NAMES, Role
from posttrain.core.errors import NotAuthenticated

# Cached on the user object: a request checks permissions several times (view, then object).
_CACHE_ATTR = "_posttrain_roles"


def signed_in_user(user: User | AnonymousUser) -> User:
    """A request's user where the view's permissions admit only signed-in users: typed as one."""
    if not isinstance(user, User) or not user.is_authenticated:
        raise NotAuthenticated("sign in first")
    return user


def user_roles(user: User | AnonymousUser | None) -> frozenset[str]:
    """The user's roles; a superuser is always an admin, an anonymous user has none."""
    if user is None or not user.is_authenticated or not user.is_active:
        return frozenset()
    cached = getattr(user, _CACHE_ATTR, None)
    if cached is None:
        names = set(user.groups.filter(name__in=ROLE_NAMES).values_list("name", flat=True))
        if user.is_superuser:
            names.add(Role.ADMIN)
        cached = frozenset(names)
        setattr(user, _CACHE_ATTR, cached)
    return cached


def user_role(user: User | AnonymousUser | None) -> str | None:
    """The user's main role (admin over researcher over reviewer over annotator), None without one."""
    roles = user_roles(user)
    return next((role for role in (Role.ADMIN, Role.RESEARCHER, Role.REVIEWER, Role.ANNOTATOR) if role in roles), None)


def forget_cached_roles(user: User) -> None:
    if hasattr(user, _CACHE_ATTR):
        delattr(user, _CACHE_ATTR)
