"""Template filters on the user's roles, so shared templates (the nav in base.html) show each role its pages."""

from __future__ import annotations

from django import template
from django.contrib.auth.models import AnonymousUser, User

from posttrain.accounts.roles import Role
from posttrain.accounts.selectors import user_roles

register = template.Library()


@register.filter
def may_act_as(user: User | AnonymousUser | None, role: str) -> bool:
    """`{% if user|may_act_as:"researcher" %}`: the same rule as role_required (admins pass every check)."""
    return bool(user_roles(user) & {role, Role.ADMIN})
