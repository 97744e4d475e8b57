"""GGUF models imported into the registry: an upload (streamed into its staging folder, gguf_uploads.py) or a file on
the server becomes a `ModelImport` (queued -> running -> done | failed) that the user-code worker converts in the
engine's sandbox (rl_engine/models/sandboxed.py: the header read with bounded reads first, then the conversion
under a memory cap and a deadline) into a model folder, moved into `<storage>/models/<name>/` and registered with
its provenance. The web process only records the import and reads it; it looks at the file's first bytes (not
a GGUF, or a version transformers cannot read: refused at once), never converts.

The import's staging folder (`<storage>/models/.imports/<import id>/`: the GGUF, and what the sandbox writes)
is removed when the import ends, either way; `model_imports_expire` (beat) fails the imports no worker finished
or took and removes what a killed worker left.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import UploadedFile
from django.db import transaction
from django.utils import timezone

from posttrain.core.errors import ServiceError
from posttrain.core.server_paths import open_checked, resolve_user_path
from posttrain.core.task_queue import task_send
from posttrain.projects.models import Project
from posttrain.registry.gguf_uploads import SOURCE_NAME, StagedUpload, staging_folder, staging_root
from posttrain.registry.models import ModelAsset, ModelImport
from posttrain.registry.services.common import (
    CHUNK_BYTES,
    NAME_MAX_CHARS,
    check_unique_name,
    clean_name,
    invalid,
    user_or_none,
)
from posttrain.registry.services.model_assets import model_register_converted
from rl_engine.spec.user_code import (
    GGUF_PREAMBLE_BYTES,
    ConvertOptions,
    GGUFError,
    SandboxUnavailable,
    check_preamble,
    convert_gguf,
    training_dtype,
)

OUTPUT = "out"  # the folder the sandbox writes into, beside the GGUF
STALE_GRACE_S = 60.0
LEFTOVER_AFTER_S = 3600.0  # a staging folder of no live import, untouched this long, is removed
UNFINISHED = (ModelImport.State.QUEUED, ModelImport.State.RUNNING)
ERROR_MAX_CHARS = 4000


# --- the request ----------------------------------------------------------------------------------------------


def model_import_upload(
    name: str,
    uploaded: UploadedFile | None,
    *,
    project: Project,
    description: str = "",
    user: User | AnonymousUser | None = None,
) -> ModelImport:
    """Record the import of an uploaded GGUF (already in its staging folder when it came through
    gguf_uploads.GGUFUploadHandler, staged here otherwise) and send it to the user-code worker after commit."""
    if uploaded is None:
        raise invalid("file", "no file was uploaded (send it as multipart field 'file', or give a server-side path)")
    staged = uploaded if isinstance(uploaded, StagedUpload) else _stage(uploaded)
    try:
        name = _free_name(name or Path(uploaded.name or "").stem[:NAME_MAX_CHARS], project)
        if staged.too_large:
            raise invalid("file", _too_big(staged.size or 0))
        with staged.path.open("rb") as handle:
            _check_start(handle, "file")
        record = ModelImport.objects.create(
            id=staged.import_id,
            project=project,
            name=name,
            description=description,
            source_name=(uploaded.name or SOURCE_NAME)[:300],
            size_bytes=staged.size,
            sha256=staged.sha256,
            created_by=user_or_none(user),
        )
        staged.claim()
    finally:
        staged.close()  # unclaimed (refused): its folder goes
    _dispatch(record)
    return record


def model_import_path(
    name: str,
    path: str,
    *,
    project: Project,
    description: str = "",
    user: User | AnonymousUser | None = None,
) -> ModelImport:
    """Record the import of a GGUF on the server (inside an import root, by a user allowed to name one); the worker
    copies it into its staging folder, so a file changed later is not the one converted."""
    source = resolve_user_path("path", path, user, "file")
    name = _free_name(name or source.stem[:NAME_MAX_CHARS], project)
    with open_checked("path", source) as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > settings.GGUF_IMPORT_MAX_BYTES:
            raise invalid("path", _too_big(size))
        _check_start(handle, "path")
    record = ModelImport.objects.create(
        project=project,
        name=name,
        description=description,
        source_name=source.name[:300],
        source_path=str(source),
        size_bytes=size,
        created_by=user_or_none(user),
    )
    _dispatch(record)
    return record


def _free_name(name: str, project: Project) -> str:
    """A model name free in the project, also among its imports still under way."""
    name = clean_name(name)
    check_unique_name(ModelAsset, name, "model", project)
    if ModelImport.objects.filter(project=project, name=name, state__in=UNFINISHED).exists():
        raise invalid("name", f"a model named {name!r} is being imported into project {project.name!r}")
    return name


def _check_start(handle: IO[bytes], field: str) -> None:
    """The file's first bytes: not a GGUF, or one transformers cannot read, is refused before anything is queued."""
    try:
        check_preamble(handle.read(GGUF_PREAMBLE_BYTES))
    except GGUFError as exc:
        raise invalid(field, str(exc)) from None


def _too_big(size: int) -> str:
    limit = settings.GGUF_IMPORT_MAX_BYTES
    return f"the file is {size / 2**30:.2f} GiB, over the limit of {limit / 2**30:.2f} GiB (GGUF_IMPORT_MAX_BYTES)"


def _stage(uploaded: UploadedFile) -> StagedUpload:
    """An upload Django stored itself (a caller other than the import view), copied into a staging folder."""
    import_id = uuid.uuid4()
    folder = staging_folder(import_id)
    folder.mkdir(parents=True, mode=0o700)
    digest, size = _copy_hashed(uploaded.chunks(CHUNK_BYTES), folder / SOURCE_NAME)
    return StagedUpload(import_id, uploaded.name or SOURCE_NAME, size, digest, size > settings.GGUF_IMPORT_MAX_BYTES)


def _copy_hashed(chunks: Any, target: Path) -> tuple[str, int]:
    """Writes the chunks to `target` (at most GGUF_IMPORT_MAX_BYTES of them); (sha256, bytes seen)."""
    digest = hashlib.sha256()
    size = 0
    with target.open("wb") as out:
        for chunk in chunks:
            size += len(chunk)
            if size > settings.GGUF_IMPORT_MAX_BYTES:
                continue  # counted, not kept
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest(), size


def _dispatch(record: ModelImport) -> None:
    """Sent after commit: the worker must see the row."""
    transaction.on_commit(lambda: task_send("model_import_run", str(record.pk)))


# --- the worker -----------------------------------------------------------------------------------------------


def model_import_run(import_id: Any) -> None:
    """The worker's side: claim the queued import (compare-and-set), bring the GGUF into its staging folder (a
    server file is copied and hashed), convert it in the sandbox, register the model. Any failure is the import's
    state, with the reason; the staging folder goes either way."""
    claimed = ModelImport.objects.filter(pk=import_id, state=ModelImport.State.QUEUED).update(
        state=ModelImport.State.RUNNING, started_at=timezone.now()
    )
    if not claimed:
        return
    record = ModelImport.objects.select_related("project", "created_by").get(pk=import_id)
    folder = staging_folder(record.pk)
    try:
        source = _source_file(record, folder)
        report = convert_gguf(source, _empty(folder / OUTPUT), _convert_options())
        model = model_register_converted(
            folder / OUTPUT / "model",
            record.name,
            project=record.project,
            description=record.description,
            user=record.created_by,
            provenance=_provenance(record, report),
        )
    except SoftTimeLimitExceeded:
        _finish(record, ModelImport.State.FAILED, error=f"stopped at the worker's time limit ({_task_limit_s():g} s)")
        return
    except (GGUFError, SandboxUnavailable) as exc:
        _finish(record, ModelImport.State.FAILED, error=str(exc))
        return
    except ValidationError as exc:  # the name taken meanwhile, an unreadable result
        _finish(record, ModelImport.State.FAILED, error="; ".join(_messages(exc)))
        return
    except ServiceError as exc:  # the server file gone or moved out of the import roots
        _finish(record, ModelImport.State.FAILED, error=str(exc))
        return
    except Exception as exc:
        _finish(record, ModelImport.State.FAILED, error=f"{type(exc).__name__}: {exc}")
        raise
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    _finish(record, ModelImport.State.DONE, model=model)


def _source_file(record: ModelImport, folder: Path) -> Path:
    """The GGUF in the staging folder: the upload, or the server file copied there now (and hashed)."""
    source = folder / SOURCE_NAME
    if not record.source_path:
        if not source.is_file():
            raise GGUFError("the uploaded file is gone from the staging folder")
        return source
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open_checked("path", Path(record.source_path)) as handle:
        digest, size = _copy_hashed(iter(lambda: handle.read(CHUNK_BYTES), b""), source)
    if size > settings.GGUF_IMPORT_MAX_BYTES:
        raise GGUFError(f"file: {_too_big(size)}")
    ModelImport.objects.filter(pk=record.pk).update(sha256=digest, size_bytes=size)
    record.sha256, record.size_bytes = digest, size
    return source


def _empty(folder: Path) -> Path:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(mode=0o700)
    return folder


def _convert_options() -> ConvertOptions:
    dtype = settings.GGUF_IMPORT_DTYPE
    return ConvertOptions(
        dtype=training_dtype() if dtype == "auto" else dtype,
        memory_mb=int(settings.GGUF_IMPORT_MEMORY_MB),
        timeout_s=float(settings.GGUF_IMPORT_TIMEOUT_S),
        cpus=float(settings.GGUF_IMPORT_CPUS),
        check_vllm=bool(settings.GGUF_IMPORT_CHECK_VLLM),
    )


def _provenance(record: ModelImport, report: dict[str, Any]) -> dict[str, Any]:
    """What the model is made from and how (shown with it): the file, its header, the conversion, the checks."""
    return {
        "format": "gguf",
        "source_file": record.source_name,
        "sha256": record.sha256,
        **report.get("header", {}),
        "size_bytes": record.size_bytes,
        "dtype": report.get("dtype"),
        "converted_with": report.get("versions", {}),
        "convert_seconds": report.get("convert_seconds"),
        "check": report.get("check"),
        "vllm_check": report.get("vllm"),
        "import": str(record.pk),
    }


def _messages(exc: ValidationError) -> list[str]:
    if hasattr(exc, "error_dict"):
        return [f"{field}: {message}" for field, errors in exc.message_dict.items() for message in errors]
    return list(exc.messages)


def _finish(record: ModelImport, state: str, *, model: ModelAsset | None = None, error: str = "") -> None:
    # Postgres keeps no NUL character in text; the message may quote the file's own strings.
    error = error.replace("\x00", "\ufffd")[:ERROR_MAX_CHARS]
    ModelImport.objects.filter(pk=record.pk, state=ModelImport.State.RUNNING).update(
        state=state, model=model, error=error, finished_at=timezone.now()
    )


def _task_limit_s() -> float:
    return float(settings.GGUF_IMPORT_TIMEOUT_S + settings.GGUF_IMPORT_COPY_S)


# --- expiry ---------------------------------------------------------------------------------------------------


def model_imports_expire(now: Any = None) -> int:
    """Fail the imports no worker can finish any more (killed at the task's hard time limit, or never taken) and
    remove staging folders no live import owns. Periodic (beat, with the trials); returns how many failed."""
    now = now or timezone.now()
    stale = now - timedelta(seconds=_task_limit_s() + STALE_GRACE_S)
    queued_long_ago = now - timedelta(seconds=settings.GGUF_IMPORT_QUEUE_S)
    failed = ModelImport.objects.filter(state=ModelImport.State.RUNNING, started_at__lt=stale).update(
        state=ModelImport.State.FAILED,
        error=f"no worker finished it within the import's time limit ({_task_limit_s():g} s); try again",
        finished_at=now,
    ) + ModelImport.objects.filter(state=ModelImport.State.QUEUED, created_at__lt=queued_long_ago).update(
        state=ModelImport.State.FAILED,
        error=f"no worker took it within {settings.GGUF_IMPORT_QUEUE_S:g} s: is the user-code worker running "
        f"(`celery -A workers.celery_app worker -Q {settings.USER_CODE_QUEUE}`)? Try again",
        finished_at=now,
    )
    _remove_leftovers()
    return failed


def _remove_leftovers() -> None:
    root = staging_root()
    if not root.is_dir():
        return
    live = {str(pk) for pk in ModelImport.objects.filter(state__in=UNFINISHED).values_list("pk", flat=True)}
    for folder in root.iterdir():
        if folder.name not in live and time.time() - _last_write(folder) > LEFTOVER_AFTER_S:
            shutil.rmtree(folder, ignore_errors=True)


def _last_write(folder: Path) -> float:
    """The newest modification time of the folder and what is directly in it (an upload grows its file)."""
    times = [folder.lstat().st_mtime]
    if folder.is_dir() and not folder.is_symlink():
        times += [entry.lstat().st_mtime for entry in folder.iterdir()]
    return max(times)
