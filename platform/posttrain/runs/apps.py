from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "posttrain.runs"
    label = "runs"
    verbose_name = "Experiments and runs"
