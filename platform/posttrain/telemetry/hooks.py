"""What the ingest needs of the scheduler, registered by scheduling (its AppConfig.ready) so that telemetry, the lower
layer, never imports it (docs/ARCHITECTURE.md, "Apps import one way"): an engine that reports `preempted` stopped for
a preemption, and one stopped at the preemption deadline reports a failure that is none."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

from django.core.exceptions import ImproperlyConfigured


@dataclass(frozen=True)
class Preemptions:
    # preempting → preempted with the preemption's record (checkpoint, note); False when the run was not preempting.
    settle: Callable[[uuid.UUID, str | None, str], bool]
    # Whether the run is preempting and its job was, or is being, stopped at the deadline.
    stopped_at_deadline: Callable[[uuid.UUID], bool]


_registered: list[Preemptions] = []


def preemptions_register(preemptions: Preemptions) -> None:
    """The scheduler's answers; registering again replaces them (ready() may run twice in tests)."""
    _registered[:] = [preemptions]


def preemptions() -> Preemptions:
    if not _registered:
        raise ImproperlyConfigured("posttrain.scheduling is not in INSTALLED_APPS: nothing settles a preemption")
    return _registered[0]
