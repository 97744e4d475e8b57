"""The scheduler's models, taken over from the runs app (its 0016) as they are: in this app's state, on their
existing tables (0002 renames the tables), their content types and with them their permissions moved here."""

import django.core.validators
import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

from posttrain.core.model_moves import content_type_moves


move_content_types, move_content_types_back = content_type_moves(("clustersample", "clustersnapshot", "preemption", "quota"), "runs", "scheduling")


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ('auth', '0012_alter_user_first_name_max_length'),
        ('runs', '0016_scheduler_models_to_scheduling'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='ClusterSample',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('at', models.DateTimeField(db_index=True)),
                        ('total', models.JSONField(default=dict)),
                        ('granted', models.JSONField(default=dict)),
                        ('used', models.JSONField(default=dict)),
                    ],
                    options={
                        'db_table': 'runs_clustersample',
                        'ordering': ['at'],
                    },
                ),
                migrations.CreateModel(
                    name='ClusterSnapshot',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('nodes', models.JSONField(default=list, help_text='[{"node_id", "address", "total": {...}, "free": {...}}]')),
                        ('total', models.JSONField(default=dict)),
                        ('free', models.JSONField(default=dict)),
                        ('taken_at', models.DateTimeField(blank=True, null=True)),
                    ],
                    options={
                        'db_table': 'runs_clustersnapshot',
                    },
                ),
                migrations.CreateModel(
                    name='Preemption',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('reason', models.TextField(blank=True)),
                        ('requested_at', models.DateTimeField(auto_now_add=True)),
                        ('settled_at', models.DateTimeField(blank=True, null=True)),
                        ('forced', models.BooleanField(default=False, help_text='Stopped at the deadline rather than at a step boundary.')),
                        ('step', models.IntegerField(blank=True, help_text='The last step it had reported when it left.', null=True)),
                        ('resumed_step', models.IntegerField(blank=True, help_text='The checkpoint step it resumes after.', null=True)),
                        ('lost_steps', models.PositiveIntegerField(default=0)),
                        ('run', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='preemptions', to='runs.run')),
                    ],
                    options={
                        'db_table': 'runs_preemption',
                        'ordering': ['requested_at', 'id'],
                    },
                ),
                migrations.CreateModel(
                    name='Quota',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('max_runs', models.PositiveIntegerField(blank=True, help_text='Concurrent runs.', null=True)),
                        ('max_cpus', models.FloatField(blank=True, help_text='CPUs held at once.', null=True)),
                        ('max_gpus', models.FloatField(blank=True, help_text='GPUs held at once.', null=True)),
                        ('weight', models.FloatField(default=1.0, help_text="Fair share: the user's or team's share of the cluster over time, relative to the others'.", validators=[django.core.validators.MinValueValidator(0.001)])),
                        ('borrowing', models.BooleanField(default=False, help_text="A team's quota only: its CPU and GPU limits are a guarantee rather than a cap. Its runs may borrow idle room beyond them, and another team within its own quota takes that room back by preemption.")),
                        ('group', models.OneToOneField(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='run_quota', to='auth.group')),
                        ('user', models.OneToOneField(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='run_quota', to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        'db_table': 'runs_quota',
                        'constraints': [models.CheckConstraint(condition=models.Q(models.Q(('group__isnull', True), ('user__isnull', False)), models.Q(('group__isnull', False), ('user__isnull', True)), _connector='OR'), name='quota_for_a_user_or_a_group')],
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(move_content_types, move_content_types_back),
    ]
