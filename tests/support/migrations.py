"""Migration tests: the database moved to chosen migrations of some apps (every other app at its latest), the
models read in that state, and the database back at every app's latest migration afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.apps.registry import Apps
from django.db import connection
from django.db.migrations.executor import MigrationExecutor


def migrate_to(targets: list[tuple[str, str | None]]) -> Apps:
    """The apps of `targets` at those migrations (None: unapplied), every other app at its latest; returns the
    models as they are in that state."""
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    moving = {app for app, _ in targets}
    others = [node for node in executor.loader.graph.leaf_nodes() if node[0] not in moving]
    executor.migrate([*others, *targets])
    executor.loader.build_graph()
    return executor.loader.project_state([*others, *((a, m) for a, m in targets if m is not None)]).apps


def a_run(apps: Apps) -> Any:
    """A run (its experiment, model and dataset) made through the models of a migration state."""
    model = apps.get_model("registry", "ModelAsset").objects.create(name="m", path="/m")
    dataset = apps.get_model("registry", "Dataset").objects.create(
        name="d", sha256="f" * 64, format="jsonl", path="/d", size_bytes=1, row_count=1
    )
    experiment = apps.get_model("runs", "Experiment").objects.create(name="e", model=model, dataset=dataset, config={})
    return apps.get_model("runs", "Run").objects.create(experiment=experiment, name="r")


@pytest.fixture
def latest_schema_after() -> Iterator[None]:
    """The database back at every app's latest migration for the tests that follow."""
    yield
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
