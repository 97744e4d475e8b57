"""The periodic check (Celery beat, `runs_reconcile`): every active native run against its Ray job, external runs
that went silent, then an admission pass."""

from __future__ import annotations

import contextlib
import logging
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from posttrain.core.errors import JobsUnavailable
from posttrain.runs.models import Run, RunKind
from posttrain.runs.services.external import external_runs_fail_lost
from posttrain.runs.services.state_machine import ACTIVE_STATES, S
from posttrain.scheduling.services.admission import runs_admit
from posttrain.scheduling.services.jobs import run_reconcile, run_submit
from posttrain.scheduling.services.jobs_api import JobsClient, default_jobs

logger = logging.getLogger(__name__)


def runs_reconcile(*, jobs: JobsClient | None = None, queued_grace_s: float | None = None, cluster=None) -> int:
    """The periodic check (Celery beat): every active native run against its Ray job; external runs
    whose client went silent fail as lost; then an admission pass (posttrain.scheduling.services).
    Under `POSTTRAIN_SCHEDULER=all-at-once`, runs queued for longer than `queued_grace_s` (default
    RUN_QUEUED_GRACE_S: their submit task was lost) are submitted again (idempotent) instead."""
    jobs = jobs or default_jobs()
    if queued_grace_s is None:
        queued_grace_s = settings.RUN_QUEUED_GRACE_S
    checked = external_runs_fail_lost()
    for run in Run.objects.filter(state__in=ACTIVE_STATES, kind=RunKind.NATIVE).order_by("created_at"):
        try:
            run_reconcile(run, jobs=jobs)
        except Exception:  # one unreachable job must not stop the others from being checked
            logger.warning("reconciling run %s failed", run.pk, exc_info=True)
        checked += 1
    if settings.SCHEDULER == "admission":
        try:
            runs_admit(cluster=cluster, jobs=jobs, refresh=True)
        except JobsUnavailable as exc:
            logger.info("admission skipped: %s", exc)  # the next check tries again
        return checked
    stale = timezone.now() - timedelta(seconds=queued_grace_s)
    queued = Run.objects.filter(state=S.QUEUED, state_changed_at__lt=stale, kind=RunKind.NATIVE)
    for run_id in queued.values_list("pk", flat=True):
        with contextlib.suppress(JobsUnavailable):  # still queued; the next check tries again
            run_submit(run_id, jobs=jobs)
        checked += 1
    return checked
