"""Admin pages of review campaigns. States, locks, judgement counts, review states and judge runs are
read-only here: they change only in the review services (compare-and-set updates)."""

from django.contrib import admin

from posttrain.review.models import Campaign, Judgement, JudgeRun, ReviewItem, ReviewRollout


@admin.register(Campaign)
class CampaignAdmin(admin.ModelAdmin):
    list_display = ["name", "kind", "state", "blind", "overlap", "created_by", "created_at"]
    list_filter = ["state", "kind", "blind"]
    search_fields = ["name", "description"]
    readonly_fields = ["state", "state_changed_at", "questions", "source", "kind", "gold_spec", "created_at"]
    filter_horizontal = ["annotators", "reviewers"]


@admin.register(ReviewRollout)
class ReviewRolloutAdmin(admin.ModelAdmin):
    list_display = ["campaign", "run", "step", "index", "reward"]
    list_select_related = ["campaign", "run"]
    raw_id_fields = ["campaign", "run", "dataset"]


@admin.register(ReviewItem)
class ReviewItemAdmin(admin.ModelAdmin):
    list_display = ["campaign", "position", "judgement_count", "review_state", "gold_source", "locked_by"]
    list_select_related = ["campaign", "locked_by"]
    list_filter = ["review_state", "gold_source"]
    raw_id_fields = ["campaign", "rollout_a", "rollout_b"]
    readonly_fields = [
        "judgement_count",
        "locked_by",
        "locked_until",
        "display_swap",
        "selection",
        "review_state",
        "decision",
        "decided_by",
        "decided_at",
    ]


@admin.register(Judgement)
class JudgementAdmin(admin.ModelAdmin):
    list_display = ["item", "annotator", "seconds", "updated_at"]
    list_select_related = ["item", "annotator"]
    raw_id_fields = ["item", "annotator"]


@admin.register(JudgeRun)
class JudgeRunAdmin(admin.ModelAdmin):
    list_display = ["reward_name", "campaign", "state", "scored", "total", "created_at"]
    list_filter = ["state"]
    readonly_fields = [
        "campaign",
        "source",
        "reward",
        "reward_name",
        "spec",
        "state",
        "total",
        "scored",
        "failed_samples",
        "error",
        "created_by",
        "started_at",
        "finished_at",
    ]
