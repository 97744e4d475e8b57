from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    name = "posttrain.scheduling"
    label = "scheduling"
    verbose_name = "Scheduling"

    def ready(self) -> None:
        # Imported here: models are not ready when apps.py is imported.
        from posttrain.runs import hooks as run_hooks
        from posttrain.scheduling import handlers
        from posttrain.telemetry import hooks as telemetry_hooks

        run_hooks.on_run_transition(handlers.admit_when_freed)
        telemetry_hooks.preemptions_register(
            telemetry_hooks.Preemptions(
                settle=handlers.preemption_settle, stopped_at_deadline=handlers.stopped_at_preemption_deadline
            )
        )
