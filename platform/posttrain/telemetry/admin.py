from django.contrib import admin

from posttrain.telemetry.models import MetricRow, RolloutFile, RunLog


@admin.register(RolloutFile)
class RolloutFileAdmin(admin.ModelAdmin):
    list_display = ["run", "step", "part", "name", "rows", "bytes"]
    raw_id_fields = ["run"]


@admin.register(MetricRow)
class MetricRowAdmin(admin.ModelAdmin):
    list_display = ["run", "step", "seq"]
    raw_id_fields = ["run"]


@admin.register(RunLog)
class RunLogAdmin(admin.ModelAdmin):
    list_display = ["run", "seq", "level", "message"]
    list_filter = ["level"]
    raw_id_fields = ["run"]
