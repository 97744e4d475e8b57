"""The sandbox itself (rl_engine/sandbox/): what code inside sees and may do, the refusal where no
sandbox can be made, the admin's override, and the relay of what the code prints."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rl_engine import sandbox
from rl_engine.config import EnvironmentConfig
from rl_engine.environments import EnvironmentPool
from rl_engine.rewards import PythonFunctionReward, RewardBatch, check_reward_file

needs_sandbox = pytest.mark.skipif(not sandbox.status().available, reason=f"no sandbox: {sandbox.status().detail}")

READS_A_HOST_FILE = """
def reward_func(queries, prompts, labels, **kwargs):
    return [float(len(open({path!r}).read()))] * len(queries)
"""


def run_inside(code: str, limits: sandbox.Limits | None = None) -> tuple[int, str]:
    box = sandbox.Sandbox.create(limits or sandbox.Limits())
    proc = box.popen([sys.executable, "-I", "-c", textwrap.dedent(code)])
    output, _ = proc.communicate(timeout=60)
    return proc.returncode, output.decode()


@pytest.fixture
def no_bubblewrap(monkeypatch):
    monkeypatch.setenv(sandbox.BWRAP_ENV, "/nonexistent/bwrap")
    monkeypatch.delenv(sandbox.ALLOW_UNSANDBOXED_ENV, raising=False)


@needs_sandbox
def test_the_code_sees_only_the_runtime_its_files_and_a_private_tmp(tmp_path):
    code, output = run_inside(
        """
        import json, os, resource, sys
        print(json.dumps({
            "root": sorted(os.listdir("/")),
            "uid": os.getuid(),
            "env": sorted(os.environ),
            "processes": resource.getrlimit(resource.RLIMIT_NPROC)[0],
            "files": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
            "file_size": resource.getrlimit(resource.RLIMIT_FSIZE)[0],
            "cpu": resource.getrlimit(resource.RLIMIT_CPU)[0],
            "memory": resource.getrlimit(resource.RLIMIT_AS)[0],
            "hostname": os.uname().nodename,
            "prefix": sys.prefix,
        }))
        """,
        sandbox.Limits(memory_mb=512, processes=32, cpu_s=60, open_files=128, file_mb=8),
    )
    assert code == 0, output
    import json

    found = json.loads(output)
    assert set(found["root"]) <= {
        "bin",
        "dev",
        "etc",
        "lib",
        "lib32",
        "lib64",
        "libx32",
        "proc",
        "run",
        "sbin",
        "tmp",
        "usr",
        *(p.split("/")[1] for p in (sys.base_prefix, sys.prefix)),
    }
    assert "home" not in found["root"] and "var" not in found["root"]
    assert found["uid"] == sandbox.SANDBOX_UID and found["hostname"] == "sandbox"
    assert not {"DATABASE_URL", "REDIS_URL", "POSTTRAIN_INGEST_TOKEN", "POSTTRAIN_SECRET_KEY"} & set(found["env"])
    assert (found["processes"], found["files"], found["file_size"], found["cpu"]) == (32, 128, 8 << 20, 60)
    assert found["memory"] == 512 << 20
    assert found["prefix"] == sys.prefix  # the venv, wherever it lives (its real folder bound, its link kept)


def test_the_runtime_folders_are_the_interpreter_and_its_site_packages_resolved():
    folders = [real for real, _ in sandbox.python_runtime()]
    assert os.path.realpath(sys.base_prefix) in folders or os.path.realpath(sys.base_prefix).startswith("/usr")
    for path in [sys.prefix, *__import__("site").getsitepackages()]:
        real = os.path.realpath(path)
        assert real.startswith("/usr") or any(real == f or real.startswith(f + "/") for f in folders), path


def test_a_runtime_folder_holding_the_platforms_state_is_refused(monkeypatch):
    monkeypatch.setenv("POSTTRAIN_HOME", os.path.join(sys.prefix, "state"))
    with pytest.raises(sandbox.SandboxUnavailable, match="would show it"):
        sandbox.python_runtime()


@needs_sandbox
def test_a_bound_file_is_read_in_place_and_only_a_folder_bound_writable_takes_writes(tmp_path):
    big = tmp_path / "model.gguf"
    big.write_bytes(b"GGUF" + b"\x00" * 100)
    big.chmod(0o666)  # its mode allows writes: the read-only bind is what refuses them
    out = tmp_path / "out"
    out.mkdir()
    if os.geteuid() == 0:
        os.chown(out, sandbox.SANDBOX_UID, sandbox.SANDBOX_UID)  # the command is nobody
    box = sandbox.Sandbox.create(sandbox.Limits())
    source = box.add_bind(big, "/input/model.gguf")
    target = box.add_bind(out, "/output", writable=True)
    code = f"""
        import errno
        print(len(open({source!r}, "rb").read()))
        open({target!r} + "/made", "w").write("ok")
        for path in ({source!r}, {str(tmp_path)!r} + "/elsewhere"):
            try:
                open(path, "a").write("x")
            except OSError as exc:
                print(errno.errorcode[exc.errno])
        """
    proc = box.popen([sys.executable, "-I", "-c", textwrap.dedent(code)])
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, output
    assert output.decode().split() == ["104", "EROFS", "ENOENT"]
    assert (out / "made").read_text() == "ok" and big.stat().st_size == 104
    assert not (tmp_path / "elsewhere").exists()


@needs_sandbox
def test_a_command_killed_by_a_signal_reports_the_signal():
    code, _ = run_inside("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    assert sandbox.died_by_signal(code, sandboxed=True) == 11
    assert sandbox.died_by_signal(-9, sandboxed=False) == 9 and sandbox.died_by_signal(1, sandboxed=False) is None


def test_without_bubblewrap_user_code_is_refused_saying_what_to_install(no_bubblewrap, tmp_path):
    status = sandbox.status()
    assert not status.available and "bubblewrap is not installed" in status.detail
    with pytest.raises(
        sandbox.SandboxUnavailable, match="install Debian's bubblewrap .*POSTTRAIN_ALLOW_UNSANDBOXED_CODE=1"
    ):
        sandbox.require()
    path = tmp_path / "reward.py"
    path.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n")
    result = PythonFunctionReward(str(path)).score(RewardBatch.build(["p"], ["r"], ["l"]))
    assert result.scores == [0.0] and "user code is not run without a sandbox" in result.errors[0]
    assert "apt-get install bubblewrap" in check_reward_file(path)[0]
    with pytest.raises(sandbox.SandboxUnavailable):
        EnvironmentPool(EnvironmentConfig(path=str(path))).call("reset", [(0, {})])


def test_a_bubblewrap_that_cannot_make_a_sandbox_is_reported(monkeypatch):
    monkeypatch.setenv(sandbox.BWRAP_ENV, "/bin/false")
    status = sandbox.status()
    assert not status.available and "cannot make a sandbox here" in status.detail
    assert "user namespaces" in status.detail


def test_an_admin_may_allow_unsandboxed_code_which_then_runs_as_a_plain_child(no_bubblewrap, monkeypatch, tmp_path):
    monkeypatch.setenv(sandbox.ALLOW_UNSANDBOXED_ENV, "1")
    assert sandbox.status().unsandboxed_allowed and sandbox.require() is False
    secret = tmp_path / "host-file"
    secret.write_text("12345")
    path = tmp_path / "reward.py"
    path.write_text(READS_A_HOST_FILE.format(path=str(secret)))
    component = PythonFunctionReward(str(path))
    try:
        # Unsandboxed: the host's files are there (which is why it is the admin's call), the limits still hold.
        assert component.score(RewardBatch.build(["p"], ["r"], ["l"])).scores == [5.0]
    finally:
        component.close()


@needs_sandbox
def test_the_same_reward_in_the_sandbox_cannot_read_the_host_file(tmp_path):
    secret = tmp_path / "host-file"
    secret.write_text("12345")
    path = tmp_path / "reward.py"
    path.write_text(READS_A_HOST_FILE.format(path=str(secret)))
    result = PythonFunctionReward(str(path)).score(RewardBatch.build(["p"], ["r"], ["l"]))
    assert result.scores == [0.0] and result.errors[0].startswith("FileNotFoundError")


def test_output_is_relayed_up_to_a_burst_then_at_a_rate_with_one_note_per_flood(tmp_path):
    sink = tmp_path / "relayed"
    with sink.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", "import sys\nfor _ in range(3000):\n    sys.stdout.write('x' * 1000 + '\\n')"],
            stdout=subprocess.PIPE,
        )
        relay = sandbox.OutputRelay(proc.stdout, sink_fd=out.fileno(), burst=100_000, rate=1000.0, label="test")
        proc.wait()
        relay.join(10)
    text = sink.read_text()
    assert relay.dropped > 2_000_000
    assert text.count("bytes of output dropped]") == 1
    assert len(text) < 200_000


NOT_ROOT_PROBE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from rl_engine import sandbox
from rl_engine.rewards.base import RewardBatch
from rl_engine.rewards.python_fn import PythonFunctionReward

component = PythonFunctionReward(sys.argv[2])
result = component.score(RewardBatch.build(["p"], ["r"], ["l"]))
component.close()
box = sandbox.Sandbox.create(sandbox.Limits(processes=8))
forks = box.popen([sys.executable, "-I", "-c", sys.argv[3]])
print(json.dumps({"available": sandbox.status().available, "scores": result.scores, "errors": result.errors,
                  "forks": forks.communicate()[0].decode().strip()}))
"""
FORK_UNTIL_REFUSED = """
import os, time
started = 0
try:
    for _ in range(100):
        if os.fork() == 0:
            time.sleep(5)
            os._exit(0)
        started += 1
except OSError:
    pass
print(started)
"""


@needs_sandbox
@pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/usr/bin/python3"), reason="needs root and Debian's python3"
)
def test_a_platform_not_running_as_root_gets_the_same_sandbox_and_limits():
    # The unprivileged path (bwrap maps the user itself, --disable-userns): as nobody, with Debian's python,
    # which nobody can run (this venv's interpreter may sit in root's home); pytest's tmp_path is root's only.
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="sandbox-not-root-"))
    folder.chmod(0o755)
    reward = folder / "uid.py"
    reward.write_text(
        "import os\n\ndef reward_func(queries, prompts, labels, **kwargs):\n    return [float(os.getuid())]\n"
    )
    reward.chmod(0o644)
    repo = str(Path(sandbox.__file__).resolve().parents[2])  # rl_engine/sandbox/__init__.py
    try:
        proc = subprocess.run(
            [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "/usr/bin/python3",
                "-I",
                "-c",
                NOT_ROOT_PROBE,
                repo,
                str(reward),
                FORK_UNTIL_REFUSED,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd="/tmp",
            env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"},
        )
    finally:
        shutil.rmtree(folder)
    assert proc.returncode == 0, proc.stderr[-2000:]
    import json

    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["available"] and found["errors"] == [None] and found["scores"] == [float(sandbox.SANDBOX_UID)]
    assert int(found["forks"]) < 8  # processes are counted per sandbox (the reaper and the child included)


def _python_reward_run(demo: Path, reward_file: Path):
    from rl_engine.demo.run_config import demo_run_config

    return demo_run_config(
        demo,
        model={"path": str(demo / "model")},
        data={"path": str(demo / "data" / "train.jsonl"), "eval_path": None},
        rewards=[{"type": "python", "name": "correct", "path": str(reward_file)}],
        rollout={"prompts_per_step": 2, "samples_per_prompt": 2, "max_new_tokens": 4},
        train={"steps": 1, "micro_batch_size": 4},
        checkpoint={"every_steps": 0, "save_final": False},
        logging={"eval_every": 0},
    )


def test_a_run_with_user_code_fails_at_start_without_a_sandbox_and_logs_the_override(
    tiny_demo, tmp_path, no_bubblewrap, monkeypatch
):
    from posttrain_sdk.event_log import read_events
    from rl_engine.loop import train

    reward = tmp_path / "reward.py"
    reward.write_text("def reward_func(queries, prompts, labels, **kwargs):\n    return [1.0] * len(queries)\n")
    cfg = _python_reward_run(tiny_demo, reward)
    with pytest.raises(sandbox.SandboxUnavailable):
        train(cfg, tmp_path / "refused")
    status = [e["data"] for e in read_events(tmp_path / "refused" / "events.jsonl") if e["type"] == "status"][-1]
    assert status["state"] == "failed" and "install Debian's bubblewrap" in status["reason"]

    monkeypatch.setenv(sandbox.ALLOW_UNSANDBOXED_ENV, "1")
    train(cfg, tmp_path / "allowed")
    logs = [e["data"]["message"] for e in read_events(tmp_path / "allowed" / "events.jsonl") if e["type"] == "log"]
    assert any("WITHOUT a sandbox" in message for message in logs)
