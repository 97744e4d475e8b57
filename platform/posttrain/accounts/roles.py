"""The roles (docs/ARCHITECTURE.md, "Roles"), kept as Django groups of the same names."""

from __future__ import annotations

from django.db import models


class Role(models.TextChoices):
    ADMIN = "admin", "Admin"
    RESEARCHER = "researcher", "Researcher"
    ANNOTATOR = "annotator", "Annotator"
    REVIEWER = "reviewer", "Reviewer"  # adjudicates review items whose annotators disagree


ROLE_NAMES: tuple[str, ...] = tuple(Role.values)
