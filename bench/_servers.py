"""The processes a bench starts (servers: uvicorn, MLflow, the demo stack; workers: one measured run each) end
with the bench however it ends, and a failed one says why.

- Every process starts in a session of its own (its whole tree stops together) and dies with the bench even when
  the bench is SIGKILLed: the kernel sends it SIGTERM when the bench goes (PR_SET_PDEATHSIG).
- `guard()`, which every `start` and `child` calls, makes the bench itself stop everything it started on SIGINT,
  SIGTERM and SIGHUP, when its own parent dies (PR_SET_PDEATHSIG on the bench), and at exit; the signal then
  unwinds the bench as `Stopped`, a KeyboardInterrupt, so its own `finally` blocks run too (`run_bench` turns it
  into the exit status 128 + the signal).
- A server that exits or never answers, and a child that fails, raise `ProcessFailed` with the tail of its
  output, not "run it alone to see why".

Linux only (prctl through ctypes), as every bench is.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = REPO / ".venv" / "bin"
LOG_TAIL_LINES = 30
STOP_GRACE_S = 20.0
PR_SET_PDEATHSIG = 1
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_libc = ctypes.CDLL(None, use_errno=True)


class ProcessFailed(RuntimeError):
    """A server or child of the bench exited, failed, or never answered; the message ends with its output's tail."""


class Stopped(KeyboardInterrupt):
    """The bench was stopped by a signal (its servers are already stopped)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return tail(path.read_text(errors="replace"), lines)
    except OSError:
        return f"(no log at {path})"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """The calling process gets `sig` when its parent dies (a child: when the bench dies, SIGKILL included)."""
    if _libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


# --- what the bench started, and stopping it -------------------------------------------------------------------

_servers: dict[int, Server] = {}
_cleanups: list[Callable[[], Any]] = []
_lock = threading.RLock()
_stopping = False
_guarded = False


def stop_all() -> None:
    """Stops every server still running and runs every registered clean-up (newest first); idempotent."""
    global _stopping
    with _lock:
        if _stopping:
            return
        _stopping = True
        try:
            for server in reversed(list(_servers.values())):
                with contextlib.suppress(Exception):
                    server.stop()
            while _cleanups:
                cleanup = _cleanups.pop()
                try:
                    cleanup()
                except Exception as exc:  # one clean-up failing must not keep the others from running
                    log(f"clean-up {getattr(cleanup, '__name__', cleanup)} failed: {type(exc).__name__}: {exc}")
        finally:
            _stopping = False


def on_stop(cleanup: Callable[[], Any]) -> Callable[[], None]:
    """Runs `cleanup` when the bench is stopped or exits (a stack started by a script, e.g. `demo.sh stop`);
    returns the function that unregisters it once the bench has cleaned up itself."""
    guard()
    with _lock:
        _cleanups.append(cleanup)

    def done() -> None:
        with _lock, contextlib.suppress(ValueError):
            _cleanups.remove(cleanup)

    return done


# Runs its command when the bench dies (the kernel's SIGTERM, PR_SET_PDEATHSIG), unless the bench ends it first.
_WATCHDOG = """
import signal, subprocess, sys
signal.signal(signal.SIGTERM, lambda *_: sys.exit(subprocess.run(sys.argv[1:], stdout=sys.stderr).returncode))
signal.signal(signal.SIGINT, signal.SIG_IGN)
while True:
    signal.pause()
"""


def on_stop_run(command: list[str], *, env: dict[str, str], cwd: Path = REPO) -> Callable[[], None]:
    """Runs `command` (the stop script of a stack that a script of its own started, whose processes are no children
    of the bench) when the bench is stopped or exits, and, through a watchdog process, even when the bench is
    killed outright (SIGKILL: nothing of the bench runs then). Returns the function to call once the bench has
    stopped the stack itself."""

    def run_stop_command() -> None:
        subprocess.run(command, cwd=cwd, env=env, stdout=sys.stderr, stdin=subprocess.DEVNULL)

    watchdog = child(
        [sys.executable, "-c", _WATCHDOG, *command], cwd=cwd, env=env, stdin=subprocess.DEVNULL, start_new_session=True
    )
    unregister = on_stop(run_stop_command)

    def done() -> None:
        unregister()
        watchdog.kill()
        watchdog.wait()

    return done


def _stop_and_raise(signum: int, frame: Any) -> None:
    if _stopping:
        return  # a second signal while stopping: finish stopping
    log(f"{signal.Signals(signum).name}: stopping every server this bench started")
    stop_all()
    raise Stopped(signum)


def use_this_checkout() -> None:
    """This checkout's code first, in the bench and in every process it starts: an editable install of the venv
    may point at another checkout of the project."""
    paths = [str(REPO), str(REPO / "platform"), str(REPO / "sdk")]
    sys.path[:0] = [p for p in paths if p not in sys.path]
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in paths]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths + inherited)


def guard() -> None:
    """Once per bench process, in its main thread: this checkout's code first (`use_this_checkout`), and what the
    bench starts stopped on SIGINT, SIGTERM, SIGHUP, when its parent dies, and at exit."""
    global _guarded
    if _guarded or threading.current_thread() is not threading.main_thread():
        return
    _guarded = True
    use_this_checkout()
    for signum in STOP_SIGNALS:
        signal.signal(signum, _stop_and_raise)
    die_with_parent(signal.SIGTERM)
    atexit.register(stop_all)


def run_bench(main: Callable[[], int | None]) -> None:
    """`sys.exit(main())`, with the bench guarded: a stop by a signal exits 128 + the signal."""
    guard()
    try:
        code = main()
    except Stopped as stopped:
        code = 128 + stopped.signum
    finally:
        stop_all()
    sys.exit(code or 0)


# --- servers ---------------------------------------------------------------------------------------------------


class Server:
    """A server the bench started: its process (the leader of a session of its own), its log, its URL."""

    def __init__(self, name: str, process: subprocess.Popen, log_path: Path, url: str | None):
        self.name, self.process, self.log_path, self.url = name, process, log_path, url

    @property
    def pid(self) -> int:
        return self.process.pid

    def failure(self, what: str) -> ProcessFailed:
        return ProcessFailed(f"{self.name} {what}; the end of its log ({self.log_path}):\n{log_tail(self.log_path)}")

    def wait_until_up(self, path: str = "/", timeout_s: float = 120) -> Server:
        """Until `url + path` answers (any HTTP status); ProcessFailed with the log's tail if it exits first or
        never answers."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise self.failure(f"exited with {self.process.returncode} before it answered")
            try:
                with urllib.request.urlopen(f"{self.url}{path}", timeout=2):
                    return self
            except urllib.error.HTTPError:
                return self  # it answered
            except Exception:
                time.sleep(0.3)
        raise self.failure(f"did not answer at {self.url}{path} within {timeout_s:g} s")

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM to its whole session, SIGKILL after `grace_s`."""
        with _lock:
            _servers.pop(self.pid, None)
        if self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            self.process.wait()

    def kill(self) -> None:
        """SIGKILL to its whole session at once (a crash, as a fault bench wants it)."""
        with _lock:
            _servers.pop(self.pid, None)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.process.wait()


def start(
    name: str, command: list[str], *, env: dict[str, str], log_path: Path, url: str | None = None, cwd: Path = REPO
) -> Server:
    """Starts a server (output appended to `log_path`) that stops with the bench; logs its pid."""
    guard()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("a") as output:
        process = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
    server = Server(name, process, log_path, url)
    with _lock:
        _servers[process.pid] = server
    log(f"{name}: started, pid {process.pid}, log {log_path}" + (f", {url}" if url else ""))
    return server


def demo_web_flags() -> list[str]:
    """uvicorn's flags as scripts/demo.sh starts the web server (its `WEB_FLAGS=(...)` line): the parser and the
    limits a demo's web server runs with."""
    line = re.search(r"^WEB_FLAGS=\((.*)\)$", (REPO / "scripts" / "demo.sh").read_text(), re.MULTILINE)
    if line is None:
        raise RuntimeError("scripts/demo.sh has no WEB_FLAGS=(...) line")
    return shlex.split(line.group(1))


def start_uvicorn(
    env: dict[str, str], log_path: Path, port: int | None = None, name: str = "ours", flags: list[str] | None = None
) -> Server:
    """The platform under uvicorn, one worker, on `port` (default: a free one; the same port again is a restart
    as clients see it), with `flags` added (demo_web_flags(): as the demo serves it)."""
    port = port or free_port()
    command = [str(VENV_BIN / "uvicorn"), "--app-dir", str(REPO / "platform"), "posttrain.asgi:application"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--workers", "1", *(flags or [])]
    return start(name, command, env=env, log_path=log_path, url=f"http://127.0.0.1:{port}")


def start_mlflow(mlflow: Path, backend_uri: str, workdir: Path) -> Server:
    """`mlflow server --workers 1` (the `mlflow` executable of a bench venv) on a free port."""
    port = free_port()
    command = [str(mlflow), "server", "--backend-store-uri", backend_uri]
    command += ["--artifacts-destination", str(workdir / "mlartifacts"), "--host", "127.0.0.1", "--port", str(port)]
    command += ["--workers", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return start(
        "mlflow", command, env=env, log_path=workdir / "mlflow.log", url=f"http://127.0.0.1:{port}", cwd=workdir
    )


# --- children (set-up commands and measured workers) -----------------------------------------------------------


def child(command: list[str], **popen: Any) -> subprocess.Popen:
    """A worker process that dies with the bench (its own session is the caller's choice)."""
    guard()
    return subprocess.Popen(command, preexec_fn=die_with_parent, **popen)


def run_checked(command: list[str], what: str, **run: Any) -> subprocess.CompletedProcess:
    """Runs a set-up command to its end, output captured; ProcessFailed with the tail of its stderr (and stdout)
    when it fails."""
    guard()
    done = subprocess.run(command, capture_output=True, text=True, preexec_fn=die_with_parent, **run)
    if done.returncode != 0:
        output = tail(done.stderr) or tail(done.stdout)
        raise ProcessFailed(f"{what} exited with {done.returncode}; the end of its output:\n{output}")
    return done
