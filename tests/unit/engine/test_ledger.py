"""The prompt ledger (rl_engine/ledger.py): every row of every epoch gets one fate, with its reason, samples
and policy versions; skipped rows and rows resolved twice show in the summary; the state survives the
checkpoint's form and the Parquet export; a resume tells what it re-does."""

from __future__ import annotations

import pytest

from rl_engine.data import PromptSampler
from rl_engine.ledger import Draw, PromptLedger, SampleOutcome, read_parquet, redone_since


def outcome(prompt: int, kept: bool, reason: str | None = None, versions=(0, 0), error=False) -> SampleOutcome:
    return SampleOutcome(prompt, kept, reason, versions, error)


def test_a_row_with_one_kept_sample_is_trained_with_its_samples_and_the_version_span_of_the_kept_ones():
    ledger = PromptLedger(4)
    draws = [Draw(0, 2), Draw(0, 0)]
    ledger.draw(3, draws)
    ledger.resolve(
        3,
        draws,
        [
            outcome(0, True, versions=(1, 2)),
            outcome(0, False, "gibberish", versions=(0, 0)),
            outcome(1, False, "zero_advantage", versions=(2, 2)),
            outcome(1, False, "zero_advantage", versions=(2, 2), error=True),
        ],
    )
    trained, filtered = ledger.entries[(0, 2)], ledger.entries[(0, 0)]
    assert (trained.fate, trained.step, trained.sample_ids, trained.trained_samples) == ("trained", 3, [0, 1], 1)
    assert (trained.version_min, trained.version_max) == (1, 2)  # the filtered sample's version 0 did not train
    assert (filtered.fate, filtered.reason, filtered.sample_ids, filtered.reward_errors) == (
        "filtered",
        "zero_advantage",
        [2, 3],
        1,
    )


def test_a_row_left_out_for_staleness_is_dropped_not_filtered():
    ledger = PromptLedger(2)
    ledger.draw(5, [Draw(0, 1)])
    ledger.resolve(5, [Draw(0, 1)], [outcome(0, False, "staleness", versions=(1, 1))])
    entry = ledger.entries[(0, 1)]
    assert (entry.fate, entry.reason) == ("dropped", "staleness")
    assert ledger.summary()[0]["dropped"] == {"staleness": 1}


def test_the_summary_counts_each_fate_per_epoch_and_what_is_not_drawn_yet():
    ledger = PromptLedger(3)
    first = [Draw(0, 0), Draw(0, 1)]
    ledger.draw(1, first)
    ledger.resolve(1, first, [outcome(0, True), outcome(1, False, "repetition")])
    ledger.draw(2, [Draw(0, 2), Draw(1, 1)])  # in flight across the epoch boundary
    epoch0, epoch1 = ledger.summary()
    assert epoch0 == {
        "epoch": 0,
        "rows": 3,
        "trained": 1,
        "filtered": {"repetition": 1},
        "dropped": {},
        "in_flight": 1,
        "not_drawn": 0,
        "skipped": 0,
        "duplicates": 0,
    }
    assert (epoch1["in_flight"], epoch1["not_drawn"], epoch1["skipped"]) == (1, 2, 0)


def test_an_epoch_left_with_rows_that_never_got_a_fate_shows_them_skipped():
    ledger = PromptLedger(4)
    ledger.draw(1, [Draw(0, 0), Draw(0, 1)])
    ledger.resolve(1, [Draw(0, 0), Draw(0, 1)], [outcome(0, True), outcome(1, True)])
    ledger.draw(2, [Draw(1, 3)])  # rows 2 and 3 of epoch 0 were never drawn
    assert ledger.summary()[0]["skipped"] == 2


def test_a_row_resolved_twice_in_one_epoch_is_a_duplicate():
    ledger = PromptLedger(2)
    ledger.draw(1, [Draw(0, 0)])
    ledger.resolve(1, [Draw(0, 0)], [outcome(0, True)])
    ledger.resolve(2, [Draw(0, 0)], [outcome(0, True)])
    assert ledger.duplicates == [(0, 0, 2)]
    assert ledger.summary()[0]["duplicates"] == 1


def test_in_flight_rows_whose_batch_came_back_stay_in_flight_and_the_others_are_dropped_as_lost():
    ledger = PromptLedger(4)
    ledger.draw(3, [Draw(0, 0), Draw(0, 1)])
    ledger.draw(4, [Draw(0, 2)])
    assert ledger.restore_in_flight({3}) == (2, 1)
    assert (ledger.entries[(0, 2)].fate, ledger.entries[(0, 2)].reason) == ("dropped", "lost_on_resume")


def test_the_staleness_bound_is_checked_on_every_trained_row():
    ledger = PromptLedger(2)
    draws = [Draw(0, 0), Draw(0, 1)]
    ledger.draw(6, draws)
    # At step 6 the trainer is version 5: a token of version 3 is 2 behind, one of version 2 is 3 behind.
    ledger.resolve(6, draws, [outcome(0, True, versions=(3, 5)), outcome(1, True, versions=(2, 4))])
    assert ledger.staleness_violations(max_staleness=2) == 1
    assert ledger.staleness_violations(max_staleness=3) == 0


def test_the_state_survives_the_checkpoint_form_and_the_parquet_file(tmp_path):
    ledger = PromptLedger(3)
    draws = [Draw(0, 1), Draw(0, 2)]
    ledger.draw(1, draws)
    ledger.resolve(1, draws, [outcome(0, True, versions=(0, 1)), outcome(1, False, "dynamic_sampling")])
    ledger.draw(2, [Draw(0, 0)])
    path = tmp_path / "ledger.parquet"
    ledger.write_parquet(path)
    for restored in (PromptLedger.from_state_dict(ledger.state_dict()), read_parquet(path)):
        assert restored.entries == ledger.entries
        assert restored.summary() == ledger.summary()
    assert not (tmp_path / "ledger.parquet.partial").exists()


def test_what_the_interrupted_run_resolved_after_the_checkpoint_is_what_the_resume_redoes():
    interrupted = PromptLedger(8)
    for step in (1, 2, 3):
        draws = [Draw(0, 2 * step - 2), Draw(0, 2 * step - 1)]
        interrupted.draw(step, draws)
        interrupted.resolve(step, draws, [outcome(0, True), outcome(1, True)])
    interrupted.draw(4, [Draw(0, 6)])  # in flight when it was killed: not done, so not re-done
    assert redone_since(interrupted, checkpoint_step=1) == ([2, 3], 4)
    assert redone_since(None, checkpoint_step=1) == ([], 0)


@pytest.mark.parametrize("shuffle", [True, False])
def test_the_sampler_draws_each_row_once_per_epoch_with_its_epoch(shuffle):
    sampler = PromptSampler(5, seed=1, shuffle=shuffle)
    draws = [d for _ in range(4) for d in sampler.draw(3)]  # 12 draws: 2 whole epochs and 2 rows of a third
    assert sorted(d.row for d in draws if d.epoch == 0) == list(range(5))
    assert sorted(d.row for d in draws if d.epoch == 1) == list(range(5))
    assert len([d for d in draws if d.epoch == 2]) == 2


def test_a_resume_from_an_early_checkpoint_redoes_the_lost_steps_once_and_ends_with_the_straight_runs_ledger(
    tiny_demo, tmp_path
):
    import shutil

    from rl_engine.config import validate_config
    from rl_engine.ledger import LEDGER_FILE
    from rl_engine.loop import train
    from tests.unit.engine.helpers import tiny_config

    rows = (tiny_demo / "data" / "train.jsonl").read_text().splitlines()[:12]
    (tmp_path / "train.jsonl").write_text("\n".join(rows) + "\n")
    cfg = tiny_config(tiny_demo, train={"steps": 6}, checkpoint={"every_steps": 2, "keep_last": 5, "save_final": False})
    cfg["data"]["path"] = str(tmp_path / "train.jsonl")  # 12 rows, 4 a step: 2 epochs in 6 steps
    cfg = validate_config(cfg)
    train(cfg, tmp_path / "straight")
    # The folder a crash after step 6 would leave, resumed from its step-2 checkpoint: steps 3-6 are lost.
    shutil.copytree(tmp_path / "straight", tmp_path / "crashed")
    train(cfg, tmp_path / "crashed", resume=tmp_path / "crashed" / "checkpoints" / "step_2")

    straight, resumed = (read_parquet(tmp_path / name / LEDGER_FILE) for name in ("straight", "crashed"))
    assert resumed.entries == straight.entries  # each row of both epochs: the same fate, step and samples
    assert [(e["skipped"], e["duplicates"], e["in_flight"], e["not_drawn"]) for e in resumed.summary()] == [
        (0, 0, 0, 0),
        (0, 0, 0, 0),
    ]
    [resume] = resumed.resumes
    assert (resume.checkpoint_step, resume.redone_steps, resume.redone_rows) == (2, [3, 4, 5, 6], 16)
    assert (resume.restored_in_flight, resume.lost_in_flight) == (0, 0)


def test_the_run_folders_file_skips_a_write_soon_after_the_last_unless_forced(tmp_path):
    from rl_engine.ledger import LedgerFile

    ledger, file = PromptLedger(2), LedgerFile(tmp_path / "ledger.parquet", spacing=1e9)
    file.save(ledger)
    ledger.draw(1, [Draw(0, 1)])
    file.save(ledger)  # within a billion times the last write's duration: skipped
    assert read_parquet(file.path).entries == {}
    file.save(ledger, force=True)  # a checkpoint, a resume, the end
    assert read_parquet(file.path).entries == ledger.entries


def test_a_full_disk_is_named_first_in_the_failure_reason_whichever_write_hit_it(tmp_path):
    import errno

    from rl_engine.loop.lifecycle import failure_reason

    arrow_style = OSError("[Errno 28] Error writing bytes to file. Detail: [errno 28] No space left on device")
    with_errno = OSError(errno.ENOSPC, "No space left on device")
    for exc in (arrow_style, with_errno):
        assert failure_reason(exc, tmp_path).startswith(
            f"no space left on device: the disk of the run folder {tmp_path}"
        )
    assert failure_reason(ValueError("bad"), tmp_path) == "ValueError: bad"
    assert failure_reason(KeyboardInterrupt(), tmp_path) == "interrupted"
