"""Admin pages of review campaigns. States, locks and judgement counts are read-only here: they change
only in posttrain.review.services (compare-and-set updates)."""

from django.contrib import admin

from posttrain.review.models import Campaign, Judgement, ReviewItem


@admin.register(Campaign)
class CampaignAdmin(admin.ModelAdmin):
    list_display = ["name", "kind", "state", "blind", "overlap", "created_by", "created_at"]
    list_filter = ["state", "kind", "blind"]
    search_fields = ["name", "description"]
    readonly_fields = ["state", "state_changed_at", "questions", "source", "kind", "created_at"]
    filter_horizontal = ["annotators"]


@admin.register(ReviewItem)
class ReviewItemAdmin(admin.ModelAdmin):
    list_display = ["campaign", "position", "judgement_count", "locked_by", "locked_until"]
    list_select_related = ["campaign", "locked_by"]
    raw_id_fields = ["campaign", "sample_a", "sample_b"]
    readonly_fields = ["judgement_count", "locked_by", "locked_until", "display_swap", "selection"]


@admin.register(Judgement)
class JudgementAdmin(admin.ModelAdmin):
    list_display = ["item", "annotator", "seconds", "updated_at"]
    list_select_related = ["item", "annotator"]
    raw_id_fields = ["item", "annotator"]
