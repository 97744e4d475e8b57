import logging

from django.apps import AppConfig
from django.conf import settings

from posttrain.core.ray_auth import DISABLED_WARNING

logger = logging.getLogger("posttrain.ray")


class CoreConfig(AppConfig):
    name = "posttrain.core"
    label = "core"
    verbose_name = "Posttrain core"

    def ready(self) -> None:
        # Every process the platform starts (web, workers, manage.py) says it, so an opt-out is never silent.
        if settings.RAY_AUTH_MODE == "disabled":
            logger.warning("RAY_AUTH_MODE=disabled. %s", DISABLED_WARNING)
