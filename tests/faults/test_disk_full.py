"""The storage root's disk fills up mid-run: the run fails saying so, and the platform stays up."""

from __future__ import annotations

import pytest

from tests.faults.invariants import assert_run_ended_truthfully
from tests.faults.servers import SmallFilesystem
from tests.support.api import create_experiment, launch, run_config

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_full_storage_disk_fails_the_run_with_no_space_left_and_the_platform_stays_up(api, registry, stack):
    with SmallFilesystem(stack.storage / "runs", size_mb=64) as disk:
        run = launch(api, create_experiment(api, registry, "disk full", run_config(1000)))
        api.wait_for(run["id"], lambda r: r["state"] == "running" and (r["last_step"] or 0) >= 1, what="a step")
        disk.fill()

        run = assert_run_ended_truthfully(api, stack, run["id"], "failed", "no space left on device", timeout_s=90)
        assert api.get("/api/health/")["status"] == "ok", "the platform went down with the disk"
        assert run["id"] in [r["id"] for r in api.get("/api/runs/")["results"]]
