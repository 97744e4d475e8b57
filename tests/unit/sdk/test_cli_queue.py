"""`posttrain queue ls` says how old the cluster's figures are (the scheduler reads Ray; the CLI reads the
scheduler's snapshot), and calls a snapshot stale when no worker refreshed it."""

from __future__ import annotations

from posttrain_sdk.cli.queue import cluster_age


def test_queue_ls_shows_the_age_of_the_cluster_snapshot():
    fresh = cluster_age({"as_of": "2026-12-04T18:00:00Z", "age_s": 12.4})
    assert fresh == "Free after the scheduler's grants, as it read the cluster 12 s ago (2026-12-04T18:00:00Z)."
    stale = cluster_age({"as_of": "2026-12-04T17:00:00Z", "age_s": 3600.0})
    assert stale.endswith("Stale: no worker has read the cluster since; is a Celery worker with beat running?")
    assert cluster_age({"as_of": None, "age_s": None}).startswith("The scheduler has not read the cluster yet")
