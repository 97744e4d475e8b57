"""Creates the demo's admin login once, with a random password kept in POSTTRAIN_HOME, and prints it."""

import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create (once) an admin user with a generated password and print the login."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="admin")

    def handle(self, *args, username: str, **options):
        password_file = settings.STATE_DIR / f"{username}-password"
        user_model = get_user_model()
        user = user_model.objects.filter(username=username).first()
        if user is None or not password_file.exists():
            password = secrets.token_urlsafe(12)
            if user is None:
                user_model.objects.create_superuser(username=username, email="", password=password)
            else:
                user.set_password(password)
                user.save(update_fields=["password"])
            password_file.write_text(password)
            password_file.chmod(0o600)
        self.stdout.write(f"login: {username} / {password_file.read_text().strip()}")
