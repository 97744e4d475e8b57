"""What a request body costs the web process, per route, now that bodies are bounded before they are read
(posttrain.core.request_bounds; docs/SECURITY.md, "Request bodies"): for each capped route, (a) the largest body it
takes (exactly its cap, a body its view parses) and (b) a body far over the cap, declared (Content-Length: 10^12,
refused before a byte is read) and chunked (pushed as fast as the server takes it until it answers); for the run's
routes also (c) the demo's attack, an anonymous chunked body that never ends. Per request: the status, the answer
time (first byte sent to the whole answer read), the web process's peak RSS growth (VmHWM, reset before each
request through /proc/<pid>/clear_refs), and what the web process read and wrote meanwhile (/proc/<pid>/io: a
body Django spooled to disk shows as written bytes). Clients on the same machine: their CPU is the server's too.

The server is uvicorn as scripts/demo.sh starts it (its WEB_FLAGS), one worker, on a fresh Postgres database,
with one researcher (an API token) and one external run (its bearer token). `--cap-bytes N` sets every cap that
has a setting to N (the smoke run's tiny sizes); by default the caps are the platform's.

    .venv/bin/python bench/request_bounds.py [--cap-bytes N] [--pg-url URL]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's root: `bench`, the engine, the SDK

from bench import _servers, ingest  # the servers and databases of the ingestion benches
from bench._machine import MachineLoad

MiB = 1 << 20
PIECE = 1 << 20  # what the client sends at a time
DECLARED_HUGE = 10**12  # the attack's declared length
DEFAULT_CAPS = {  # the platform's defaults (platform/posttrain/settings.py), for the body sizes
    "events": 64 * MiB,
    "rollout_upload": 512 * MiB,
    "dataset_file": 200 * MiB,  # DATASET_MAX_BYTES; the route's cap adds 1 MiB for the form around the file
    "user_code": 4 * MiB,
    "api_json": 2 * MiB,
    "login": 16 * 1024,
}
CAP_SETTINGS = {  # the environment variable of each cap that has one
    "events": "POSTTRAIN_INGEST_MAX_BODY_BYTES",
    "rollout_upload": "POSTTRAIN_ROLLOUT_UPLOAD_MAX_BYTES",
    "dataset_file": "POSTTRAIN_DATASET_MAX_BYTES",
    "user_code": "POSTTRAIN_USER_CODE_BODY_MAX_BYTES",
    "api_json": "POSTTRAIN_API_BODY_MAX_BYTES",
}


def log(message: str) -> None:
    print(f"[request_bounds {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- the web process, measured ---------------------------------------------------------------------------------


class WebProcess:
    """The uvicorn process's memory and I/O counters, from /proc."""

    def __init__(self, pid: int):
        self.pid = pid

    def _status_kib(self, key: str) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        raise KeyError(key)

    def io(self) -> dict[str, int]:
        lines = Path(f"/proc/{self.pid}/io").read_text().splitlines()
        return {key: int(value) for key, value in (line.split(": ") for line in lines)}

    def reset_peak(self) -> int:
        """Resets the peak RSS to the current RSS (clear_refs 5); the current RSS in KiB."""
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")
        return self._status_kib("VmRSS")

    def peak_kib(self) -> int:
        return self._status_kib("VmHWM")


@dataclass
class Answer:
    status: int  # 0: the server closed without an answer
    headers: dict[str, str]  # names in lower case
    body: bytes
    sent: int  # body bytes the client got into its socket


def measured(web: WebProcess, send: Callable[[], Answer]) -> dict[str, Any]:
    rss_before = web.reset_peak()
    io_before = web.io()
    started = time.perf_counter()
    answer = send()
    elapsed = time.perf_counter() - started
    io_after = web.io()
    message = ""
    try:
        errors = json.loads(answer.body).get("errors")
        message = errors[0]["msg"][:160] if errors else ""
    except (ValueError, AttributeError, TypeError, KeyError, IndexError):
        pass
    return {
        "status": answer.status,
        "answer_s": round(elapsed, 4),
        "client_sent_bytes": answer.sent,
        "rss_growth_mib": round((web.peak_kib() - rss_before) / 1024, 2),
        "web_read_mib": round((io_after["rchar"] - io_before["rchar"]) / MiB, 2),
        "web_wrote_mib": round((io_after["wchar"] - io_before["wchar"]) / MiB, 2),
        "message": message,
    }


# --- the client: raw HTTP/1.1, so it can declare a length it never sends and stop as soon as it is answered ------


def _read_answer(sock: socket.socket, sent: int) -> Answer:
    received = b""
    try:
        while b"\r\n\r\n" not in received:
            data = sock.recv(65536)
            if not data:
                return Answer(0, {}, received, sent)  # closed without an answer
            received += data
        head, _, body = received.partition(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
        while len(body) < int(headers.get("content-length", 0)) and (data := sock.recv(65536)):
            body += data
        return Answer(int(status_line.split()[1]), headers, body, sent)
    except ConnectionResetError:
        return Answer(0, {}, received, sent)


def send_request(
    url: str,
    method: str,
    path: str,
    headers: dict[str, str],
    pieces: Iterator[bytes],
    *,
    declared: int | None,
    timeout_s: float = 600,
) -> Answer:
    """Sends the request, its body from `pieces` (chunked when `declared` is None), as fast as the server takes it;
    stops sending as soon as an answer arrives or the server closes, and reads that answer. TimeoutError when the
    server neither takes a byte nor answers for `timeout_s`."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=timeout_s)
    framing = "Transfer-Encoding: chunked" if declared is None else f"Content-Length: {declared}"
    head = f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\n{framing}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    try:
        sock.sendall(head.encode())
        sock.setblocking(False)
        sent, pending, more = 0, b"", True
        while pending or more:
            readable, writable, _ = select.select([sock], [sock], [], timeout_s)
            if not readable and not writable:
                raise TimeoutError(f"{method} {path}: no progress for {timeout_s} s ({sent} bytes sent)")
            if readable:
                break
            if writable:
                if not pending:
                    piece = next(pieces, None)
                    if piece is None:
                        more, pending = False, b"0\r\n\r\n" if declared is None else b""
                        continue
                    pending = b"%x\r\n%s\r\n" % (len(piece), piece) if declared is None else piece
                try:
                    count = sock.send(pending)
                except (BrokenPipeError, ConnectionResetError):
                    break
                pending = pending[count:]
                sent += count
        sock.setblocking(True)
        sock.settimeout(timeout_s)
        return _read_answer(sock, sent)
    finally:
        sock.close()


def repeated(piece: bytes, total: int) -> Iterator[bytes]:
    """`total` bytes as copies of `piece` (the last one cut): a body far over a cap (tests/security too)."""
    while total > 0:
        yield piece[:total]
        total -= len(piece)


def endless() -> Iterator[bytes]:
    piece = b"x" * PIECE
    while True:
        yield piece


# --- bodies of exactly a size, that the route's view parses ------------------------------------------------------


def json_padded(make: Callable[[str], Any], size: int) -> bytes:
    """The JSON of make(pad) with `pad` chosen so the body is exactly `size` bytes (ASCII padding)."""
    empty = json.dumps(make("")).encode()
    body = json.dumps(make("x" * max(0, size - len(empty)))).encode()
    assert len(body) == size, (len(body), size)
    return body


def events_batch(run_id: str, size: int) -> bytes:
    """A batch of log events of `size` bytes (the schema's 10,000 events at most: long messages)."""
    count = max(1, min(10_000, size // 8192))
    first = json.dumps({"events": [log_event(run_id, seq, "") for seq in range(1, count + 1)]}).encode()
    per_event, extra = divmod(size - len(first), count)
    events = [log_event(run_id, seq, "x" * (per_event + (extra if seq == count else 0))) for seq in range(1, count + 1)]
    body = json.dumps({"events": events}).encode()
    assert len(body) == size, (len(body), size)
    return body


def log_event(run_id: str, seq: int, message: str) -> dict[str, Any]:
    data = {"level": "info", "message": message}
    return {"run": run_id, "seq": seq, "type": "log", "step": 0, "time": 1.0, "data": data}


def rollout_file_under(size: int) -> bytes:
    """A real rollout file (the upload parses it: footer, schema, bounds) of at most `size` bytes and not much less:
    rows whose responses are random text at most MAX_TEXT_BYTES long (zstd cannot shrink it much), as many as fit."""
    import base64
    import os as system

    from posttrain_sdk import rollout_files as rf

    text_bytes = min(rf.MAX_TEXT_BYTES, max(1024, size // 8))

    def encoded(rows: int) -> bytes:
        records = [
            {
                "index": i,
                "group": i,
                "prompt": "p",
                "response": base64.b64encode(system.urandom(text_bytes * 3 // 4)).decode()[:text_bytes],
                "label": "l",
                "reward": 0.0,
                "components": {},
                "advantage": 0.0,
                "length": 1,
                "finish_reason": "length",
                "kept": True,
            }
            for i in range(rows)
        ]
        return rf.encode(rf.rows_table(records, 1))

    rows = max(1, int(size / (text_bytes * 0.76)))  # base64 of random bytes: zstd keeps ~3/4 of it
    body = encoded(rows)
    while len(body) > size and rows > 1:  # the file's own bytes (footer, other columns) pushed it over
        rows = max(1, min(rows - 1, rows * size // len(body)))
        body = encoded(rows)
    return body


def dataset_multipart(file_size: int) -> tuple[str, int, Iterator[bytes]]:
    """A multipart dataset upload whose JSONL file is exactly `file_size` bytes: (content type, length, pieces)."""
    boundary = uuid.uuid4().hex
    fields = {"name": f"bench {boundary[:8]}", "format": "jsonl", "prompt_field": "prompt", "label_field": "label"}
    head = "".join(
        f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n' for k, v in fields.items()
    )
    head += f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="big.jsonl"\r\n'
    head += "Content-Type: application/x-ndjson\r\n\r\n"
    tail = f"\r\n--{boundary}--\r\n".encode()
    line = b'{"prompt": "' + b"1+1=" * 240 + b'", "label": "2"}\n'  # ~1 KiB a row
    lines_per_piece = max(1, PIECE // len(line))

    def pieces() -> Iterator[bytes]:
        yield head.encode()
        whole, rest = divmod(file_size, len(line))
        for start in range(0, whole, lines_per_piece):
            yield line * min(lines_per_piece, whole - start)
        if rest:  # one last row padded to fill the size exactly
            pad = max(0, rest - len(b'{"prompt": "", "label": "2"}\n'))
            yield (b'{"prompt": "' + b"x" * pad + b'", "label": "2"}\n')[-rest:] if pad else b"\n" * rest
        yield tail

    return f"multipart/form-data; boundary={boundary}", len(head.encode()) + file_size + len(tail), pieces()


# --- the routes -------------------------------------------------------------------------------------------------


@dataclass
class Route:
    name: str  # the cap's key in REQUEST_BODY_MAX_BYTES
    method: str
    path: str
    headers: dict[str, str]  # credentials and content type
    largest: Callable[[], tuple[int, Iterator[bytes], dict[str, str]]]  # (length, pieces, extra headers)
    run_token: bool = False  # the engine's route: (c) the anonymous attack too


def routes(caps: dict[str, int], api_token: str, run: dict[str, Any]) -> list[Route]:
    user = {"Authorization": f"Token {api_token}"}
    engine = {"Authorization": f"Bearer {run['ingest_token']}"}
    as_json = {"Content-Type": "application/json"}

    def whole(body: bytes) -> tuple[int, Iterator[bytes], dict[str, str]]:
        return len(body), iter([body[i : i + PIECE] for i in range(0, len(body), PIECE)]), {}

    def dataset() -> tuple[int, Iterator[bytes], dict[str, str]]:
        content_type, length, pieces = dataset_multipart(caps["dataset_file"])
        return length, pieces, {"Content-Type": content_type}

    def reward() -> bytes:
        return json_padded(
            lambda pad: {
                "name": f"r{uuid.uuid4().hex[:8]}",
                "kind": "builtin",
                "spec": {"type": "exact_match"},
                "description": pad,
            },
            caps["user_code"],
        )

    def external_run() -> bytes:  # the body is taken whole; its config is over the service's 1 MiB: a 400
        return json_padded(lambda pad: {"experiment": "bench", "name": "big", "config": {"pad": pad}}, caps["api_json"])

    return [
        Route(
            "events",
            "POST",
            f"/api/runs/{run['id']}/events",
            {**engine, **as_json},
            lambda: whole(events_batch(run["id"], caps["events"])),
            run_token=True,
        ),
        Route(
            "rollout_upload",
            "PUT",
            f"/api/runs/{run['id']}/rollouts/step_00000001.parquet/upload",
            {**engine, "Content-Type": "application/vnd.apache.parquet"},
            lambda: whole(rollout_file_under(caps["rollout_upload"])),
            run_token=True,
        ),
        Route("dataset_upload", "POST", "/api/datasets/", user, dataset),
        Route("user_code", "POST", "/api/rewards/", {**user, **as_json}, lambda: whole(reward())),
        Route("api_json", "POST", "/api/runs/external/", {**user, **as_json}, lambda: whole(external_run())),
        Route(
            "login",
            "POST",
            "/api/auth/token/",
            as_json,
            lambda: whole(json_padded(lambda pad: {"username": "bench", "password": pad}, caps["login"])),
        ),
    ]


def measure_route(url: str, web: WebProcess, route: Route) -> list[dict[str, Any]]:
    rows = []

    def row(case: str, **result: Any) -> None:
        rows.append({"route": route.name, "request": f"{route.method} {route.path}", "case": case, **result})
        log(f"{route.name}: {case}: {result['status']} in {result['answer_s']} s, RSS +{result['rss_growth_mib']} MiB")

    length, pieces, extra = route.largest()
    headers = {**route.headers, **extra}
    row(
        "largest it takes",
        body_bytes=length,
        **measured(web, lambda: send_request(url, route.method, route.path, headers, pieces, declared=length)),
    )
    empty: Iterator[bytes] = iter(())
    row(
        "far over, declared",
        declared_bytes=DECLARED_HUGE,
        **measured(web, lambda: send_request(url, route.method, route.path, headers, empty, declared=DECLARED_HUGE)),
    )
    row(
        "far over, chunked",
        **measured(web, lambda: send_request(url, route.method, route.path, headers, endless(), declared=None)),
    )
    if route.run_token:
        anonymous = {k: v for k, v in headers.items() if k != "Authorization"}
        row(
            "anonymous, chunked, endless",
            **measured(web, lambda: send_request(url, route.method, route.path, anonymous, endless(), declared=None)),
        )
    return rows


# --- main ----------------------------------------------------------------------------------------------------------


def external_run(url: str, api_token: str) -> dict[str, Any]:
    connection = http.client.HTTPConnection(url.removeprefix("http://"), timeout=60)
    headers = {"Authorization": f"Token {api_token}", "Content-Type": "application/json"}
    connection.request("POST", "/api/runs/external/", json.dumps({"experiment": "bench", "name": "bounds"}), headers)
    response = connection.getresponse()
    body = json.loads(response.read())
    if response.status != 201:
        raise RuntimeError(f"creating the external run: HTTP {response.status} {body}")
    return {"id": body["run"]["id"], "ingest_token": body["ingest_token"]}


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--cap-bytes", type=int, default=None, help="every cap that has a setting (default: the platform's)"
    )
    ap.add_argument("--pg-url", default=os.environ.get("BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432"))
    args = ap.parse_args()

    machine = MachineLoad()
    uptime_start = uptime()
    caps = dict(DEFAULT_CAPS)
    if args.cap_bytes is not None:
        caps.update({name: args.cap_bytes for name in CAP_SETTINGS})
    workdir = Path(tempfile.mkdtemp(prefix="bench-request-bounds-"))
    pg = ingest.Postgres(args.pg_url)
    env, api_token = ingest.prepare_for_a_researcher(pg, workdir)
    env.update({CAP_SETTINGS[name]: str(caps[name]) for name in CAP_SETTINGS})
    env["POSTTRAIN_STORAGE"] = str(workdir / "storage")
    flags = _servers.demo_web_flags()
    server = _servers.start_uvicorn(env, workdir / "uvicorn.log", flags=flags).wait_until_up("/login/")
    try:
        run = external_run(server.url, api_token)
        web = WebProcess(server.pid)
        rows = [row for route in routes(caps, api_token, run) for row in measure_route(server.url, web, route)]
        out = {
            "bench": "request_bounds",
            "server": f"uvicorn posttrain.asgi:application, 1 worker, {' '.join(flags)}, Postgres",
            "caps_bytes": caps,
            "rows": rows,
            "web_alive": server.process.poll() is None,
            "machine": machine.report(uptime_start=uptime_start, uptime_end=uptime()),
        }
        print(json.dumps(out, indent=2))
        return 0
    except Exception:
        ingest.log_server_tails([server])
        raise
    finally:
        server.stop()
        pg.drop(ingest.OURS_DB)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    _servers.run_bench(main)
