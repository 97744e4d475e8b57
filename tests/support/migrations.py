"""Migration tests: the database moved to chosen migrations of some apps (every other app at its latest), the
models read in that state, and the database back at every app's latest migration afterwards."""

from __future__ import annotations

from collections.abc import Iterator

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


@pytest.fixture
def latest_schema_after() -> Iterator[None]:
    """The database back at every app's latest migration for the tests that follow."""
    yield
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
