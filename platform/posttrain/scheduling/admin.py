from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from posttrain.scheduling.models import Quota, QuotaKind


class QuotaKindFilter(admin.SimpleListFilter):
    title = "whose"
    parameter_name = "kind"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [(kind.value, kind.label) for kind in QuotaKind]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() in QuotaKind.values:
            return queryset.filter(**{f"{self.value()}__isnull": False})
        return queryset


@admin.register(Quota)
class QuotaAdmin(admin.ModelAdmin):
    """Admins set each user's, group's (team's) and project's limits, fair-share weight and lending here; the
    scheduler reads them at every admission (docs/SCHEDULER.md, "Quotas")."""

    list_display = ["__str__", "kind", "max_runs", "max_cpus", "max_gpus", "weight", "borrowing"]
    list_filter = [QuotaKindFilter, "borrowing"]
    raw_id_fields = ["user"]
    autocomplete_fields = ["project"]  # ProjectAdmin searches projects by name
    list_select_related = ["user", "group", "project"]
