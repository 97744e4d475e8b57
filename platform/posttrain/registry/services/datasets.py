"""Datasets: uploaded or registered prompt files, stored once per content hash and inspected on the way in."""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import IO

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.core.files.uploadedfile import UploadedFile
from django.db import IntegrityError, transaction

from posttrain.core.server_paths import open_checked, resolve_user_path
from posttrain.projects.models import Project
from posttrain.registry.dataset_files import DatasetError, detect_format, inspect_dataset
from posttrain.registry.models import Dataset
from posttrain.registry.services.common import (
    CHUNK_BYTES,
    NAME_MAX_CHARS,
    clean_name,
    delete_unless_in_use,
    invalid,
    remove_tree_after_commit,
    same_folder,
    storage_path,
    update_name_and_description,
    user_or_none,
)


def dataset_upload(
    name: str,
    uploaded_file: UploadedFile,
    format: str | None = None,
    prompt_field: str = "prompt",
    label_field: str | None = "label",
    *,
    project: Project,
    description: str = "",
    user: User | AnonymousUser | None = None,
) -> tuple[Dataset, bool]:
    """Validate and store an uploaded file; returns (dataset, created). The same content uploaded
    again to the project returns its existing dataset (created False) instead of a duplicate."""
    if uploaded_file is None:
        raise invalid("file", "no file was uploaded (send it as multipart field 'file', or give a server-side path)")
    fmt = _dataset_format(uploaded_file.name, format)
    prompt_field, label_field = _dataset_fields(prompt_field, label_field)
    limit = settings.DATASET_MAX_BYTES
    if uploaded_file.size is not None and uploaded_file.size > limit:
        raise invalid("file", _too_big(uploaded_file.size, limit))
    staged = _stage(uploaded_file.chunks(CHUNK_BYTES), limit, "file")
    name = clean_name(name or Path(uploaded_file.name or "").stem[:NAME_MAX_CHARS])
    return _dataset_store(
        name, description, staged, (fmt, prompt_field, label_field), user, project=project, file_field="file"
    )


def dataset_register_path(
    name: str,
    path: str,
    format: str | None = None,
    prompt_field: str = "prompt",
    label_field: str | None = "label",
    *,
    project: Project,
    description: str = "",
    user: User | AnonymousUser | None = None,
) -> tuple[Dataset, bool]:
    """Register a file already on the server (inside an import root, by a user an admin allowed to: see
    posttrain.core.server_paths): validated and copied into the content-addressed store like an upload, so
    later edits of the original cannot change a dataset runs used. Its errors never quote the file."""
    source = resolve_user_path("path", path, user, "file")
    size = source.stat().st_size
    if size > settings.DATASET_MAX_BYTES:
        raise invalid("path", _too_big(size, settings.DATASET_MAX_BYTES))
    try:
        with open_checked("path", source) as f:
            return _dataset_from_file(
                name,
                source,
                f,
                (format, prompt_field, label_field),
                project=project,
                description=description,
                user=user,
                quote=False,
            )
    except OSError as exc:
        raise invalid("path", f"cannot read {path}: {exc.strerror or 'error'}") from None


def dataset_register_platform_file(
    name: str,
    path: Path,
    format: str | None = None,
    prompt_field: str = "prompt",
    label_field: str | None = "label",
    *,
    project: Project,
    description: str = "",
    user: User | AnonymousUser | None = None,
) -> tuple[Dataset, bool]:
    """Register a file the platform itself wrote under its storage root (a review campaign's export): no user
    named it, so it takes no permission and no import root; it is stored like any other dataset."""
    source = Path(path)
    if not source.resolve().is_relative_to(Path(settings.STORAGE_ROOT).resolve()):
        raise ValueError(f"{source} is not a file the platform wrote under its storage root")
    with source.open("rb") as f:
        return _dataset_from_file(
            name,
            source,
            f,
            (format, prompt_field, label_field),
            project=project,
            description=description,
            user=user,
            quote=True,
        )


def _dataset_from_file(
    name: str,
    source: Path,
    opened: IO[bytes],
    fields: tuple[str | None, str | None, str | None],  # format, prompt_field, label_field as the user gave them
    *,
    project: Project,
    description: str,
    user: User | AnonymousUser | None,
    quote: bool,
) -> tuple[Dataset, bool]:
    """A server file, already opened, validated and stored like an upload (errors at `path`)."""
    format, prompt_field, label_field = fields
    fmt = _dataset_format(source.name, format)
    prompt_field, label_field = _dataset_fields(prompt_field, label_field)
    staged = _stage(iter(lambda: opened.read(CHUNK_BYTES), b""), settings.DATASET_MAX_BYTES, "path")
    name = clean_name(name or source.stem[:NAME_MAX_CHARS])
    return _dataset_store(
        name,
        description,
        staged,
        (fmt, prompt_field, label_field),
        user,
        project=project,
        file_field="path",
        quote=quote,
    )


def dataset_store_rows(
    name: str,
    rows: list[dict],
    *,
    project: Project,
    description: str = "",
    user: User | AnonymousUser | None = None,
) -> tuple[Dataset, bool]:
    """Rows made on the server (an environment's generated tasks) stored as a JSONL dataset like an upload."""
    data = b"".join(json.dumps(row, ensure_ascii=False).encode() + b"\n" for row in rows)
    staged = _stage(iter([data]), settings.DATASET_MAX_BYTES, "rows")
    return _dataset_store(
        clean_name(name), description, staged, ("jsonl", "prompt", "label"), user, project=project, file_field="rows"
    )


def _dataset_format(filename: str | None, given: str | None) -> str:
    try:
        return detect_format(filename or "", given)
    except DatasetError as exc:
        raise invalid(exc.field, exc.message) from None


def _dataset_fields(prompt_field: str | None, label_field: str | None) -> tuple[str, str]:
    prompt_field = (prompt_field or "").strip()
    if not prompt_field:
        raise invalid("prompt_field", "is required: the field (column) that holds the prompt text")
    return prompt_field, (label_field or "").strip()


def _too_big(size: int | None, limit: int) -> str:
    what = f"the file is {_mib(size)}, over" if size is not None else "the file is over"
    return f"{what} the size limit of {_mib(limit)} (DATASET_MAX_BYTES = {limit} bytes)"


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n} bytes"


def _stage(chunks: Iterable[bytes], limit: int, field: str) -> tuple[Path, str, int]:
    """Stream the content into a temporary file next to the store, hashing it on the way."""
    incoming = storage_path("datasets", ".incoming")
    incoming.mkdir(parents=True, exist_ok=True)
    tmp = incoming / f"{uuid.uuid4().hex}.part"
    digest = hashlib.sha256()
    size = 0
    try:
        with tmp.open("wb") as out:
            for chunk in chunks:
                size += len(chunk)
                if size > limit:
                    raise invalid(field, _too_big(None, limit))
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
    fields: tuple[str, str, str],  # format, prompt_field, label_field
    user: User | AnonymousUser | None,
    *,
    project: Project,
    file_field: str,
    quote: bool = True,
) -> tuple[Dataset, bool]:
    tmp, sha256, size = staged
    fmt, prompt_field, label_field = fields
    try:
        existing = Dataset.objects.filter(project=project, sha256=sha256).first()
        if existing is not None:
            return existing, False
        try:
            summary = inspect_dataset(tmp, fmt, prompt_field, label_field, quote=quote)
        except DatasetError as exc:
            raise invalid(file_field if exc.field == "file" else exc.field, exc.message) from None
        final = storage_path("datasets", sha256) / f"data.{fmt}"
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, final)  # same file system: atomic, readers never see half a file
        try:
            with transaction.atomic():
                dataset = Dataset.objects.create(
                    project=project,
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
                    created_by=user_or_none(user),
                )
        except IntegrityError:  # the same content stored by a concurrent request
            existing = Dataset.objects.filter(project=project, sha256=sha256).first()
            if existing is None:
                raise
            return existing, False
        return dataset, True
    finally:
        tmp.unlink(missing_ok=True)


def dataset_update(dataset: Dataset, *, name: str | None = None, description: str | None = None) -> Dataset:
    # Dataset names need not be unique: the content hash identifies a dataset.
    return update_name_and_description(dataset, "dataset", name, description, unique_name=False)


def dataset_delete(dataset: Dataset) -> None:
    """Delete the entry, and its stored file once no project's entry has the same content."""
    folder = Path(dataset.path).parent
    delete_unless_in_use(dataset, "dataset")
    shared = Dataset.objects.filter(sha256=dataset.sha256).exists()
    if not shared and same_folder(folder.parent, storage_path("datasets")):
        remove_tree_after_commit(folder)


def dataset_copy(
    dataset: Dataset, project: Project, *, name: str | None = None, user: User | AnonymousUser | None = None
) -> tuple[Dataset, bool]:
    """The dataset in another project too: an entry over the same stored file (nothing is copied or inspected
    again); the project's own entry with that content where it has one (created False). The caller checked that
    the user reads the source and creates in `project`."""
    existing = Dataset.objects.filter(project=project, sha256=dataset.sha256).first()
    if existing is not None:
        return existing, False
    fields = {
        f: getattr(dataset, f)
        for f in ("description", "sha256", "format", "path", "size_bytes", "row_count", "prompt_field")
    }
    try:
        with transaction.atomic():
            copy = Dataset.objects.create(
                project=project,
                name=clean_name(name or dataset.name),
                label_field=dataset.label_field,
                columns=dataset.columns,
                splits=dataset.splits,
                preview=Dataset.objects.values_list("preview", flat=True).get(pk=dataset.pk),
                created_by=user_or_none(user),
                **fields,
            )
    except IntegrityError:  # the same content copied there by a concurrent request
        return Dataset.objects.get(project=project, sha256=dataset.sha256), False
    return copy, True
