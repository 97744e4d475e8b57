"""Metric series at scale: the column store (MetricBlock), the run summary, M4 downsampling, the
series endpoint on every x axis, the data migration that fills the store, and the raw export."""

from __future__ import annotations

import csv
import importlib
import io
import json
import math

import numpy as np
import pytest
from django.apps import apps as django_apps
from django.db import connection
from django.test.utils import CaptureQueriesContext

from posttrain.runs.models import Run, RunState
from posttrain.telemetry import selectors as telemetry_selectors
from posttrain.telemetry import series
from posttrain.telemetry.ingestion import events_ingest
from posttrain.telemetry.models import MetricBlock, MetricRow
from posttrain.telemetry.series import sealing
from tests.unit.platform.helpers import make_run, unknown_run_id

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch", "storage")]
T0 = 1_700_000_000.0


class MovedModels:
    """The models an old data migration asks for (`apps.get_model("runs", "MetricRow")`) where they live now:
    the migration's code run on today's tables (the telemetry app took these models over in its 0001)."""

    def get_model(self, app_label: str, model_name: str):
        try:
            return django_apps.get_model(app_label, model_name)
        except LookupError:
            return django_apps.get_model("telemetry", model_name)


@pytest.fixture
def run(experiment) -> Run:
    return make_run(experiment, RunState.RUNNING)


def metrics_event(run: Run, seq: int, step: int, data: dict, time: float | None = None) -> dict:
    return {
        "run": str(run.id),
        "seq": seq,
        "type": "metrics",
        "step": step,
        "time": T0 + step if time is None else time,
        "data": data,
    }


def ingest(run: Run, events: list[dict]) -> None:
    events_ingest(run.id, events)
    run.refresh_from_db()


def stored(run: Run, name: str) -> tuple[list[int], list[float | None]]:
    found, _, _ = series.read_series([run.pk], [name])
    s = found[(str(run.pk), name)]
    return s.steps.astype(int).tolist(), [v if math.isfinite(v) else None for v in s.values.tolist()]


# --- M4 downsampling -------------------------------------------------------------------------


def spiky() -> tuple[np.ndarray, np.ndarray]:
    """20 points: a spike up at 3 and down at 6 in the first half, down at 12 and up at 15 in the second."""
    y = np.array([0, 1, 2, 50, 4, 5, -5, 7, 8, 9, 1, 1, -100, 1, 1, 100, 1, 1, 1, 1], dtype=float)
    return np.arange(20, dtype=float), y


def test_m4_keeps_first_min_max_and_last_of_each_bucket_in_x_order():
    x, y = spiky()
    # max_points 10 -> 2 buckets of 4 points: x 0..9 and x 10..19
    assert series.m4_indices(x, y, 10).tolist() == [0, 3, 6, 9, 10, 12, 15, 19]


def test_m4_keeps_a_non_finite_point_as_a_gap_and_stays_within_max_points():
    x, y = spiky()
    y[4] = np.nan
    # gaps: 5 points per bucket, still 2 buckets (10 // 5); the gap at 4 is kept
    assert series.m4_indices(x, y, 10).tolist() == [0, 3, 4, 6, 9, 10, 12, 15, 19]
    payload = series.chart_series(series.Series(x, y, None), "step", 10)
    assert payload["x"] == [0, 3, 4, 6, 9, 10, 12, 15, 19]
    assert payload["y"] == [0.0, 50.0, None, -5.0, 9.0, 1.0, -100.0, 100.0, 1.0]
    assert (payload["points"], payload["downsampled"]) == (20, True)


def test_m4_buckets_cover_equal_x_ranges_not_equal_point_counts():
    x = np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 98, 99], dtype=float)  # a long pause before the last two
    y = np.array([5, 1, 2, 3, 4, 9, 6, 7, 8, 0, 3, 4], dtype=float)
    # buckets x < 49.5 (points 0..9: first 0, max 5, min and last 9) and x >= 49.5 (10, 11)
    assert series.m4_indices(x, y, 10).tolist() == [0, 5, 9, 10, 11]


def test_m4_buckets_by_position_when_x_goes_backwards():
    x, y = spiky()
    x[10] = 0.5  # not sorted: equal counts, 0..9 and 10..19
    assert series.m4_indices(x, y, 10).tolist() == [0, 3, 6, 9, 10, 12, 15, 19]


def test_m4_keeps_the_first_of_tied_extremes_and_leaves_short_series_alone():
    x = np.arange(12, dtype=float)
    y = np.array([3, 7, 1, 7, 1, 3, 3, 3, 3, 3, 3, 3], dtype=float)
    # 12 points, max_points 10: 2 buckets (x < 5.5 and x >= 5.5); bucket 0 has max 7 at 1 and 3, min 1 at 2 and 4
    assert series.m4_indices(x, y, 10).tolist() == [0, 1, 2, 5, 6, 11]
    assert series.m4_indices(x[:10], y[:10], 10).tolist() == list(range(10))


# --- the store ---------------------------------------------------------------------------------


def test_series_crossing_block_boundaries_read_back_as_the_raw_rows(run, monkeypatch):
    monkeypatch.setattr(sealing, "BLOCK_POINTS", 4)
    seq, step = 1, 0
    for batch_size in (3, 5, 1, 7, 4, 2):
        events = []
        for _ in range(batch_size):
            data = {"a": step * 0.5}
            if step % 2 == 0:
                data["b"] = -step
            if step % 5 == 3:
                data["c"] = "nan" if step % 2 else "-inf"
            else:
                data["c"] = step
            events.append(metrics_event(run, seq, step, data))
            seq, step = seq + 1, step + 1
        ingest(run, events)
    raw = telemetry_selectors.run_metric_series(run)
    for name in ("a", "b", "c"):  # 20 events sealed in blocks of 4, the last 2 read from MetricRow
        assert stored(run, name) == (raw[name]["steps"], raw[name]["values"])
    counts = list(MetricBlock.objects.filter(run=run, name="a").order_by("index").values_list("index", "count"))
    assert counts == [(0, 4), (1, 4), (2, 4), (3, 4), (4, 4)]
    assert list(MetricBlock.objects.filter(run=run, name="b").values_list("count", flat=True)) == [2] * 5
    last = MetricBlock.objects.get(run=run, name="a", index=4)
    assert (last.first_step, last.last_step, last.through_seq, last.min, last.max) == (16, 19, 20, 8.0, 9.5)


def test_the_series_endpoint_reads_blocks_and_the_unsealed_tail_alike(api, run, monkeypatch):
    monkeypatch.setattr(sealing, "BLOCK_POINTS", 4)
    ingest(run, [metrics_event(run, seq, seq, {"a": float(seq)}) for seq in range(1, 10)])
    assert MetricBlock.objects.filter(run=run).count() == 2  # seqs 1..8; 9 stays in the tail
    body = api.get(f"/api/runs/{run.id}/series/", {"names": "a"}).json()
    assert body["series"]["a"]["y"] == [float(seq) for seq in range(1, 10)]
    assert body["last_seq"] == 9


def test_a_step_sent_again_later_reads_back_in_step_order(run):
    ingest(
        run,
        [
            metrics_event(run, 1, 1, {"a": 1.0}),
            metrics_event(run, 2, 2, {"a": 2.0}),
            metrics_event(run, 3, 1, {"a": 1.5}),
        ],
    )  # e.g. a resume that re-ran step 1
    assert stored(run, "a") == ([1, 1, 2], [1.0, 1.5, 2.0])


def test_a_null_value_counts_as_not_logged_in_blocks_tail_and_summary(run, monkeypatch):
    monkeypatch.setattr(sealing, "BLOCK_POINTS", 2)
    ingest(
        run,
        [
            metrics_event(run, 1, 1, {"a": 1.0, "b": None}),
            metrics_event(run, 2, 2, {"a": None, "b": 2.0}),
            metrics_event(run, 3, 3, {"a": 3.0, "b": None}),
        ],
    )  # seqs 1-2 sealed, 3 in the tail
    assert stored(run, "a") == ([1, 3], [1.0, 3.0])
    assert stored(run, "b") == ([2], [2.0])
    assert (run.summary["a"]["count"], run.summary["b"]["count"]) == (2, 1)


def test_reading_runs_that_no_longer_exist_finds_nothing(run):
    assert series.read_series([unknown_run_id()], ["a"]) == ({}, {}, {})


def test_the_summary_keeps_last_min_max_and_count_ignoring_non_finite_values(run):
    ingest(run, [metrics_event(run, 1, 1, {"a": 1.0, "b": "nan"}), metrics_event(run, 2, 2, {"a": "nan"})])
    ingest(
        run,
        [
            metrics_event(run, 3, 3, {"a": 3.0}),
            metrics_event(run, 4, 4, {"a": -2.0}),
            metrics_event(run, 5, 5, {"a": "inf"}),
        ],
    )
    assert run.summary == {
        "a": {"last": None, "step": 5, "min": -2.0, "max": 3.0, "count": 5},
        "b": {"last": None, "step": 1, "min": None, "max": None, "count": 1},
    }
    ingest(run, [metrics_event(run, 6, 6, {"b": 0.5})])
    assert run.summary["b"] == {"last": 0.5, "step": 6, "min": 0.5, "max": 0.5, "count": 2}
    assert run.summary["a"]["count"] == 5


def test_a_batch_without_metrics_leaves_the_summary_alone(run):
    ingest(run, [metrics_event(run, 1, 1, {"a": 1.0})])
    ingest(run, [{"run": str(run.id), "seq": 2, "type": "heartbeat", "step": None, "time": T0, "data": {}}])
    assert run.summary == {"a": {"last": 1.0, "step": 1, "min": 1.0, "max": 1.0, "count": 1}}


def test_ingesting_a_batch_costs_the_same_queries_however_long_the_run(experiment, monkeypatch):
    """Blocks are written once: a long run's batch does what a short run's does."""
    monkeypatch.setattr(sealing, "BLOCK_POINTS", 4)

    def queries_of_next_batch(batches_before: int) -> int:
        run = make_run(experiment, RunState.RUNNING)

        def batch(first: int) -> list[dict]:  # 4 events: each batch seals one block per metric
            return [metrics_event(run, seq, seq, {"a": 1.0, "b": 2.0}) for seq in range(first, first + 4)]

        for i in range(batches_before):
            events_ingest(run.id, batch(4 * i + 1))
        with CaptureQueriesContext(connection) as captured:
            events_ingest(run.id, batch(4 * batches_before + 1))
        return len(captured.captured_queries)

    assert queries_of_next_batch(1) == queries_of_next_batch(50)


def test_the_data_migration_fills_blocks_and_summaries_from_stored_rows(run, experiment, monkeypatch):
    monkeypatch.setattr(sealing, "BLOCK_POINTS", 3)
    migration = importlib.import_module("posttrain.runs.migrations.0004_metricblock")
    other = make_run(experiment, RunState.RUNNING)
    events = [
        metrics_event(run, seq, seq, {"a": seq * 1.0, **({"b": "nan"} if seq % 3 == 0 else {})}) for seq in range(1, 11)
    ]
    ingest(run, events[:6])
    ingest(run, events[6:])
    ingest(other, [metrics_event(other, 1, 0, {"a": 7.0})])
    fields = ("name", "index", "count", "first_step", "last_step", "through_seq", "min", "max")
    expected_blocks = list(MetricBlock.objects.filter(run=run).order_by("name", "index").values_list(*fields))
    expected_bytes = [
        bytes(b) for b in MetricBlock.objects.filter(run=run).order_by("name", "index").values_list("values", flat=True)
    ]
    expected_summary = run.summary
    assert [b[:2] for b in expected_blocks] == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1), ("b", 2)]

    MetricBlock.objects.all().delete()  # the state before the migration: rows only
    Run.objects.update(summary={})
    migration.backfill_metric_blocks(MovedModels(), None)

    run.refresh_from_db()
    assert run.summary == expected_summary
    assert run.summary["a"] == {"last": 10.0, "step": 10, "min": 1.0, "max": 10.0, "count": 10}
    assert list(MetricBlock.objects.filter(run=run).order_by("name", "index").values_list(*fields)) == expected_blocks
    assert [
        bytes(b) for b in MetricBlock.objects.filter(run=run).order_by("name", "index").values_list("values", flat=True)
    ] == expected_bytes
    assert Run.objects.get(pk=other.pk).summary["a"]["count"] == 1
    migration.delete_metric_blocks(MovedModels(), None)
    assert not MetricBlock.objects.exists()


# --- GET /api/runs/<id>/series/ ------------------------------------------------------------------


@pytest.fixture
def trained(run) -> Run:
    """Steps 1..4, 8 samples and 100 tokens per step, 2 s apart; an eval at step 2 on its own; a NaN."""
    events, seq = [], 1
    for step in (1, 2, 3, 4):
        data = {"reward/mean": 0.25 * step, "progress/samples": 8 * step, "progress/tokens": 100 * step}
        if step == 3:
            data["reward/mean"] = "nan"
        events.append(metrics_event(run, seq, step, data, time=T0 + 2 * step))
        seq += 1
        if step == 2:
            events.append(metrics_event(run, seq, 2, {"eval/accuracy": 0.5}, time=T0 + 2 * step + 1))
            seq += 1
    events.append({"run": str(run.id), "seq": seq, "type": "heartbeat", "step": None, "time": T0, "data": {}})
    ingest(run, events)
    return run


def get_series(api, run: Run, **params):
    return api.get(f"/api/runs/{run.id}/series/", params)


def test_series_on_the_step_axis_carry_points_and_gaps(api, trained):
    response = get_series(api, trained, names="reward/mean,eval/accuracy,missing")
    assert response.status_code == 200
    body = response.json()
    assert (body["run"], body["x_axis"], body["last_seq"]) == (str(trained.id), "step", 5)
    assert body["series"]["reward/mean"] == {
        "x": [1, 2, 3, 4],
        "y": [0.25, 0.5, None, 1.0],
        "step": [1, 2, 3, 4],
        "points": 4,
        "downsampled": False,
    }
    assert body["series"]["eval/accuracy"]["x"] == [2]
    assert body["series"]["missing"] == {"x": [], "y": [], "step": [], "points": 0, "downsampled": False}


def test_series_default_to_every_metric(api, trained):
    body = get_series(api, trained).json()
    assert sorted(body["series"]) == ["eval/accuracy", "progress/samples", "progress/tokens", "reward/mean"]


@pytest.mark.parametrize(
    ("axis", "reward_x", "eval_x"),
    [
        ("samples", [8, 16, 24, 32], [16]),
        ("tokens", [100, 200, 300, 400], [200]),
        ("time", [0.0, 2.0, 4.0, 6.0], [3.0]),  # seconds since the first metrics event (step 1 at T0 + 2)
    ],
)
def test_series_on_the_samples_tokens_and_time_axes(api, trained, axis, reward_x, eval_x):
    body = get_series(api, trained, names="reward/mean,eval/accuracy", x=axis).json()
    assert body["x_axis"] == axis
    assert body["series"]["reward/mean"]["x"] == reward_x
    assert body["series"]["reward/mean"]["step"] == [1, 2, 3, 4]
    assert body["series"]["eval/accuracy"]["x"] == eval_x


def test_points_before_the_first_progress_value_have_no_place_on_the_samples_axis(api, run):
    ingest(
        run,
        [
            metrics_event(run, 1, 0, {"reward/mean": 0.1}),
            metrics_event(run, 2, 1, {"reward/mean": 0.2, "progress/samples": 8}),
        ],
    )
    body = get_series(api, run, names="reward/mean", x="samples").json()
    assert body["series"]["reward/mean"] == {"x": [8], "y": [0.2], "step": [1], "points": 2, "downsampled": False}


def test_long_series_come_downsampled_to_max_points(api, run):
    values = [0.0] * 100
    values[37], values[64] = 5.0, -5.0
    ingest(run, [metrics_event(run, i + 1, i, {"loss": v}) for i, v in enumerate(values)])
    body = get_series(api, run, max_points=12).json()["series"]["loss"]
    # 3 buckets over steps 0..99 (x * 3 / 99): 0..32, 33..65, 66..99
    assert body["step"] == [0, 32, 33, 37, 64, 65, 66, 99]
    assert body["y"] == [0.0, 0.0, 0.0, 5.0, -5.0, 0.0, 0.0, 0.0]
    assert (body["points"], body["downsampled"]) == (100, True)


@pytest.mark.parametrize(
    ("params", "loc"),
    [
        ({"x": "wall"}, "x"),
        ({"max_points": "many"}, "max_points"),
        ({"max_points": 9}, "max_points"),
        ({"max_points": 20001}, "max_points"),
        ({"names": ",".join(f"m{i}" for i in range(201))}, "names"),
    ],
)
def test_bad_series_parameters_are_400_naming_them(api, trained, params, loc):
    response = get_series(api, trained, **params)
    assert response.status_code == 400
    assert response.json()["errors"][0]["loc"] == loc


# --- GET /api/runs/<id>/export/ ------------------------------------------------------------------


def test_the_csv_export_has_every_metric_of_every_step(api, trained):
    response = api.get(f"/api/runs/{trained.id}/export/")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert response["Content-Disposition"] == 'attachment; filename="sums grpo #1-metrics.csv"'
    rows = list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert rows == [
        ["step", "time", "eval/accuracy", "progress/samples", "progress/tokens", "reward/mean"],
        ["1", repr(T0 + 2), "", "8", "100", "0.25"],
        ["2", repr(T0 + 4), "", "16", "200", "0.5"],
        ["2", repr(T0 + 5), "0.5", "", "", ""],
        ["3", repr(T0 + 6), "", "24", "300", "nan"],
        ["4", repr(T0 + 8), "", "32", "400", "1.0"],
    ]


def test_the_jsonl_export_has_one_event_per_line(api, trained):
    response = api.get(f"/api/runs/{trained.id}/export/", {"format": "jsonl"})
    assert response.status_code == 200
    assert response["Content-Disposition"] == 'attachment; filename="sums grpo #1-metrics.jsonl"'
    lines = [json.loads(line) for line in b"".join(response.streaming_content).decode().splitlines()]
    assert len(lines) == 5
    assert lines[2] == {"step": 2, "time": T0 + 5, "values": {"eval/accuracy": 0.5}}
    assert lines[3]["values"]["reward/mean"] == "nan"


def test_an_unnamed_run_exports_under_its_id_and_a_bad_format_is_a_400(api, trained):
    Run.objects.filter(pk=trained.pk).update(name="")
    response = api.get(f"/api/runs/{trained.id}/export/", {"format": "csv"})
    assert response["Content-Disposition"] == f'attachment; filename="{trained.id}-metrics.csv"'
    bad = api.get(f"/api/runs/{trained.id}/export/", {"format": "xml"})
    assert bad.status_code == 400 and bad.json()["errors"][0]["loc"] == "format"


def test_metric_rows_stay_the_raw_log(trained):
    assert MetricRow.objects.filter(run=trained).count() == 5


# --- overviews: what a long run's chart reads ------------------------------------------------


def test_a_block_overview_keeps_first_last_minimum_maximum_and_gap_of_every_64_points():
    steps = np.arange(128, dtype=float)
    values = np.zeros(128)
    values[[10, 70]] = [9.0, -9.0]
    values[100] = np.nan
    raw_steps, raw_values, _ = series.block_overview(steps, values, steps + T0)
    kept_steps = np.frombuffer(raw_steps, dtype="<f8").astype(int).tolist()
    kept_values = np.frombuffer(raw_values, dtype="<f8")
    # 64-point buckets 0..63 and 64..127: first (also the first zero: the minimum, or the maximum), the
    # spike, the first gap, last.
    assert kept_steps == [0, 10, 63, 64, 70, 100, 127]
    assert kept_values[1] == 9.0 and kept_values[4] == -9.0 and math.isnan(kept_values[5])


def test_a_long_series_chart_reads_overviews_with_every_point_counted_and_its_extremes_kept(api, run, monkeypatch):
    monkeypatch.setattr(sealing, "BLOCK_POINTS", 256)
    rng = np.random.default_rng(3)
    values = np.cumsum(rng.normal(size=3000))
    values[1234], values[2500] = 500.0, -500.0
    events = [
        metrics_event(run, i + 1, i, {"loss": float(v), "rare": 1.0} if i % 100 == 0 else {"loss": float(v)})
        for i, v in enumerate(values)
    ]
    for start in range(0, len(events), 500):
        ingest(run, events[start : start + 500])
    found, _, _ = series.read_series([run.pk], ["loss"], overview=[(str(run.pk), "loss")])
    reduced = found[(str(run.pk), "loss")]
    # 11 blocks of 256 sealed points read as their overviews (at most 4 of every 64), the 184 after them whole
    assert reduced.points == 3000 and reduced.size <= 11 * 256 // 64 * 4 + 184
    body = get_series(api, run, names="loss,rare", max_points=40).json()["series"]  # 32 x 40 <= 3000: overviews
    loss = body["loss"]
    assert (loss["points"], loss["downsampled"]) == (3000, True) and len(loss["y"]) <= 40
    assert (loss["step"][0], loss["step"][-1]) == (0, 2999)
    assert max(loss["y"]) == 500.0 and min(loss["y"]) == -500.0
    assert all(values[s] == y for s, y in zip(loss["step"], loss["y"]))  # every point shown is a stored one
    assert body["rare"]["points"] == 30 and body["rare"]["step"] == list(range(0, 3000, 100))  # too few: read whole


def test_the_overview_migration_fills_blocks_sealed_before_it(run, monkeypatch):
    monkeypatch.setattr(sealing, "BLOCK_POINTS", 128)
    ingest(run, [metrics_event(run, i + 1, i, {"a": float(i % 7)}) for i in range(300)])
    fields = ("overview_steps", "overview_values", "overview_times")
    expected = [tuple(bytes(b) for b in row) for row in MetricBlock.objects.order_by("index").values_list(*fields)]
    assert len(expected) == 2 and all(expected[0])
    MetricBlock.objects.update(overview_steps=b"", overview_values=b"", overview_times=b"")
    importlib.import_module("posttrain.runs.migrations.0015_metric_block_overview").fill_overviews(MovedModels(), None)
    assert [
        tuple(bytes(b) for b in row) for row in MetricBlock.objects.order_by("index").values_list(*fields)
    ] == expected


def test_a_run_that_ends_has_its_short_tail_sealed_and_later_points_still_read(run, monkeypatch):
    from posttrain.runs.services.state_machine import run_transition

    monkeypatch.setattr(sealing, "BLOCK_POINTS", 4)
    ingest(run, [metrics_event(run, seq, seq, {"a": float(seq)}) for seq in range(1, 7)])  # 4 sealed, 2 in the tail
    assert list(MetricBlock.objects.filter(run=run).values_list("count", flat=True)) == [4]
    assert run_transition(run.pk, [RunState.RUNNING], RunState.SUCCEEDED, "engine finished every step")
    assert list(MetricBlock.objects.filter(run=run).order_by("index").values_list("count", "through_seq")) == [
        (4, 4),
        (2, 6),
    ]
    assert stored(run, "a") == (list(range(1, 7)), [float(s) for s in range(1, 7)])
    ingest(run, [metrics_event(run, seq, seq, {"a": float(seq)}) for seq in range(7, 12)])  # a late batch
    assert stored(run, "a") == (list(range(1, 12)), [float(s) for s in range(1, 12)])
    assert list(MetricBlock.objects.filter(run=run).order_by("index").values_list("count", flat=True)) == [4, 2, 4]
