"""Facts about processes the engine reports (peak memory of a role and its children)."""

from __future__ import annotations

import os
from pathlib import Path

GiB = 2**30


def peak_rss_gb(pid: int | None = None, children: bool = True) -> float:
    """Peak resident memory (VmHWM) of a process plus that of its live descendants (vLLM's engine core
    runs in a child), in GiB; Linux /proc, 0 elsewhere."""
    pid = pid or os.getpid()
    total = 0
    stack = [pid]
    while stack:
        current = stack.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
            total += next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")) * 1024
            for task in Path(f"/proc/{current}/task").iterdir() if children else ():
                stack.extend(int(c) for c in (task / "children").read_text().split())
        except (OSError, StopIteration, ValueError):
            continue
    return total / GiB
