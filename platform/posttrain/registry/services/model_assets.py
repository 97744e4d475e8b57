"""Models: a Hugging Face folder on the server, a run's checkpoint copied into the storage root, or a folder the
platform converted from a GGUF (model_imports.py) moved into it."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Any

from django.contrib.auth.models import AnonymousUser, User

from posttrain.core.server_paths import resolve_run_checkpoint, resolve_user_path
from posttrain.projects.models import Project
from posttrain.registry.model_files import ModelFolderError, ModelFolderInfo, inspect_model_folder, json_safe
from posttrain.registry.models import ModelAsset
from posttrain.registry.reward_specs import component_name
from posttrain.registry.services.common import (
    check_unique_name,
    clean_name,
    create_named,
    delete_unless_in_use,
    invalid,
    remove_tree_after_commit,
    same_folder,
    storage_path,
    update_name_and_description,
    user_or_none,
)
from rl_engine.spec.checkpoints import ENGINE_STATE


def _inspect_model(path: str | Path, field: str) -> ModelFolderInfo:
    try:
        return inspect_model_folder(path)
    except ModelFolderError as exc:
        raise invalid(field, str(exc)) from None


def model_register(
    name: str, path: str, *, project: Project, description: str = "", user: User | AnonymousUser | None = None
) -> ModelAsset:
    """Register a Hugging Face model folder on the server (inside an import root, by a user allowed to name
    one: posttrain.core.server_paths), used in place: weights are not copied."""
    name = clean_name(name)
    check_unique_name(ModelAsset, name, "model", project)
    folder = resolve_user_path("path", path, user, "folder")
    return _create_model(name, description, ModelAsset.Source.FOLDER, _inspect_model(folder, "path"), user, project)


def _create_model(
    name: str,
    description: str,
    source: str,
    info: ModelFolderInfo,
    user: User | AnonymousUser | None,
    project: Project,
    **lineage: Any,
) -> ModelAsset:
    return create_named(
        ModelAsset,
        "model",
        project=project,
        name=name,
        description=description,
        source=source,
        path=str(info.path),
        architecture=info.architecture,
        parameter_count=info.parameter_count,
        hf_config=info.hf_config,
        created_by=user_or_none(user),
        **lineage,
    )


def model_register_checkpoint(
    run: Any,
    step: int,
    path: str | Path,
    name: str | None = None,
    *,
    project: Project,
    description: str = "",
    user: User | AnonymousUser | None = None,
) -> ModelAsset:
    """Register a run's checkpoint as a model in `project`, keeping its lineage (source_run, source_step).

    The HF files are hard-linked (copied across file systems) into `<storage>/models/<name>/`:
    the engine rotates old checkpoints away (`keep_last`), and a registered model must outlive
    that. Hard links cost no space and no time on the same file system.
    """
    name = clean_name(name or f"{run.name or run.pk}-step-{step}")
    check_unique_name(ModelAsset, name, "model", project)
    source = _inspect_model(resolve_run_checkpoint("checkpoint", str(path), run.pk), "path")
    target = _copy_checkpoint(source.path, name)
    try:
        return _create_model(
            name,
            description,
            ModelAsset.Source.CHECKPOINT,
            _inspect_model(target, "path"),
            user,
            project,
            source_run=run,
            source_step=step,
        )
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise


def model_register_converted(
    folder: Path,
    name: str,
    *,
    project: Project,
    description: str = "",
    user: User | AnonymousUser | None = None,
    provenance: dict[str, Any],
) -> ModelAsset:
    """A model folder the platform made (a GGUF converted in the sandbox) moved into `<storage>/models/<name>/` (a
    rename: it was made on that file system, so it appears whole) and registered with its provenance; nothing of
    it stays in the store when this fails."""
    name = clean_name(name)
    check_unique_name(ModelAsset, name, "model", project)
    target = _store_folder(name)
    folder.rename(target)
    try:
        info = _inspect_model(target, "file")
        return _create_model(
            name, description, ModelAsset.Source.GGUF, info, user, project, provenance=json_safe(provenance)
        )
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise


def _store_folder(name: str) -> Path:
    """A folder of the models store for a model named `name`, not taken."""
    root = storage_path("models")
    root.mkdir(parents=True, exist_ok=True)
    slug = component_name(name, "model")
    target = root / slug
    if target.exists():  # a name used before (the model was deleted, or renamed since)
        target = root / f"{slug}-{uuid.uuid4().hex[:8]}"
    return target


def _copy_checkpoint(source: Path, name: str) -> Path:
    root = storage_path("models")
    target = _store_folder(name)
    partial = root / f".{target.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    try:
        shutil.copytree(
            source, partial, copy_function=_link_or_copy, ignore=shutil.ignore_patterns(ENGINE_STATE, "*.partial")
        )
        partial.rename(target)
    except OSError as exc:
        shutil.rmtree(partial, ignore_errors=True)
        raise invalid("path", f"cannot copy the checkpoint {source} into {root}: {exc.strerror or exc}") from None
    return target


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def model_update(model: ModelAsset, *, name: str | None = None, description: str | None = None) -> ModelAsset:
    return update_name_and_description(model, "model", name, description)


def model_delete(model: ModelAsset) -> None:
    """Delete the registry entry; a folder we made (a checkpoint's copy, a converted GGUF) is removed too once no
    copy of the entry in another project uses it, a user's folder never."""
    own_copy = model.source in (ModelAsset.Source.CHECKPOINT, ModelAsset.Source.GGUF) and same_folder(
        Path(model.path).parent, storage_path("models")
    )
    delete_unless_in_use(model, "model")
    if own_copy and not ModelAsset.objects.filter(path=model.path).exists():
        remove_tree_after_commit(Path(model.path))


def model_copy(
    model: ModelAsset, project: Project, *, name: str | None = None, user: User | AnonymousUser | None = None
) -> ModelAsset:
    """The model registered in another project too: a second entry over the same folder (weights are not copied),
    lineage kept. The caller checked that the user reads the source and creates in `project`."""
    name = clean_name(name or model.name)
    check_unique_name(ModelAsset, name, "model", project)
    return create_named(
        ModelAsset,
        "model",
        project=project,
        name=name,
        description=model.description,
        source=model.source,
        path=model.path,
        architecture=model.architecture,
        parameter_count=model.parameter_count,
        hf_config=model.hf_config,
        source_run=model.source_run,
        source_step=model.source_step,
        provenance=model.provenance,
        created_by=user_or_none(user),
    )
