"""Serializers of the review API: shapes only. Rules live in posttrain.review.services and questions."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from rest_framework import serializers

from posttrain.projects.api.fields import ReadableRelatedField, project_input_field, project_name_field
from posttrain.registry.models import RewardFunction
from posttrain.review.export import EXPORT_FORMATS
from posttrain.review.guidelines import render_markdown
from posttrain.review.models import Campaign, CampaignKind, JudgeRun, ReviewItem, ReviewRollout
from posttrain.review.selectors import campaign_progress

_QUESTIONS_HELP = (
    'A list of questions: {"key", "kind": rating|pass_fail|pairwise|tags|comment|steps, "label", "required", '
    '"help" (markdown)}; ratings add "min", "max" and optional "labels" and "rubric" (markdown), one per point; '
    'tags add "options"; steps (single campaigns) add "unit": sentence|token. Pairwise questions come back with '
    '"choices": ["A", "B", "tie", "both_bad"].'
)
_SOURCE_HELP = (
    'Which rollouts become items: {"runs": [run ids], "steps": [..] or "step_range": [first, last], "rule": '
    "random|lowest_reward|highest_reward|component_disagreement|reward_vs_component|near_boundary|"
    'reward_vs_judge|alerts|one_per_group, "k": items per step, "components": [names] (component rules), '
    '"boundary" (near_boundary), "judge_run" (reward_vs_judge: a finished judge run over the runs), "alerts": '
    '[{"run", "step", "indices", "code"}] (alerts; default the runs\' current alerts), "seed", "pair_steps": '
    "same|latest (pairs across two runs)}."
)
_GOLD_HELP = (
    'Gold rows mixed in unmarked: single campaigns {"dataset": id, "share": 0..0.5, "question": key, '
    '"response_field": "response"} (the dataset\'s labels are the known answers); pair campaigns {"dataset", '
    '"share", "chosen_field": "chosen", "rejected_field": "rejected"}. Needs a blind campaign.'
)
_GOLD_POLICY_HELP = (
    '{"min_items": gold answers before accuracy counts (3), "min_accuracy": set aside below it (0), '
    '"weighting": none|accuracy}.'
)


def _users_field(role: str, **kwargs) -> serializers.SlugRelatedField:
    return serializers.SlugRelatedField(
        many=True,
        slug_field="username",
        queryset=get_user_model().objects.filter(is_active=True),
        help_text=f"Usernames of users with the {role} role.",
        **kwargs,
    )


def _annotators_field(**kwargs) -> serializers.SlugRelatedField:
    return _users_field("annotator", **kwargs)


def _reviewers_field(**kwargs) -> serializers.SlugRelatedField:
    return _users_field("reviewer", **kwargs)


class CampaignCreateSerializer(serializers.Serializer):
    project = project_input_field()
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
    reviewers = _reviewers_field(required=False, default=list)
    review_rating_spread = serializers.IntegerField(
        default=2, help_text="Ratings this many points apart send a complete item to the reviewers."
    )
    gold = serializers.JSONField(required=False, allow_null=True, default=None, help_text=_GOLD_HELP)
    gold_policy = serializers.JSONField(required=False, allow_null=True, default=None, help_text=_GOLD_POLICY_HELP)
    show_suggestions = serializers.BooleanField(
        default=False, help_text="Show annotators the latest judge run's pre-labels (false: they judge blind)."
    )


class CampaignUpdateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200, required=False)
    description = serializers.CharField(required=False, allow_blank=True)
    instructions = serializers.CharField(required=False, allow_blank=True)
    annotators = _annotators_field(required=False)
    reviewers = _reviewers_field(required=False)
    gold_policy = serializers.JSONField(required=False, help_text=_GOLD_POLICY_HELP)
    show_suggestions = serializers.BooleanField(required=False)
    review_rating_spread = serializers.IntegerField(required=False)


class CampaignSerializer(serializers.ModelSerializer):
    project_name = project_name_field()
    annotators: serializers.ManyRelatedField = serializers.SlugRelatedField(
        many=True, read_only=True, slug_field="username"
    )
    reviewers: serializers.ManyRelatedField = serializers.SlugRelatedField(
        many=True, read_only=True, slug_field="username"
    )
    created_by = serializers.CharField(source="created_by.username", read_only=True, default=None, allow_null=True)
    kind = serializers.CharField(read_only=True, help_text="single or pair")
    state = serializers.CharField(
        read_only=True, help_text="draft, active or closed; building (a worker draws its items) or failed"
    )
    item_count = serializers.IntegerField(read_only=True, default=0)
    items_complete = serializers.IntegerField(read_only=True, default=0, help_text="Items with `overlap` judgements.")
    judgement_total = serializers.IntegerField(read_only=True, default=0)

    class Meta:
        model = Campaign
        fields = [
            "id",
            "project",
            "project_name",
            "name",
            "description",
            "kind",
            "blind",
            "overlap",
            "state",
            "state_changed_at",
            "annotators",
            "reviewers",
            "show_suggestions",
            "build_error",
            "gaps",
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
    gold_items = serializers.IntegerField(help_text="Items with known answers (mixed in unmarked).")
    review_pending = serializers.IntegerField(help_text="Complete items whose annotators disagree, undecided.")
    review_decided = serializers.IntegerField(help_text="Items a reviewer decided.")


class CampaignDetailSerializer(CampaignSerializer):
    questions = serializers.JSONField(read_only=True)
    source = serializers.JSONField(read_only=True)
    gold_spec = serializers.JSONField(read_only=True, help_text="Gold rows drawn from a dataset, if any.")
    gold_policy = serializers.JSONField(read_only=True)
    instructions_html = serializers.SerializerMethodField(help_text="The instructions rendered (markdown).")
    progress = serializers.SerializerMethodField()

    class Meta(CampaignSerializer.Meta):
        fields = [
            *CampaignSerializer.Meta.fields,
            "instructions",
            "instructions_html",
            "questions",
            "source",
            "lock_ttl_s",
            "review_rating_spread",
            "gold_spec",
            "gold_policy",
            "progress",
        ]
        read_only_fields = fields

    def get_instructions_html(self, campaign: Campaign) -> str:
        return render_markdown(campaign.instructions)

    def get_progress(self, campaign: Campaign) -> dict:
        return CampaignProgressSerializer(campaign_progress(campaign)).data


class RolloutBriefSerializer(serializers.Serializer):
    id = serializers.IntegerField(help_text="The campaign's copy of the rollout.")
    run = serializers.UUIDField(source="run_id", allow_null=True, help_text="Where it came from (null: a gold row).")
    run_name = serializers.SerializerMethodField()
    step = serializers.IntegerField(allow_null=True)
    index = serializers.IntegerField(allow_null=True)
    reward = serializers.FloatField(allow_null=True)

    def get_run_name(self, rollout: ReviewRollout) -> str | None:
        return None if rollout.run is None else (rollout.run.name or str(rollout.run_id))


class ReviewItemSerializer(serializers.ModelSerializer):
    rollout_a = RolloutBriefSerializer()
    rollout_b = RolloutBriefSerializer(allow_null=True)
    locked_by = serializers.CharField(source="locked_by.username", default=None, allow_null=True, read_only=True)
    decided_by = serializers.CharField(source="decided_by.username", default=None, allow_null=True, read_only=True)
    skip_count = serializers.IntegerField(read_only=True, default=0)

    class Meta:
        model = ReviewItem
        fields = [
            "id",
            "position",
            "rollout_a",
            "rollout_b",
            "display_swap",
            "selection",
            "judgement_count",
            "locked_by",
            "locked_until",
            "skip_count",
            "gold",
            "gold_source",
            "review_state",
            "decision",
            "decided_by",
            "decided_at",
        ]
        read_only_fields = fields


class GoldBodySerializer(serializers.Serializer):
    answers = serializers.JSONField(
        allow_null=True,
        help_text='Known answers to graded questions (pass_fail, rating, pairwise "A" = rollout_a, steps); '
        "null unmarks an owner-set gold item.",
    )


# --- judges -----------------------------------------------------------------------------------------


class JudgeRunSerializer(serializers.ModelSerializer):
    project_name = project_name_field()
    reward: serializers.PrimaryKeyRelatedField = serializers.PrimaryKeyRelatedField(read_only=True, allow_null=True)
    created_by = serializers.CharField(source="created_by.username", default=None, allow_null=True, read_only=True)
    state = serializers.CharField(read_only=True, help_text="queued, running, done or failed")

    class Meta:
        model = JudgeRun
        fields = [
            "id",
            "project",
            "project_name",
            "campaign",
            "source",
            "reward",
            "reward_name",
            "threshold",
            "score_min",
            "score_max",
            "state",
            "total",
            "scored",
            "failed_samples",
            "error",
            "created_by",
            "created_at",
            "started_at",
            "finished_at",
        ]
        read_only_fields = fields


class _JudgeSettingsSerializer(serializers.Serializer):
    reward = ReadableRelatedField(
        queryset=RewardFunction.objects.all(), help_text="The registered reward that judges (its id; in the project)."
    )
    threshold = serializers.FloatField(default=0.5, help_text="Pass/fail: a score at or above it is a pass.")
    score_min = serializers.FloatField(default=0.0, help_text="Ratings: the score of the scale's lowest point.")
    score_max = serializers.FloatField(default=1.0, help_text="Ratings: the score of the scale's highest point.")


class JudgeCreateSerializer(_JudgeSettingsSerializer):
    pass


class JudgePoolCreateSerializer(_JudgeSettingsSerializer):
    project = project_input_field()
    source = serializers.JSONField(help_text='{"runs": [run ids], "steps": [..] or "step_range": [first, last]}')


class JudgeRegisterSerializer(serializers.Serializer):
    project = project_input_field("The project the reward is registered in (its id or name). Default: the judge run's.")
    name = serializers.CharField(max_length=200, help_text="The new reward's name in the registry.")
    question = serializers.CharField(
        required=False, allow_null=True, default=None, help_text="The question whose kappa counts (default: first)."
    )


class ExportRegisterSerializer(serializers.Serializer):
    project = project_input_field("The project the dataset is registered in (its id or name). Default: the campaign's.")
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
    instructions_html = serializers.CharField(help_text="The instructions rendered (markdown).")
    kind = serializers.CharField()
    blind = serializers.BooleanField()
    questions = serializers.JSONField(help_text="Each with help_html and (ratings) rubric_html, one per point.")


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
    steps = serializers.DictField(
        allow_null=True,
        help_text="With a steps question: texts and starts (the response cut into steps), unit (sentence or "
        "token) and tokens (the token pieces, when marked by token).",
    )
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
    suggestion = serializers.DictField(
        allow_null=True,
        help_text="When the campaign shows them: the latest judge's answers (pairwise as shown) and scores.",
    )
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
    run = serializers.UUIDField(allow_null=True)
    run_name = serializers.CharField(allow_null=True)
    step = serializers.IntegerField(allow_null=True)
    index = serializers.IntegerField(allow_null=True)
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
    gold = serializers.DictField(allow_null=True, help_text="Known answers of a gold item.")
    gold_source = serializers.CharField(help_text='"owner", "dataset" or "" (not gold).')
    review_state = serializers.CharField(help_text='"pending", "decided" or "" (no review needed).')
    disputed = serializers.ListField(child=serializers.CharField(), help_text="Questions the annotators disagree on.")
    decision = serializers.DictField(allow_null=True)
    decided_by = serializers.CharField(allow_null=True)
    decided_at = serializers.DateTimeField(allow_null=True)
    labels = serializers.DictField(help_text="Per graded question: {value, source: gold|decision|annotators}.")
    judge = serializers.DictField(allow_null=True, help_text="The latest judge run's answers and scores.")


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


class AgreementAfterSerializer(serializers.Serializer):
    questions = QuestionAgreementSerializer(many=True)


class AgreementSerializer(serializers.Serializer):
    campaign = serializers.IntegerField()
    annotators = serializers.ListField(child=serializers.CharField())
    judgements = serializers.IntegerField()
    questions = QuestionAgreementSerializer(many=True, help_text="Before adjudication.")
    after_adjudication = AgreementAfterSerializer(help_text="Decided items' answers replaced by the decision.")
    adjudication = serializers.DictField(help_text="{pending, decided} items.")
    gold = serializers.DictField(
        help_text="{items, policy, annotators: [{annotator, answered, correct, accuracy, counted, set_aside, weight}]}"
    )
    annotator_stats = serializers.ListField(
        child=serializers.DictField(),
        help_text=(
            "Per annotator: {annotator, items_judged, mean_seconds, questions: {key: {answered, pass_rate | mean | "
            "choices | tag_rates, agreement_with_majority {rate, items} | mean_abs_diff_from_others {value, items}}}}"
        ),
    )


# --- reviewers -----------------------------------------------------------------------------------


class ReviewerQueueEntrySerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    kind = serializers.CharField()
    state = serializers.CharField()
    pending = serializers.IntegerField(help_text="Items waiting for a decision.")
    held_by_others = serializers.IntegerField()
    decided = serializers.IntegerField()
    decided_by_me = serializers.IntegerField()


class ReviewerItemSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    campaign = serializers.IntegerField()
    position = serializers.IntegerField()
    kind = serializers.CharField()
    prompt = serializers.CharField()
    reference = serializers.CharField(allow_null=True)
    responses = ResponseViewSerializer(many=True, help_text='In stored order: "A" is rollout_a.')
    judgements = serializers.ListField(child=serializers.DictField(), help_text="[{annotator, answers}]")
    disputed = serializers.ListField(child=serializers.CharField())
    agreed = serializers.DictField(help_text="The answer of the graded questions nobody disputes.")
    judge = serializers.DictField(allow_null=True)
    review_state = serializers.CharField()
    decision = serializers.DictField(allow_null=True)
    locked_until = serializers.DateTimeField(allow_null=True)


class NextReviewSerializer(serializers.Serializer):
    campaign = AnnotatorCampaignSerializer()
    item = ReviewerItemSerializer()
    queue = ReviewerQueueEntrySerializer()


class DecisionBodySerializer(serializers.Serializer):
    answers = serializers.JSONField(
        help_text='The item\'s label: graded question key to answer (pairwise "A" = rollout_a, as shown to '
        "reviewers); the disputed questions are required."
    )
    claim_next = serializers.BooleanField(default=False, help_text="Also claim and return the next item.")


class DecisionResponseSerializer(serializers.Serializer):
    item = serializers.IntegerField()
    decision = serializers.DictField()
    decided_by = serializers.CharField()
    queue = ReviewerQueueEntrySerializer()
    next = NextReviewSerializer(allow_null=True, required=False)
