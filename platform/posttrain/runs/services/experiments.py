"""Experiments: a config completed from the registry (model, dataset, rewards) that passes the
engine's own validation, so a run of it never fails for a reason that could be checked up front."""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from posttrain.core.errors import InvalidInput
from posttrain.core.server_paths import run_config_check_user_paths, run_config_paths_resolve
from posttrain.projects.models import Project
from posttrain.registry.models import Dataset, ModelAsset, RewardFunction
from posttrain.registry.reward_specs import component_name
from posttrain.registry.services import dataset_copy, model_copy, reward_copy
from posttrain.runs.models import (
    Experiment,
    ExperimentReward,
)
from posttrain.runs.services.alert_webhooks import webhook_url_checked
from posttrain.runs.services.run_fields import clean_seed

# Set by the platform, never by the experiment's config (they come from the registry or the launch).
_PLATFORM_FIELDS = {
    "model.path": "comes from the experiment's registry model",
    "data.path": "comes from the experiment's registry dataset",
    "data.format": "comes from the experiment's registry dataset",
    "data.prompt_field": "comes from the experiment's registry dataset",
    "data.label_field": "comes from the experiment's registry dataset",
    "rewards": "comes from the experiment's rewards (registry reward functions with weights)",
    "logging.run_dir": "is set per run by the platform (<storage>/runs/<run id>)",
    "logging.rollouts_dir": "is set per run by the platform (<rollout store>/runs/<run id>/rollouts)",
}
PLATFORM_FIELDS: tuple[str, ...] = tuple(_PLATFORM_FIELDS)  # the launch form leaves these out
_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.\- ]+")


def _run_config_name(name: str) -> str:
    """The engine's run name from an experiment name (letters, digits, spaces and - _ . only)."""
    cleaned = _NAME_CHARS.sub("-", name).strip(" -")[:100]
    return cleaned or "experiment"


def build_engine_config(
    config: dict[str, Any],
    model: ModelAsset,
    dataset: Dataset,
    rewards: Sequence[tuple[RewardFunction, float]],
    *,
    name: str,
) -> dict[str, Any]:
    """The full engine config: the experiment's config plus model, data and rewards from the registry."""
    full = copy.deepcopy(config)
    full.setdefault("name", _run_config_name(name))
    for section in ("model", "data"):
        if section in full and not isinstance(full[section], dict):
            raise InvalidInput.one(section, f"must be an object, got {type(full[section]).__name__}")
    full["model"] = {**full.get("model", {}), "path": model.path}
    full["data"] = {
        **full.get("data", {}),
        "path": dataset.path,
        "format": dataset.format,
        "prompt_field": dataset.prompt_field,
        "label_field": dataset.label_field or None,
    }
    specs = []
    for reward, weight in rewards:
        spec = dict(reward.spec) if isinstance(reward.spec, dict) else {}
        spec.setdefault("name", component_name(reward.name, reward.kind)[:100])  # metrics read reward/<name>
        spec["weight"] = weight
        specs.append(spec)
    full["rewards"] = specs
    return full


def validated_engine_config_and_needs(
    full: dict[str, Any], *, user: Any = None, check_user_paths: bool = False
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The engine's own validation (rl_engine.config; a ConfigError becomes a 400 naming each `loc`) and the
    run's resource needs, from the one validated config. Every server path in it is resolved and checked
    against the import roots as they are now (posttrain.core.server_paths; the engine reads the resolved
    ones); `check_user_paths`: also whether `user` may name the paths typed into the config (create, validate)."""
    from rl_engine.spec.config import ConfigError, check_runnable, validate_config
    from rl_engine.spec.resources import resource_needs

    try:
        config = validate_config(full)
        check_runnable(config)  # refused at launch, not as a failed run later
    except ConfigError as exc:
        raise InvalidInput(exc.errors) from None
    if check_user_paths:
        run_config_check_user_paths(config, user)
    return run_config_paths_resolve(config.model_dump(mode="json"), config), resource_needs(config)


def nul_at(value: Any, loc: str = "") -> str | None:
    """Where a NUL character hides in a JSON value (Postgres jsonb cannot store one), or None."""
    if isinstance(value, str):
        return loc if "\x00" in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{loc}.{key}" if loc else str(key)
            if "\x00" in str(key):
                return here
            found = nul_at(item, here)
            if found is not None:
                return found
    if isinstance(value, list):
        for i, item in enumerate(value):
            found = nul_at(item, f"{loc}.{i}" if loc else str(i))
            if found is not None:
                return found
    return None


def _check_platform_fields(config: dict[str, Any]) -> None:
    errors = []
    for dotted, why in _PLATFORM_FIELDS.items():
        section, _, key = dotted.partition(".")
        present = section in config if not key else isinstance(config.get(section), dict) and key in config[section]
        if present:
            errors.append({"loc": dotted, "msg": f"{why}; leave it out of the config"})
    if errors:
        raise InvalidInput(errors)


def _check_rewards(
    rewards: Sequence[tuple[RewardFunction, float]], config: dict[str, Any]
) -> list[tuple[RewardFunction, float]]:
    # A multi-turn environment or an agent scores its episodes itself; the engine checks the rest.
    plays_episodes = isinstance(config, dict) and bool(config.get("environment") or config.get("agent"))
    if not rewards and not plays_episodes:
        raise InvalidInput.one("rewards", "at least one reward function is required")
    errors, seen = [], set()
    for i, (reward, weight) in enumerate(rewards):
        if reward.pk in seen:
            errors.append({"loc": f"rewards[{i}].reward", "msg": f"reward {reward.name!r} is listed twice"})
        seen.add(reward.pk)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            errors.append({"loc": f"rewards[{i}].weight", "msg": "must be a finite number"})
    if errors:
        raise InvalidInput(errors)
    return [(reward, float(weight)) for reward, weight in rewards]


@dataclass(frozen=True)
class CheckedExperiment:
    rewards: list[tuple[RewardFunction, float]]
    # Validated, defaults filled in: what a run of the experiment gets, before its seed and run_dir.
    engine_config: dict[str, Any]
    # What a run of it holds on the cluster (rl_engine.distributed.placement.resource_needs).
    resources: dict[str, Any]


def _check_same_project(
    project: Project, model: ModelAsset, dataset: Dataset, rewards: Sequence[tuple[RewardFunction, float]]
) -> None:
    """An experiment refers to its own project's registry objects only: another project's are copied in first
    (a reference across projects would show their names to members who cannot read them, and keep their owners
    from deleting them)."""
    named: list[tuple[str, ModelAsset | Dataset | RewardFunction]] = [("model", model), ("dataset", dataset)]
    named += [(f"rewards[{i}].reward", reward) for i, (reward, _) in enumerate(rewards)]
    errors = [
        {"loc": loc, "msg": f"{obj.name!r} is in another project: copy it into {project.name!r} first"}
        for loc, obj in named
        if obj.project_id != project.pk
    ]
    if errors:
        raise InvalidInput(errors)


def experiment_check(
    *,
    project: Project,
    name: str,
    model: ModelAsset,
    dataset: Dataset,
    rewards: Sequence[tuple[RewardFunction, float]],
    config: dict[str, Any],
    user: Any = None,
    webhook_url: str = "",
) -> CheckedExperiment:
    """Every check `experiment_create` makes, writing nothing: the launch form validates with it as
    the researcher types, so the form and the create can never disagree. `user` names the server paths of
    the config (None: the platform itself, e.g. a management command)."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidInput.one("name", "required")
    if len(name) > 200:
        raise InvalidInput.one("name", "at most 200 characters")
    if not isinstance(config, dict):
        raise InvalidInput.one("config", f"must be an object (the engine run config), got {type(config).__name__}")
    nul = nul_at(config)
    if nul is not None:
        raise InvalidInput.one(nul or "config", "contains a NUL character")
    rewards = _check_rewards(rewards, config)
    _check_same_project(project, model, dataset, rewards)
    webhook_url_checked(webhook_url)
    _check_platform_fields(config)
    if "seed" in config:  # the launch defaults to it, so a seed the launch refuses is refused here already
        clean_seed(config["seed"], 0)
    engine_config, resources = validated_engine_config_and_needs(
        build_engine_config(config, model, dataset, rewards, name=name), user=user, check_user_paths=True
    )
    return CheckedExperiment(rewards, engine_config, resources)


def experiment_create(
    *,
    project: Project,
    name: str,
    model: ModelAsset,
    dataset: Dataset,
    rewards: Sequence[tuple[RewardFunction, float]],
    config: dict[str, Any],
    user=None,
    description: str = "",
    webhook_url: str = "",
) -> Experiment:
    """An experiment whose config, completed from the registry, passes the engine's validation.

    `config` is stored as given (without model.path, data.* of the dataset, rewards, logging.run_dir).
    `webhook_url`: where its runs' critical alerts go (services.alert_webhooks), checked by the outbound policy."""
    rewards = experiment_check(
        project=project,
        name=name,
        model=model,
        dataset=dataset,
        rewards=rewards,
        config=config,
        user=user,
        webhook_url=webhook_url,
    ).rewards
    with transaction.atomic():
        experiment = Experiment.objects.create(
            project=project,
            name=name.strip(),
            description=description or "",
            model=model,
            dataset=dataset,
            config=config,
            webhook_url=webhook_url_checked(webhook_url),
            created_by=user if getattr(user, "is_authenticated", False) else None,
        )
        ExperimentReward.objects.bulk_create(
            ExperimentReward(experiment=experiment, reward=reward, weight=weight, position=i)
            for i, (reward, weight) in enumerate(rewards)
        )
    return experiment


def experiment_engine_config(experiment: Experiment) -> dict[str, Any]:
    if experiment.is_external:
        raise InvalidInput.one(
            "experiment", f"{experiment.name!r} is a project of external runs: nothing launches from it"
        )
    if experiment.model is None or experiment.dataset is None:
        raise InvalidInput.one("experiment", f"{experiment.name!r} has no model or dataset to launch with")
    rewards = [(link.reward, link.weight) for link in experiment.experimentreward_set.select_related("reward")]
    return build_engine_config(experiment.config, experiment.model, experiment.dataset, rewards, name=experiment.name)


def experiment_copy(experiment: Experiment, project: Project, *, user=None) -> Experiment:
    """The experiment in another project, with its model, dataset and rewards copied there (each reused where the
    project already holds the same one: the same folder, content or spec under the same name). The caller checked
    that the user reads the experiment and creates in `project`."""
    if experiment.model is None or experiment.dataset is None:
        raise InvalidInput.one("experiment", f"{experiment.name!r} has no model or dataset to copy")
    links = list(experiment.experimentreward_set.select_related("reward"))
    with transaction.atomic():
        model = _model_in(project, experiment.model, user)
        dataset, _ = dataset_copy(experiment.dataset, project, user=user)
        copy = Experiment.objects.create(
            project=project,
            name=experiment.name,
            description=experiment.description,
            model=model,
            dataset=dataset,
            config=experiment.config,
            created_by=user if getattr(user, "is_authenticated", False) else None,
        )
        ExperimentReward.objects.bulk_create(
            ExperimentReward(
                experiment=copy, reward=_reward_in(project, link.reward, user), weight=link.weight, position=i
            )
            for i, link in enumerate(links)
        )
    return copy


def _free_name(model: Any, project: Project, name: str, source_project: Project) -> str:
    taken = model.objects.filter(project=project, name=name).exists()
    return name if not taken else f"{name} (from {source_project.name})"[:200]


def _model_in(project: Project, model: ModelAsset, user: Any) -> ModelAsset:
    same = ModelAsset.objects.filter(project=project, name=model.name, path=model.path).first()
    if same is not None:
        return same
    return model_copy(model, project, name=_free_name(ModelAsset, project, model.name, model.project), user=user)


def _reward_in(project: Project, reward: RewardFunction, user: Any) -> RewardFunction:
    same = RewardFunction.objects.filter(project=project, name=reward.name, kind=reward.kind, spec=reward.spec).first()
    if same is not None:
        return same
    return reward_copy(
        reward, project, name=_free_name(RewardFunction, project, reward.name, reward.project), user=user
    )
