"""Where the CLI and the SDK find the server and the token.

`posttrain login` stores one token per server in `~/.config/posttrain/credentials.json` (mode 0600;
`POSTTRAIN_CONFIG_DIR` moves it), like `huggingface-cli login` and `wandb login`, and remembers the
last server logged in to as the default. `POSTTRAIN_URL` and `POSTTRAIN_TOKEN` override both (CI,
notebooks, jobs on a cluster).

`posttrain projects use NAME` stores a default project beside the server's token: lists show only it
and creates go into it. `POSTTRAIN_PROJECT` (or `--project`, `Client(project=...)`) overrides it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from posttrain_sdk.errors import NotLoggedIn

DEFAULT_URL = "http://127.0.0.1:8000"


def config_dir() -> Path:
    configured = os.environ.get("POSTTRAIN_CONFIG_DIR")
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "posttrain"


def credentials_path() -> Path:
    return config_dir() / "credentials.json"


def normalize_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        url = f"http://{url}"
    return url


def _read() -> dict:
    path = credentials_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {"default": None, "servers": {}}
    except ValueError:
        raise NotLoggedIn(f"{path} is not valid JSON; delete it and run `posttrain login` again") from None
    if not isinstance(data, dict) or not isinstance(data.get("servers"), dict):
        return {"default": None, "servers": {}}
    return data


def _write(data: dict) -> None:
    path = credentials_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    # Created 0600 before anything is written: the token never sits in a world-readable file.
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
    os.replace(temporary, path)


def save_token(url: str, token: str, username: str) -> None:
    data = _read()
    url = normalize_url(url)
    # Logging in again keeps the server's default project.
    data["servers"][url] = {**data["servers"].get(url, {}), "token": token, "username": username}
    data["default"] = url
    _write(data)


def save_project(url: str, project: str | None) -> None:
    """The default project of the server (None forgets it)."""
    data = _read()
    url = normalize_url(url)
    if not project and url not in data["servers"]:
        return
    entry = dict(data["servers"].get(url) or {})
    if project:
        entry["project"] = project
    else:
        entry.pop("project", None)
    data["servers"][url] = entry
    _write(data)


def forget_token(url: str) -> bool:
    data = _read()
    url = normalize_url(url)
    removed = data["servers"].pop(url, None) is not None
    if data.get("default") == url:
        data["default"] = next((u for u, entry in data["servers"].items() if entry.get("token")), None)
    _write(data)
    return removed


@dataclass(frozen=True)
class Credentials:
    url: str
    token: str
    username: str | None = None
    project: str | None = None  # the server's default project (`posttrain projects use`)


def default_url() -> str:
    return normalize_url(os.environ.get("POSTTRAIN_URL") or _read().get("default") or DEFAULT_URL)


def resolve(url: str | None = None, token: str | None = None) -> Credentials:
    """The server and token to use: the arguments, else the environment, else what login stored."""
    url = normalize_url(url) if url else default_url()
    token = token or os.environ.get("POSTTRAIN_TOKEN")
    if token:
        return Credentials(url, token, project=stored_project(url))
    stored = _read()["servers"].get(url)
    if not stored or not stored.get("token"):
        raise NotLoggedIn(f"not logged in to {url}: run `posttrain login --url {url}` (or set POSTTRAIN_TOKEN)")
    return Credentials(url, stored["token"], stored.get("username"), stored.get("project") or None)


def stored_project(url: str) -> str | None:
    """The default project stored for the server; None when there is none, or no readable file (a token given
    by argument or environment needs no file)."""
    try:
        entry = _read()["servers"].get(normalize_url(url))
    except NotLoggedIn:
        return None
    return (entry.get("project") or None) if isinstance(entry, dict) else None
