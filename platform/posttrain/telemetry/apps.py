from django.apps import AppConfig


class TelemetryConfig(AppConfig):
    name = "posttrain.telemetry"
    label = "telemetry"
    verbose_name = "Telemetry"

    def ready(self) -> None:
        # Imported here: models are not ready when apps.py is imported.
        from posttrain.runs import hooks
        from posttrain.telemetry import handlers

        hooks.on_run_transition(handlers.publish_move)
        hooks.in_run_transition(handlers.seal_when_ended)
