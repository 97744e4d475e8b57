"""What a run reports, as the platform keeps it: the metric series (the raw events and their column-store
blocks), the index of its rollout files, and its log lines. Written by ingestion only."""

from __future__ import annotations

from django.db import models

from posttrain.runs.models import Run


class MetricRow(models.Model):
    """All metrics of one `metrics` event: one row per (run, step) keeps ingestion to one insert per step."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="metric_rows")
    seq = models.BigIntegerField()
    step = models.IntegerField()
    time = models.FloatField()
    values = models.JSONField()

    class Meta:
        ordering = ["step", "seq"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="unique_metric_seq")]
        indexes = [
            models.Index(fields=["run", "step"], name="runs_metric_run_id_94ac23_idx")
        ]  # its name from the runs app


class MetricBlock(models.Model):
    """A column-store chunk of one metric of one run (posttrain.telemetry.series): its points among a run of
    BLOCK_POINTS consecutive metrics events, as packed little-endian float64 arrays in seq order.
    Written once, never updated. Reading one metric of a long run reads a few dozen blocks instead of
    every wide MetricRow; MetricRow stays the raw event log (and holds the unsealed tail)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="metric_blocks")
    name = models.CharField(max_length=200)
    index = models.IntegerField(help_text="Position of the block in the metric's series, from 0.")
    through_seq = models.BigIntegerField(
        help_text="Every metrics event of the run up to this seq is in blocks; later ones are read from MetricRow."
    )
    count = models.IntegerField()
    first_step = models.IntegerField()
    last_step = models.IntegerField()
    min = models.FloatField(null=True, help_text="Over the finite values; null when there is none.")
    max = models.FloatField(null=True)
    steps = models.BinaryField()
    values = models.BinaryField(help_text="NaN where the engine reported a non-finite value (or null).")
    times = models.BinaryField(help_text="Event time (seconds since the epoch) of each point.")
    # The block's overview (series.OVERVIEW_BUCKET_POINTS): the points M4 keeps of each bucket of 64
    # consecutive points, what a chart of a long run reads instead of every point.
    overview_steps = models.BinaryField(default=b"")
    overview_values = models.BinaryField(default=b"")
    overview_times = models.BinaryField(default=b"")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "name", "index"], name="unique_metric_block")]
        indexes = [models.Index(fields=["run", "through_seq"], name="runs_metricblock_sealed_idx")]


class RolloutFile(models.Model):
    """One step's rollout file in the store (posttrain.telemetry.rollouts; docs/ROLLOUTS.md): the index the
    platform keeps per step instead of a row per rollout. Written from the `samples` event that announced
    the file (its statistics computed by whoever wrote it), deleted when the engine's retention removed it."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="rollout_files")
    seq = models.BigIntegerField(help_text="Seq of the samples event that announced the file (live-stream replay).")
    step = models.IntegerField()
    part = models.IntegerField(default=0, help_text="0, or the n-th further batch an external run logged for the step.")
    name = models.CharField(max_length=40, help_text="step_<step>.parquet in the run's rollout folder.")
    rows = models.IntegerField()
    bytes = models.BigIntegerField()
    sha256 = models.CharField(max_length=64, blank=True)
    stats = models.JSONField(
        default=dict, blank=True, help_text="reward and length {count, mean, min, max}, finish_reasons, kept."
    )

    class Meta:
        ordering = ["step", "part"]
        constraints = [models.UniqueConstraint(fields=["run", "step", "part"], name="unique_rollout_file")]
        indexes = [models.Index(fields=["run", "seq"], name="runs_rolloutfile_seq_idx")]


class RunLog(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="logs")
    seq = models.BigIntegerField()
    step = models.IntegerField(null=True)
    time = models.FloatField()
    level = models.CharField(max_length=20, default="info")
    message = models.TextField()

    class Meta:
        ordering = ["seq"]
