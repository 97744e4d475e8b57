"""Admin pages of experiments and runs. States are read-only here: they change only in services."""

from django.contrib import admin

from posttrain.runs.models import (
    Checkpoint,
    Experiment,
    ExperimentReward,
    Run,
    RunTransition,
)


class ExperimentRewardInline(admin.TabularInline):
    model = ExperimentReward
    extra = 0


@admin.register(Experiment)
class ExperimentAdmin(admin.ModelAdmin):
    list_display = ["name", "model", "dataset", "created_by", "created_at"]
    search_fields = ["name", "description"]
    list_select_related = ["model", "dataset", "created_by"]
    inlines = [ExperimentRewardInline]
    raw_id_fields = ["model", "dataset"]


class RunTransitionInline(admin.TabularInline):
    model = RunTransition
    extra = 0
    can_delete = False
    readonly_fields = ["from_state", "to_state", "reason", "at"]

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "experiment", "state", "priority", "queue_position", "last_step", "created_at"]
    list_filter = ["state", "priority"]
    search_fields = ["id", "name", "note", "experiment__name"]
    list_select_related = ["experiment"]
    readonly_fields = [
        "id",
        "experiment",
        "state",
        "state_reason",
        "state_changed_at",
        "resolved_config",
        "parent",
        "resume_from",
        "ingest_token_hash",
        "last_seq",
        "last_event_at",
        "last_step",
        "started_at",
        "finished_at",
        "created_by",
        "created_at",
        "resources",
        "priority",  # changed through the API's priority endpoint (it re-runs admission)
        "queue_position",
        "queue_reason",
    ]
    inlines = [RunTransitionInline]


@admin.register(Checkpoint)
class CheckpointAdmin(admin.ModelAdmin):
    list_display = ["run", "step", "path", "created_at"]
    raw_id_fields = ["run"]
