"""A GGUF upload streamed straight into the models store's staging folder (one folder per import, named by its
id), hashed on the way: Django's default handler would write a file of many GiB to a temporary file, which the
service would then copy and read again (the ASGI handler's own spool of the request body comes before either).
The request's body is bounded in front of Django (posttrain.core.request_bounds, `gguf_upload`); past
GGUF_IMPORT_MAX_BYTES nothing more is written and the upload is refused by the service.

A staged upload nobody claims (the request failed before its import was recorded) is removed when Django closes
the request's files; a claimed one belongs to its import, whose worker removes it."""

from __future__ import annotations

import hashlib
import shutil
import uuid
from pathlib import Path
from typing import IO, Any

from django.conf import settings
from django.core.files.uploadedfile import UploadedFile
from django.core.files.uploadhandler import FileUploadHandler, SkipFile
from django.http import HttpRequest

SOURCE_NAME = "source.gguf"  # the staged file in its import's folder
FIELD = "file"


def staging_root() -> Path:
    """Where imports wait and convert: on the models store's file system, so the result is renamed into place.
    (The path is spelled here, not read from registry.services: the services import this module, and importing
    them from here ran their package's __init__ in a circle.)"""
    return Path(settings.STORAGE_ROOT) / "models" / ".imports"


def staging_folder(import_id: Any) -> Path:
    return staging_root() / str(import_id)


class StagedUpload(UploadedFile):
    """The uploaded GGUF in its staging folder: `import_id` names the folder (and the import made from it)."""

    def __init__(self, import_id: uuid.UUID, name: str, size: int, sha256: str, too_large: bool) -> None:
        self.import_id = import_id
        self.sha256 = sha256
        self.too_large = too_large  # past GGUF_IMPORT_MAX_BYTES: the file holds only what came before
        self._claimed = False
        handle: IO[bytes] = open(self.path, "rb")  # noqa: SIM115  closed with the request's files
        super().__init__(handle, name=name, content_type="application/octet-stream", size=size)

    @property
    def folder(self) -> Path:
        return staging_folder(self.import_id)

    @property
    def path(self) -> Path:
        return self.folder / SOURCE_NAME

    def claim(self) -> None:
        """Its import owns the folder now: closing the request's files leaves it."""
        self._claimed = True

    def close(self) -> None:
        super().close()
        if not self._claimed:
            shutil.rmtree(self.folder, ignore_errors=True)


class GGUFUploadHandler(FileUploadHandler):
    """Django's upload handler for POST /api/models/import-gguf/: the `file` field into a new staging folder, every
    other file field skipped."""

    def __init__(self, request: HttpRequest | None = None) -> None:
        super().__init__(request)
        self._handle: IO[bytes] | None = None
        self._import_id = uuid.uuid4()
        self._digest = hashlib.sha256()
        self._size = 0
        self._limit = int(settings.GGUF_IMPORT_MAX_BYTES)

    def new_file(self, field_name: str, file_name: str, *args: Any, **kwargs: Any) -> None:
        if field_name != FIELD or self._handle is not None:
            raise SkipFile()
        super().new_file(field_name, file_name, *args, **kwargs)
        folder = staging_folder(self._import_id)
        folder.mkdir(parents=True, mode=0o700)
        self._handle = open(folder / SOURCE_NAME, "wb")  # noqa: SIM115  closed in file_complete

    def receive_data_chunk(self, raw_data: bytes, start: int) -> None:
        assert self._handle is not None
        self._size += len(raw_data)
        if self._size <= self._limit:
            self._digest.update(raw_data)
            self._handle.write(raw_data)
        return None

    def file_complete(self, file_size: int) -> StagedUpload | None:
        if self._handle is None:
            return None
        self._handle.close()
        too_large = self._size > self._limit
        if too_large:  # nothing of it is kept beyond the limit; the service refuses it
            (staging_folder(self._import_id) / SOURCE_NAME).write_bytes(b"")
        return StagedUpload(
            self._import_id, self.file_name or SOURCE_NAME, self._size, self._digest.hexdigest(), too_large
        )

    def upload_interrupted(self) -> None:
        if self._handle is not None:
            self._handle.close()
            shutil.rmtree(staging_folder(self._import_id), ignore_errors=True)
