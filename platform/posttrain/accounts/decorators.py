"""Role checks for server-rendered pages (the API uses posttrain.accounts.permissions)."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse

from posttrain.accounts.roles import Role
from posttrain.accounts.selectors import user_role, user_roles


def role_required(*roles: str) -> Callable:
    """Anonymous users go to the login page; a signed-in user without one of `roles` gets a 403 naming them."""
    allowed = frozenset(roles) | {Role.ADMIN}

    def decorator(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @wraps(view)
        def wrapped(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path())
            if not user_roles(request.user) & allowed:
                raise PermissionDenied(
                    f"This page is for {', '.join(sorted(allowed))}; your role is {user_role(request.user) or 'none'}."
                )
            return view(request, *args, **kwargs)

        return wrapped

    return decorator


researcher_required = role_required(Role.RESEARCHER)
