"""The metric column store (MetricBlock), filled from the MetricRows already stored, with each run's summary."""

import django.db.models.deletion
from django.db import migrations, models


def backfill_metric_blocks(apps, schema_editor) -> None:
    """Blocks and Run.summary of every run from its MetricRows: full chunks of BLOCK_POINTS events
    sealed in seq order, as ingestion seals them; the rest stays in the MetricRow tail."""
    from posttrain.telemetry.series.sealing import BLOCK_POINTS, seal_chunk, summary_with

    Run = apps.get_model("runs", "Run")
    MetricRow = apps.get_model("runs", "MetricRow")
    MetricBlock = apps.get_model("runs", "MetricBlock")
    for run_id in MetricRow.objects.values_list("run_id", flat=True).distinct().order_by("run_id"):
        MetricBlock.objects.filter(run_id=run_id).delete()
        summary: dict = {}
        chunk: list[dict] = []
        rows = MetricRow.objects.filter(run_id=run_id).order_by("seq").values_list("seq", "step", "time", "values")
        for seq, step, time, values in rows.iterator(chunk_size=BLOCK_POINTS):
            chunk.append({"seq": seq, "step": step, "time": time, "data": values})
            if len(chunk) == BLOCK_POINTS:
                seal_chunk(run_id, chunk, block_model=MetricBlock)
                summary = summary_with(summary, chunk)
                chunk = []
        Run.objects.filter(pk=run_id).update(summary=summary_with(summary, chunk))


def delete_metric_blocks(apps, schema_editor) -> None:
    apps.get_model("runs", "MetricBlock").objects.all().delete()


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0003_run_summary_event_seqs"),
    ]

    operations = [
        migrations.CreateModel(
            name="MetricBlock",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("name", models.CharField(max_length=200)),
                ("index", models.IntegerField(help_text="Position of the block in the metric's series, from 0.")),
                ("through_seq", models.BigIntegerField(
                    help_text="Every metrics event of the run up to this seq is in blocks; later ones are read from "
                    "MetricRow.")),
                ("count", models.IntegerField()),
                ("first_step", models.IntegerField()),
                ("last_step", models.IntegerField()),
                ("min", models.FloatField(help_text="Over the finite values; null when there is none.", null=True)),
                ("max", models.FloatField(null=True)),
                ("steps", models.BinaryField()),
                ("values", models.BinaryField(help_text="NaN where the engine reported a non-finite value (or null).")),
                ("times", models.BinaryField(help_text="Event time (seconds since the epoch) of each point.")),
                ("run", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="metric_blocks",
                                          to="runs.run")),
            ],
            options={
                "indexes": [models.Index(fields=["run", "through_seq"], name="runs_metricblock_sealed_idx")],
                "constraints": [models.UniqueConstraint(fields=("run", "name", "index"), name="unique_metric_block")],
            },
        ),
        migrations.RunPython(backfill_metric_blocks, delete_metric_blocks),
    ]
