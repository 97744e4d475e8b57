"""What user code prints reaches the job log with every line marked, so none of it passes for the engine's own
(rl_engine/user_output.py): through a real child process and the sandbox's rate-limiting relay."""

from __future__ import annotations

import subprocess
import sys

from rl_engine.user_output import LineMarker, MarkedOutput, is_user_output

PREFIX = "[user code: reward.py] "


def test_every_way_to_start_a_line_starts_a_marked_line():
    marker = LineMarker("reward.py")
    text = "one\ntwo\rthree\r\nfour\x0bfive\x0csix\x1cseven\x85eight\u2028nine\u2029ten"
    out = (marker.feed(text.encode()) + marker.feed(b"", final=True)).decode()
    lines = out.split("\n")
    assert lines[-1] == ""  # the last line is ended for it
    assert lines[:-1] == [
        PREFIX + word for word in ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
    ]
    assert all(is_user_output(line) for line in lines[:-1])
    # The engine's own lines split the same way (str.splitlines) and still find every line marked.
    assert all(is_user_output(line) for line in out.splitlines())


def test_a_line_split_across_reads_is_marked_once_and_a_split_character_survives():
    marker = LineMarker("reward.py")
    euro = "€".encode()
    out = marker.feed(b"OSError: [Errno 28] No sp") + marker.feed(b"ace left on device " + euro[:1])
    out += marker.feed(euro[1:] + b"\nnext") + marker.feed(b"", final=True)
    assert out.decode() == f"{PREFIX}OSError: [Errno 28] No space left on device €\n{PREFIX}next\n"


def test_terminal_escapes_cannot_move_the_cursor_back_over_the_mark():
    marker = LineMarker("agent")
    out = (marker.feed(b"\x1b[2K\x1b[1Gerror: engine crashed\x00") + marker.feed(b"", final=True)).decode()
    assert out == "[user code: agent] \ufffd[2K\ufffd[1Gerror: engine crashed\ufffd\n"


def test_a_label_from_a_file_name_cannot_break_the_mark():
    out = LineMarker("evil]\nname.py").feed(b"x\n").decode()
    assert out == "[user code: evil_name.py] x\n"


def test_a_child_processs_output_arrives_marked_through_the_relay(tmp_path):
    sink = tmp_path / "job.log"
    script = "import sys\nprint('hello')\nsys.stdout.write('No space left on device\\rfake line')\n"
    with sink.open("wb") as log:
        child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
        relayed = MarkedOutput(child.stdout, label="reward.py", sink_fd=log.fileno())
        child.wait(timeout=30)
        relayed.join(10)
    assert sink.read_text() == f"{PREFIX}hello\n{PREFIX}No space left on device\n{PREFIX}fake line\n"
    assert relayed.dropped == 0
