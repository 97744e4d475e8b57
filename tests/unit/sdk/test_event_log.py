"""The event log reads back whole lines only: a write cut short anywhere (a crash, a full disk), inside a
multi-byte character too, loses that line and nothing before it, and a resumed run's log continues after the
last whole event."""

from __future__ import annotations

from pathlib import Path

import pytest

from posttrain_sdk.event_log import EVENTS_FILE, EventLog, read_events

# The last event holds characters of two, three and four bytes in UTF-8 (the log writes them unescaped).
MULTI_BYTE_SAMPLE = {"prompt": "Grüße: 2+2 = ?", "response": "четыре ∑ 🙂", "reward": 1.0}


def a_log_with_a_multi_byte_last_line(run_dir: Path) -> tuple[bytes, bytes]:
    """Writes three events; returns (the first two lines, the last line) as bytes."""
    log = EventLog(run_dir, "run-1")
    log.emit("metrics", {"reward/mean": 0.5}, step=1)
    log.emit("log", {"level": "info", "message": "step 1 done"}, step=1)
    log.emit("samples", {"samples": [MULTI_BYTE_SAMPLE]}, step=2)
    log.close()
    data = (run_dir / EVENTS_FILE).read_bytes()
    last_start = data.rstrip(b"\n").rfind(b"\n") + 1
    return data[:last_start], data[last_start:]


def torn_tails(last: bytes) -> list[bytes]:
    """Every way the write of `last` can be cut short: each of its prefixes, its newline excluded."""
    return [last[:cut] for cut in range(len(last))]


def test_every_torn_tail_of_a_multi_byte_line_reads_back_as_the_whole_events_before_it(tmp_path):
    whole, last = a_log_with_a_multi_byte_last_line(tmp_path / "run")
    path = tmp_path / "run" / EVENTS_FILE
    before = read_events(path)[:2]
    cut_inside_a_character = 0
    for tail in torn_tails(last):
        try:
            tail.decode("utf-8")
        except UnicodeDecodeError:
            cut_inside_a_character += 1
        path.write_bytes(whole + tail)
        assert read_events(path) == before, f"cut after {len(tail)} bytes of the last line"
    assert cut_inside_a_character >= 6, "the cuts must fall inside multi-byte characters too"
    assert read_events(path)[1]["data"]["message"] == "step 1 done"


def test_a_resumed_log_drops_any_torn_tail_and_continues_after_the_last_whole_event(tmp_path):
    whole, last = a_log_with_a_multi_byte_last_line(tmp_path / "run")
    path = tmp_path / "run" / EVENTS_FILE
    for tail in torn_tails(last):
        path.write_bytes(whole + tail)
        resumed = EventLog(tmp_path / "run", "run-1")
        assert resumed.last_seq == 2, f"cut after {len(tail)} bytes"
        resumed.emit("samples", {"samples": [MULTI_BYTE_SAMPLE]}, step=2)
        resumed.close()
        events = read_events(path)
        assert [e["seq"] for e in events] == [1, 2, 3]
        assert events[2]["data"]["samples"] == [MULTI_BYTE_SAMPLE]
        assert path.read_bytes().startswith(whole), "the whole events before the cut are kept as written"


def test_a_whole_line_that_is_no_event_is_named_by_its_number(tmp_path):
    path = tmp_path / EVENTS_FILE
    path.write_bytes(b'{"seq": 1}\n\xff\xfe not json\n{"seq": 3}\n')
    with pytest.raises(ValueError, match=r"line 2 is not an event"):
        read_events(path)


def test_a_missing_log_has_no_events(tmp_path):
    assert read_events(tmp_path / EVENTS_FILE) == []
