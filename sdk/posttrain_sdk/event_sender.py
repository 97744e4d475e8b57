"""Ships a run's `events.jsonl` to the platform: `POST <url>` with `{"events": [...]}` in batches.

The file is the durable record (the log writes every event there first); the sender only tails it,
so an outage of the platform loses nothing: a background thread keeps the events that are not
acknowledged yet, retries with exponential backoff on connection errors, timeouts and 5xx, and
never drops or reorders them. The platform stores each `seq` once and answers
`{"acknowledged_seq": N}`; a 409 `{"expected_seq": M}` (the platform has less, or more, than the
sender assumed) re-seeks the file to M. Other 4xx answers (bad token, invalid events) cannot be
fixed by retrying: the sender stops and says why (the events stay in the file).

    sender = EventSender(run_dir / "events.jsonl", url, token)
    sender.start(); log.add_listener(lambda event: sender.wake())
    ...
    sender.flush(timeout_s=120)   # True once everything written so far is acknowledged
    sender.close()

Standard library only: the engine and the SDK use it without any of the platform's dependencies.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from http.client import HTTPException
from pathlib import Path
from typing import Any

# Statuses worth retrying: the server is down, overloaded, restarting or timed out.
_RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
_READ_CHUNK = 1 << 20
ROLLOUT_FOLDER = "rollouts"  # posttrain_sdk.rollout_files.FOLDER (this module stays standard library only)
DEFAULT_FLUSH_TIMEOUT_S = 120.0


class EventSender:
    def __init__(
        self,
        events_path: str | Path,
        url: str,
        token: str,
        batch_size: int = 500,
        max_backoff_s: float = 10.0,
        *,
        max_batch_bytes: int = 8 << 20,
        initial_backoff_s: float = 0.25,
        request_timeout_s: float = 30.0,
        poll_interval_s: float = 1.0,
    ):
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        self.path = Path(events_path)
        self.url = url
        self._token = token
        self.batch_size = batch_size
        self.max_backoff_s = max_backoff_s
        self.max_batch_bytes = max_batch_bytes
        self.initial_backoff_s = initial_backoff_s
        self.request_timeout_s = request_timeout_s
        self.poll_interval_s = poll_interval_s

        self._offset = 0  # bytes of the file consumed into _pending (always at a line boundary)
        self._pending: deque[tuple[int, bytes]] = deque()  # (seq, raw JSON line), in file order
        self._acked = 0
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="event-sender", daemon=True)
        self.error: str | None = None  # why shipping stopped for good (the platform refused the events)
        self.last_failure: str | None = None  # the latest retried failure, for diagnostics
        self.posts = 0  # requests sent, retries included
        self._uploaded: set[int] = set()  # seqs of samples events whose file went up (or was refused)
        self.refused_files: dict[str, str] = {}  # rollout file name -> why the platform refused it
        self.retries = 0

    # -- public ---------------------------------------------------------------------------------

    @property
    def acknowledged_seq(self) -> int:
        with self._cond:
            return self._acked

    def start(self) -> EventSender:
        self._thread.start()
        return self

    def wake(self, event: Any = None) -> None:
        """New events were written (usable directly as a log listener)."""
        self._wake.set()

    def flush(self, timeout_s: float = DEFAULT_FLUSH_TIMEOUT_S, until_seq: int | None = None) -> bool:
        """Wait until every event written so far (or up to `until_seq`) is acknowledged. False when
        the timeout passes first or shipping stopped for good (`error`)."""
        target = _last_complete_seq(self.path) if until_seq is None else until_seq
        deadline = time.monotonic() + timeout_s
        self._wake.set()
        with self._cond:
            while self._acked < target:
                remaining = deadline - time.monotonic()
                if self.error is not None or remaining <= 0 or not self._thread.is_alive():
                    return False
                self._cond.wait(min(remaining, 0.5))
            return True

    def close(self) -> None:
        """Stop the thread (unacknowledged events stay in the file)."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.request_timeout_s + 5)

    def finish(self, timeout_s: float | None = None) -> bool:
        """Flush, then close; reports on stderr what could not be delivered. For the end of a run."""
        if timeout_s is None:
            timeout_s = float(os.environ.get("POSTTRAIN_EVENTS_FLUSH_TIMEOUT_S", DEFAULT_FLUSH_TIMEOUT_S))
        delivered = self.flush(timeout_s)
        self.close()
        if not delivered:
            last = _last_complete_seq(self.path)
            why = self.error or self.last_failure or f"not acknowledged within {timeout_s:g}s"
            print(
                f"event sender: events {self.acknowledged_seq + 1}..{last} were not delivered to {self.url} "
                f"(they stay in {self.path}): {why}",
                file=sys.stderr,
                flush=True,
            )
        return delivered

    # -- the thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        except Exception as exc:  # a bug or an unreadable file: say so instead of dying silently
            with self._cond:
                self.error = f"{type(exc).__name__}: {exc}"
                self._cond.notify_all()
            print(f"event sender: stopped: {self.error}", file=sys.stderr, flush=True)

    def _loop(self) -> None:
        attempt = 0
        while not self._stop.is_set():
            self._read_new_lines()
            if not self._pending:
                self._wake.wait(self.poll_interval_s)
                self._wake.clear()
                continue
            batch = self._next_batch()
            outcome, value = self._upload_files(batch)
            if outcome == "ok":
                outcome, value = self._post(batch)
            if outcome == "ok":
                attempt = 0
                self._acknowledge(value)
            elif outcome == "conflict":
                self._reseek(value)
                attempt += 1  # a server that keeps disagreeing must not be hammered
                if attempt > 1:
                    self._stop.wait(self._backoff(attempt - 1))
            elif outcome == "retry":
                self.retries += 1
                self.last_failure = value
                self._stop.wait(self._backoff(attempt))
                attempt += 1
            else:  # fatal
                with self._cond:
                    self.error = value
                    self._cond.notify_all()
                print(f"event sender: stopped: {value}", file=sys.stderr, flush=True)
                return

    def _backoff(self, attempt: int) -> float:
        return min(self.max_backoff_s, self.initial_backoff_s * (2**attempt))

    def _read_new_lines(self) -> None:
        """Move complete lines after `_offset` into `_pending` (bounded, so a long backlog after an
        outage is read as it is shipped, not all at once)."""
        if len(self._pending) >= 4 * self.batch_size:
            return
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read(_READ_CHUNK)
                # A line longer than the chunk (a step with many samples): read until its end.
                while data and b"\n" not in data:
                    more = f.read(_READ_CHUNK)
                    if not more:
                        break
                    data += more
        except FileNotFoundError:
            return
        end = data.rfind(b"\n")
        if end < 0:
            return  # only a partial line so far: the writer has not finished it
        acked = self.acknowledged_seq
        last = self._pending[-1][0] if self._pending else acked
        for line in data[: end + 1].splitlines():
            if not line.strip():
                continue
            seq = int(json.loads(line)["seq"])
            if seq > acked and seq > last:
                self._pending.append((seq, line))
                last = seq
        self._offset += end + 1

    def _next_batch(self) -> list[bytes]:
        batch: list[bytes] = []
        size = 0
        for _, line in self._pending:
            if batch and (len(batch) >= self.batch_size or size + len(line) > self.max_batch_bytes):
                break
            batch.append(line)
            size += len(line) + 1
        return batch

    def _upload_files(self, lines: list[bytes]) -> tuple[str, Any]:
        """Before a batch goes out, the rollout files its `samples` events name and ask to upload (an
        external run's, written next to the event log; the engine's are already in the store). A file
        that is not there, or that the platform refuses (too large, not Parquet), is not uploaded and does
        not hold the run's other events back: its event still goes out, and the platform shows the step's
        rollouts as missing."""
        for line in lines:
            if b'"samples"' not in line:
                continue
            event = json.loads(line)
            data = event.get("data") or {}
            if event.get("type") != "samples" or not data.get("upload") or event["seq"] in self._uploaded:
                continue
            path = self.path.parent / ROLLOUT_FOLDER / str(data.get("file", ""))
            if not path.is_file():
                self._uploaded.add(event["seq"])
                continue
            outcome, value = self._put_file(path)
            if outcome == "refused":
                self.refused_files[path.name] = value
                print(f"event sender: {value}; step {event.get('step')} shows as missing", file=sys.stderr, flush=True)
            elif outcome != "ok":
                return outcome, value
            self._uploaded.add(event["seq"])
        return "ok", None

    def _put_file(self, path: Path) -> tuple[str, Any]:
        base = self.url.rstrip("/").removesuffix("/events")
        request = urllib.request.Request(
            f"{base}/rollouts/{path.name}/upload",
            data=path.read_bytes(),
            method="PUT",
            headers={"Content-Type": "application/vnd.apache.parquet", "Authorization": f"Bearer {self._token}"},
        )
        self.posts += 1
        try:
            with urllib.request.urlopen(request, timeout=self.request_timeout_s) as response:
                response.read()
            return "ok", None
        except urllib.error.HTTPError as exc:
            text = _read_error(exc)
            if exc.code in _RETRY_STATUSES:
                return "retry", f"HTTP {exc.code} uploading {path.name}: {text[:200]}"
            if exc.code == 409 and '"loc":"name"' in text.replace(" ", ""):
                return "ok", None  # announced already: a resent batch (`posttrain sync`) of a file the platform holds
            refused = f"the platform refused the rollout file {path.name} (HTTP {exc.code}): {text[:500]}"
            # A token the platform does not take fails the events too; anything else is this file's own fault.
            return ("fatal" if exc.code in (401, 403) else "refused"), refused
        except (urllib.error.URLError, HTTPException, OSError) as exc:
            return "retry", f"{type(exc).__name__} uploading {path.name}: {exc}"

    def _post(self, lines: list[bytes]) -> tuple[str, Any]:
        body = b'{"events":[' + b",".join(lines) + b"]}"
        request = urllib.request.Request(
            self.url,
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self._token}"},
        )
        self.posts += 1
        try:
            with urllib.request.urlopen(request, timeout=self.request_timeout_s) as response:
                reply = json.loads(response.read() or b"{}")
            return "ok", int(reply["acknowledged_seq"])
        except urllib.error.HTTPError as exc:
            text = _read_error(exc)
            if exc.code == 409:
                try:
                    return "conflict", int(json.loads(text)["expected_seq"])
                except (ValueError, KeyError, TypeError):
                    return "fatal", f"409 without expected_seq: {text[:500]}"
            if exc.code in _RETRY_STATUSES:
                return "retry", f"HTTP {exc.code}: {text[:200]}"
            return "fatal", f"the platform refused the events (HTTP {exc.code}): {text[:500]}"
        except (urllib.error.URLError, HTTPException, OSError) as exc:  # refused, reset, timed out
            return "retry", f"{type(exc).__name__}: {exc}"
        except (ValueError, KeyError, TypeError) as exc:  # a 200 whose body we cannot read: ask again
            return "retry", f"unreadable acknowledgement: {exc}"

    def _acknowledge(self, acked: int) -> None:
        with self._cond:
            self._acked = acked
            while self._pending and self._pending[0][0] <= self._acked:
                self._pending.popleft()
            self._cond.notify_all()
        if acked > 0 and self._pending and self._pending[0][0] > acked + 1:
            self._reseek(acked + 1)  # the platform is behind what we still hold: resend from there

    def _reseek(self, expected_seq: int) -> None:
        """The platform wants `expected_seq` next: drop what it has, or re-read what it lacks."""
        with self._cond:
            self._acked = expected_seq - 1
            while self._pending and self._pending[0][0] < expected_seq:
                self._pending.popleft()
            if self._pending and self._pending[0][0] == expected_seq:
                self._cond.notify_all()
                return
            if not self._pending and self._offset > 0 and expected_seq > _last_complete_seq(self.path):
                self._cond.notify_all()
                return  # it has everything we wrote; new events continue from here
            self._pending.clear()
            self._offset = 0  # it lacks events we already let go: read the file again from the start
            self._cond.notify_all()


def _read_error(exc: urllib.error.HTTPError) -> str:
    try:
        return exc.read().decode("utf-8", "replace")
    except Exception:
        return str(exc)


def _last_complete_seq(path: Path) -> int:
    """The seq of the last complete line of the file (0 when there is none)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            window = 64 * 1024
            while True:
                start = max(0, size - window)
                f.seek(start)
                data = f.read(size - start)
                end = data.rfind(b"\n")
                if end >= 0:
                    begin = data.rfind(b"\n", 0, end) + 1
                    if begin > 0 or start == 0:
                        line = data[begin:end]
                        return int(json.loads(line)["seq"]) if line.strip() else 0
                if start == 0:
                    return 0
                window *= 4
    except FileNotFoundError:
        return 0


def ingest_token_from_env() -> str:
    """The run's ingestion token: read once from the 0600 file POSTTRAIN_INGEST_TOKEN_FILE names, which is
    then deleted (the platform keeps it out of the job's environment, which anyone who can list Ray
    jobs can read), else POSTTRAIN_INGEST_TOKEN (the engine run by hand, or by an older platform)."""
    path = os.environ.get("POSTTRAIN_INGEST_TOKEN_FILE")
    if not path:
        return os.environ.get("POSTTRAIN_INGEST_TOKEN", "")
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise RuntimeError(
            f"cannot read the run's ingestion token from {path} ({exc.strerror}): it is read once, when the "
            "run starts; restart the run from the platform"
        ) from None
    Path(path).unlink(missing_ok=True)
    return token


def sender_from_env(log: Any) -> EventSender | None:
    """A started sender for the log's file when the platform launched this run (POSTTRAIN_EVENTS_URL and
    the token, see `ingest_token_from_env`), else None."""
    url = os.environ.get("POSTTRAIN_EVENTS_URL")
    if not url:
        return None
    sender = EventSender(log.path, url, ingest_token_from_env())
    log.add_listener(sender.wake)
    return sender.start()
