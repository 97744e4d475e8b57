"""The Tinker API over HTTP, as the official ``tinker`` SDK calls it (routes under ``/api/v1/``).

A standard-library threaded HTTP server: each request is parsed and answered on its own thread, and the
computing calls go to :class:`~rl_engine.tinker.service.TinkerService`'s queue, so a long
``retrieve_future`` poll never holds up a submission. Bodies are capped (``max_body_bytes``) before they
are read; every caller must send one of the accepted keys in ``X-API-Key``.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pydantic import ValidationError
from tinker import types

from rl_engine.tinker.losses import LossRefused
from rl_engine.tinker.model import AdamSettings, LoraSettings
from rl_engine.tinker.service import Future, TinkerService
from rl_engine.tinker.wire import decode_forward_backward

__all__ = ["CLIENT_CONFIG", "TinkerServer"]

log = logging.getLogger(__name__)

#: What the SDK is told of this server: no JWT exchange; the SDK's standard HTTP transport; one
#: forward_backward chunk in flight per training client (arrival order is seq order); uncompressed bodies.
CLIENT_CONFIG: dict[str, Any] = {
    "pjwt_auth_enabled": False,
    "credential_default_source": "api_key",
    "use_pyqwest_transport": False,
    "parallel_fwdbwd_chunks": False,
    "proto_compress_fwdbwd": False,
    "sample_use_retrieve_futures": False,
    "custom_loss_server_side": False,
    "sample_join_sampling_session": False,
}
#: How long one retrieve_future waits for its call before answering "try again" (the SDK waits 45 s).
POLL_SECONDS = 20.0
DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024


class _Refused(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


Route = Callable[["_Handler", Any], tuple[int, Any]]


class TinkerServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        service: TinkerService,
        api_keys: set[str] | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        poll_seconds: float = POLL_SECONDS,
    ) -> None:
        super().__init__(address, _Handler)
        self.service, self.api_keys = service, api_keys or set()
        self.max_body_bytes, self.poll_seconds = max_body_bytes, poll_seconds

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}" if isinstance(host, str) else f"http://{host.decode()}:{port}"


class _Handler(BaseHTTPRequestHandler):
    server: TinkerServer
    protocol_version = "HTTP/1.1"
    # Headers and body leave in two writes: with Nagle's algorithm on, the body waits for the client's delayed
    # ACK (40 ms on Linux) on every answer.
    disable_nagle_algorithm = True
    key = ""
    body = b""

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        self._answer("GET")

    def do_POST(self) -> None:
        self._answer("POST")

    def _answer(self, method: str) -> None:
        try:
            self._authenticate()
            self.body = self._body() if method == "POST" else b""
            route, arg = _route(method, self.path)
            status, payload = route(
                self, _parsed(self.body, self.headers.get("Content-Type", "")) if arg is None else arg
            )
        except _Refused as exc:
            status, payload = exc.status, {"detail": exc.detail}
        except PermissionError as exc:
            status, payload = 403 if self.key else 401, {"detail": str(exc)}
        except LossRefused as exc:
            status, payload = 400, {"detail": str(exc)}
        except ValidationError as exc:
            status, payload = 400, {"detail": _validation_detail(exc)}
        except Exception as exc:  # one request's failure is that request's
            log.exception("tinker request %s failed", self.path)
            status, payload = 500, {"detail": f"{type(exc).__name__}: {exc}"}
        self._send(status, payload)

    def _authenticate(self) -> None:
        """The caller's key: one of the server's own, or (with Posttrain) a token Posttrain accepts."""
        given = self.headers.get("X-API-Key", "")
        if any(hmac.compare_digest(given, key) for key in self.server.api_keys):
            self.key = given
            return
        runs = self.server.service.runs
        if runs is None:
            raise _Refused(401, "X-API-Key: not a key this server accepts")
        runs.authenticate(given)
        self.key = given

    def _body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            raise _Refused(411, "Content-Length is required")
        if int(length) > self.server.max_body_bytes:
            raise _Refused(413, f"the body is {length} bytes, over this server's {self.server.max_body_bytes}")
        return self.rfile.read(int(length))

    def _send(self, status: int, payload: Any) -> None:
        if isinstance(payload, bytes):
            body, content_type = payload, "application/x-protobuf"
        else:
            body, content_type = json.dumps(payload).encode(), "application/json"
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _parsed(body: bytes, content_type: str) -> Any:
    if "application/x-protobuf" in content_type:
        return body
    if not body:
        return {}
    try:
        return json.loads(body)
    except ValueError as exc:
        raise _Refused(400, f"the body is not JSON: {exc}") from exc


def _validation_detail(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first.get("loc", ())) or "body"
    return f"{where}: {first.get('msg', 'invalid')}"


# --- routes ------------------------------------------------------------------------------------------


def _future_json(future: Future) -> dict[str, Any]:
    return {"request_id": future.request_id}


def _healthz(handler: _Handler, body: Any) -> tuple[int, Any]:
    return 200, {"status": "ok"}


def _client_config(handler: _Handler, body: Any) -> tuple[int, Any]:
    return 200, CLIENT_CONFIG


def _capabilities(handler: _Handler, body: Any) -> tuple[int, Any]:
    return 200, {"supported_models": handler.server.service.capabilities()}


def _create_session(handler: _Handler, body: Any) -> tuple[int, Any]:
    request = types.CreateSessionRequest.model_validate(body)
    session_id = handler.server.service.create_session(handler.key, request.project_id)
    return 200, {"type": "create_session", "session_id": session_id}


def _heartbeat(handler: _Handler, body: Any) -> tuple[int, Any]:
    request = types.SessionHeartbeatRequest.model_validate(body)
    handler.server.service.heartbeat(request.session_id, handler.key)
    return 200, {"type": "session_heartbeat"}


def _create_model(handler: _Handler, body: Any) -> tuple[int, Any]:
    request = types.CreateModelRequest.model_validate(body)
    if request.lora_config is None:
        raise LossRefused("lora_config: only LoRA training clients are served (create_lora_training_client)")
    if request.optimizer_config.type != "adamw":
        raise LossRefused(f"optimizer_config.type {request.optimizer_config.type!r} is not served (adamw)")
    lora = LoraSettings(
        rank=request.lora_config.rank,
        seed=request.lora_config.seed,
        train_attn=request.lora_config.train_attn,
        train_mlp=request.lora_config.train_mlp,
        train_unembed=request.lora_config.train_unembed,
    )
    future = handler.server.service.create_model(request.session_id, handler.key, request.base_model, lora)
    return 200, _future_json(future)


def _get_info(handler: _Handler, body: Any) -> tuple[int, Any]:
    return 200, handler.server.service.info(types.GetInfoRequest.model_validate(body).model_id, handler.key)


def _forward_backward(handler: _Handler, body: Any) -> tuple[int, Any]:
    if not isinstance(body, bytes):
        raise _Refused(415, "forward_backward: send application/x-protobuf (the SDK does)")
    call = decode_forward_backward(body)
    return 200, {**_future_json(handler.server.service.forward_backward(call, handler.key)), "model_id": call.model_id}


def _optim_step(handler: _Handler, body: Any) -> tuple[int, Any]:
    request = types.OptimStepRequest.model_validate(body)
    if not isinstance(request.optim_params, types.AdamParams):
        raise LossRefused(f"optim_params: only AdamParams are served, got {type(request.optim_params).__name__}")
    adam = AdamSettings(**request.optim_params.model_dump(exclude={"type"}))
    return 200, {
        **_future_json(handler.server.service.optim_step(request.model_id, handler.key, adam)),
        "model_id": request.model_id,
    }


def _save_weights(handler: _Handler, body: Any) -> tuple[int, Any]:
    request = types.SaveWeightsRequest.model_validate(body)
    return 200, _future_json(
        handler.server.service.save(request.model_id, handler.key, request.path, for_sampler=False)
    )


def _save_for_sampler(handler: _Handler, body: Any) -> tuple[int, Any]:
    request = types.SaveWeightsForSamplerRequest.model_validate(body)
    return 200, _future_json(handler.server.service.save(request.model_id, handler.key, request.path, for_sampler=True))


def _load_weights(handler: _Handler, body: Any) -> tuple[int, Any]:
    request = types.LoadWeightsRequest.model_validate(body)
    if request.model_id is None:
        raise LossRefused("model_id: load into an existing training client (create it first)")
    future = handler.server.service.load(request.model_id, handler.key, request.path, request.optimizer)
    return 200, _future_json(future)


def _create_sampling_session(handler: _Handler, body: Any) -> tuple[int, Any]:
    request = types.CreateSamplingSessionRequest.model_validate(body)
    sampling_id = handler.server.service.create_sampling_session(
        request.session_id, handler.key, request.base_model, request.model_path
    )
    return 200, {"type": "create_sampling_session", "sampling_session_id": sampling_id}


def _sample(handler: _Handler, body: Any) -> tuple[int, Any]:
    request = types.SampleRequest.model_validate(body)  # the SDK's own checks; the service reads the plain dict
    future = handler.server.service.sample(body, handler.key)
    sequence_ids = [f"{future.request_id}-{index}" for index in range(request.num_samples)]
    return 200, {**_future_json(future), "sample_sequence_ids": sequence_ids}


def _retrieve(handler: _Handler, body: Any) -> tuple[int, Any]:
    request = types.FutureRetrieveRequest.model_validate(body)
    future = handler.server.service.future(request.request_id, handler.key)
    if not future.done.wait(handler.server.poll_seconds):
        return 200, {"type": "try_again", "request_id": future.request_id, "queue_state": "active"}
    if future.error is not None:
        return 200, {"error": future.error, "category": future.category}
    return 200, future.proto if future.proto is not None else future.json


def _accepted(handler: _Handler, body: Any) -> tuple[int, Any]:
    return 200, {"status": "accepted"}


def _finish_session(handler: _Handler, session_id: str) -> tuple[int, Any]:
    body = _parsed(handler.body, handler.headers.get("Content-Type", ""))
    status = str((body.get("reason") or {}).get("type") or "success")
    handler.server.service.finish_session(session_id, handler.key, status, body.get("detail"))
    return 200, {}


def _checkpoints(handler: _Handler, model_id: str) -> tuple[int, Any]:
    return 200, {"checkpoints": handler.server.service.checkpoints(model_id, handler.key)}


_POST: dict[str, Route] = {
    "/api/v1/client/config": _client_config,
    "/api/v1/create_session": _create_session,
    "/api/v1/session_heartbeat": _heartbeat,
    "/api/v1/create_model": _create_model,
    "/api/v1/get_info": _get_info,
    "/api/v1/forward_backward": _forward_backward,
    "/api/v1/optim_step": _optim_step,
    "/api/v1/save_weights": _save_weights,
    "/api/v1/save_weights_for_sampler": _save_for_sampler,
    "/api/v1/load_weights": _load_weights,
    "/api/v1/create_sampling_session": _create_sampling_session,
    "/api/v1/asample": _sample,
    "/api/v1/retrieve_future": _retrieve,
    "/api/v1/telemetry": _accepted,
    "/api/v1/cancel_future": _accepted,
}
_GET: dict[str, Route] = {
    "/api/v1/healthz": _healthz,
    "/api/v1/get_server_capabilities": _capabilities,
}


def _route(method: str, raw_path: str) -> tuple[Route, Any]:
    path = raw_path.split("?", 1)[0]
    table = _POST if method == "POST" else _GET
    if path in table:
        return table[path], None
    parts = path.strip("/").split("/")
    if len(parts) == 5 and parts[:2] == ["api", "v1"]:
        if method == "GET" and parts[2] == "training_runs" and parts[4] == "checkpoints":
            return _checkpoints, parts[3]
        if method == "POST" and parts[2] == "sessions" and parts[4] == "finish":
            return _finish_session, parts[3]
    raise _Refused(404, f"{method} {path}: no such Tinker route here")
