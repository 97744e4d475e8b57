"""Rewinding a run's store to a checkpoint step (W&B's rewind): what it recorded after that step is dropped,
because the run resumes from the checkpoint and records those steps again. A preempted run stopped at the
deadline (posttrain.scheduling.services) is the one case: the steps after its last checkpoint are lost."""

from __future__ import annotations

import uuid

from django.db import transaction
from django.db.models import Min

from posttrain.runs.models import Checkpoint, Run
from posttrain.telemetry import series
from posttrain.telemetry.models import MetricBlock, MetricRow, RolloutFile, RunLog


def run_rewind(run_id: uuid.UUID | str, step: int) -> int:
    """Drop the run's metrics, rollout-file index rows, checkpoints and logs of steps after `step`; returns how many metric
    steps were dropped. Sealed metric blocks that reach past `step` are unsealed (their points stay in the
    MetricRows they were sealed from and are sealed again as the run goes on), and the summary is rebuilt."""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        later = MetricRow.objects.filter(run=run, step__gt=step)
        dropped = later.values("step").distinct().count()
        first_seal = MetricBlock.objects.filter(run=run, last_step__gt=step).aggregate(low=Min("through_seq"))["low"]
        if first_seal is not None:
            MetricBlock.objects.filter(run=run, through_seq__gte=first_seal).delete()
        later.delete()
        # The files stay: the resumed engine writes those steps' files again under the same names.
        RolloutFile.objects.filter(run=run, step__gt=step).delete()
        Checkpoint.objects.filter(run=run, step__gt=step).delete()
        RunLog.objects.filter(run=run, step__gt=step).delete()
        rows = [
            {"seq": seq, "step": s, "time": time, "data": values}
            for seq, s, time, values in MetricRow.objects.filter(run=run)
            .order_by("seq")
            .values_list("seq", "step", "time", "values")
        ]
        summary = series.summary_with({}, rows)
        last = max((row["step"] for row in rows), default=None)
        Run.objects.filter(pk=run.pk).update(summary=summary, last_step=last)
    return dropped
