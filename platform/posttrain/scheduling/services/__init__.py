"""Admission: the Celery worker's side of the scheduler (docs/ARCHITECTURE.md, "The scheduler").

`runs_admit` looks at the waiting native runs (queued, preempted) and the Ray cluster, and moves those
that fit now `queued → starting` in the order of posttrain.scheduling.rules, then submits their Ray
jobs; every other waiting run gets its queue position and the reason it waits. It runs when a run is
launched, when a run stops holding resources (it ends, fails, is cancelled or preempted) and on the
periodic reconcile.

Preemption: when the run at the head of the queue does not fit, running runs of a lower priority may
be moved `running → preempting` to make room (posttrain.scheduling.rules.preemption_victims). Their
engines are asked (a request file in the run folder, rl_engine/preemption.py) to checkpoint at the
next step boundary and exit; each then reports `preempted`, goes back to the queue, and when admitted
again resumes from that checkpoint as its next Ray job (`Run.attempt`, `Run.ray_job_id`).

The Ray jobs (`jobs.py`): the one submit (`run_submit`, for a queued run under all-at-once and for each run a pass
admitted), the stop of a cancelled run, and the reconcile of each active run against its job; the periodic pass over
them all, then admission, is `reconcile.py`'s `runs_reconcile`.

Safe under any number of workers: a pass holds a row lock on the ClusterSnapshot row for its whole
transaction, so passes run one after another, each seeing the grants of the ones before; and the
move to `starting` is a compare-and-set, so a run cancelled meanwhile is never admitted.

What is free: the cluster's total minus what the platform's own holding runs were granted (their
stored resource needs), minus what Ray reports in use beyond those grants (other jobs on the
cluster). Ray's report lags a few seconds behind; counting grants from the database makes a run that
was just admitted count at once and one that just ended free at once (Ray starts the next job as
soon as the old one's process is gone: its own enforcement, the entrypoint resources and the
placement group, is the last word).
"""

from posttrain.scheduling.services.admission import run_set_priority, runs_admit
from posttrain.scheduling.services.cluster import RAY_REPORT_LAG_S
from posttrain.scheduling.services.jobs import run_reconcile, run_stop, run_submit
from posttrain.scheduling.services.jobs_api import JobsClient, default_jobs
from posttrain.scheduling.services.preemption import (
    preemption_forced,
    record_preemption_settled,
    run_preemption_deadline,
    run_preemption_settle,
    run_request_preemption,
)
from posttrain.scheduling.services.quotas import TeamQuota, holding_usage, project_quota_limits, quota_limits
from posttrain.scheduling.services.reconcile import runs_reconcile

__all__ = [
    "RAY_REPORT_LAG_S",
    "JobsClient",
    "TeamQuota",
    "default_jobs",
    "holding_usage",
    "preemption_forced",
    "project_quota_limits",
    "quota_limits",
    "record_preemption_settled",
    "run_preemption_deadline",
    "run_preemption_settle",
    "run_request_preemption",
    "run_set_priority",
    "run_reconcile",
    "run_stop",
    "run_submit",
    "runs_admit",
    "runs_reconcile",
]
