"""Each sealed MetricBlock gets its overview (posttrain.runs.series.block_overview): the points M4 keeps of
each bucket of 64 consecutive points. Blocks sealed before this migration get theirs computed here, so a
long run's chart reads overviews for its whole length."""

import numpy as np
from django.db import migrations, models

BATCH = 500


def fill_overviews(apps, schema_editor):
    from posttrain.telemetry.series import block_overview

    MetricBlock = apps.get_model("runs", "MetricBlock")
    pending = MetricBlock.objects.filter(overview_values=b"").order_by("pk")
    last_pk = 0
    while batch := list(pending.filter(pk__gt=last_pk)[:BATCH]):
        for block in batch:
            steps, values, times = (np.frombuffer(bytes(raw), dtype="<f8") for raw in (block.steps, block.values, block.times))
            block.overview_steps, block.overview_values, block.overview_times = block_overview(steps, values, times)
        MetricBlock.objects.bulk_update(batch, ["overview_steps", "overview_values", "overview_times"])
        last_pk = batch[-1].pk


class Migration(migrations.Migration):
    dependencies = [("runs", "0014_alert_webhooks")]

    operations = [
        migrations.AddField(model_name="metricblock", name="overview_steps", field=models.BinaryField(default=b"")),
        migrations.AddField(model_name="metricblock", name="overview_values", field=models.BinaryField(default=b"")),
        migrations.AddField(model_name="metricblock", name="overview_times", field=models.BinaryField(default=b"")),
        migrations.RunPython(fill_overviews, migrations.RunPython.noop),
    ]
