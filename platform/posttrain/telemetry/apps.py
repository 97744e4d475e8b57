from django.apps import AppConfig


class TelemetryConfig(AppConfig):
    name = "posttrain.telemetry"
    label = "telemetry"
    verbose_name = "Telemetry"
