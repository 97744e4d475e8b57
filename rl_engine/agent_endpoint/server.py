"""The endpoint's HTTP servers (TCP, and the Unix socket the sandboxed agent reaches) and the request handler
that routes each request to the executor and writes its reply, JSON or Server-Sent Events."""

from __future__ import annotations

import json
import re
import socketserver
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from rl_engine.agent_endpoint.protocol import TOKEN_ENV, AgentError, stream_chunks

if TYPE_CHECKING:  # the executor builds its handler from this module's: a run-time import would go in a circle
    from rl_engine.agent_endpoint.executor import AgentExecutor

# Connections waiting to be accepted: an agent opens many at once (socketserver's default of 5 is for a toy
# server; past it connections wait or are refused while the endpoint is busy generating).
ENDPOINT_BACKLOG = 128
_SESSION_PATH = re.compile(r"^/sessions/([0-9a-f]{32})(/.*)$")


class _EndpointServer:
    """What both of the endpoint's servers share: request threads that never hold the engine's exit, and a
    backlog sized for an agent's many connections."""

    daemon_threads = True
    request_queue_size = ENDPOINT_BACKLOG


class _UnixHTTPServer(_EndpointServer, socketserver.ThreadingUnixStreamServer):
    pass


class _TCPHTTPServer(_EndpointServer, ThreadingHTTPServer):
    pass


class _Handler(BaseHTTPRequestHandler):
    owner: AgentExecutor
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the run's events say what happened; per-request lines would flood the job log

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, chunks: list[dict[str, Any]]) -> None:
        """Server-Sent Events in HTTP/1.1 chunked transfer encoding (the connection stays reusable)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for event in [*(f"data: {json.dumps(c)}\n\n" for c in chunks), "data: [DONE]\n\n"]:
            data = event.encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError as exc:
            raise AgentError(400, f"the body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise AgentError(400, "the body must be a JSON object")
        return body

    def _handle(self, method: str) -> None:
        try:
            owner = self.owner
            if not owner.authorized(self.headers.get("Authorization")):
                # Before anything else, the body included: no task, no session, no model name for a stranger.
                self.close_connection = True
                raise AgentError(401, f"a bearer token is required: the run's own ({TOKEN_ENV})")
            path = self.path.split("?", 1)[0]
            matched = _SESSION_PATH.match(path)
            session_id, rest = (matched.group(1), matched.group(2)) if matched else (None, path)
            if method == "GET" and rest == "/v1/models":
                reply = {
                    "object": "list",
                    "data": [{"id": owner.model_name, "object": "model", "owned_by": "posttrain"}],
                }
            elif method == "POST" and path == "/sessions":
                reply = owner.open_session()
            elif method == "POST" and session_id and rest == "/v1/chat/completions":
                body = self._body()
                completion = owner.complete(session_id, body)
                if body.get("stream"):
                    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                    self._stream(stream_chunks(completion, owner.tokenizer, include_usage))
                    return
                reply = completion.reply
            elif method == "POST" and session_id and rest == "/finish":
                reply = owner.finish(session_id, self._body())
            else:
                raise AgentError(404, f"no route {method} {path}")
            self._reply(200, reply)
        except AgentError as exc:
            self._reply(
                exc.status,
                {
                    "error": {
                        "message": str(exc),
                        "type": "invalid_request_error" if exc.status in (400, 401) else "posttrain_error",
                        "param": exc.param,
                        "code": "invalid_api_key" if exc.status == 401 else None,
                    }
                },
            )

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")
