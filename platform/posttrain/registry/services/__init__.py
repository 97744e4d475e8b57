"""Writes of the registry, one module per asset: `model_assets.py`, `datasets.py`, `rewards.py`, and
`model_imports.py` (GGUF files converted into models, on a worker), `reward_try.py` (trying a reward out and
checking new code, on a worker), `reward_probes.py` (probing a reward with adversarial answers, on a worker),
`environments.py` (installed environments: generated on a worker, tried, mixed); `common.py` holds what they
share (names, deletes, storage).

Every problem with the input raises Django's ValidationError keyed by the input field
(`{"path": ["no config.json in /x"]}`), deleting an asset an experiment uses raises AssetInUse;
the API answers them as 400 and 409 in the error contract (posttrain.core.api.errors).
"""

from posttrain.registry.services.common import AssetInUse
from posttrain.registry.services.datasets import (
    dataset_copy,
    dataset_delete,
    dataset_register_path,
    dataset_register_platform_file,
    dataset_update,
    dataset_upload,
)
from posttrain.registry.services.environments import (
    environment_create,
    environment_delete,
    environment_generate,
    environment_trial_run,
    environment_try,
    environments_mix,
)
from posttrain.registry.services.model_assets import (
    model_copy,
    model_delete,
    model_register,
    model_register_checkpoint,
    model_update,
)
from posttrain.registry.services.model_imports import (
    model_import_path,
    model_import_run,
    model_import_upload,
    model_imports_expire,
)
from posttrain.registry.services.reward_probes import reward_probe_run, reward_probe_start
from posttrain.registry.services.reward_try import (
    MAX_TRY_SAMPLES,
    WorkerUnavailable,
    reward_import_check,
    reward_trial_run,
    reward_try,
)
from posttrain.registry.services.rewards import reward_copy, reward_create, reward_delete, reward_update

__all__ = [
    "MAX_TRY_SAMPLES",
    "AssetInUse",
    "WorkerUnavailable",
    "dataset_copy",
    "dataset_delete",
    "dataset_register_path",
    "dataset_register_platform_file",
    "dataset_update",
    "dataset_upload",
    "environment_create",
    "environment_delete",
    "environment_generate",
    "environment_trial_run",
    "environment_try",
    "environments_mix",
    "model_copy",
    "model_delete",
    "model_import_path",
    "model_import_run",
    "model_import_upload",
    "model_imports_expire",
    "model_register",
    "model_register_checkpoint",
    "model_update",
    "reward_copy",
    "reward_create",
    "reward_delete",
    "reward_import_check",
    "reward_probe_run",
    "reward_probe_start",
    "reward_trial_run",
    "reward_try",
    "reward_update",
]
