from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "posttrain.core"
    label = "core"
    verbose_name = "Posttrain core"
