"""The scheduler's four models move to the scheduling app, which takes them over in its 0001: they leave this
app's state only. Their tables, and every row in them, stay (the scheduling app renames them in its 0002)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("runs", "0015_metric_block_overview")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(
                    name='ClusterSample',
                ),
                migrations.DeleteModel(
                    name='ClusterSnapshot',
                ),
                migrations.RemoveField(
                    model_name='quota',
                    name='group',
                ),
                migrations.RemoveField(
                    model_name='quota',
                    name='user',
                ),
                migrations.DeleteModel(
                    name='Preemption',
                ),
                migrations.DeleteModel(
                    name='Quota',
                ),
            ],
            database_operations=[],
        )
    ]
