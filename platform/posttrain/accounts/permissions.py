"""DRF permission classes by role, shared by every app's API.

- `IsResearcher`: researchers and admins (registry, experiments, runs).
- `IsAnnotator`: annotators and admins (review work). Combine with `|` for endpoints both use:
  `permission_classes = [IsResearcher | IsAnnotator]`.
- `IsReviewer`: reviewers and admins (adjudicating items whose annotators disagree).
- `IsAdminRole`: admins only (users, quotas, cluster settings).

A superuser counts as an admin. An anonymous request is refused before the role check with
DRF's "Authentication credentials were not provided." (403, because session authentication
comes first and sends no WWW-Authenticate challenge).
"""

from __future__ import annotations

from rest_framework.permissions import BasePermission
from rest_framework.request import Request
from rest_framework.views import APIView

from posttrain.accounts.roles import Role
from posttrain.accounts.selectors import user_role, user_roles


class _HasRole(BasePermission):
    allowed_roles: frozenset[str] = frozenset()
    who: str = ""

    def has_permission(self, request: Request, view: APIView) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            return False
        if user_roles(user) & self.allowed_roles:
            return True
        # DRF reads `message` after a refusal; naming the role tells the user what to ask for.
        role = user_role(user)
        self.message = f"Only {self.who} may use this endpoint; your role is {role or 'none (ask an admin)'}."
        return False


class IsResearcher(_HasRole):
    allowed_roles = frozenset({Role.RESEARCHER, Role.ADMIN})
    who = "researchers and admins"


class IsAnnotator(_HasRole):
    allowed_roles = frozenset({Role.ANNOTATOR, Role.ADMIN})
    who = "annotators and admins"


class IsReviewer(_HasRole):
    allowed_roles = frozenset({Role.REVIEWER, Role.ADMIN})
    who = "reviewers and admins"


class IsAdminRole(_HasRole):
    allowed_roles = frozenset({Role.ADMIN})
    who = "admins"
