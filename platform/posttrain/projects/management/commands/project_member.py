"""`manage.py project_member PROJECT USERNAME ROLE` (or `--remove`): an admin's way to set who is in a project
from the host, e.g. for the first owner of a project nobody owns yet. `--create` makes the project first."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from posttrain.core.errors import ServiceError
from posttrain.projects.models import Project, ProjectRole, project_name_validator
from posttrain.projects.services import membership_remove, membership_set


class Command(BaseCommand):
    help = "Add a user to a project with a role (owner, maintainer, member, viewer), change it, or --remove them."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("project")
        parser.add_argument("username")
        parser.add_argument("role", nargs="?", choices=ProjectRole.values)
        parser.add_argument("--remove", action="store_true", help="take the user out of the project")
        parser.add_argument("--create", action="store_true", help="make the project if it does not exist")

    def handle(self, *args, project: str, username: str, role: str | None, remove: bool, create: bool, **options):
        found = Project.objects.filter(name=project).first()
        if found is None and create:
            try:
                project_name_validator(project)
            except ValidationError as exc:
                raise CommandError(f"project: {exc.messages[0]}") from None
            found = Project.objects.create(name=project)
        if found is None:
            raise CommandError(f"no project named {project!r} (--create makes it)")
        if not remove and role is None:
            raise CommandError("give the role, or --remove")
        try:
            if remove:
                membership_remove(found, username, actor=None)
                self.stdout.write(f"{username} is no longer in {found.name}")
            else:
                membership_set(found, username, role, actor=None)
                self.stdout.write(f"{username} is a {role} of {found.name}")
        except ServiceError as exc:
            raise CommandError(str(exc)) from None
