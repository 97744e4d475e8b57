from django.contrib import admin

from posttrain.registry.models import Dataset, ModelAsset, RewardFunction


class _RegisteredThroughServices(admin.ModelAdmin):
    """Assets are added through the API (validation, hashing, sandbox checks live in the
    services); the admin lists, renames and deletes them."""

    def has_add_permission(self, request) -> bool:
        return False


@admin.register(ModelAsset)
class ModelAssetAdmin(_RegisteredThroughServices):
    list_display = (
        "name",
        "architecture",
        "parameter_count",
        "source",
        "source_run",
        "source_step",
        "created_by",
        "created_at",
    )
    list_filter = ("source", "architecture")
    search_fields = ("name", "path", "description")
    # Read from the folder at registration; editing them here would make them disagree with it.
    readonly_fields = (
        "source",
        "path",
        "architecture",
        "parameter_count",
        "hf_config",
        "source_run",
        "source_step",
        "created_by",
        "created_at",
    )


@admin.register(Dataset)
class DatasetAdmin(_RegisteredThroughServices):
    list_display = ("name", "format", "row_count", "size_bytes", "sha256", "created_by", "created_at")
    list_filter = ("format",)
    search_fields = ("name", "sha256", "description")
    readonly_fields = (
        "sha256",
        "format",
        "path",
        "size_bytes",
        "row_count",
        "prompt_field",
        "label_field",
        "columns",
        "splits",
        "preview",
        "source_campaign_id",
        "created_by",
        "created_at",
    )


@admin.register(RewardFunction)
class RewardFunctionAdmin(_RegisteredThroughServices):
    list_display = ("name", "kind", "created_by", "created_at")
    list_filter = ("kind",)
    search_fields = ("name", "description")
    # The spec was validated by the engine's schema and the code in the sandbox at creation.
    readonly_fields = ("kind", "spec", "source", "created_by", "created_at")
