"""`manage.py grant_server_paths ada [--revoke]`: let a user name files on the server (or no longer)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from posttrain.accounts.services import user_set_server_paths


class Command(BaseCommand):
    help = (
        "Grant a user the permission to register datasets, models and reward files by their path on the server "
        "and to name run files (inside POSTTRAIN_IMPORT_ROOTS only); --revoke takes it back."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--revoke", action="store_true", help="take the permission back")

    def handle(self, *args, username: str, revoke: bool, **options) -> None:
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user named {username!r}")
        user_set_server_paths(user, not revoke)
        verb = "may no longer" if revoke else "may now"
        self.stdout.write(f"{username} {verb} name server paths")
