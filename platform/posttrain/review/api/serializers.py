"""Serializers of the review API: shapes only. Rules live in posttrain.review.services and questions."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from rest_framework import serializers

from posttrain.review.export import EXPORT_FORMATS
from posttrain.review.models import Campaign, CampaignKind, ReviewItem
from posttrain.review.selectors import campaign_progress

_QUESTIONS_HELP = (
    'A list of questions: {"key", "kind": rating|pass_fail|pairwise|tags|comment, "label", "required", "help"}; '
    'ratings add "min", "max" and optional "labels" (one per point); tags add "options". Pairwise questions '
    'come back with "choices": ["A", "B", "tie", "both_bad"].'
)
_SOURCE_HELP = (
    'Which samples become items: {"runs": [run ids], "steps": [..] or "step_range": [first, last], "rule": '
    'random|lowest_reward|highest_reward|component_disagreement|reward_vs_component, "k": items per step, '
    '"components": [names] (disagreement rules), "seed", "pair_steps": same|latest (pairs across two runs)}.'
)


def _annotators_field(**kwargs) -> serializers.SlugRelatedField:
    return serializers.SlugRelatedField(
        many=True,
        slug_field="username",
        queryset=get_user_model().objects.filter(is_active=True),
        help_text="Usernames of users with the annotator role.",
        **kwargs,
    )


class CampaignCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200)
    description = serializers.CharField(required=False, allow_blank=True, default="")
    instructions = serializers.CharField(
        required=False, allow_blank=True, default="", help_text="Shown to annotators with every item."
    )
    # Plain strings (validated by the service) rather than enums: drf-spectacular would give these
    # names that collide with the registry's `kind` and `format` enums.
    kind = serializers.CharField(default=CampaignKind.SINGLE, help_text="single (one response per item) or pair.")
    questions = serializers.JSONField(help_text=_QUESTIONS_HELP)
    source = serializers.JSONField(help_text=_SOURCE_HELP)
    blind = serializers.BooleanField(
        default=True, help_text="Hide rewards, components, runs and steps from annotators."
    )
    overlap = serializers.IntegerField(default=1, help_text="Annotators per item (1..20).")
    lock_ttl_s = serializers.IntegerField(default=600, help_text="Seconds an item stays locked to its annotator.")
    annotators = _annotators_field(required=False, default=list)


class CampaignUpdateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200, required=False)
    description = serializers.CharField(required=False, allow_blank=True)
    instructions = serializers.CharField(required=False, allow_blank=True)
    annotators = _annotators_field(required=False)


class CampaignSerializer(serializers.ModelSerializer):
    annotators: serializers.ManyRelatedField = serializers.SlugRelatedField(
        many=True, read_only=True, slug_field="username"
    )
    created_by = serializers.CharField(source="created_by.username", read_only=True, default=None, allow_null=True)
    kind = serializers.CharField(read_only=True, help_text="single or pair")
    state = serializers.CharField(read_only=True, help_text="draft, active or closed")
    item_count = serializers.IntegerField(read_only=True, default=0)
    items_complete = serializers.IntegerField(read_only=True, default=0, help_text="Items with `overlap` judgements.")
    judgement_total = serializers.IntegerField(read_only=True, default=0)

    class Meta:
        model = Campaign
        fields = [
            "id",
            "name",
            "description",
            "kind",
            "blind",
            "overlap",
            "state",
            "state_changed_at",
            "annotators",
            "created_by",
            "created_at",
            "item_count",
            "items_complete",
            "judgement_total",
        ]
        read_only_fields = fields


class AnnotatorProgressSerializer(serializers.Serializer):
    annotator = serializers.CharField()
    judged = serializers.IntegerField()
    seconds = serializers.FloatField(help_text="Seconds spent on their judgements, in all.")
    holding = serializers.BooleanField(help_text="Holds an unexpired lock now.")


class CampaignProgressSerializer(serializers.Serializer):
    items = serializers.IntegerField()
    items_complete = serializers.IntegerField()
    items_locked = serializers.IntegerField()
    judgements = serializers.IntegerField()
    judgements_needed = serializers.IntegerField(help_text="items × overlap")
    fraction = serializers.FloatField()
    per_annotator = AnnotatorProgressSerializer(many=True)


class CampaignDetailSerializer(CampaignSerializer):
    questions = serializers.JSONField(read_only=True)
    source = serializers.JSONField(read_only=True)
    progress = serializers.SerializerMethodField()

    class Meta(CampaignSerializer.Meta):
        fields = [*CampaignSerializer.Meta.fields, "instructions", "questions", "source", "lock_ttl_s", "progress"]
        read_only_fields = fields

    def get_progress(self, campaign: Campaign) -> dict:
        return CampaignProgressSerializer(campaign_progress(campaign)).data


class SampleBriefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    run = serializers.UUIDField(source="run_id")
    run_name = serializers.SerializerMethodField()
    step = serializers.IntegerField()
    index = serializers.IntegerField()
    reward = serializers.FloatField(allow_null=True)

    def get_run_name(self, sample) -> str:
        return sample.run.name or str(sample.run_id)


class ReviewItemSerializer(serializers.ModelSerializer):
    sample_a = SampleBriefSerializer()
    sample_b = SampleBriefSerializer(allow_null=True)
    locked_by = serializers.CharField(source="locked_by.username", default=None, read_only=True)
    skip_count = serializers.IntegerField(read_only=True, default=0)

    class Meta:
        model = ReviewItem
        fields = [
            "id",
            "position",
            "sample_a",
            "sample_b",
            "display_swap",
            "selection",
            "judgement_count",
            "locked_by",
            "locked_until",
            "skip_count",
        ]
        read_only_fields = fields


class ExportRegisterSerializer(serializers.Serializer):
    format = serializers.CharField(help_text=", ".join(f for f, kind in EXPORT_FORMATS.items() if kind.registrable))
    name = serializers.CharField(
        max_length=200,
        required=False,
        allow_blank=True,
        default="",
        help_text="Dataset name; default '<campaign> (<format>)'.",
    )
    description = serializers.CharField(required=False, allow_blank=True, default="")
    question = serializers.CharField(
        required=False, allow_null=True, default=None, help_text="trl: the pairwise question (default: the first)."
    )


# --- annotators ---------------------------------------------------------------------------------


class AnnotatorSerializer(serializers.Serializer):
    username = serializers.CharField()
    id = serializers.IntegerField()


class AnnotatorCampaignSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    instructions = serializers.CharField()
    kind = serializers.CharField()
    blind = serializers.BooleanField()
    questions = serializers.JSONField()


class MyProgressSerializer(serializers.Serializer):
    judged = serializers.IntegerField()
    remaining = serializers.IntegerField(help_text="Items you may still judge (some may be locked by others).")
    available = serializers.IntegerField(help_text="Of those, items nobody else holds now.")
    skipped = serializers.IntegerField(help_text="Of the remaining, items you skipped (they come last).")
    held_item = serializers.IntegerField(allow_null=True, help_text="The item you hold now, if any.")
    done = serializers.BooleanField()


class QueueEntrySerializer(AnnotatorCampaignSerializer):
    description = serializers.CharField()
    progress = MyProgressSerializer()


class ResponseViewSerializer(serializers.Serializer):
    label = serializers.ChoiceField(choices=["A", "B"])
    text = serializers.CharField()
    sample = serializers.DictField(
        required=False, help_text="Not blind only: id, run, run_name, step, index, reward, components."
    )


class ItemViewSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    campaign = serializers.IntegerField()
    position = serializers.IntegerField()
    kind = serializers.CharField()
    prompt = serializers.CharField()
    reference = serializers.CharField(allow_null=True, help_text="The dataset's reference answer, if any.")
    responses = ResponseViewSerializer(many=True, help_text="One (single) or two (pair, in display order).")
    locked_until = serializers.DateTimeField(allow_null=True)
    my_answers = serializers.DictField(allow_null=True, help_text="Your earlier answers (pairwise as shown).")


class NextItemSerializer(serializers.Serializer):
    campaign = AnnotatorCampaignSerializer()
    item = ItemViewSerializer()
    progress = MyProgressSerializer()


class JudgementBodySerializer(serializers.Serializer):
    answers = serializers.JSONField(
        help_text="Question key to answer: rating an integer, pass_fail true/false, "
        'pairwise "A"|"B"|"tie"|"both_bad" as shown, tags a list, comment a string.'
    )
    seconds = serializers.FloatField(default=0.0, help_text="Seconds spent on the item.")
    claim_next = serializers.BooleanField(default=False, help_text="Also claim and return the next item.")


class ClaimNextBodySerializer(serializers.Serializer):
    claim_next = serializers.BooleanField(default=False, help_text="Also claim and return the next item.")


class JudgementViewSerializer(serializers.Serializer):
    item = serializers.IntegerField()
    answers = serializers.DictField(help_text="As you gave them (pairwise as shown).")
    seconds = serializers.FloatField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


class JudgementResponseSerializer(serializers.Serializer):
    judgement = JudgementViewSerializer()
    created = serializers.BooleanField(help_text="False when it replaced your earlier judgement.")
    progress = MyProgressSerializer()
    next = NextItemSerializer(allow_null=True, required=False, help_text="With claim_next: the next item, or null.")


class SkipResponseSerializer(serializers.Serializer):
    skipped = serializers.BooleanField()
    progress = MyProgressSerializer()
    next = NextItemSerializer(allow_null=True, required=False, help_text="With claim_next: the next item, or null.")


class ReleaseResponseSerializer(serializers.Serializer):
    released = serializers.BooleanField(help_text="False when you did not hold the item (nothing changed).")


# --- results and agreement (documentation of the shapes) ---------------------------------------------


class ResultSampleSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    run = serializers.UUIDField()
    run_name = serializers.CharField()
    step = serializers.IntegerField()
    index = serializers.IntegerField()
    reward = serializers.FloatField(allow_null=True)
    components = serializers.DictField()
    response = serializers.CharField()
    label = serializers.CharField(allow_null=True)


class ResultJudgementSerializer(serializers.Serializer):
    annotator = serializers.CharField()
    answers = serializers.DictField(help_text='Pairwise answers as stored: "A" = samples.A.')
    seconds = serializers.FloatField()
    updated_at = serializers.DateTimeField()


class ResultRowSerializer(serializers.Serializer):
    item = serializers.IntegerField()
    position = serializers.IntegerField()
    selection = serializers.DictField(help_text="rule, score, step, pairing")
    prompt = serializers.CharField()
    samples = serializers.DictField(child=ResultSampleSerializer(), help_text='"A" and, for pairs, "B".')
    judgement_count = serializers.IntegerField()
    complete = serializers.BooleanField()
    judgements = ResultJudgementSerializer(many=True)
    summary = serializers.DictField(
        help_text="Per question key: pass_fail {n, pass_rate}, rating {n, mean}, "
        "pairwise {n, counts, majority}, tags {n, counts}."
    )
    reward_preferred = serializers.CharField(
        required=False, allow_null=True, help_text='Pairs: "A", "B", "tie" or null.'
    )
    human_preferred = serializers.CharField(
        required=False, allow_null=True, help_text="Pairs: plurality answer of the first pairwise question."
    )
    human_score = serializers.FloatField(required=False, allow_null=True, help_text="Singles: 0..1.")
    reward_rank = serializers.FloatField(
        required=False, allow_null=True, help_text="Singles: the reward's standing among the campaign's items, 0..1."
    )
    disagreement = serializers.FloatField(allow_null=True)
    disagrees = serializers.BooleanField()


class KappaPairSerializer(serializers.Serializer):
    annotators = serializers.ListField(child=serializers.CharField())
    items = serializers.IntegerField()
    kappa = serializers.FloatField(allow_null=True)


class QuestionAgreementSerializer(serializers.Serializer):
    key = serializers.CharField()
    kind = serializers.CharField()
    label = serializers.CharField()
    metric = serializers.CharField(help_text="nominal, interval, or 'nominal per tag'")
    kappa_weighting = serializers.CharField(allow_null=True, help_text="quadratic for ratings")
    items = serializers.IntegerField(required=False, help_text="Items with two or more answers.")
    alpha = serializers.FloatField(required=False, allow_null=True)
    kappa = serializers.FloatField(required=False, allow_null=True, help_text="When exactly two annotators answered.")
    pairwise_kappa = KappaPairSerializer(many=True, required=False)
    per_tag = serializers.DictField(required=False, help_text="Tags: per tag {items, alpha, kappa, pairwise_kappa}.")


class AgreementSerializer(serializers.Serializer):
    campaign = serializers.IntegerField()
    annotators = serializers.ListField(child=serializers.CharField())
    judgements = serializers.IntegerField()
    questions = QuestionAgreementSerializer(many=True)
    annotator_stats = serializers.ListField(
        child=serializers.DictField(),
        help_text=(
            "Per annotator: {annotator, items_judged, mean_seconds, questions: {key: {answered, pass_rate | mean | "
            "choices | tag_rates, agreement_with_majority {rate, items} | mean_abs_diff_from_others {value, items}}}}"
        ),
    )
