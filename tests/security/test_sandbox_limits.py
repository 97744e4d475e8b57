"""The sandbox's kernel limits and deadlines, with real processes: each row is a hostile thing user code does,
the exact outcome it gets (killed within which bound, failed with which reason, refused with which error), and
the caller (the engine here; the worker runs the same code for "Try it" and the import check) going on.

The kernel's side is real: the sandbox's cgroup (memory, pids, cpu), the seccomp filter, the session keyring.
These rows skip where the host gives no cgroup (not root, nothing delegated): /api/health/ warns there.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from rl_engine import sandbox
from rl_engine.config import EnvironmentConfig
from rl_engine.environments import EnvironmentPool
from rl_engine.rewards import PythonFunctionReward, RewardBatch, check_reward_file, python_fn
from rl_engine.rewards._sandbox import FRAME_HEADER
from rl_engine.rewards.sandbox_worker import Channel, ReplyCap, ReplyRefused, decode_reply, parse_bound
from rl_engine.sandbox import cgroup as sandbox_cgroup
from tests.hostile_programs import wait_until

REPO = Path(__file__).resolve().parents[2]
STATUS = sandbox.status()
needs_sandbox = pytest.mark.skipif(not STATUS.available, reason=f"no sandbox here: {STATUS.detail}")
needs_kernel_limits = pytest.mark.skipif(
    not STATUS.available or bool(STATUS.warnings), reason=f"no kernel limits here: {STATUS.warnings}"
)
pytestmark = needs_sandbox

TIMEOUT_S = 1.0
GRACE_S = 1.0
# What a call may take past timeout_s + grace: killing what it left and the parent's own bookkeeping, on a
# loaded 2-core machine. A call held by the sandbox would take its whole sleep (60 s) instead.
SLACK_S = 4.0
CALL_BOUND_S = TIMEOUT_S + GRACE_S + SLACK_S


@pytest.fixture(autouse=True)
def fixed_grace(monkeypatch):
    monkeypatch.setattr(python_fn, "HARD_KILL_GRACE_S", GRACE_S)


@pytest.fixture
def reward(tmp_path):
    """A python reward from a `reward_func` body; its sandbox is closed at the end of the test."""
    made: list[PythonFunctionReward] = []

    def make(body: str, memory_mb: float = 256, timeout_s: float = TIMEOUT_S) -> PythonFunctionReward:
        path = tmp_path / f"reward_{len(made)}.py"
        source = "import ctypes, os, signal, struct, sys, threading, time\n\n\n"
        source += "def reward_func(queries, prompts, labels, **kwargs):\n"
        source += textwrap.indent(textwrap.dedent(body).strip("\n"), "    ") + "\n"
        path.write_text(source)
        made.append(PythonFunctionReward(str(path), timeout_s=timeout_s, memory_mb=memory_mb))
        return made[-1]

    yield make
    for component in made:
        component.close()


def one() -> RewardBatch:
    return RewardBatch.build(["2+2="], ["4"], ["4"])


def timed_score(component: PythonFunctionReward, batch: RewardBatch) -> tuple[float, list, list]:
    started = time.monotonic()
    result = component.score(batch)
    return time.monotonic() - started, result.scores, result.errors


def run_in_sandbox(code: str, limits: sandbox.Limits, sandboxed: bool = True) -> tuple[int, str]:
    box = sandbox.Sandbox(limits, sandboxed, {}, {})
    proc = box.popen([sys.executable, "-I", "-c", textwrap.dedent(code)])
    output, _ = proc.communicate(timeout=120)
    return proc.returncode, output.decode()


# --- case 7: memory the address-space limit does not count --------------------------------------


@needs_kernel_limits
def test_memfd_pages_past_the_memory_cap_get_the_sandbox_killed_during_the_call(reward):
    # 360 MB of memfds under a 128 MB cap (each process stays far below its address-space limit).
    component = reward(
        """
        held = []
        for _ in range(45):
            fd = os.memfd_create("hog")
            os.write(fd, bytes(8 << 20))
            held.append(fd)
        return [1.0]
        """,
        memory_mb=128,
        timeout_s=10.0,  # the cgroup ends it long before (under a second here): the time limit plays no part
    )
    component.start()
    for _ in range(2):  # and again, in a fresh sandbox: the caller goes on
        elapsed, scores, errors = timed_score(component, one())
        assert scores == [0.0]
        assert errors == ["worker process was killed: out of memory (the sandbox's cap is 128 MB)"]
        assert elapsed < 10.0 + GRACE_S + SLACK_S


@needs_kernel_limits
def test_tmpfs_pages_count_against_the_memory_cap_not_only_against_the_tmpfs_size():
    # /dev/shm may take 512 MB and a file 1 GB, the sandbox only 128 MB in all: the cgroup ends it, not ENOSPC.
    code, output = run_in_sandbox(
        """
        with open("/dev/shm/hog", "wb") as f:
            for i in range(300):
                f.write(bytes(1 << 20))
                f.flush()
        print("wrote 300 MB")
        """,
        sandbox.Limits(memory_mb=128, tmp_mb=512, file_mb=1024),
    )
    assert output == ""  # neither written nor refused: the OOM killer ended it
    assert sandbox.died_by_signal(code, sandboxed=True) == signal.SIGKILL


@needs_kernel_limits
def test_the_cgroup_holds_the_limits_the_sandbox_was_given():
    box = sandbox.Sandbox(sandbox.Limits(memory_mb=96, processes=12, cpus=0.5), True, {}, {})
    proc = box.popen([sys.executable, "-I", "-c", "import time; time.sleep(30)"])
    group = proc.cgroup
    assert group is not None
    folders = [folder for _, folder in group.folders]
    try:
        v2 = any(h.version == 2 and "memory" in h.controllers for h, _ in group.folders)
        memory = group.read("memory", "memory.max" if v2 else "memory.limit_in_bytes")
        pids = group.read("pids", "pids.max")
        cpu = group.read("cpu", "cpu.max" if v2 else "cpu.cfs_quota_us")
        assert (memory, pids) == (str(96 << 20), "14")  # bubblewrap's two processes on top of the 12
        assert cpu in ("50000", "50000 100000")
        # The launcher joined the cgroup before it became bubblewrap: every process of the sandbox is in it.
        assert wait_until(lambda: len(proc.members()) == 3, 10)  # bubblewrap, its init, the command
        assert proc.pid in group.pids()
    finally:
        proc.kill()
    assert folders and not any(folder.exists() for folder in folders)  # killed, and its cgroups removed


@needs_sandbox
def test_a_nested_user_namespace_is_refused_so_no_tmpfs_of_its_own(reward):
    component = reward(
        """
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(0x10000000) != 0:  # CLONE_NEWUSER
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        libc.mount(b"none", b"/tmp", b"tmpfs", 0, b"size=8g")
        return [1.0]
        """
    )
    for _ in range(2):  # the same sandbox answers the next call the same way
        elapsed, scores, errors = timed_score(component, one())
        assert scores == [0.0] and errors == ["PermissionError: [Errno 1] Operation not permitted (line 7)"]


# --- case 7: the forged reply ------------------------------------------------------------------


@needs_sandbox
def test_a_forged_60_mb_reply_frame_is_refused_at_its_header_and_the_engine_barely_grows(reward):
    component = reward(
        """
        fd = int(sys.argv[-1])
        os.write(fd, struct.pack(">I", 60 << 20))
        os.write(fd, b"[" * (60 << 20))
        return [1.0]
        """
    )
    component.start()
    tracemalloc.start()
    try:
        elapsed, scores, errors = timed_score(component, one())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    cap = ReplyCap.for_items(1).bytes
    refused = f"the sandbox's reply is larger than {cap} bytes ({60 << 20} announced)"
    assert scores == [0.0] and errors == [refused]
    assert peak < 2 << 20  # the header and one read chunk, not 60 MB (nor the 1.4 GB it took to parse)
    assert elapsed < CALL_BOUND_S
    assert component.score(one()).errors == [refused]  # a fresh sandbox, refused again: the caller goes on


def test_a_reply_as_large_as_allowed_costs_the_parent_at_most_the_bound_it_states():
    # Worst cases within the cap of a batch of 64, each read from a pipe and parsed: empty objects (the
    # costliest value), one long string that needs 4 bytes a character, and floats.
    cap = ReplyCap.for_items(64)
    objects = (cap.values - 3) // 2  # each counts twice: its brace and its comma
    frames = {
        "objects": b'{"value": [' + b",".join([b"{}"] * objects) + b"]}",
        "wide string": b'{"value": "' + b"a" * (cap.bytes - 40) + b'\\ud83d\\ude00"}',
        "floats": b'{"value": [' + b",".join([b"1.5e300"] * (cap.values - 3)) + b"]}",
    }
    for name, frame in frames.items():
        assert len(frame) <= cap.bytes, name
        reader, writer = os.pipe()
        channel = Channel(reader, os.open(os.devnull, os.O_WRONLY))
        sender = threading.Thread(target=_write_all, args=(writer, FRAME_HEADER.pack(len(frame)) + frame))
        sender.start()
        tracemalloc.start()
        try:
            reply = channel.recv(time.monotonic() + 60, cap)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
            sender.join()
            channel.close()
        assert "value" in reply
        assert peak <= parse_bound(cap), (name, peak, parse_bound(cap))


def test_a_reply_with_more_values_than_its_cap_is_refused_before_it_is_parsed():
    cap = ReplyCap.for_items(1)
    frame = b'{"value": [' + b",".join([b"0"] * cap.values) + b"]}"
    with pytest.raises(ReplyRefused, match=f"holds more than {cap.values} values"):
        decode_reply(frame, cap)
    with pytest.raises(ReplyRefused, match="not ASCII"):
        decode_reply('{"value": "é"}'.encode(), cap)


def _write_all(fd: int, data: bytes) -> None:
    with os.fdopen(fd, "wb") as out:
        out.write(data)


# --- case 6: deadlines -----------------------------------------------------------------------------


@needs_sandbox
def test_a_partial_reply_frame_costs_one_call_and_no_more(reward):
    component = reward(
        """
        signal.signal(signal.SIGALRM, signal.SIG_IGN)
        os.write(int(sys.argv[-1]), struct.pack(">I", 1000) + b'{"op": "res')
        time.sleep(60)
        return [1.0]
        """
    )
    component.start()
    elapsed, scores, errors = timed_score(component, one())
    assert scores == [0.0] and errors == [f"timeout after {TIMEOUT_S:g}s"]
    assert TIMEOUT_S + GRACE_S <= elapsed < CALL_BOUND_S


@needs_sandbox
def test_a_child_that_stops_itself_after_replying_cannot_hold_the_next_large_request(reward):
    component = reward(
        """
        threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGSTOP)).start()
        return [0.0] * len(queries)
        """
    )
    assert component.score(one()).errors == [None]
    time.sleep(1.0)  # stopped now, between calls
    big = RewardBatch.build(["2+2="] * 64, ["x" * 4096] * 64, ["4"] * 64)  # 256 KB: more than a pipe holds
    elapsed, scores, errors = timed_score(component, big)
    assert scores == [0.0] * 64 and errors == [f"timeout after {TIMEOUT_S:g}s"] * 64
    assert elapsed < CALL_BOUND_S
    assert component.score(one()).errors == [None]  # a fresh sandbox took over


@needs_sandbox
def test_an_environment_that_stops_itself_costs_one_call(tmp_path):
    path = tmp_path / "environment.py"
    path.write_text(
        "import os, signal\n\n"
        "class Environment:\n"
        "    def reset(self, prompt, label, metadata):\n"
        "        signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
        "        os.kill(os.getpid(), signal.SIGSTOP)\n"
        "        return None\n\n"
        "    def step(self, action):\n"
        "        return None, 1.0, True\n"
    )
    pool = EnvironmentPool(EnvironmentConfig(path=str(path), timeout_s=TIMEOUT_S, memory_mb=256))
    try:
        started = time.monotonic()
        replies = pool.call("reset", [(0, {"prompt": "p", "label": None, "metadata": {}})])
        elapsed = time.monotonic() - started
    finally:
        pool.close()
    assert replies == {0: (False, f"reset() did not return within {TIMEOUT_S + 2.0:g}s")} and pool.lost
    assert elapsed < TIMEOUT_S + 2.0 + SLACK_S


# --- case 9: what a call forks is gone when it returns ---------------------------------------------


@needs_sandbox
def test_processes_forked_by_a_call_are_killed_when_it_returns(reward):
    component = reward(
        """
        for _ in range(5):
            if os.fork() == 0:
                os.setsid()  # out of its parent's session and process group: still in the sandbox
                if os.fork() == 0:
                    while True:
                        pass  # burns CPU until killed
                os._exit(0)
        return [0.0]
        """
    )
    elapsed, scores, errors = timed_score(component, one())
    assert scores == [0.0] and errors == [None] and elapsed < CALL_BOUND_S
    worker = component._worker
    assert worker is not None
    # Only bubblewrap, its init and the reward's own process are left (the same process serves the next call).
    assert len(worker.proc.members()) == 3
    pid = component.worker_pid
    assert component.score(one()).errors == [None]
    assert component.worker_pid == pid


@needs_kernel_limits
def test_a_fork_bomb_without_a_namespace_stops_at_pids_max():
    # The admin's unsandboxed override sets no RLIMIT_NPROC (it would count all of the user's processes):
    # only the cgroup holds the count.
    code, output = run_in_sandbox(
        """
        import os, time
        started = 0
        try:
            for _ in range(200):
                if os.fork() == 0:
                    time.sleep(30)
                    os._exit(0)
                started += 1
        except OSError as exc:
            print("refused:", exc.strerror)
        print(started)
        """,
        sandbox.Limits(processes=16),
        sandboxed=False,
    )
    lines = output.strip().splitlines()
    assert code == 0 and lines[0] == "refused: Resource temporarily unavailable", output
    assert int(lines[1]) == 17  # pids.max = 16 + 2: this process and 17 forks


@needs_kernel_limits
def test_a_cpu_burn_in_four_processes_gets_its_quota_of_cores_not_more():
    code, output = run_in_sandbox(
        """
        import os, time
        started, kids = time.monotonic(), []
        for _ in range(4):
            pid = os.fork()
            if pid == 0:
                end = time.monotonic() + 2.0
                while time.monotonic() < end:
                    pass
                os._exit(0)
            kids.append(pid)
        used = 0.0
        for pid in kids:
            usage = os.wait4(pid, 0)[2]
            used += usage.ru_utime + usage.ru_stime
        print(used / (time.monotonic() - started))
        """,
        sandbox.Limits(cpus=0.5),
    )
    assert code == 0, output
    # Half a core, give or take a scheduler period; without the quota an idle 2-core machine gives about 2.
    assert float(output) <= 0.5 * 1.3


# --- case 8: the keyring --------------------------------------------------------------------------

KEYRING_PROBE = """
import ctypes, json, os, sys
sys.path.insert(0, sys.argv[1])
import pyseccomp
from rl_engine import sandbox

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
keyctl, add_key = (pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, n) for n in ("keyctl", "add_key"))
assert libc.syscall(keyctl, 1, b"posttrain-engine") >= 0  # this process's own session keyring
assert libc.syscall(add_key, b"user", b"posttrain-engine-key", b"s3cret", 6, -3) >= 0
engine_keyring = libc.syscall(keyctl, 0, -3, 0)  # KEYCTL_GET_KEYRING_ID of the session keyring
inside = '''
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
keyring = libc.syscall(%d, 0, -3, 0)  # KEYCTL_GET_KEYRING_ID
error = ctypes.get_errno() if keyring < 0 else 0
key = libc.syscall(%d, 10, -3, b"user", b"posttrain-engine-key", 0)  # KEYCTL_SEARCH
print(json.dumps({"keyring": keyring, "errno": error, "finds_key": key >= 0}))
''' % (keyctl, keyctl)
out = {}
for sandboxed in (True, False):
    box = sandbox.Sandbox(sandbox.Limits(), sandboxed, {}, {})
    proc = box.popen([sys.executable, "-I", "-c", inside])
    out["sandboxed" if sandboxed else "unsandboxed"] = json.loads(proc.communicate(timeout=60)[0])
out["engine_keyring"] = engine_keyring
print(json.dumps(out))
"""


@needs_sandbox
def test_a_sandbox_gets_a_fresh_session_keyring_and_no_keyctl_at_all():
    proc = subprocess.run(
        [sys.executable, "-c", KEYRING_PROBE, str(REPO)], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    # In the sandbox the seccomp filter refuses keyctl (EPERM): no key can be read or added.
    assert found["sandboxed"] == {"keyring": -1, "errno": 1, "finds_key": False}
    # Without the filter (the admin's override) the launcher's fresh session keyring is all there is.
    unsandboxed = found["unsandboxed"]
    assert unsandboxed["keyring"] > 0 and unsandboxed["keyring"] != found["engine_keyring"]
    assert unsandboxed["finds_key"] is False


# --- case 13: the sandbox wherever the project is installed ---------------------------------------


UNDER_TMP_PROBE = """
import json, sys
from rl_engine.rewards import PythonFunctionReward, RewardBatch, check_reward_file
from rl_engine.sandbox import python_runtime

problems = check_reward_file(sys.argv[1])
component = PythonFunctionReward(sys.argv[1])
result = component.score(RewardBatch.build(["2+2="], ["4"], ["4"]))
component.close()
print(json.dumps({"problems": problems, "scores": result.scores, "errors": result.errors,
                  "runtime": [real for real, _ in python_runtime()]}))
"""


@needs_sandbox
def test_a_project_and_its_venv_under_tmp_register_and_score_a_python_reward():
    folder = Path(tempfile.mkdtemp(prefix="posttrain-under-tmp-", dir="/tmp"))
    try:
        shutil.copytree(REPO / "rl_engine", folder / "rl_engine", ignore=shutil.ignore_patterns("__pycache__"))
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder / ".venv")], check=True, timeout=120)
        python = folder / ".venv" / "bin" / "python"
        # The clone's venv finds this one's packages (what its own `make install` would have installed).
        venv_site = subprocess.run(
            [str(python), "-c", "import site; print(site.getsitepackages()[0])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        Path(venv_site, "posttrain-test-packages.pth").write_text("\n".join(site.getsitepackages()) + "\n")
        reward = folder / "exact.py"
        reward.write_text(
            "def reward_func(queries, prompts, labels, **kwargs):\n"
            "    return [float(r == l) for r, l in zip(kwargs['responses'], labels)]\n"
        )
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        proc = subprocess.run(
            [str(python), "-c", UNDER_TMP_PROBE, str(reward)],
            capture_output=True,
            text=True,
            timeout=180,
            cwd=folder,
            env={**env, "PYTHONPATH": str(folder)},
            check=False,
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert str(folder / ".venv") in found["runtime"]  # the venv the sandbox binds lies under /tmp
    assert found["problems"] == [] and found["scores"] == [1.0] and found["errors"] == [None]


@needs_sandbox
def test_a_failed_import_check_says_what_the_child_printed(tmp_path):
    path = tmp_path / "dies.py"
    path.write_text(
        "import os, sys\nprint('cannot find the model weights', file=sys.stderr, flush=True)\nos._exit(3)\n"
    )
    assert check_reward_file(path) == [
        "loading the file failed: worker process exited with code 3: cannot find the model weights"
    ]


# --- where no cgroup can be made -----------------------------------------------------------------


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"), reason="needs root and python3")
@pytest.mark.skipif(bool(sandbox_cgroup.plan().missing), reason="this host gives no cgroup even to root")
def test_a_platform_that_cannot_make_cgroups_says_so_in_its_status():
    # The same host, as a platform not running as root (nobody): no cgroup hierarchy is writable.
    probe = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); from rl_engine import sandbox; "
        "s = sandbox.status(); print(json.dumps({'limits': s.limits, 'warnings': s.warnings}))"
    )
    proc = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "/usr/bin/python3",
            "-I",
            "-c",
            probe,
            str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/tmp",
        env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["warnings"] and found["warnings"][0].startswith("sandboxes run without a cgroup limit on")
    assert "not writable" in found["warnings"][0]
