import json

import pytest

from posttrain_sdk.event_log import EventLog, read_events
from rl_engine.config import DataConfig
from rl_engine.data import DataError, PromptData, PromptSampler, read_rows

ROWS = [{"prompt": f"{a}+1=", "label": str(a + 1), "source": "s"} for a in range(10, 30)]


class CharTokenizer:
    """One token per character: enough to test length limits without a model."""

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) for c in text]}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet", "hf_disk"])
def test_every_dataset_format_reads_the_same_rows(tmp_path, fmt):
    if fmt == "jsonl":
        path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    elif fmt == "csv":
        import csv

        path = tmp_path / "d.csv"
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(ROWS[0]))
            writer.writeheader()
            writer.writerows(ROWS)
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = tmp_path / "d.parquet"
        pq.write_table(pa.Table.from_pylist(ROWS), path)
    else:
        import datasets

        path = tmp_path / "d"
        datasets.Dataset.from_list(ROWS).save_to_disk(str(path))
    assert read_rows(path) == ROWS


def test_a_bad_jsonl_line_is_named(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "a", "label": "1"}\n{"prompt": "b", "label": \n')
    with pytest.raises(DataError, match=r"line 2: not valid JSON"):
        read_rows(path)


def test_a_missing_prompt_field_names_the_row_and_field(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "label": "1"}, {"question": "b", "label": "2"}])
    with pytest.raises(DataError, match=r"row 2: field 'prompt' is missing"):
        PromptData.load(DataConfig(path=str(path)), CharTokenizer(), seed=0)


def test_held_out_fraction_is_disjoint_and_seeded(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    cfg = DataConfig(path=str(path), eval_fraction=0.25)
    first = PromptData.load(cfg, CharTokenizer(), seed=1)
    again = PromptData.load(cfg, CharTokenizer(), seed=1)
    assert len(first.eval) == 5 and len(first.train) == 15
    assert {p.raw for p in first.eval}.isdisjoint({p.raw for p in first.train})
    assert [p.raw for p in first.eval] == [p.raw for p in again.eval]
    assert first.train[0].metadata == {"source": "s"}


def test_prompts_longer_than_the_limit_are_dropped_and_counted(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "short", "label": "1"}, {"prompt": "x" * 50, "label": "2"}])
    data = PromptData.load(DataConfig(path=str(path), max_prompt_tokens=10), CharTokenizer(), seed=0)
    assert [p.raw for p in data.train] == ["short"] and data.dropped_too_long == 1


def test_the_sampler_resumes_at_the_same_position_across_epochs():
    straight = PromptSampler(7, seed=3, shuffle=True)
    batches = [straight.next_batch(4) for _ in range(5)]
    resumed = PromptSampler(7, seed=3, shuffle=True)
    for _ in range(2):
        resumed.next_batch(4)
    state = resumed.state_dict()
    fresh = PromptSampler(7, seed=3, shuffle=True)
    fresh.load_state_dict(state)
    assert [fresh.next_batch(4) for _ in range(3)] == batches[2:]
    assert sorted(batches[0] + batches[1][:3]) == list(range(7))  # an epoch covers every prompt once


def test_events_continue_their_seq_after_a_torn_line_from_a_crash(tmp_path):
    sink = EventLog(tmp_path, "r1")
    sink.emit("status", {"state": "running"})
    sink.emit("metrics", {"loss": float("nan"), "kl": float("inf")}, step=1)
    sink.close()
    with (tmp_path / "events.jsonl").open("a") as f:
        f.write('{"run": "r1", "seq": 3, "ty')  # the crash
    reopened = EventLog(tmp_path, "r1")
    event = reopened.emit("status", {"state": "running"})
    reopened.close()
    events = read_events(tmp_path / "events.jsonl")
    assert [e["seq"] for e in events] == [1, 2, 3] and event["seq"] == 3
    assert events[1]["data"] == {"loss": "nan", "kl": "inf"}  # recorded, still valid JSON


def test_unknown_event_types_are_refused(tmp_path):
    sink = EventLog(tmp_path, "r1")
    with pytest.raises(ValueError, match="unknown event type"):
        sink.emit("metric", {})
    sink.close()
