"""How busy the machine was around a measurement, for every bench's JSON: a figure taken with more runnable
processes than cores (load average above the CPU count) measures the machine's other work as much as the code."""

from __future__ import annotations

import os
from typing import Any


def load_average() -> list[float]:
    """The 1, 5 and 15-minute load averages."""
    return [round(x, 2) for x in os.getloadavg()]


class MachineLoad:
    """Taken when a bench starts; `report()` at its end: {cpus, loadavg_start, loadavg_end}."""

    def __init__(self) -> None:
        self.cpus = os.cpu_count()
        self.start = load_average()

    def report(self, **facts: Any) -> dict[str, Any]:
        return {"cpus": self.cpus, "loadavg_start": self.start, "loadavg_end": load_average(), **facts}
