"""The one resolver for every server path a user names: a dataset or model to register, a python reward's
file, a reward model's folder, and a run's `data.eval_path`, `model.tokenizer_path`, `environment.path` and
`agent.files`. (Label Studio's LOCAL_FILES_DOCUMENT_ROOT is the shape: files are served only from folders
an admin opened.)

A path counts only after its symlinks are resolved, and only inside an import root (`IMPORT_ROOTS`, from
POSTTRAIN_IMPORT_ROOTS; by default `<storage>/imports/`) or the engine's own example environments. Whatever
the roots, the platform's own files are never readable through a path: `/proc`, `/sys`, `/dev`, the state
folder outside storage (secret key, admin passwords, logs, pids, the embedded database and broker with their
-wal/-shm/-journal sidecars, wherever those live) and the runs' folders. Naming a server path at all is a
permission an admin grants (IMPORT_PERMISSION); uploads need none.

Errors name the field and the rule and quote only the path the user typed, never a byte of a file, and a
path outside the roots is refused the same way whether or not it exists (no oracle for the host's files).

The engine does not know the roots: the platform resolves every path of a run's config at launch and hands
the engine the resolved, checked paths (`run_config_paths_resolve`).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import IO, Any, Literal

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User

from posttrain.core.errors import InvalidInput, PermissionDenied

IMPORT_PERMISSION = "registry.import_server_paths"
Kind = Literal["file", "folder", "any"]

# A model or tokenizer folder is walked for links that leave the roots; a folder this big is refused instead.
MAX_FOLDER_ENTRIES = 10_000
SQLITE_SIDECARS = ("", "-wal", "-shm", "-journal")
_OUTSIDE = "is outside the server folders an admin opened for imports (POSTTRAIN_IMPORT_ROOTS)"
_PRIVATE = "is one of the platform's own files or folders, which no path may name"


@dataclass(frozen=True)
class _Private:
    folders: tuple[Path, ...]  # nothing inside these is readable ...
    open_inside: tuple[Path, ...]  # ... except inside these (the storage folder, when it lies in the state folder)
    closed_inside: tuple[Path, ...]  # ... and never inside these (the runs' folders)
    files: tuple[Path, ...]  # exact files (databases and their sidecars), wherever they are


def import_roots() -> list[Path]:
    """The admin's import roots, resolved."""
    return [Path(os.path.realpath(root)) for root in settings.IMPORT_ROOTS]


@cache
def builtin_roots() -> tuple[Path, ...]:
    """The engine's example environments and agents: public code every researcher may name, read-only."""
    from rl_engine.spec.user_code import BUILTIN_ENVIRONMENTS

    return (Path(os.path.realpath(BUILTIN_ENVIRONMENTS)),)


def platform_stores() -> list[Path]:
    """Where the platform itself stores what users registered (datasets, python rewards, model copies)."""
    storage = Path(os.path.realpath(settings.STORAGE_ROOT))
    return [storage / "datasets", storage / "rewards", storage / "models"]


def may_name_server_paths(user: User | AnonymousUser | None) -> bool:
    """Whether `user` may name server paths. `None` is the platform itself (a management command)."""
    if user is None:
        return True
    return bool(user.is_authenticated and user.has_perm(IMPORT_PERMISSION))


def require_permission(field: str, user: User | AnonymousUser | None) -> None:
    if not may_name_server_paths(user):
        raise PermissionDenied(
            "naming a file on the server needs the 'import server paths' permission, which an admin grants "
            "(`manage.py grant_server_paths USER`); uploads need none",
            loc=field,
        )


def resolve_user_path(field: str, raw: Any, user: User | AnonymousUser | None, kind: Kind = "any") -> Path:
    """The resolved path a user named, inside an import root (or the engine's examples) and not private;
    refused with a field error otherwise. Needs the permission unless it is one of the engine's examples."""
    path = _parse(field, raw)
    real = Path(os.path.realpath(path))
    if not _inside_any(real, builtin_roots()):
        require_permission(field, user)
    return _checked(field, raw, real, _user_roots(), kind)


def resolve_stored_path(field: str, raw: Any, kind: Kind = "any") -> Path:
    """A path from the registry (a model folder, a dataset or reward file) as a run is launched with it: inside
    an import root, the platform's own stores or the engine's examples, and not private. Not checked for
    existence: the engine says what is missing, as it always did."""
    path = _parse(field, raw)
    real = Path(os.path.realpath(path))
    return _checked(field, raw, real, [*import_roots(), *platform_stores(), *builtin_roots()], kind, must_exist=False)


def resolve_run_checkpoint(field: str, raw: Any, run_id: Any) -> Path:
    """A checkpoint folder of run `run_id` (resume, register as a model): inside that run's own folder only."""
    path = _parse(field, raw)
    real = Path(os.path.realpath(path))
    own = Path(os.path.realpath(Path(settings.STORAGE_ROOT) / "runs" / str(run_id)))
    if not _inside(real, own) or real == own:
        raise InvalidInput.one(field, f"{raw} is not a checkpoint folder of run {run_id}")
    return real


@contextmanager
def open_checked(field: str, real: Path) -> Iterator[IO[bytes]]:
    """`real` (from `resolve_user_path`) opened for reading, and checked again through the open file itself,
    so a link swapped in between the check and the open cannot lead it elsewhere."""
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise InvalidInput.one(field, f"{real} cannot be read ({exc.strerror or 'error'})") from None
    handle = os.fdopen(fd, "rb")
    try:
        opened = Path(os.readlink(f"/proc/self/fd/{fd}"))
        if not _inside_any(opened, _user_roots()) or _is_private(opened, os.fstat(fd)):
            raise InvalidInput.one(field, f"{real} {_OUTSIDE}")
        yield handle
    finally:
        handle.close()


def run_config_paths(config: Any) -> list[tuple[str, str, Kind]]:
    """Every server path a user typed into a run config (an `rl_engine.config.RunConfig`): (field, path, kind).
    The registry's own paths (model.path, data.path, rewards) are listed by `run_config_stored_paths`."""
    named: list[tuple[str, str, Kind]] = []
    if config.model.tokenizer_path:
        named.append(("model.tokenizer_path", config.model.tokenizer_path, "folder"))
    if config.data.eval_path:
        named.append(("data.eval_path", config.data.eval_path, "any"))
    if config.environment is not None:
        if config.environment.path is not None:
            named.append(("environment.path", config.environment.path, "file"))
        named += [(f"environment.files.{i}", path, "file") for i, path in enumerate(config.environment.files)]
    for i, reward in enumerate(config.rewards):  # the files an installed environment's reward reads (verifiers)
        named += [(f"rewards.{i}.files.{j}", path, "file") for j, path in enumerate(getattr(reward, "files", []))]
    if config.agent is not None:
        named += [(f"agent.files.{i}", path, "file") for i, path in enumerate(config.agent.files)]
    return named


def run_config_stored_paths(config: Any) -> list[tuple[str, str, Kind]]:
    named: list[tuple[str, str, Kind]] = [
        ("model.path", config.model.path, "folder"),
        ("data.path", config.data.path, "any"),
    ]
    for i, reward in enumerate(config.rewards):
        if reward.type in ("python", "reward_model"):
            named.append((f"rewards.{i}.path", reward.path, "file" if reward.type == "python" else "folder"))
    return named


def run_config_check_user_paths(config: Any, user: User | AnonymousUser | None) -> None:
    """At create and validate: every path the user typed resolves and may be named by this user."""
    errors: list[dict[str, str]] = []
    for field, raw, kind in run_config_paths(config):
        try:
            resolve_user_path(field, raw, user, kind)
        except InvalidInput as exc:
            errors += exc.errors
    if errors:
        raise InvalidInput(errors)


def run_config_paths_resolve(dumped: dict[str, Any], config: Any) -> dict[str, Any]:
    """At launch: the run config (`dumped`, the validated config as JSON) with every server path resolved and
    checked against the roots as they are now (an admin may have narrowed them); the engine reads these."""
    errors: list[dict[str, str]] = []
    resolved: dict[str, str] = {}
    for field, raw, kind in run_config_paths(config):
        try:
            resolved[field] = str(_checked(field, raw, Path(os.path.realpath(_parse(field, raw))), _user_roots(), kind))
        except InvalidInput as exc:
            errors += exc.errors
    for field, raw, kind in run_config_stored_paths(config):
        try:
            resolved[field] = str(resolve_stored_path(field, raw, kind))
        except InvalidInput as exc:
            errors += exc.errors
    if errors:
        raise InvalidInput(errors)
    for field, value in resolved.items():
        _set_dotted(dumped, field, value)
    return dumped


# --- the rules -------------------------------------------------------------------------------------------


def _user_roots() -> list[Path]:
    return [*import_roots(), *builtin_roots()]


def _parse(field: str, raw: Any) -> Path:
    if not isinstance(raw, str) or not raw.strip():
        raise InvalidInput.one(field, "is required: an absolute path on the server")
    if "\x00" in raw:
        raise InvalidInput.one(field, "must not contain NUL characters")
    path = Path(raw)
    if not path.is_absolute():
        raise InvalidInput.one(field, f"must be an absolute path on the server, got {raw!r}")
    return path


def _checked(field: str, raw: str, real: Path, roots: list[Path], kind: Kind, *, must_exist: bool = True) -> Path:
    if not _inside_any(real, roots):
        raise InvalidInput.one(field, f"{raw} {_OUTSIDE}")
    try:
        info = real.stat()
    except OSError:
        info = None
    if _is_private(real, info) or _holds_private(real):
        raise InvalidInput.one(field, f"{raw} {_PRIVATE}")
    if info is None:
        if must_exist:
            raise InvalidInput.one(field, f"{raw} does not exist")
        return real
    if kind == "file" and not stat.S_ISREG(info.st_mode):
        raise InvalidInput.one(field, f"{raw} is not a file")
    if kind == "folder" and not stat.S_ISDIR(info.st_mode):
        raise InvalidInput.one(field, f"{raw} is not a folder")
    if stat.S_ISDIR(info.st_mode):
        _check_links_inside(field, raw, real, roots)
    return real


def _check_links_inside(field: str, raw: str, folder: Path, roots: list[Path]) -> None:
    """A folder's own entries may be links too (`config.json -> /secret`): each must stay inside the roots."""
    seen = 0
    for parent, dirs, files in os.walk(folder, followlinks=False):
        for name in [*dirs, *files]:
            seen += 1
            if seen > MAX_FOLDER_ENTRIES:
                raise InvalidInput.one(field, f"{raw} holds more than {MAX_FOLDER_ENTRIES} files and folders")
            entry = Path(parent, name)
            if not entry.is_symlink():
                continue
            target = Path(os.path.realpath(entry))
            try:
                info = target.stat()
            except OSError:
                info = None
            if not _inside_any(target, roots) or _is_private(target, info):
                shown = entry.relative_to(folder)
                raise InvalidInput.one(
                    field, f"{raw}: {shown} inside it links outside the server folders open for imports"
                )


def _is_private(real: Path, info: os.stat_result | None) -> bool:
    areas = _private_areas()
    if any(real == f for f in areas.files):
        return True
    if info is not None and stat.S_ISREG(info.st_mode):
        for file in areas.files:
            try:
                other = file.stat()
            except OSError:
                continue
            if (other.st_dev, other.st_ino) == (info.st_dev, info.st_ino):  # a hard link to it
                return True
    if any(_inside(real, closed) for closed in areas.closed_inside):
        return True
    return any(
        _inside(real, folder) and not any(_inside(real, open_) for open_ in areas.open_inside)
        for folder in areas.folders
    )


def _holds_private(real: Path) -> bool:
    """A folder that contains any of the platform's own (naming `/` would hand all of it to the engine)."""
    areas = _private_areas()
    return any(real in area.parents for area in (*areas.folders, *areas.closed_inside, *areas.files))


def _private_areas() -> _Private:
    state = Path(os.path.realpath(settings.STATE_DIR))
    storage = Path(os.path.realpath(settings.STORAGE_ROOT))
    # Also matched by inode (a hard link elsewhere). The Ray token may be an operator's file outside the state folder.
    files = [state / "secret_key", *state.glob("*-password"), Path(os.path.realpath(settings.RAY_TOKEN_FILE))]
    for database in settings.DATABASES.values():
        if database["ENGINE"].endswith("sqlite3") and str(database.get("NAME") or "").strip():
            files += _with_sidecars(Path(str(database["NAME"])))
    broker = str(getattr(settings, "CELERY_BROKER_URL", "") or "")
    if broker.startswith("sqla+sqlite:///"):
        files += _with_sidecars(Path(broker[len("sqla+sqlite://") :]))
    return _Private(
        folders=(Path("/proc"), Path("/sys"), Path("/dev"), state),
        open_inside=(storage,) if _inside(storage, state) else (),
        closed_inside=(storage / "runs",),
        files=tuple(files),
    )


def _with_sidecars(database: Path) -> list[Path]:
    real = Path(os.path.realpath(database))
    return [Path(f"{real}{suffix}") for suffix in SQLITE_SIDECARS]


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _inside_any(path: Path, folders: Iterable[Path]) -> bool:
    return any(_inside(path, folder) for folder in folders)


def _set_dotted(config: dict[str, Any], dotted: str, value: str) -> None:
    keys = dotted.split(".")
    target: Any = config
    for key in keys[:-1]:
        target = target[int(key)] if isinstance(target, list) else target[key]
    last = keys[-1]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
