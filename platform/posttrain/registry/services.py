"""Writes of the registry: models, datasets and reward functions (and trying a reward out).

Every problem with the input raises Django's ValidationError keyed by the input field
(`{"path": ["no config.json in /x"]}`), deleting an asset an experiment uses raises AssetInUse;
the API turns them into 400 and 409.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import UploadedFile
from django.db import IntegrityError, models, transaction
from django.db.models import ProtectedError

from posttrain.registry.dataset_files import DatasetError, detect_format, inspect_dataset
from posttrain.registry.model_files import ModelFolderError, ModelFolderInfo, inspect_model_folder
from posttrain.registry.models import Dataset, ModelAsset, RewardFunction
from posttrain.registry.reward_specs import RewardSpecError, component_name, validate_reward_spec
from rl_engine.rewards import CompositeReward, RewardBatch, build_component, check_reward_file

NAME_MAX_CHARS = 200
CHUNK_BYTES = 1024 * 1024
MAX_TRY_SAMPLES = 32
TRY_TIMEOUT_CAP_S = 10.0  # per call, for python and http rewards in "try it"
# The engine's checkpoint folders hold the HF model plus this file (optimizer, RNG, data
# position): a registered model needs only the former. Named here, not imported, because
# rl_engine.checkpoint imports torch.
ENGINE_STATE_FILE = "engine_state.pt"


class AssetInUse(Exception):
    """Deleting a model, dataset or reward that an experiment still uses."""


# --- shared -----------------------------------------------------------------------------------


def _invalid(field: str, message: str | list[str]) -> ValidationError:
    return ValidationError({field: message})


def _clean_name(name: str | None) -> str:
    name = (name or "").strip()
    if not name:
        raise _invalid("name", "is required")
    if len(name) > NAME_MAX_CHARS:
        raise _invalid("name", f"is {len(name)} characters long; at most {NAME_MAX_CHARS}")
    return name


def _check_unique_name(model: type[models.Model], name: str, what: str, exclude_pk: Any = None) -> None:
    taken = model.objects.filter(name=name)
    if exclude_pk is not None:
        taken = taken.exclude(pk=exclude_pk)
    if taken.exists():
        raise _invalid("name", f"a {what} named {name!r} already exists")


def _create_named(model: type[models.Model], what: str, **fields: Any) -> Any:
    """Create a row whose name is unique; a concurrent duplicate is a field error, not a 500."""
    try:
        with transaction.atomic():
            return model.objects.create(**fields)
    except IntegrityError:
        _check_unique_name(model, fields["name"], what)
        raise


def _user_or_none(user: AbstractBaseUser | None) -> AbstractBaseUser | None:
    return user if user is not None and user.is_authenticated else None


def _update_name_and_description(
    obj: Any, what: str, name: str | None, description: str | None, *, unique_name: bool = True
) -> Any:
    fields = []
    if name is not None:
        name = _clean_name(name)
        if unique_name:
            _check_unique_name(type(obj), name, what, exclude_pk=obj.pk)
        obj.name = name
        fields.append("name")
    if description is not None:
        obj.description = description
        fields.append("description")
    if fields:
        obj.save(update_fields=fields)
    return obj


def _delete(obj: models.Model, what: str) -> None:
    try:
        with transaction.atomic():
            obj.delete()
    except ProtectedError as exc:
        users = sorted({str(getattr(o, "experiment", o)) for o in exc.protected_objects})
        shown = ", ".join(repr(u) for u in users[:5]) + (", ..." if len(users) > 5 else "")
        raise AssetInUse(
            f"{what} {obj.name!r} is used by {len(users)} experiment(s) ({shown}); delete those experiments first"
        ) from None


def _remove_tree_after_commit(folder: Path) -> None:
    transaction.on_commit(lambda: shutil.rmtree(folder, ignore_errors=True))


def _storage(*parts: str) -> Path:
    return Path(settings.STORAGE_ROOT).joinpath(*parts)


def _same_folder(folder: Path, store: Path) -> bool:
    """Whether `folder` is exactly the store folder (we only ever delete what we stored)."""
    return folder.resolve() == store.resolve()


# --- models -----------------------------------------------------------------------------------


def _inspect_model(path: str | Path, field: str) -> ModelFolderInfo:
    try:
        return inspect_model_folder(path)
    except ModelFolderError as exc:
        raise _invalid(field, str(exc)) from None


def model_register(name: str, path: str, *, description: str = "", user: AbstractBaseUser | None = None) -> ModelAsset:
    """Register a local Hugging Face model folder (used in place: weights are not copied)."""
    name = _clean_name(name)
    _check_unique_name(ModelAsset, name, "model")
    return _create_model(name, description, ModelAsset.Source.FOLDER, _inspect_model(path, "path"), user)


def _create_model(
    name: str, description: str, source: str, info: ModelFolderInfo, user: AbstractBaseUser | None, **lineage: Any
) -> ModelAsset:
    return _create_named(
        ModelAsset,
        "model",
        name=name,
        description=description,
        source=source,
        path=str(info.path),
        architecture=info.architecture,
        parameter_count=info.parameter_count,
        hf_config=info.hf_config,
        created_by=_user_or_none(user),
        **lineage,
    )


def model_register_checkpoint(
    run: Any,
    step: int,
    path: str | Path,
    name: str | None = None,
    *,
    description: str = "",
    user: AbstractBaseUser | None = None,
) -> ModelAsset:
    """Register a run's checkpoint as a model, keeping its lineage (source_run, source_step).

    The HF files are hard-linked (copied across file systems) into `<storage>/models/<name>/`:
    the engine rotates old checkpoints away (`keep_last`), and a registered model must outlive
    that. Hard links cost no space and no time on the same file system.
    """
    name = _clean_name(name or f"{run.name or run.pk}-step-{step}")
    _check_unique_name(ModelAsset, name, "model")
    source = _inspect_model(path, "path")
    target = _copy_checkpoint(source.path, name)
    try:
        return _create_model(
            name,
            description,
            ModelAsset.Source.CHECKPOINT,
            _inspect_model(target, "path"),
            user,
            source_run=run,
            source_step=step,
        )
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise


def _copy_checkpoint(source: Path, name: str) -> Path:
    root = _storage("models")
    root.mkdir(parents=True, exist_ok=True)
    slug = component_name(name, "model")
    target = root / slug
    if target.exists():  # a name used before (the model was deleted, or renamed since)
        target = root / f"{slug}-{uuid.uuid4().hex[:8]}"
    partial = root / f".{target.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    try:
        shutil.copytree(
            source, partial, copy_function=_link_or_copy, ignore=shutil.ignore_patterns(ENGINE_STATE_FILE, "*.partial")
        )
        partial.rename(target)
    except OSError as exc:
        shutil.rmtree(partial, ignore_errors=True)
        raise _invalid("path", f"cannot copy the checkpoint {source} into {root}: {exc.strerror or exc}") from None
    return target


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def model_update(model: ModelAsset, *, name: str | None = None, description: str | None = None) -> ModelAsset:
    return _update_name_and_description(model, "model", name, description)


def model_delete(model: ModelAsset) -> None:
    """Delete the registry entry; a checkpoint copy we made is removed too, a user's folder never."""
    own_copy = model.source == ModelAsset.Source.CHECKPOINT and _same_folder(
        Path(model.path).parent, _storage("models")
    )
    _delete(model, "model")
    if own_copy:
        _remove_tree_after_commit(Path(model.path))


# --- datasets ---------------------------------------------------------------------------------


def dataset_upload(
    name: str,
    uploaded_file: UploadedFile,
    format: str | None = None,  # noqa: A002 - the API's and the engine's name for it
    prompt_field: str = "prompt",
    label_field: str | None = "label",
    *,
    description: str = "",
    user: AbstractBaseUser | None = None,
) -> tuple[Dataset, bool]:
    """Validate and store an uploaded file; returns (dataset, created). The same content uploaded
    again returns the existing dataset (created False) instead of a duplicate."""
    if uploaded_file is None:
        raise _invalid("file", "no file was uploaded (send it as multipart field 'file', or give a server-side path)")
    fmt = _dataset_format(uploaded_file.name, format)
    prompt_field, label_field = _dataset_fields(prompt_field, label_field)
    limit = settings.DATASET_MAX_BYTES
    if uploaded_file.size is not None and uploaded_file.size > limit:
        raise _invalid("file", _too_big(uploaded_file.size, limit))
    staged = _stage(uploaded_file.chunks(CHUNK_BYTES), limit, "file")
    name = _clean_name(name or Path(uploaded_file.name or "").stem[:NAME_MAX_CHARS])
    return _dataset_store(name, description, staged, fmt, prompt_field, label_field, user, file_field="file")


def dataset_register_path(
    name: str,
    path: str,
    format: str | None = None,  # noqa: A002
    prompt_field: str = "prompt",
    label_field: str | None = "label",
    *,
    description: str = "",
    user: AbstractBaseUser | None = None,
) -> tuple[Dataset, bool]:
    """Register a file already on the server: validated and copied into the content-addressed
    store like an upload, so later edits of the original cannot change a dataset runs used."""
    source = Path(path or "")
    if not str(path or "").strip():
        raise _invalid("path", "is required")
    if not source.is_absolute():
        raise _invalid("path", f"must be an absolute path on the server, got {path!r}")
    if not source.exists():
        raise _invalid("path", f"{source} does not exist")
    if not source.is_file():
        raise _invalid("path", f"{source} is not a file (give the .jsonl, .csv or .parquet file itself)")
    fmt = _dataset_format(source.name, format)
    prompt_field, label_field = _dataset_fields(prompt_field, label_field)
    limit = settings.DATASET_MAX_BYTES
    size = source.stat().st_size
    if size > limit:
        raise _invalid("path", _too_big(size, limit))
    try:
        with source.open("rb") as f:
            staged = _stage(iter(lambda: f.read(CHUNK_BYTES), b""), limit, "path")
    except OSError as exc:
        raise _invalid("path", f"cannot read {source}: {exc.strerror or exc}") from None
    name = _clean_name(name or source.stem[:NAME_MAX_CHARS])
    return _dataset_store(name, description, staged, fmt, prompt_field, label_field, user, file_field="path")


def _dataset_format(filename: str | None, given: str | None) -> str:
    try:
        return detect_format(filename or "", given)
    except DatasetError as exc:
        raise _invalid(exc.field, exc.message) from None


def _dataset_fields(prompt_field: str | None, label_field: str | None) -> tuple[str, str]:
    prompt_field = (prompt_field or "").strip()
    if not prompt_field:
        raise _invalid("prompt_field", "is required: the field (column) that holds the prompt text")
    return prompt_field, (label_field or "").strip()


def _too_big(size: int | None, limit: int) -> str:
    what = f"the file is {_mib(size)}, over" if size is not None else "the file is over"
    return f"{what} the size limit of {_mib(limit)} (DATASET_MAX_BYTES = {limit} bytes)"


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n} bytes"


def _stage(chunks: Iterable[bytes], limit: int, field: str) -> tuple[Path, str, int]:
    """Stream the content into a temporary file next to the store, hashing it on the way."""
    incoming = _storage("datasets", ".incoming")
    incoming.mkdir(parents=True, exist_ok=True)
    tmp = incoming / f"{uuid.uuid4().hex}.part"
    digest = hashlib.sha256()
    size = 0
    try:
        with tmp.open("wb") as out:
            for chunk in chunks:
                size += len(chunk)
                if size > limit:
                    raise _invalid(field, _too_big(None, limit))
                digest.update(chunk)
                out.write(chunk)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp, digest.hexdigest(), size


def _dataset_store(
    name: str,
    description: str,
    staged: tuple[Path, str, int],
    fmt: str,
    prompt_field: str,
    label_field: str,
    user: AbstractBaseUser | None,
    *,
    file_field: str,
) -> tuple[Dataset, bool]:
    tmp, sha256, size = staged
    try:
        existing = Dataset.objects.filter(sha256=sha256).first()
        if existing is not None:
            return existing, False
        try:
            summary = inspect_dataset(tmp, fmt, prompt_field, label_field)
        except DatasetError as exc:
            raise _invalid(file_field if exc.field == "file" else exc.field, exc.message) from None
        final = _storage("datasets", sha256) / f"data.{fmt}"
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, final)  # same file system: atomic, readers never see half a file
        try:
            with transaction.atomic():
                dataset = Dataset.objects.create(
                    name=name,
                    description=description,
                    sha256=sha256,
                    format=fmt,
                    path=str(final),
                    size_bytes=size,
                    row_count=summary.row_count,
                    prompt_field=prompt_field,
                    label_field=label_field,
                    columns=summary.columns,
                    splits=summary.splits,
                    preview=summary.preview,
                    created_by=_user_or_none(user),
                )
        except IntegrityError:  # the same content stored by a concurrent request
            existing = Dataset.objects.filter(sha256=sha256).first()
            if existing is None:
                raise
            return existing, False
        return dataset, True
    finally:
        tmp.unlink(missing_ok=True)


def dataset_update(dataset: Dataset, *, name: str | None = None, description: str | None = None) -> Dataset:
    # Dataset names need not be unique: the content hash identifies a dataset.
    return _update_name_and_description(dataset, "dataset", name, description, unique_name=False)


def dataset_delete(dataset: Dataset) -> None:
    """Delete the entry and its stored file (content-addressed: no other dataset shares it)."""
    folder = Path(dataset.path).parent
    _delete(dataset, "dataset")
    if _same_folder(folder.parent, _storage("datasets")):
        _remove_tree_after_commit(folder)


# --- reward functions -------------------------------------------------------------------------


def reward_create(
    name: str,
    kind: str,
    spec: dict[str, Any] | None,
    source: str = "",
    *,
    description: str = "",
    user: AbstractBaseUser | None = None,
) -> RewardFunction:
    """Register a reward component. `spec` is validated with the engine's RewardSpec schema; a
    python reward's `source` is stored under `<storage>/rewards/<sha256>.py` (spec.path points at
    it) after importing it in the engine's sandbox (never in this process)."""
    name = _clean_name(name)
    _check_unique_name(RewardFunction, name, "reward")
    spec = {} if spec is None else spec
    source = source or ""
    staged_source: Path | None = None
    if kind == RewardFunction.Kind.PYTHON:
        if isinstance(spec, dict):  # else validation below names the problem
            spec, source = _python_spec(spec, source)
    elif source:
        raise _invalid("source", f"only python rewards take source code, not kind {kind!r}")
    try:
        normalized = validate_reward_spec(kind, spec, default_name=component_name(name, kind))
    except RewardSpecError as exc:
        raise ValidationError(exc.errors) from None
    if kind == RewardFunction.Kind.REWARD_MODEL:
        normalized["path"] = _reward_model_path(normalized["path"])
    if kind == RewardFunction.Kind.PYTHON:
        staged_source = _check_python_source(source, normalized)
    try:
        reward = _create_named(
            RewardFunction,
            "reward",
            name=name,
            description=description,
            kind=kind,
            spec=normalized,
            source=source,
            created_by=_user_or_none(user),
        )
    except BaseException:
        if staged_source is not None:
            staged_source.unlink(missing_ok=True)
        raise
    if staged_source is not None:
        os.replace(staged_source, normalized["path"])  # same content if it already exists
    return reward


def _python_spec(spec: dict[str, Any], source: str) -> tuple[dict[str, Any], str]:
    """The spec with path set to where the source will be stored, and the source text."""
    spec = dict(spec)
    given_path = spec.pop("path", None)
    if source and given_path:
        raise _invalid("spec.path", "leave it out when sending source: the registry stores the code and sets the path")
    if not source and given_path:
        # A file on the server: its text is stored like sent source, so later edits of the
        # original cannot change what runs using this reward execute.
        file = Path(str(given_path))
        if not file.is_file():
            raise _invalid("spec.path", f"{file} does not exist (or send the code as source)")
        try:
            source = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise _invalid("spec.path", f"cannot read {file} as UTF-8 text: {exc}") from None
    if not source.strip():
        raise _invalid(
            "source", "is required for a python reward: code defining reward_func (OpenRLHF) or compute_score (verl)"
        )
    digest = hashlib.sha256(source.encode("utf-8")).hexdigest()
    spec["path"] = str(_storage("rewards", f"{digest}.py"))
    return spec, source


def _check_python_source(source: str, spec: dict[str, Any]) -> Path:
    """Write the code to a temporary file and import it in the engine's sandbox child; returns
    the file, to be moved to spec.path once the reward row exists."""
    final = Path(spec["path"])
    final.parent.mkdir(parents=True, exist_ok=True)
    staged = final.with_name(f".{uuid.uuid4().hex}.py")
    staged.write_text(source, encoding="utf-8")
    try:
        problems = check_reward_file(
            staged, function=spec["function"], timeout_s=spec["timeout_s"], memory_mb=spec["memory_mb"]
        )
    except BaseException:
        staged.unlink(missing_ok=True)
        raise
    if problems:
        staged.unlink(missing_ok=True)
        raise _invalid("source", problems)
    return staged


def _reward_model_path(path: str) -> str:
    """A registered model's name or a HF folder on the server, as the folder's absolute path."""
    registered = ModelAsset.objects.filter(name=path).first()
    folder = registered.path if registered is not None else path
    try:
        return str(inspect_model_folder(folder).path)
    except ModelFolderError as exc:
        raise _invalid("spec.path", f"{exc} (give a registered model's name or a Hugging Face model folder)") from None


def reward_update(reward: RewardFunction, *, name: str | None = None, description: str | None = None) -> RewardFunction:
    """Rename or redescribe; the component name in spec (the metric name) stays, so curves of
    earlier runs keep matching."""
    return _update_name_and_description(reward, "reward", name, description)


def reward_delete(reward: RewardFunction) -> None:
    # The stored source file stays: another reward may hold the same code (same sha256).
    _delete(reward, "reward")


def reward_try(reward: RewardFunction, samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Score sample inputs exactly as a run would: the engine's component and composite, python
    code in its sandbox child, a reward model in a separate process (no torch in this one).

    Returns {"scores": [...], "components": {name: [...]}, "errors": [[...]], "extra_logs": {...}}.
    """
    batch = _try_batch(samples)
    spec = _try_spec(reward.spec)
    if reward.kind == RewardFunction.Kind.REWARD_MODEL:
        return _score_in_subprocess(spec, batch)
    try:
        component = build_component(spec)
    except ValueError as exc:
        raise _invalid("spec", f"the stored reward cannot be built: {exc}") from None
    with CompositeReward([(component, 1.0)]) as composite:
        result = composite.score(batch)
    return {
        "scores": result.total,
        "components": result.components,
        "errors": result.errors,
        "extra_logs": result.extra_logs,
    }


def _try_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The stored spec with its waiting bounded: a web request must answer in seconds, while a
    run may wait out a server's retries or a slow per-sample call. Everything else is unchanged."""
    spec = dict(spec)
    if "timeout_s" in spec and spec.get("type") in ("python", "http"):
        spec["timeout_s"] = min(float(spec["timeout_s"]), TRY_TIMEOUT_CAP_S)
    if spec.get("type") == "http":
        spec["retries"] = min(int(spec.get("retries", 0)), 1)
        spec["backoff_s"] = min(float(spec.get("backoff_s", 0.0)), 1.0)
    return spec


def _try_batch(samples: Any) -> RewardBatch:
    if not isinstance(samples, list) or not samples:
        raise _invalid("samples", "give a list of at least one {prompt, response, label} sample")
    if len(samples) > MAX_TRY_SAMPLES:
        raise _invalid("samples", f"at most {MAX_TRY_SAMPLES} samples per try, got {len(samples)}")
    prompts, responses, labels, metadata = [], [], [], []
    for i, sample in enumerate(samples):
        if not isinstance(sample, dict):
            raise _invalid(f"samples.{i}", "must be an object with prompt, response and label")
        for key in ("prompt", "response"):
            if not isinstance(sample.get(key), str):
                raise _invalid(f"samples.{i}.{key}", "is required and must be a string")
        label = sample.get("label")
        if label is not None and not isinstance(label, (str, int, float)):
            raise _invalid(f"samples.{i}.label", "must be a string, a number or null")
        meta = sample.get("metadata") or {}
        if not isinstance(meta, dict):
            raise _invalid(f"samples.{i}.metadata", "must be an object")
        prompts.append(sample["prompt"])
        responses.append(sample["response"])
        labels.append(None if label is None else str(label))  # the engine passes labels as text
        metadata.append(meta)
    return RewardBatch.build(prompts, responses, labels, metadata=metadata)


def _score_in_subprocess(spec: dict[str, Any], batch: RewardBatch) -> dict[str, Any]:
    """Run `python -m rl_engine.rewards score` (torch loads there, never here) with a timeout."""
    timeout_s = float(getattr(settings, "REWARD_TRY_TIMEOUT_S", 180))
    payload = {
        "rewards": [spec],
        "samples": [
            {"prompt": p, "response": r, "label": lab, "metadata": m}
            for p, r, lab, m in zip(batch.prompts, batch.responses, batch.labels, batch.metadata)
        ],
    }
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(settings.REPO_ROOT), os.environ.get("PYTHONPATH")])),
    }
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "rl_engine.rewards", "score"],
            input=json.dumps(payload),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=settings.REPO_ROOT,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return _failed_result(spec["name"], len(batch), f"scoring took longer than {timeout_s:g}s and was stopped")
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode != 0 or not lines:
        detail = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        return _failed_result(spec["name"], len(batch), f"scoring process failed: {detail}")
    try:
        return json.loads(lines[-1])  # the result is the last line; libraries may print before it
    except json.JSONDecodeError:
        return _failed_result(spec["name"], len(batch), "scoring process printed no result")


def _failed_result(name: str, n: int, reason: str) -> dict[str, Any]:
    return {
        "scores": [0.0] * n,
        "components": {name: [0.0] * n},
        "errors": [[f"{name}: {reason}"] for _ in range(n)],
        "extra_logs": {},
    }
