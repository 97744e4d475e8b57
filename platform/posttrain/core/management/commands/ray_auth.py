"""How the platform authenticates to Ray, for scripts/demo.sh to start its Ray head the same way (docs/SECURITY.md,
"Ray"): `token <the token file's path>` or `disabled`. The path only, never the token: the head reads the file
(RAY_AUTH_TOKEN_PATH) and nothing prints what is in it."""

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from posttrain.core.ray_auth import RayTokenUnavailable, ray_token


class Command(BaseCommand):
    help = "Print Ray's authentication mode and the path of the platform's Ray token file (never the token)."
    requires_system_checks: list[str] = []  # a start script's quick question: no database, no checks

    def handle(self, *args, **options):
        if settings.RAY_AUTH_MODE == "disabled":
            self.stdout.write("disabled")
            return
        try:
            ray_token()  # the file is there and holds a token, or the head would start with none
        except RayTokenUnavailable as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"token {settings.RAY_TOKEN_FILE}")
