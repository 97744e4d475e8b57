"""Items hold their own copy of the rollouts they show (ReviewRollout) instead of foreign keys to
runs.Sample: every existing item's samples are copied over, with their reference (run, step, index).
Adds gold items, adjudication, reviewers and judge runs."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

SAMPLE_FIELDS = ("step", "index", "group", "prompt", "response", "label", "reward", "components", "finish_reason")


def copy_samples(apps, schema_editor):
    """One ReviewRollout per (campaign, sample) an item points at; pairs share nothing but the prompt."""
    item_model = apps.get_model("review", "ReviewItem")
    rollout_model = apps.get_model("review", "ReviewRollout")
    copies: dict[tuple[int, int], int] = {}

    def copy(campaign_id, sample):
        key = (campaign_id, sample.pk)
        if key not in copies:
            tokens = sample.tokens if isinstance(sample.tokens, dict) else {}
            rollout = rollout_model.objects.create(
                campaign_id=campaign_id,
                run_id=sample.run_id,
                tokens=tokens,
                **{name: getattr(sample, name) for name in SAMPLE_FIELDS},
            )
            copies[key] = rollout.pk
        return copies[key]

    items = item_model.objects.select_related("sample_a", "sample_b").order_by("pk")
    for item in items.iterator(chunk_size=500):
        item.rollout_a_id = copy(item.campaign_id, item.sample_a)
        item.rollout_b_id = None if item.sample_b is None else copy(item.campaign_id, item.sample_b)
        item.save(update_fields=["rollout_a", "rollout_b"])


class Migration(migrations.Migration):
    dependencies = [
        ("review", "0001_initial"),
        ("runs", "0009_run_attempt"),
        ("registry", "0003_reward_trial"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="ReviewRollout",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("step", models.IntegerField(blank=True, null=True)),
                ("index", models.IntegerField(blank=True, null=True)),
                ("group", models.IntegerField(default=0)),
                ("prompt", models.TextField()),
                ("response", models.TextField()),
                ("label", models.TextField(blank=True, help_text="The dataset's reference answer, if any.", null=True)),
                ("reward", models.FloatField(blank=True, null=True)),
                ("components", models.JSONField(blank=True, default=dict)),
                ("finish_reason", models.CharField(blank=True, max_length=20)),
                (
                    "tokens",
                    models.JSONField(blank=True, default=dict, help_text="The per-token view, when the step had one."),
                ),
                (
                    "dataset_row",
                    models.IntegerField(blank=True, help_text="Gold rows: the dataset row (0-based).", null=True),
                ),
                (
                    "campaign",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="rollouts", to="review.campaign"
                    ),
                ),
                (
                    "dataset",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to="registry.dataset",
                    ),
                ),
                (
                    "run",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to="runs.run",
                    ),
                ),
            ],
            options={"ordering": ["campaign", "run", "step", "index"]},
        ),
        migrations.AlterField(
            model_name="campaign",
            name="instructions",
            field=models.TextField(blank=True, help_text="Markdown, shown to annotators beside every item."),
        ),
        migrations.AddField(
            model_name="campaign",
            name="reviewers",
            field=models.ManyToManyField(
                blank=True,
                help_text="Who adjudicates.",
                related_name="adjudicated_campaigns",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddField(
            model_name="campaign",
            name="review_rating_spread",
            field=models.PositiveIntegerField(
                default=2, help_text="Ratings this many points apart (or more) send a complete item to the reviewers."
            ),
        ),
        migrations.AddField(
            model_name="campaign",
            name="gold_spec",
            field=models.JSONField(
                blank=True, help_text="Gold items drawn from a dataset at creation (normalised), if any.", null=True
            ),
        ),
        migrations.AddField(
            model_name="campaign",
            name="gold_policy",
            field=models.JSONField(
                default=dict, help_text="How gold accuracy weighs judgements: min_accuracy, min_items, weighting."
            ),
        ),
        migrations.AddField(
            model_name="campaign",
            name="show_suggestions",
            field=models.BooleanField(
                default=False, help_text="Show annotators the latest judge run's pre-labels (else they judge blind)."
            ),
        ),
        migrations.AddField(
            model_name="reviewitem",
            name="rollout_a",
            field=models.ForeignKey(
                null=True, on_delete=django.db.models.deletion.CASCADE, related_name="+", to="review.reviewrollout"
            ),
        ),
        migrations.AddField(
            model_name="reviewitem",
            name="rollout_b",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="+",
                to="review.reviewrollout",
            ),
        ),
        migrations.RunPython(copy_samples, migrations.RunPython.noop),
        migrations.RemoveField(model_name="reviewitem", name="sample_a"),
        migrations.RemoveField(model_name="reviewitem", name="sample_b"),
        migrations.AlterField(
            model_name="reviewitem",
            name="rollout_a",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE, related_name="+", to="review.reviewrollout"
            ),
        ),
        migrations.AlterField(
            model_name="reviewitem",
            name="display_swap",
            field=models.BooleanField(
                default=False,
                help_text="Pairs: show rollout_b as A (position bias); stored answers always mean rollout_a/b.",
            ),
        ),
        migrations.AddField(
            model_name="reviewitem",
            name="gold",
            field=models.JSONField(
                blank=True, help_text="Known answers (question key -> answer, as stored).", null=True
            ),
        ),
        migrations.AddField(
            model_name="reviewitem",
            name="gold_source",
            field=models.CharField(
                blank=True,
                choices=[("", "Not gold"), ("owner", "Set by the campaign's owner"), ("dataset", "A row of a gold dataset")],
                default="",
                max_length=10,
            ),
        ),
        migrations.AddField(
            model_name="reviewitem",
            name="review_state",
            field=models.CharField(
                blank=True,
                choices=[
                    ("", "No review needed"),
                    ("pending", "Annotators disagree: waiting for a reviewer"),
                    ("decided", "A reviewer decided"),
                ],
                db_index=True,
                default="",
                max_length=10,
            ),
        ),
        migrations.AddField(
            model_name="reviewitem",
            name="decision",
            field=models.JSONField(blank=True, help_text="The reviewer's answers: the item's label.", null=True),
        ),
        migrations.AddField(
            model_name="reviewitem",
            name="decided_by",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AddField(
            model_name="reviewitem",
            name="decided_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="reviewitem",
            index=models.Index(fields=["campaign", "review_state"], name="review_item_review_idx"),
        ),
        migrations.CreateModel(
            name="JudgeRun",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                (
                    "source",
                    models.JSONField(blank=True, help_text="A pool: runs and steps (normalised).", null=True),
                ),
                ("reward_name", models.CharField(help_text="Kept when the reward is deleted.", max_length=200)),
                ("spec", models.JSONField(help_text="The reward spec the worker scored with (a copy).")),
                ("threshold", models.FloatField(default=0.5, help_text="A score at or above it is a pass.")),
                (
                    "score_min",
                    models.FloatField(default=0.0, help_text="Ratings: the score mapped to the scale's lowest point."),
                ),
                (
                    "score_max",
                    models.FloatField(default=1.0, help_text="Ratings: the score mapped to the scale's highest point."),
                ),
                (
                    "state",
                    models.CharField(
                        choices=[("queued", "Queued"), ("running", "Running"), ("done", "Done"), ("failed", "Failed")],
                        db_index=True,
                        default="queued",
                        max_length=10,
                    ),
                ),
                ("total", models.PositiveIntegerField(default=0, help_text="Rollouts to score.")),
                ("scored", models.PositiveIntegerField(default=0, help_text="Rollouts scored so far.")),
                (
                    "failed_samples",
                    models.PositiveIntegerField(default=0, help_text="Rollouts the reward reported errors for."),
                ),
                (
                    "error",
                    models.TextField(
                        blank=True, help_text="Why the worker could not run it (not the reward's own errors)."
                    ),
                ),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("started_at", models.DateTimeField(blank=True, null=True)),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
                (
                    "campaign",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="judge_runs",
                        to="review.campaign",
                    ),
                ),
                (
                    "created_by",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                (
                    "reward",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to="registry.rewardfunction",
                    ),
                ),
            ],
            options={"ordering": ["-created_at", "-id"]},
        ),
        migrations.CreateModel(
            name="JudgeScore",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("step", models.IntegerField(blank=True, null=True)),
                ("index", models.IntegerField(blank=True, null=True)),
                ("score", models.FloatField(blank=True, help_text="Null when the reward failed on it.", null=True)),
                ("errors", models.JSONField(blank=True, default=list)),
                (
                    "judge_run",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="scores", to="review.judgerun"
                    ),
                ),
                (
                    "rollout",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="review.reviewrollout",
                    ),
                ),
                (
                    "run",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="runs.run",
                    ),
                ),
            ],
            options={
                "ordering": ["judge_run", "id"],
                "constraints": [
                    models.UniqueConstraint(fields=("judge_run", "rollout"), name="unique_judge_score_rollout"),
                    models.UniqueConstraint(
                        fields=("judge_run", "run", "step", "index"), name="unique_judge_score_ref"
                    ),
                ],
            },
        ),
    ]
