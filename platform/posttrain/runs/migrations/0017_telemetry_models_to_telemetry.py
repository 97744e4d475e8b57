"""What a run reports (MetricRow, MetricBlock, RolloutFile, RunLog) moves to the telemetry app, which takes the
models over in its 0001: they leave this app's state only. Their tables, and every row in them, stay (the
telemetry app renames them in its 0002)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("runs", "0016_scheduler_models_to_scheduling")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveField(
                    model_name='metricrow',
                    name='run',
                ),
                migrations.RemoveField(
                    model_name='rolloutfile',
                    name='run',
                ),
                migrations.RemoveField(
                    model_name='runlog',
                    name='run',
                ),
                migrations.DeleteModel(
                    name='MetricBlock',
                ),
                migrations.DeleteModel(
                    name='MetricRow',
                ),
                migrations.DeleteModel(
                    name='RolloutFile',
                ),
                migrations.DeleteModel(
                    name='RunLog',
                ),
            ],
            database_operations=[],
        )
    ]
