from typing import Any

from django.apps import AppConfig, apps
from django.db.models.signals import post_migrate


def role_groups_ensure(using: str = "default", **_: Any) -> None:
    """Every role's group exists after each `migrate` and each `flush` (both send post_migrate, as Django's
    own permissions rely on): a database emptied by a flush still has its roles."""
    from django.contrib.auth.models import Group

    from posttrain.accounts.roles import ROLE_NAMES

    for name in ROLE_NAMES:
        Group.objects.using(using).get_or_create(name=name)


class AccountsConfig(AppConfig):
    name = "posttrain.accounts"
    label = "accounts"
    verbose_name = "Accounts and roles"

    def ready(self) -> None:
        # Sent per app that has models: this one has none (roles are auth's groups), so on auth's.
        auth = apps.get_app_config("auth")
        post_migrate.connect(role_groups_ensure, sender=auth, dispatch_uid="posttrain.accounts.role_groups")
