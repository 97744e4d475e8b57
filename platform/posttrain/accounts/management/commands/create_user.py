"""`manage.py create_user ada --role researcher`: a user with a role (password generated unless given)."""

from __future__ import annotations

import os
import secrets

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from posttrain.accounts.roles import ROLE_NAMES
from posttrain.accounts.services import token_get_or_create, user_create

PASSWORD_ENV = "POSTTRAIN_NEW_USER_PASSWORD"


class Command(BaseCommand):
    help = "Create a user with a role (admin, researcher, reviewer or annotator) and print the login and API token."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--role", required=True, choices=ROLE_NAMES)
        parser.add_argument("--email", default="")
        parser.add_argument(
            "--password",
            default=None,
            help=f"Password (else ${PASSWORD_ENV}, else a generated one that is printed). "
            "Prefer the variable: a command-line argument shows up in the process list.",
        )
        parser.add_argument("--token", action="store_true", help="Also create and print an API token.")

    def handle(self, *args, username: str, role: str, email: str, password: str | None, token: bool, **options) -> None:
        password = password or os.environ.get(PASSWORD_ENV) or ""
        generated = not password
        if generated:
            password = secrets.token_urlsafe(12)
        try:
            user = user_create(username, password, role, email=email)
        except ValidationError as exc:
            raise CommandError(
                "; ".join(f"{field}: {' '.join(msgs)}" for field, msgs in exc.message_dict.items())
            ) from None
        line = f"created {role} {user.username}"
        if generated:
            line += f" / password: {password}"
        self.stdout.write(line)
        if token:
            self.stdout.write(f"API token: {token_get_or_create(user).key}")
