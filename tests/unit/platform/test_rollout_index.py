"""The rollout store's search index (posttrain.telemetry.rollout_index): a sidecar per rollout file that lets a
text search or a same-prompt query skip the files that cannot match, without ever dropping a match."""

from __future__ import annotations

import random
import uuid
from pathlib import Path

import pytest
from django.core.management import call_command

from posttrain.runs.models import RunState
from posttrain.telemetry import rollout_index, rollouts
from posttrain.telemetry.ingestion import events_ingest
from tests.unit.platform.helpers import make_run, sample_record, samples_event

pytestmark = [pytest.mark.usefixtures("storage"), pytest.mark.django_db]


def ingest(run, texts_by_step: dict[int, list[str]], prompts_by_step: dict[int, list[str]] | None = None) -> None:
    events = []
    for seq, (step, texts) in enumerate(sorted(texts_by_step.items()), start=1):
        prompts = (prompts_by_step or {}).get(step) or [f"p{i}" for i in range(len(texts))]
        records = [sample_record(i, response=t, prompt=p) for i, (t, p) in enumerate(zip(texts, prompts))]
        events.append(samples_event(run, seq, step, records))
    events_ingest(run.id, events)


def found(run, **filters) -> list[tuple[int, int]]:
    rows = rollouts.rollouts_query([run.id], filters=rollouts.RolloutFilter(**filters), columns=("step", "index"))
    return [(r["step"], r["index"]) for r in rows]


def scanned(run, **filters) -> list[tuple[int, int]]:
    """The same query with every file read (files passed without the sha256 and size their index needs)."""
    files = [rollouts.StoredFile(f.run_id, f.step, f.part, f.name, f.rows) for f in rollouts.run_files([run.id])]
    rows = rollouts.rollouts_query(
        [run.id], filters=rollouts.RolloutFilter(**filters), columns=("step", "index"), files=files
    )
    return [(r["step"], r["index"]) for r in rows]


def candidate_steps(run, q: str | None = None, prompt: str | None = None) -> list[int]:
    files = rollouts.run_files([run.id])
    return [f.step for f in rollout_index.candidate_files(rollouts.connection(), files, q, prompt)]


def test_a_samples_event_queues_the_index_build_of_its_run_after_commit(
    experiment, no_dispatch, django_capture_on_commit_callbacks
):
    run = make_run(experiment, RunState.RUNNING)
    no_dispatch.clear()
    with django_capture_on_commit_callbacks(execute=True):
        ingest(run, {1: ["a b"]})
    assert ("rollout_index_update", str(run.id)) in no_dispatch


def test_a_text_search_reads_only_the_files_whose_index_holds_every_word(experiment, no_dispatch):
    run = make_run(experiment, RunState.RUNNING)
    ingest(run, {1: ["alpha beta", "gamma"], 2: ["the Needle here", "beta"], 3: ["nothing, really"]})
    assert rollouts.rollout_index_update(run.id) == 3
    assert candidate_steps(run, q="needle") == [2]
    assert candidate_steps(run, q="NEED") == [2]  # a substring of a word, either case
    assert candidate_steps(run, q="needle here") == [2]
    assert candidate_steps(run, q="beta") == [1, 2]
    assert candidate_steps(run, q="zzqqxx") == []
    assert candidate_steps(run, q="alpha needle") == []  # the words are in different files
    assert found(run, q="needle") == [(2, 0)]
    assert found(run, q="zzqqxx") == []
    assert rollouts.rollout_index_update(run.id) == 0  # every file already has a current index


def test_the_search_with_its_index_finds_exactly_what_a_scan_of_every_file_finds(experiment, no_dispatch):
    rng = random.Random(7)
    alphabet = list("abcdeXYZ .,!-\t") + ["Straße", "İ", "Σς", "ﬁ", "K", "ſ", "日本", "\n"]
    texts = {
        step: ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30))) for _ in range(5)]
        for step in range(1, 7)
    }
    run = make_run(experiment, RunState.RUNNING)
    ingest(run, texts)
    rollouts.rollout_index_update(run.id)
    queries = ["zzq", "  ", "ss", "STRASSE", "straße", "i̇", "σ", "ﬁ", "k", "s", "日", "a b", ". ,", "x\ty"]
    for _ in range(60):  # slices of the texts themselves, changed case: most are found somewhere
        text = rng.choice(rng.choice(list(texts.values())))
        start = rng.randint(0, max(0, len(text) - 1))
        piece = text[start : start + rng.randint(1, 6)]
        queries.append(piece.upper() if rng.random() < 0.5 else piece)
    for q in queries:
        if q.strip():
            assert found(run, q=q) == scanned(run, q=q), q


def test_a_file_without_a_current_index_is_read_whole(experiment, no_dispatch, storage):
    run = make_run(experiment, RunState.RUNNING)
    ingest(run, {1: ["needle"], 2: ["needle"]})
    rollouts.rollout_index_update(run.id)
    # Step 2's index now describes other bytes than the file the run indexed (a file replaced in place).
    sidecar = Path(rollout_index.index_location(run.id, "step_00000002.parquet"))
    header, _, rest = sidecar.read_text().partition("\n")
    sidecar.write_text(header.replace(header.split(" ")[2], "0" * 64) + "\n" + rest.replace("needle", "other"))
    Path(rollout_index.index_location(run.id, "step_00000001.parquet")).unlink()  # and step 1 has none
    assert candidate_steps(run, q="needle") == [1, 2]
    assert found(run, q="needle") == [(1, 0), (2, 0)]
    assert rollouts.rollout_index_update(run.id) == 2  # both rebuilt


def test_the_same_prompt_across_steps_reads_only_the_files_that_hold_it(experiment, no_dispatch):
    run = make_run(experiment, RunState.RUNNING)
    prompts = {1: ["what is 2+2?", "other"], 2: ["else", "more"], 3: ["x", "what is 2+2?"]}
    ingest(run, {step: ["r", "r"] for step in prompts}, prompts)
    rollouts.rollout_index_update(run.id)
    assert candidate_steps(run, prompt="what is 2+2?") == [1, 3]
    assert candidate_steps(run, prompt="What is 2+2?") == []  # exact, not case-insensitive
    view = rollouts.rollout_token_view(run.id, 3, 1)
    assert view["same_prompt"] == [{"step": 1, "index": 0}, {"step": 3, "index": 1}]
    assert rollouts.rollouts_count([run.id], rollouts.RolloutFilter(prompt="what is 2+2?")) == 2


def test_retention_removes_the_index_of_the_files_it_removed(
    experiment, no_dispatch, django_capture_on_commit_callbacks
):
    run = make_run(experiment, RunState.RUNNING)
    ingest(run, {1: ["a"], 2: ["b"]})
    rollouts.rollout_index_update(run.id)
    first = Path(rollout_index.index_location(run.id, "step_00000001.parquet"))
    assert first.exists()
    with django_capture_on_commit_callbacks(execute=True):
        event = samples_event(run, 3, 3, [sample_record(0)])
        event["data"]["pruned"] = ["step_00000001.parquet"]
        events_ingest(run.id, [event])
    assert not first.exists()
    assert Path(rollout_index.index_location(run.id, "step_00000002.parquet")).exists()


def test_the_index_of_a_bucket_store_is_written_and_read_through_fsspec(experiment, no_dispatch, settings):
    import fsspec

    settings.ROLLOUT_STORE = f"memory://bucket-{uuid.uuid4().hex[:8]}/posttrain"
    rollouts.reset_connections()
    try:
        run = make_run(experiment, RunState.RUNNING)
        ingest(run, {1: ["alpha"], 2: ["needle"]})
        assert rollouts.rollout_index_update(run.id) == 2
        fs, _ = fsspec.core.url_to_fs(settings.ROLLOUT_STORE)
        assert fs.exists(rollout_index.index_location(run.id, "step_00000002.parquet"))
        assert candidate_steps(run, q="needle") == [2]
        assert found(run, q="needle") == [(2, 0)]
    finally:
        rollouts.reset_connections()


def test_the_management_command_indexes_the_files_that_have_no_index(experiment, no_dispatch, capsys):
    run = make_run(experiment, RunState.SUCCEEDED)
    ingest(run, {1: ["a"], 2: ["b"]})
    call_command("rollout_index", str(run.id))
    assert f"{run.id}: 2 index files written" in capsys.readouterr().out
    call_command("rollout_index")
    assert f"{run.id}: 0 index files written" in capsys.readouterr().out
