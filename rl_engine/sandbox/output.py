"""What sandboxed code prints, relayed to our stderr under a rate limit (`OutputRelay`), its last lines kept
for a reason it failed."""

from __future__ import annotations

import os
import threading
import time
from collections import deque


class OutputRelay:
    """Copies what sandboxed code prints to our stderr: at most `burst` bytes at once, then `rate` bytes/s;
    the rest is dropped and counted, so endless output cannot fill the job log or stall the code."""

    TAIL_BYTES = 2048

    def __init__(self, source, sink_fd: int = 2, burst: int = 1 << 20, rate: float = 64 << 10, label: str = "sandbox"):
        self._source = source
        self._sink = sink_fd
        self._burst, self._rate, self._label = burst, rate, label
        self.dropped = 0
        self._tail: deque[bytes] = deque()
        self._tail_size = 0
        self._thread = threading.Thread(target=self._run, name=f"{label}-output", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        tokens, last, dropped = float(self._burst), time.monotonic(), 0
        fd = self._source.fileno()
        while True:
            try:
                chunk = os.read(fd, 1 << 16)
            except OSError:
                break
            if not chunk:
                break
            self._keep(chunk)
            now = time.monotonic()
            tokens, last = min(float(self._burst), tokens + (now - last) * self._rate), now
            if dropped and tokens >= self._burst / 2:
                self._write(f"[{self._label}: {dropped} bytes of output dropped]\n".encode())
                dropped = 0
            if dropped or len(chunk) > tokens:
                if not dropped:
                    # A flood spends what is left of the burst, so it ends only once half the burst has
                    # refilled: one note per flood, not one per chunk that happens to fit.
                    tokens = 0.0
                dropped += len(chunk)
                self.dropped += len(chunk)
                continue
            self._write(chunk)
            tokens -= len(chunk)
        if dropped:
            self._write(f"[{self._label}: {dropped} bytes of output dropped]\n".encode())
        self._source.close()

    def _keep(self, chunk: bytes) -> None:
        self._tail.append(chunk[-self.TAIL_BYTES :])
        self._tail_size += len(self._tail[-1])
        while self._tail_size - len(self._tail[0]) >= self.TAIL_BYTES:
            self._tail_size -= len(self._tail.popleft())

    def tail(self, lines: int = 3, chars: int = 500) -> str:
        """The last lines the command printed (at most `chars` characters), for a reason it failed."""
        text = b"".join(self._tail).decode(errors="replace")
        kept = [line.rstrip() for line in text.splitlines() if line.strip()][-lines:]
        return " | ".join(kept)[-chars:]

    def _write(self, data: bytes) -> None:
        try:
            while data:
                data = data[os.write(self._sink, data) :]
        except OSError:
            pass

    def join(self, timeout_s: float | None) -> None:  # None: until the code's output ends
        self._thread.join(timeout_s)
