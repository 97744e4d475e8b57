"""Projects: every experiment, run, registry object, campaign, judge run and project quota belongs to one, and a
user reads and writes by their role in it (docs/SECURITY.md, "Projects and ownership"; the rule itself is
posttrain.projects.access)."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models

DEFAULT_PROJECT_NAME = "default"

# Names appear in URLs (`?project=`), in the CLI (`--project`) and in paths of nothing: letters, digits, and
# . _ - inside, so a name never needs quoting and never looks like an id.
PROJECT_NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9._-]{0,99}$"
project_name_validator = RegexValidator(
    PROJECT_NAME_PATTERN,
    "1-100 characters: a letter first, then letters, digits, '.', '_' or '-'",
)


class ProjectRole(models.TextChoices):
    """A member's role in one project, strongest first. Reads: every role. Writes: an owner or maintainer writes
    every object of the project, a member the objects they created; a viewer writes nothing. Members are managed
    by owners and maintainers (only an owner makes or unmakes an owner)."""

    OWNER = "owner"
    MAINTAINER = "maintainer"
    MEMBER = "member"
    VIEWER = "viewer"


class Project(models.Model):
    name = models.CharField(max_length=100, unique=True, validators=[project_name_validator])
    description = models.TextField(blank=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, through="Membership", related_name="projects")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="project_memberships")
    role = models.CharField(max_length=12, choices=ProjectRole.choices)
    added_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["project__name", "user__username"]
        constraints = [models.UniqueConstraint(fields=["project", "user"], name="one_membership_per_user")]

    def __str__(self) -> str:
        return f"{self.user} in {self.project} ({self.role})"


def default_project_id() -> int:
    """The project an object lands in when nothing names one (Django's admin, management commands, rows made
    before projects existed): made on first use, as the migration that introduced projects made it."""
    # Reads the id alone: a migration that adds the field to existing rows calls this, against a schema that may
    # predate later columns of Project.
    found = Project.objects.filter(name=DEFAULT_PROJECT_NAME).values_list("pk", flat=True).first()
    if found is not None:
        return found
    project, _ = Project.objects.get_or_create(
        name=DEFAULT_PROJECT_NAME, defaults={"description": "Everything made before projects existed."}
    )
    return project.pk
