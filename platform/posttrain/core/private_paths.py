"""Server paths a user names (a dataset or reward file to register, an environment file, an agent's files)
must never point at the platform's own secrets: the web process would read them into the registry, and
the engine would copy them into a sandbox whose code could print them."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings


def private_files() -> list[tuple[Path, str]]:
    """(path, what it is) for the files and folders the platform keeps to itself."""
    found = [
        (settings.STATE_DIR / "secret_key", "the platform's secret key"),
        (settings.STATE_DIR / "celery-broker.sqlite3", "the task broker's database"),
        (Path(settings.STORAGE_ROOT) / "runs", "the runs' folders (their events and tokens)"),
    ]
    for database in settings.DATABASES.values():
        if database["ENGINE"].endswith("sqlite3"):
            found.append((Path(database["NAME"]), "the platform's database"))
    return found


def private_path_problem(path: str | Path) -> str | None:
    """Why `path` must not be read for a user, or None when it may."""
    try:
        real = Path(path).expanduser().resolve()
    except (OSError, RuntimeError):
        return None  # the caller's own checks report a path that cannot be resolved
    for private, what in private_files():
        target = private.resolve()
        if real == target or target in real.parents:
            return f"{path} is {what}, which the platform keeps private"
    return None
