"""OpenEnv environments, served inside the environment's sandbox and played through the package's own client,
over OpenEnv's public API only (an environment package's FastAPI `app`, `openenv.core.GenericEnvClient`).

This file runs in the sandbox (copied in alone, like a user's environment file, with `environment.files` beside
it): standard library, uvicorn and openenv. No network leaves the sandbox: the server listens on the sandbox's
own loopback, started once per sandbox process, and every episode is one WebSocket session of its own.

    environment: {package: openenv, options: {app: "my_env.server.app:app", action_field: message,
                                               observation_field: echoed_message}}

- `app`: the environment server's ASGI app, `module:attribute` (an installed environment package's, or a file of
  `environment.files`);
- `action_field`: the action's field that receives the model's text;
- `observation_field`: the observation's field shown to the model (empty: the observation as JSON, without
  `reward`, `done` and `metadata`);
- `reset`: keyword arguments of every `reset()` (a row's `seed`, when it has one, is added).

Each step's reward is the environment's own; an episode ends when the environment says done, or after
`environment.max_turns` turns. A server at a URL (`url`, `base_url`) is refused: nothing leaves the sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import socket
import threading
import time
from typing import Any

START_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 60.0
_servers: dict[str, _Server] = {}


class _Server:
    """The app under uvicorn on 127.0.0.1, and the event loop every client of this process runs on."""

    def __init__(self, app_path: str):
        import uvicorn

        module_name, _, attribute = app_path.partition(":")
        if not module_name or not attribute:
            raise ValueError(f"app must be 'module:attribute', got {app_path!r}")
        app = getattr(importlib.import_module(module_name), attribute)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.loop = asyncio.new_event_loop()
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        thread = threading.Thread(target=self._serve, name="openenv-server", daemon=True)
        thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the environment server {app_path} did not start")
            time.sleep(0.02)

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self.server.serve())

    def run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(CALL_TIMEOUT_S)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _server(app: str) -> _Server:
    if app not in _servers:
        _servers[app] = _Server(app)
    return _servers[app]


class OpenEnv:
    def __init__(
        self,
        app: str,
        action_field: str = "message",
        observation_field: str | None = None,
        reset: dict | None = None,
        url: str | None = None,
        base_url: str | None = None,
    ):
        if url or base_url:  # nothing leaves the sandbox (no outbound request policy covers environments yet)
            raise ValueError("an environment server at a URL is not reached: give its app, the run serves it here")
        self.app, self.action_field, self.observation_field = app, action_field, observation_field
        self.reset_args = dict(reset or {})
        self.client: Any = None

    def reset(self, prompt: str, label: str | None, metadata: dict) -> str | None:
        from openenv.core import GenericEnvClient

        self.server = _server(self.app)
        self.client = GenericEnvClient(base_url=self.server.url)
        self.server.run(self.client.connect())
        arguments = dict(self.reset_args)
        if isinstance((metadata or {}).get("seed"), int):
            arguments["seed"] = metadata["seed"]
        result = self.server.run(self.client.reset(**arguments))
        return self._text(result.observation) or None

    def step(self, action: str) -> tuple[str | None, float, bool, dict]:
        result = self.server.run(self.client.step({self.action_field: action}))
        done = bool(result.done)
        if done:
            self.close()
        return self._text(result.observation) or None, float(result.reward or 0.0), done, {}

    def _text(self, observation: Any) -> str:
        if not isinstance(observation, dict):
            return str(observation or "")
        if self.observation_field:
            return str(observation.get(self.observation_field) or "")
        shown = {k: v for k, v in observation.items() if k not in ("reward", "done", "metadata")}
        return json.dumps(shown, sort_keys=True) if shown else ""

    def close(self) -> None:
        if self.client is not None:
            client, self.client = self.client, None
            with contextlib.suppress(Exception):  # a session the server already dropped
                self.server.run(client.close())

    def __del__(self) -> None:
        self.close()
