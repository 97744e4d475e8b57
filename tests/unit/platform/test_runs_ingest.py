"""Event ingestion: POST /api/runs/<id>/events with the run's bearer token."""

from __future__ import annotations

import json

import pytest

from posttrain.runs.models import Checkpoint, Run, RunState
from posttrain.telemetry import live_channel
from posttrain.telemetry.models import MetricRow, RolloutFile, RunLog
from tests.unit.platform.helpers import auth, event, make_run, post_events, sample_record, samples_event

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch", "storage")]
S = RunState


@pytest.fixture
def run(experiment) -> Run:
    return make_run(experiment, S.STARTING)


def a_step(run: Run, first_seq: int, step: int, n_samples: int = 4) -> list[dict]:
    return [
        event(run, first_seq, "metrics", step, {"reward/mean": 0.25 * step, "kl/mean": "nan"}),
        samples_event(run, first_seq + 1, step, [sample_record(i) for i in range(n_samples)]),
        event(run, first_seq + 2, "heartbeat", step),
    ]


def test_events_land_in_their_tables_and_move_the_run(client, run):
    batch = [
        event(run, 1, "status", None, {"state": "running", "resumed_from": None}),
        event(run, 2, "log", 0, {"level": "info", "message": "policy Qwen2 with 2,000 parameters"}),
        *a_step(run, 3, 1),
        event(run, 6, "checkpoint", 1, {"path": "/storage/runs/x/checkpoints/step_1", "format": "hf"}),
        event(run, 7, "status", 1, {"state": "succeeded"}),
    ]
    response = post_events(client, run, batch)
    assert response.status_code == 200, response.content
    assert response.json() == {"acknowledged_seq": 7, "stored": 7}
    run.refresh_from_db()
    assert (run.state, run.last_seq, run.last_step) == (S.SUCCEEDED, 7, 1)
    assert run.last_event_at is not None and run.started_at is not None
    assert list(run.transitions.values_list("to_state", flat=True)) == ["queued", "running", "succeeded"]
    metric = MetricRow.objects.get(run=run)
    assert (metric.step, metric.seq, metric.values["reward/mean"]) == (1, 3, 0.25)
    assert RolloutFile.objects.get(run=run, step=1).rows == 4  # one index row per step, not one per rollout
    assert Checkpoint.objects.get(run=run).path.endswith("step_1")
    assert RunLog.objects.get(run=run).message.startswith("policy Qwen2")


def test_the_same_event_batch_posted_twice_is_stored_once(client, run):
    batch = [event(run, 1, "status", None, {"state": "running"}), *a_step(run, 2, 1)]
    first = post_events(client, run, batch)
    second = post_events(client, run, batch)
    assert first.json() == {"acknowledged_seq": 4, "stored": 4}
    assert second.status_code == 200 and second.json() == {"acknowledged_seq": 4, "stored": 0}
    assert MetricRow.objects.filter(run=run).count() == 1
    assert RolloutFile.objects.filter(run=run).count() == 1
    assert run.transitions.filter(to_state=S.RUNNING).count() == 1


def test_a_batch_overlapping_stored_events_stores_only_the_new_ones(client, run):
    post_events(client, run, a_step(run, 1, 1))
    response = post_events(client, run, [*a_step(run, 1, 1), *a_step(run, 4, 2)])
    assert response.json() == {"acknowledged_seq": 6, "stored": 3}
    assert list(MetricRow.objects.filter(run=run).values_list("seq", flat=True)) == [1, 4]


@pytest.mark.parametrize("seqs", [[3, 4], [1, 3], [2, 1], [1, 1]])
def test_a_batch_that_does_not_continue_the_stored_events_is_a_409_with_the_expected_seq(client, run, seqs):
    response = post_events(client, run, [event(run, seq) for seq in seqs])
    assert response.status_code == 409
    assert response.json()["expected_seq"] == 1
    run.refresh_from_db()
    assert run.last_seq == 0  # all or nothing


def test_after_a_conflict_the_engine_resends_from_the_expected_seq(client, run):
    post_events(client, run, [event(run, 1), event(run, 2)])
    conflict = post_events(client, run, [event(run, 5)])
    assert conflict.status_code == 409 and conflict.json()["expected_seq"] == 3
    assert post_events(client, run, [event(run, s) for s in (3, 4, 5)]).json()["acknowledged_seq"] == 5


def test_the_events_url_works_without_the_trailing_slash(client, run):
    response = post_events(client, run, [event(run, 1)], slash=False)
    assert response.status_code == 200 and response.json()["acknowledged_seq"] == 1


def test_the_token_of_another_run_is_refused(client, experiment, run):
    other = make_run(experiment, S.STARTING)
    response = post_events(client, run, [event(run, 1)], headers=auth(other))
    assert response.status_code == 403
    assert post_events(client, run, [event(run, 1)], headers={}).status_code == 401
    assert post_events(client, run, [event(run, 1)], headers={"HTTP_AUTHORIZATION": "Bearer nope"}).status_code == 403
    assert post_events(client, run, [event(run, 1)], headers={"HTTP_AUTHORIZATION": "Basic abc"}).status_code == 401
    run.refresh_from_db()
    assert run.last_seq == 0


def test_a_logged_in_user_without_the_token_cannot_post_events(client, researcher, run):
    client.force_login(researcher)
    assert post_events(client, run, [event(run, 1)], headers={}).status_code == 401


def test_events_of_an_unknown_run_are_404(client, run):
    url = "/api/runs/00000000-0000-0000-0000-000000000000/events/"
    response = client.post(url, data=json.dumps({"events": []}), content_type="application/json", **auth(run))
    assert response.status_code == 404


def _bad(owner: Run, i: int, **changes) -> dict:
    e = event(owner, i + 1, "metrics", 1, {"reward/mean": 0.1})
    e.update(changes)
    return e


BAD_BATCHES = [
    # (name, body builder, loc named in the error)
    ("body is a list", lambda r: [], ""),
    ("no events key", lambda r: {"evts": []}, "events"),
    ("events not a list", lambda r: {"events": {"seq": 1}}, "events"),
    ("event not an object", lambda r: {"events": [_bad(r, 0), 7]}, "events[1]"),
    ("seq missing", lambda r: {"events": [{k: v for k, v in _bad(r, 0).items() if k != "seq"}]}, "events[0].seq"),
    ("seq a string", lambda r: {"events": [_bad(r, 0), _bad(r, 1), _bad(r, 2), _bad(r, 3, seq="4")]}, "events[3].seq"),
    ("seq zero", lambda r: {"events": [_bad(r, 0, seq=0)]}, "events[0].seq"),
    ("seq a bool", lambda r: {"events": [_bad(r, 0, seq=True)]}, "events[0].seq"),
    ("seq beyond 64 bits", lambda r: {"events": [_bad(r, 0, seq=2**63)]}, "events[0].seq"),
    ("step beyond 32 bits", lambda r: {"events": [_bad(r, 0, step=2**31)]}, "events[0].step"),
    ("unknown type", lambda r: {"events": [_bad(r, 0, type="metric")]}, "events[0].type"),
    ("another run", lambda r: {"events": [_bad(r, 0, run="someone-else")]}, "events[0].run"),
    ("data not an object", lambda r: {"events": [_bad(r, 0, data=[1, 2])]}, "events[0].data"),
    ("time a string", lambda r: {"events": [_bad(r, 0, time="now")]}, "events[0].time"),
    ("negative step", lambda r: {"events": [_bad(r, 0, step=-1)]}, "events[0].step"),
    ("metrics without step", lambda r: {"events": [_bad(r, 0, step=None)]}, "events[0].step"),
    (
        "metric value a dict",
        lambda r: {"events": [_bad(r, 0, data={"reward/mean": {"x": 1}})]},
        "events[0].data.reward/mean",
    ),
    (
        "samples with rows",
        lambda r: {"events": [_bad(r, 0, type="samples", data={"samples": [sample_record(0)]})]},
        "events[0].data.samples",
    ),
    (
        "samples without a file",
        lambda r: {"events": [_bad(r, 0, type="samples", data={"rows": 1, "bytes": 9})]},
        "events[0].data.file",
    ),
    (
        "a file of another step",
        lambda r: {
            "events": [_bad(r, 0, type="samples", data={"file": "step_00000002.parquet", "rows": 1, "bytes": 9})]
        },
        "events[0].data.file",
    ),
    (
        "a path for a file name",
        lambda r: {"events": [_bad(r, 0, type="samples", data={"file": "../../etc/passwd", "rows": 1, "bytes": 9})]},
        "events[0].data.file",
    ),
    (
        "negative rows",
        lambda r: {
            "events": [_bad(r, 0, type="samples", data={"file": "step_00000001.parquet", "rows": -1, "bytes": 9})]
        },
        "events[0].data.rows",
    ),
    ("checkpoint without path", lambda r: {"events": [_bad(r, 0, type="checkpoint", data={})]}, "events[0].data.path"),
    (
        "log without message",
        lambda r: {"events": [_bad(r, 0, type="log", data={"level": "info"})]},
        "events[0].data.message",
    ),
    (
        "unknown engine state",
        lambda r: {"events": [_bad(r, 0, type="status", data={"state": "paused"})]},
        "events[0].data.state",
    ),
]


@pytest.mark.parametrize(("name", "build", "loc"), BAD_BATCHES, ids=[b[0] for b in BAD_BATCHES])
def test_bad_event_batches_are_400_naming_the_field(client, run, name, build, loc):
    response = client.post(
        f"/api/runs/{run.id}/events/", data=json.dumps(build(run)), content_type="application/json", **auth(run)
    )
    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    assert loc in [e["loc"] for e in errors], errors
    assert all(e["msg"] for e in errors)
    run.refresh_from_db()
    assert run.last_seq == 0


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"", "empty body"),
        (b"{not json", "invalid JSON"),
        (b'{"events": [{"seq": NaN}]}', "NaN is not JSON"),
        (b"\xff\xfe", "UTF-8"),
    ],
)
def test_a_body_that_is_not_json_is_a_400_saying_why(client, run, body, needle):
    response = client.post(f"/api/runs/{run.id}/events/", data=body, content_type="application/json", **auth(run))
    assert response.status_code == 400
    assert needle in response.json()["errors"][0]["msg"]


def test_a_batch_larger_than_the_limit_is_a_413(client, run, settings):
    settings.INGEST_MAX_BODY_BYTES = 100
    response = post_events(client, run, [event(run, 1, "log", None, {"message": "x" * 200})])
    assert response.status_code == 413


def test_a_multi_turn_sample_keeps_its_turns_and_environment_logs(client, run, researcher):
    turns = [
        {"role": "assistant", "text": "37+48", "reward": None},
        {"role": "environment", "text": "=85", "reward": -0.05},
        {"role": "assistant", "text": "85", "reward": None},
        {"role": "environment", "text": "", "reward": 1.0},
    ]
    record = sample_record(0, turns=turns, env={"turns": 2, "calls": 1, "correct": 1.0})
    assert post_events(client, run, [samples_event(run, 1, 1, [record, sample_record(1)])]).status_code == 200
    client.force_login(researcher)
    page = client.get(f"/api/runs/{run.id}/samples/").json()["results"]
    assert page[0]["turns"] == turns and page[0]["env"] == {"turns": 2, "calls": 1, "correct": 1.0}
    assert page[1]["turns"] == [] and page[1]["env"] == {}  # single-turn samples carry none


def test_non_finite_values_read_back_as_null(client, run, researcher):
    record = sample_record(0, reward="nan", advantage="-inf", env={"turns": 2, "env_time_s": "inf"})
    response = post_events(client, run, [samples_event(run, 1, 1, [record])])
    assert response.status_code == 200, response.content
    client.force_login(researcher)
    (row,) = client.get(f"/api/runs/{run.id}/samples/").json()["results"]
    assert (row["reward"], row["advantage"], row["env"]) == (None, None, {"turns": 2, "env_time_s": None})


def test_a_file_the_store_lacks_is_named_as_a_gap_on_the_page(client, run, researcher, storage):
    post_events(client, run, [*a_step(run, 1, 1), *a_step(run, 4, 2)])
    (storage / "runs" / str(run.id) / "rollouts" / "step_00000001.parquet").unlink()
    client.force_login(researcher)
    page = client.get(f"/api/runs/{run.id}/samples/").json()
    assert [(r["step"], r["index"]) for r in page["results"]] == [(2, i) for i in range(4)]
    assert [g["step"] for g in page["gaps"]] == [1] and "never arrived" in page["gaps"][0]["reason"]
    files = client.get(f"/api/runs/{run.id}/rollouts/").json()
    assert [(f["step"], f["available"]) for f in files["files"]] == [(1, False), (2, True)]


def test_a_step_the_engine_never_announced_is_a_gap(client, run, researcher):
    post_events(client, run, [*a_step(run, 1, 1), *a_step(run, 4, 3)])  # step 2's file never came
    client.force_login(researcher)
    gaps = client.get(f"/api/runs/{run.id}/rollouts/").json()["gaps"]
    assert [g["step"] for g in gaps] == [2] and "never announced" in gaps[0]["reason"]


def test_retention_removes_the_index_rows_of_pruned_files(client, run):
    post_events(client, run, [*a_step(run, 1, 1), *a_step(run, 4, 2)])
    pruned = samples_event(run, 7, 3, [sample_record(0)])
    pruned["data"]["pruned"] = ["step_00000001.parquet"]
    assert post_events(client, run, [pruned]).status_code == 200
    assert list(RolloutFile.objects.filter(run=run).values_list("step", flat=True)) == [2, 3]


def test_the_engines_failure_reason_becomes_the_state_reason(client, run):
    reason = "ValueError: path: line 2: invalid syntax"
    post_events(client, run, [event(run, 1, "status", None, {"state": "failed", "reason": reason})])
    run.refresh_from_db()
    assert (run.state, run.state_reason) == (S.FAILED, reason)


def test_a_failure_reported_while_cancelling_ends_the_run_cancelled(client, experiment):
    run = make_run(experiment, S.CANCELLING)
    post_events(client, run, [event(run, 1, "status", None, {"state": "failed", "reason": "interrupted"})])
    run.refresh_from_db()
    assert (run.state, run.state_reason) == (S.CANCELLED, "cancelled (engine: interrupted)")


def test_events_of_a_finished_run_are_still_stored_but_do_not_change_its_state(client, experiment):
    run = make_run(experiment, S.FAILED, state_reason="lost: no event for 120s")
    response = post_events(client, run, [*a_step(run, 1, 1), event(run, 4, "status", 1, {"state": "succeeded"})])
    assert response.status_code == 200
    run.refresh_from_db()
    assert (run.state, run.last_seq) == (S.FAILED, 4)


def test_a_heartbeat_only_updates_when_the_run_was_last_heard_of(client, run):
    post_events(client, run, [event(run, 1, "heartbeat", 3)])
    run.refresh_from_db()
    assert run.last_event_at is not None and run.state == S.STARTING
    assert not MetricRow.objects.exists() and not RunLog.objects.exists()


def test_an_accepted_batch_is_published_on_the_runs_live_channel_after_commit(
    client, run, settings, django_capture_on_commit_callbacks
):
    settings.PUBSUB_BACKEND = "inprocess"
    batch = a_step(run, 1, 1)
    with live_channel.subscribe(run.id) as subscription:
        with django_capture_on_commit_callbacks(execute=False) as callbacks:
            post_events(client, run, batch)
        assert subscription.get(timeout=0.05) is None  # nothing before the commit
        for callback in callbacks:
            callback()
        published = subscription.get(timeout=2)
        with django_capture_on_commit_callbacks(execute=True) as again:
            post_events(client, run, batch)  # a repeat stores nothing and publishes nothing
        assert again == [] and subscription.get(timeout=0.1) is None
    assert [e["seq"] for e in published] == [1, 2, 3]
    assert published[1]["data"]["file"] == "step_00000001.parquet" and published[1]["data"]["rows"] == 4
