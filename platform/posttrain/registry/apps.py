from django.apps import AppConfig


class RegistryConfig(AppConfig):
    name = "posttrain.registry"
    label = "registry"
    verbose_name = "Registry (models, datasets, rewards)"
