"""The runs app split in three (runs 0016-0017, scheduling 0001-0002, telemetry 0001-0002): the scheduler's
models and what runs report move to their own apps with every row, their tables renamed, their content types
(and so their permissions) with them; and back again."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import connection

from tests.support.migrations import a_run, latest_schema_after, migrate_to

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["latest_schema_after"]  # the fixture, used by name

BEFORE = [("runs", "0015_metric_block_overview"), ("scheduling", None), ("telemetry", None)]
AFTER = [("runs", "0016_scheduler_models_to_scheduling"), ("scheduling", "0002_tables_renamed"), ("telemetry", None)]
BEFORE_TELEMETRY = [("runs", "0016_scheduler_models_to_scheduling"), ("telemetry", None)]
AFTER_TELEMETRY = [("runs", "0017_telemetry_models_to_telemetry"), ("telemetry", "0002_tables_renamed")]
AT = datetime(2026, 1, 1, tzinfo=UTC)


def _tables() -> set[str]:
    return set(connection.introspection.table_names())


def test_the_scheduler_keeps_every_row_and_permission_when_its_models_move_apps(latest_schema_after):
    old = migrate_to(BEFORE)
    assert {"runs_quota", "runs_preemption"} <= _tables() and "scheduling_quota" not in _tables()
    user = old.get_model("auth", "User").objects.create(username="ann")
    team = old.get_model("auth", "Group").objects.create(name="vision")
    run = a_run(old)
    old.get_model("runs", "Quota").objects.create(user=user, max_runs=2, weight=3.0)
    old.get_model("runs", "Quota").objects.create(group=team, max_gpus=8.0, borrowing=True)
    old.get_model("runs", "Preemption").objects.create(run=run, reason="for r2", forced=True, lost_steps=4)
    old.get_model("runs", "ClusterSample").objects.create(at=AT, total={"CPU": 2.0}, granted={"CPU": 1.0})
    old.get_model("runs", "ClusterSnapshot").objects.create(total={"CPU": 2.0}, free={"CPU": 1.0})
    content_type = old.get_model("contenttypes", "ContentType")
    quota_type = content_type.objects.get_or_create(app_label="runs", model="quota")[0]
    change_quota = old.get_model("auth", "Permission").objects.get_or_create(
        content_type=quota_type, codename="change_quota", defaults={"name": "Can change quota"}
    )[0]
    user.user_permissions.add(change_quota)

    new = migrate_to(AFTER)

    assert {"scheduling_quota", "scheduling_preemption", "scheduling_clustersample"} <= _tables()
    assert not {"runs_quota", "runs_preemption", "runs_clustersample", "runs_clustersnapshot"} & _tables()
    quotas = new.get_model("scheduling", "Quota").objects.order_by("pk")
    assert [(q.user_id, q.group_id, q.max_runs, q.max_gpus, q.weight, q.borrowing) for q in quotas] == [
        (user.pk, None, 2, None, 3.0, False),
        (None, team.pk, None, 8.0, 1.0, True),
    ]
    preemption = new.get_model("scheduling", "Preemption").objects.get()
    assert (preemption.run_id, preemption.reason, preemption.forced, preemption.lost_steps) == (
        run.pk,
        "for r2",
        True,
        4,
    )
    sample = new.get_model("scheduling", "ClusterSample").objects.get()
    assert (sample.at, sample.granted) == (AT, {"CPU": 1.0})
    assert new.get_model("scheduling", "ClusterSnapshot").objects.get().free == {"CPU": 1.0}
    moved_type = new.get_model("contenttypes", "ContentType").objects.get(pk=quota_type.pk)
    assert (moved_type.app_label, moved_type.model) == ("scheduling", "quota")
    assert new.get_model("auth", "User").objects.get(pk=user.pk).user_permissions.get().pk == change_quota.pk

    back = migrate_to(BEFORE)
    assert back.get_model("runs", "Quota").objects.count() == 2 and "scheduling_quota" not in _tables()
    assert back.get_model("contenttypes", "ContentType").objects.get(pk=quota_type.pk).app_label == "runs"


def test_what_runs_reported_keeps_every_row_when_it_moves_to_the_telemetry_app(latest_schema_after):
    old = migrate_to(BEFORE_TELEMETRY)
    assert "runs_metricblock" in _tables() and "telemetry_metricblock" not in _tables()
    run = a_run(old)
    old.get_model("runs", "MetricRow").objects.create(run=run, seq=1, step=1, time=5.0, values={"reward/mean": 0.5})
    old.get_model("runs", "MetricBlock").objects.create(
        run=run,
        name="reward/mean",
        index=0,
        through_seq=1,
        count=1,
        first_step=1,
        last_step=1,
        min=0.5,
        max=0.5,
        steps=b"\x01",
        values=b"\x02",
        times=b"\x03",
        overview_steps=b"\x04",
    )
    old.get_model("runs", "RolloutFile").objects.create(
        run=run, seq=2, step=1, name="step_1.parquet", rows=8, bytes=900, sha256="a" * 64, stats={"kept": 8}
    )
    old.get_model("runs", "RunLog").objects.create(run=run, seq=3, step=1, time=6.0, level="warning", message="slow")

    new = migrate_to(AFTER_TELEMETRY)

    assert {"telemetry_metricrow", "telemetry_metricblock", "telemetry_rolloutfile", "telemetry_runlog"} <= _tables()
    assert not {"runs_metricrow", "runs_metricblock", "runs_rolloutfile", "runs_runlog"} & _tables()
    row = new.get_model("telemetry", "MetricRow").objects.get()
    assert (row.run_id, row.seq, row.values) == (run.pk, 1, {"reward/mean": 0.5})
    block = new.get_model("telemetry", "MetricBlock").objects.get()
    assert (bytes(block.steps), bytes(block.values), bytes(block.overview_steps), block.max) == (
        b"\x01",
        b"\x02",
        b"\x04",
        0.5,
    )
    stored = new.get_model("telemetry", "RolloutFile").objects.get()
    assert (stored.name, stored.rows, stored.stats) == ("step_1.parquet", 8, {"kept": 8})
    assert new.get_model("telemetry", "RunLog").objects.get().message == "slow"
    assert new.get_model("contenttypes", "ContentType").objects.filter(app_label="telemetry", model="runlog").exists()

    back = migrate_to(BEFORE_TELEMETRY)
    assert back.get_model("runs", "RunLog").objects.get().message == "slow" and "telemetry_runlog" not in _tables()
