"""Writes of the runs app, one module per concept:

- `experiments.py`: experiments, their config completed from the registry and validated by the engine;
- `state_machine.py`: `run_transition`, the only place a run changes state (compare-and-set; other apps act on a
  move through posttrain.runs.hooks);
- `launch.py`: launch, clone, resume, edit and cancel (web side; tasks dispatched after commit; the Ray jobs are
  posttrain.scheduling.services');
- `external.py`: runs of other engines tracked through the SDK (no job; lost when their client goes silent);
- `alert_webhooks.py`: the webhook an experiment's critical alerts go to (posttrain.telemetry.alerts sends them).
"""

from posttrain.runs.services.alert_webhooks import experiment_set_webhook, webhook_url_checked
from posttrain.runs.services.experiments import (
    PLATFORM_FIELDS,
    CheckedExperiment,
    build_engine_config,
    experiment_check,
    experiment_create,
    experiment_engine_config,
)
from posttrain.runs.services.external import ExternalRun, external_run_create, external_runs_fail_lost
from posttrain.runs.services.launch import run_cancel, run_clone, run_dir_for, run_launch, run_resume, run_update
from posttrain.runs.services.state_machine import ACTIVE_STATES, ALLOWED_TRANSITIONS, run_revive_lost, run_transition

__all__ = [
    "ACTIVE_STATES",
    "ALLOWED_TRANSITIONS",
    "PLATFORM_FIELDS",
    "CheckedExperiment",
    "ExternalRun",
    "build_engine_config",
    "experiment_check",
    "experiment_create",
    "experiment_engine_config",
    "experiment_set_webhook",
    "external_run_create",
    "external_runs_fail_lost",
    "run_cancel",
    "run_clone",
    "run_dir_for",
    "run_launch",
    "run_resume",
    "run_revive_lost",
    "run_transition",
    "run_update",
    "webhook_url_checked",
]
