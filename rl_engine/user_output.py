"""What user code prints (a python reward, an environment, an agent command) reaches the run's job log with every
line marked `[user code: <label>] `, so no line of it can pass for the engine's own: the platform builds a
failed run's headline from unmarked lines only (posttrain.scheduling.services.jobs). The rate limit and the "bytes
dropped" notes are the sandbox's OutputRelay; this adds the mark, line by line, after it.

Every way text can start a new line counts as one (what `str.splitlines` splits on: \\r, \\v, \\f, \\x1c-\\x1e,
\\x85, \\u2028, \\u2029 as well as \\n) and becomes a marked line of its own; other control characters
(escape sequences that could move a terminal's cursor over the mark) are replaced.
"""

from __future__ import annotations

import codecs
import os
import re
import threading
from typing import IO

from rl_engine.sandbox import OutputRelay

USER_OUTPUT_MARK = "[user code"
_LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]+")
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1b\x7f]")
_BOUNDARIES = "\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


def prefix_for(label: str) -> str:
    safe = _LABEL_UNSAFE.sub("_", label)[:40] or "code"
    return f"{USER_OUTPUT_MARK}: {safe}] "


def is_user_output(line: str) -> bool:
    return line.startswith(USER_OUTPUT_MARK)


class LineMarker:
    """Text in, marked lines out: each line that starts gets the prefix, each line ending becomes \\n."""

    def __init__(self, label: str):
        self.prefix = prefix_for(label)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._at_line_start = True

    def feed(self, data: bytes, final: bool = False) -> bytes:
        text = self._decoder.decode(data, final)
        out: list[str] = []
        for piece in text.splitlines(keepends=True):
            body = piece.rstrip(_BOUNDARIES)
            ended = len(body) != len(piece)
            if self._at_line_start:
                out.append(self.prefix)
            out.append(_CONTROL.sub("\ufffd", body))
            if ended:
                out.append("\n")
            self._at_line_start = ended
        if final and not self._at_line_start:
            out.append("\n")
            self._at_line_start = True
        return "".join(out).encode("utf-8")


class MarkedOutput:
    """Copies a user process's output (its stdout pipe) to our stderr through the sandbox's OutputRelay, with
    every line marked. Call sites use it where they used OutputRelay."""

    def __init__(self, source: IO[bytes], label: str, sink_fd: int = 2):
        read_fd, write_fd = os.pipe()
        self._sink = sink_fd
        self._marker = LineMarker(label)
        self._relay = OutputRelay(source, sink_fd=write_fd, label=label)
        self._copier = threading.Thread(target=self._copy, args=(read_fd,), name=f"{label}-marked", daemon=True)
        self._copier.start()
        # The relay's thread ends at the code's end of output; then our pipe ends too.
        threading.Thread(target=self._close_after_relay, args=(write_fd,), daemon=True).start()

    @property
    def dropped(self) -> int:
        return self._relay.dropped

    def _close_after_relay(self, write_fd: int) -> None:
        self._relay.join(None)
        os.close(write_fd)

    def _copy(self, read_fd: int) -> None:
        with os.fdopen(read_fd, "rb", buffering=0) as pipe:
            while True:
                chunk = pipe.read(1 << 16)
                self._write(self._marker.feed(chunk or b"", final=not chunk))
                if not chunk:
                    break

    def _write(self, data: bytes) -> None:
        try:
            while data:
                data = data[os.write(self._sink, data) :]
        except OSError:
            pass

    def join(self, timeout_s: float | None) -> None:
        self._copier.join(timeout_s)

    def tail(self, lines: int = 3, chars: int = 500) -> str:
        """The last lines the code printed, unmarked (for the reason a load failed)."""
        return self._relay.tail(lines, chars)
