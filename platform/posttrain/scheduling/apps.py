from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    name = "posttrain.scheduling"
    label = "scheduling"
    verbose_name = "Scheduling"
