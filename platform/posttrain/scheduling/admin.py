from django.contrib import admin

from posttrain.scheduling.models import Quota


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin):
    """Admins set each user's and team's (group's) limits, fair-share weight and lending here; the scheduler
    reads them at every admission (docs/SCHEDULER.md)."""

    list_display = ["__str__", "max_runs", "max_cpus", "max_gpus", "weight", "borrowing"]
    raw_id_fields = ["user"]
