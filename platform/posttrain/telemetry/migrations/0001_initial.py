"""What a run reports, taken over from the runs app (its 0017) as it is: in this app's state, on the existing
tables (0002 renames them), their content types and with them their permissions moved here."""

import django.db.models.deletion
from django.db import migrations, models

from posttrain.core.model_moves import content_type_moves


move_content_types, move_content_types_back = content_type_moves(("metricrow", "metricblock", "rolloutfile", "runlog"), "runs", "telemetry")


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ('runs', '0017_telemetry_models_to_telemetry'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='RunLog',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('seq', models.BigIntegerField()),
                        ('step', models.IntegerField(null=True)),
                        ('time', models.FloatField()),
                        ('level', models.CharField(default='info', max_length=20)),
                        ('message', models.TextField()),
                        ('run', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='logs', to='runs.run')),
                    ],
                    options={
                        'db_table': 'runs_runlog',
                        'ordering': ['seq'],
                    },
                ),
                migrations.CreateModel(
                    name='MetricBlock',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('name', models.CharField(max_length=200)),
                        ('index', models.IntegerField(help_text="Position of the block in the metric's series, from 0.")),
                        ('through_seq', models.BigIntegerField(help_text='Every metrics event of the run up to this seq is in blocks; later ones are read from MetricRow.')),
                        ('count', models.IntegerField()),
                        ('first_step', models.IntegerField()),
                        ('last_step', models.IntegerField()),
                        ('min', models.FloatField(help_text='Over the finite values; null when there is none.', null=True)),
                        ('max', models.FloatField(null=True)),
                        ('steps', models.BinaryField()),
                        ('values', models.BinaryField(help_text='NaN where the engine reported a non-finite value (or null).')),
                        ('times', models.BinaryField(help_text='Event time (seconds since the epoch) of each point.')),
                        ('overview_steps', models.BinaryField(default=b'')),
                        ('overview_values', models.BinaryField(default=b'')),
                        ('overview_times', models.BinaryField(default=b'')),
                        ('run', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='metric_blocks', to='runs.run')),
                    ],
                    options={
                        'db_table': 'runs_metricblock',
                        'indexes': [models.Index(fields=['run', 'through_seq'], name='runs_metricblock_sealed_idx')],
                        'constraints': [models.UniqueConstraint(fields=('run', 'name', 'index'), name='unique_metric_block')],
                    },
                ),
                migrations.CreateModel(
                    name='MetricRow',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('seq', models.BigIntegerField()),
                        ('step', models.IntegerField()),
                        ('time', models.FloatField()),
                        ('values', models.JSONField()),
                        ('run', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='metric_rows', to='runs.run')),
                    ],
                    options={
                        'db_table': 'runs_metricrow',
                        'ordering': ['step', 'seq'],
                        'indexes': [models.Index(fields=['run', 'step'], name='runs_metric_run_id_94ac23_idx')],
                        'constraints': [models.UniqueConstraint(fields=('run', 'seq'), name='unique_metric_seq')],
                    },
                ),
                migrations.CreateModel(
                    name='RolloutFile',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('seq', models.BigIntegerField(help_text='Seq of the samples event that announced the file (live-stream replay).')),
                        ('step', models.IntegerField()),
                        ('part', models.IntegerField(default=0, help_text='0, or the n-th further batch an external run logged for the step.')),
                        ('name', models.CharField(help_text="step_<step>.parquet in the run's rollout folder.", max_length=40)),
                        ('rows', models.IntegerField()),
                        ('bytes', models.BigIntegerField()),
                        ('sha256', models.CharField(blank=True, max_length=64)),
                        ('stats', models.JSONField(blank=True, default=dict, help_text='reward and length {count, mean, min, max}, finish_reasons, kept.')),
                        ('run', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='rollout_files', to='runs.run')),
                    ],
                    options={
                        'db_table': 'runs_rolloutfile',
                        'ordering': ['step', 'part'],
                        'indexes': [models.Index(fields=['run', 'seq'], name='runs_rolloutfile_seq_idx')],
                        'constraints': [models.UniqueConstraint(fields=('run', 'step', 'part'), name='unique_rollout_file')],
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(move_content_types, move_content_types_back),
    ]
