"""Hostile user code, as a table: each program tries one thing a sandbox must stop. The same table runs as
a reward, as an environment (tests/unit/engine/test_sandbox_hostile.py) and through the reward's "Try it"
on a real Celery worker (tests/integration/test_try_it_sandbox.py).

A program is the body of `attack()`, which returns a number: 1.0 means the attack worked (it read the
secret, reached the server, ...). A program is contained when its sample fails with a reason matching
`fails` (the attack raised inside the sandbox, or the sandbox was ended), or when it scores `scores` without
an error (the attack ran and found nothing); some programs may end either way (a signal to PID 1 is refused
when the platform runs as root and ignored otherwise). Each is called twice in the same sandbox, and both
calls must be contained (a process the first call forked must be gone at the second). Whatever it does, the
host's own checks (`HostWorld.assert_untouched`) must hold: no marker file written outside, no secret in any
output, the stand-in servers alive and never connected to.
"""

from __future__ import annotations

import ctypes
import os
import re
import secrets
import socket
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self
from urllib.parse import urlparse

PREAMBLE = """
import ctypes, json, os, signal, socket, struct, subprocess, sys, threading, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR = {
    "x86_64": {"clone": 56, "keyctl": 250, "add_key": 248, "bpf": 321, "perf_event_open": 298,
               "userfaultfd": 323, "fsopen": 430},
    "aarch64": {"clone": 220, "keyctl": 219, "add_key": 217, "bpf": 280, "perf_event_open": 241,
                "userfaultfd": 282, "fsopen": 430},
}[os.uname().machine]
CLONE_NEWUSER = 0x10000000


def refused():
    code = ctypes.get_errno()
    raise OSError(code, os.strerror(code))


def running(pid):
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def reply_fd():
    return int(sys.argv[-1])  # the child's end of the reply pipe (its last argument)
"""


@dataclass(frozen=True)
class HostileProgram:
    name: str
    body: str  # the body of attack(); {placeholders} are HostWorld attributes
    fails: str | None = None  # a regex the failure reason must match
    scores: float | None = None  # or: the score it must get without an error
    heavy: bool = False  # needs more memory / time (imports torch)

    def __post_init__(self) -> None:
        assert self.fails is not None or self.scores is not None, self.name

    @property
    def timeout_s(self) -> float:
        return 60.0 if self.heavy else 2.0

    @property
    def memory_mb(self) -> float:
        return 2048.0 if self.heavy else 256.0

    def contained(self, score: float, error: str | None) -> bool:
        if error:
            return self.fails is not None and re.search(self.fails, error) is not None
        return self.scores is not None and score == self.scores


def _read(path: str) -> str:
    return f"return float(len(open({path!r}).read()) > 0)"


PROGRAMS: list[HostileProgram] = [
    # --- the platform's files ---
    HostileProgram(
        "read the secret key", "return float(open('{secret_key}').read() == '{secret}')", fails="FileNotFoundError"
    ),
    HostileProgram("read the database file", _read("{database}"), fails="FileNotFoundError"),
    HostileProgram(
        "read another run's folder", "return float(len(os.listdir('{other_run}')) > 0)", fails="FileNotFoundError"
    ),
    HostileProgram("read another run's events", _read("{other_run}/events.jsonl"), fails="FileNotFoundError"),
    HostileProgram("read the web server's environment", _read("/proc/{web_pid}/environ"), fails="FileNotFoundError"),
    HostileProgram("read the engine's environment", _read("/proc/{engine_pid}/environ"), fails="FileNotFoundError"),
    HostileProgram(
        "list the environment",
        "return float(any('{secret}' in value for value in os.environ.values())"
        " or any(name in os.environ for name in {secret_env_names!r}))",
        scores=0.0,
    ),
    HostileProgram(
        "look through the home directory",
        "return float(any(name not in {home_allowed!r} for name in os.listdir('{home}')))",
        scores=0.0,
    ),
    HostileProgram("read /etc/shadow", _read("/etc/shadow"), fails="FileNotFoundError"),
    HostileProgram(
        "see other processes",
        "return float(any(int(p) > 3 for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()))",
        scores=0.0,
    ),
    HostileProgram(
        "read another sandbox's /dev/shm", "return float('{shm_name}' in os.listdir('/dev/shm'))", scores=0.0
    ),
    HostileProgram("list /sys", "return float(len(os.listdir('/sys')) > 0)", fails="FileNotFoundError"),
    # --- the network ---
    HostileProgram(
        "connect to the web port", "socket.create_connection(('127.0.0.1', {web_port}), 2); return 1.0", fails="Error"
    ),
    HostileProgram(
        "connect to Postgres", "socket.create_connection(('127.0.0.1', {postgres_port}), 2); return 1.0", fails="Error"
    ),
    HostileProgram(
        "connect to Redis", "socket.create_connection(('127.0.0.1', {redis_port}), 2); return 1.0", fails="Error"
    ),
    HostileProgram(
        "connect to the Ray dashboard",
        "socket.create_connection(('127.0.0.1', {ray_port}), 2); return 1.0",
        fails="Error",
    ),
    HostileProgram("resolve a name (DNS)", "socket.getaddrinfo('example.com', 80); return 1.0", fails="gaierror"),
    HostileProgram(
        "connect to a host Unix socket",
        "s = socket.socket(socket.AF_UNIX); s.connect('{unix_socket}'); return 1.0",
        fails="FileNotFoundError",
    ),
    HostileProgram(
        "connect to a host abstract Unix socket",
        "s = socket.socket(socket.AF_UNIX); s.connect('\\0{abstract_socket}'); return 1.0",
        fails="ConnectionRefusedError",
    ),
    # --- processes ---
    HostileProgram(
        "os.system writes a file on the host",
        "os.system('touch {escaped}'); return float(os.path.exists('{escaped}'))",
        scores=0.0,
    ),
    HostileProgram(
        "subprocess writes a file on the host",
        "subprocess.run(['sh', '-c', 'echo x > {escaped}']); return float(os.path.exists('{escaped}'))",
        scores=0.0,
    ),
    HostileProgram(
        "fork 1,000 times",
        "for _ in range(1000):\n    if os.fork() == 0:\n        time.sleep(60)\n        os._exit(0)\nreturn 1.0",
        fails="BlockingIOError|Resource temporarily unavailable",
    ),
    HostileProgram(
        "kill the parent",
        "os.kill(os.getppid(), signal.SIGTERM)\nos.kill(os.getppid(), signal.SIGKILL)\ntime.sleep(0.2)\nreturn 0.0",
        scores=0.0,
        fails="PermissionError",
    ),
    HostileProgram("kill the web server", "os.kill({web_pid}, signal.SIGKILL); return 1.0", fails="ProcessLookupError"),
    HostileProgram(
        "kill the process group",
        "os.killpg(os.getpgid(0), signal.SIGKILL); return 1.0",
        fails="died from signal SIGKILL|ProcessLookupError",
    ),
    HostileProgram(
        "kill PID 1", "os.kill(1, signal.SIGKILL)\ntime.sleep(0.2)\nreturn 0.0", scores=0.0, fails="PermissionError"
    ),
    HostileProgram(
        "kill every process it can",
        "os.kill(-1, signal.SIGKILL)\ntime.sleep(0.2)\nreturn 0.0",
        scores=0.0,
        fails="ProcessLookupError",
    ),
    HostileProgram(
        "ptrace the web server",
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "if libc.ptrace(16, {web_pid}, 0, 0) == 0:\n    return 1.0\n"
        "raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))",
        fails="Operation not permitted|No such process",  # the seccomp filter, or a PID namespace without it
    ),
    HostileProgram("become root", "os.setuid(0); return 1.0", fails="PermissionError|Invalid argument"),
    HostileProgram(
        "mount a filesystem",
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "if libc.mount(b'none', b'/tmp', b'tmpfs', 0, None) == 0:\n    return float(os.path.exists('{home}'))\n"
        "raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))",
        fails="PermissionError|OSError",
    ),
    # --- resources ---
    HostileProgram(
        "write 10 GB to tmp",
        "with open('/tmp/big', 'wb') as f:\n    for _ in range(10 * 1024):\n        f.write(bytes(1 << 20))\nreturn 1.0",
        fails="No space left|File too large|OSError",
    ),
    HostileProgram(
        "write outside tmp",
        "open('/usr/lib/posttrain-was-here', 'w').write('x'); return 1.0",
        fails="Read-only file system",
    ),
    HostileProgram(
        "write next to its own file",
        "open('/sandbox/more.py', 'w').write('x'); return 1.0",
        fails="Read-only file system",
    ),
    HostileProgram(
        "write into the run folder",
        "open('{other_run}/events.jsonl', 'a').write('forged'); return 1.0",
        fails="FileNotFoundError",
    ),
    HostileProgram("allocate 20 GB", "block = bytearray(20 << 30); return 1.0", fails="MemoryError"),
    HostileProgram(
        "ignore SIGALRM and spin",
        "signal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass",
        fails="time|within",
    ),
    HostileProgram(
        "swallow SIGALRM and sleep",
        "signal.signal(signal.SIGALRM, lambda *a: None)\nwhile True:\n    time.sleep(10)",
        fails="time|within",
    ),
    HostileProgram("print forever", "while True:\n    print('x' * 10000)", fails="time|within"),
    HostileProgram(
        "return a deeply nested value",
        "x = []\nfor _ in range(100000):\n    x = [x]\nreturn x",
        fails="Recursion|must be a number",
    ),
    # --- the kernel: what the seccomp filter denies ---
    HostileProgram(
        "unshare a user namespace and mount a tmpfs past tmp_mb",
        "if libc.unshare(CLONE_NEWUSER) != 0:\n    refused()\n"
        "if libc.mount(b'none', b'/tmp', b'tmpfs', 0, b'size=8g') != 0:\n    refused()\n"
        "open('/tmp/big', 'wb').write(bytes(512 << 20))\nreturn 1.0",
        fails="PermissionError.*Operation not permitted",
    ),
    HostileProgram(
        "clone a process into a new user namespace",
        "pid = libc.syscall(NR['clone'], CLONE_NEWUSER | signal.SIGCHLD, 0, 0, 0, 0)\n"
        "if pid == 0:\n    os._exit(0)\n"
        "if pid > 0:\n    os.waitpid(pid, 0)\n    return 1.0\nrefused()",
        fails="PermissionError.*Operation not permitted",
    ),
    HostileProgram(
        "ptrace its own child",
        "pid = os.fork()\nif pid == 0:\n    time.sleep(30)\n    os._exit(0)\n"
        "if libc.ptrace(16, pid, 0, 0) == 0:\n    return 1.0\nrefused()",
        fails="PermissionError.*Operation not permitted",
    ),
    HostileProgram(
        "load a BPF program",
        "if libc.syscall(NR['bpf'], 5, 0, 0) >= 0:\n    return 1.0\nrefused()",
        fails="PermissionError.*Operation not permitted",
    ),
    HostileProgram(
        "open a perf event",
        "attr = ctypes.create_string_buffer(128)\n"
        "if libc.syscall(NR['perf_event_open'], attr, 0, -1, -1, 0) >= 0:\n    return 1.0\nrefused()",
        fails="PermissionError.*Operation not permitted",
    ),
    HostileProgram(
        "open a userfaultfd",
        "if libc.syscall(NR['userfaultfd'], 0) >= 0:\n    return 1.0\nrefused()",
        fails="PermissionError.*Operation not permitted",
    ),
    HostileProgram(
        "mount with the new mount API (fsopen)",
        "if libc.syscall(NR['fsopen'], b'tmpfs', 0) >= 0:\n    return 1.0\nrefused()",
        fails="PermissionError.*Operation not permitted",
    ),
    # --- the kernel keyrings ---
    HostileProgram(
        "read the session keyring",
        "buffer = ctypes.create_string_buffer(4096)\n"
        "if libc.syscall(NR['keyctl'], 11, -3, buffer, 4096) >= 0:\n    return 1.0\nrefused()",
        fails="PermissionError.*Operation not permitted",
    ),
    HostileProgram(
        "add a key to the user keyring",
        "if libc.syscall(NR['add_key'], b'user', b'posttrain-planted', b'x', 1, -4) >= 0:\n    return 1.0\nrefused()",
        fails="PermissionError.*Operation not permitted",
    ),
    HostileProgram(
        "list the engine's keys (/proc/keys)",
        "return float('{key_description}' in open('/proc/keys').read())",
        scores=0.0,
        fails="FileNotFoundError",  # a kernel without /proc/keys
    ),
    # --- memory the address-space limit does not count: the sandbox's cgroup does ---
    HostileProgram(
        "hold 640 MB in memfds",
        "held = []\nfor _ in range(40):\n"
        "    fd = os.memfd_create('hog')\n    os.write(fd, bytes(16 << 20))\n    held.append(fd)\nreturn 1.0",
        # The cgroup's OOM killer ends it (its cap is 256 MB); on a crowded machine reclaim may take the call past
        # its time limit first, which ends the sandbox (and frees the memfds) too. Without the cgroup it returns.
        fails="out of memory|Cannot allocate memory|MemoryError|timeout|within",
    ),
    HostileProgram(
        "fill /dev/shm past its size",
        "with open('/dev/shm/big', 'wb') as f:\n    for _ in range(1024):\n        f.write(bytes(1 << 20))\nreturn 1.0",
        fails="No space left|OSError",
    ),
    HostileProgram(
        "hold 800 MB across four forked processes",
        "kids = []\nfor _ in range(4):\n    pid = os.fork()\n    if pid == 0:\n"
        "        block = bytearray(200 << 20)\n        for i in range(0, len(block), 4096):\n"
        "            block[i] = 1\n        time.sleep(30)\n        os._exit(0)\n    kids.append(pid)\n"
        "time.sleep(1.5)\nreturn float(all(running(pid) for pid in kids))",
        scores=0.0,
        fails="out of memory",  # the OOM killer may pick the reward's own process
    ),
    # --- processes ---
    HostileProgram(
        "leave a forked process running after the call",
        "marker = '/tmp/lingering-pid'\nif os.path.exists(marker):\n"
        "    return float(running(int(open(marker).read())))\n"
        "pid = os.fork()\nif pid == 0:\n    os.setsid()\n    while True:\n        pass\n"
        "open(marker, 'w').write(str(pid))\nreturn 0.0",
        scores=0.0,
    ),
    HostileProgram(
        "fork bomb (every child forks)",
        "me = os.getpid()\nfor _ in range(12):\n    try:\n        os.fork()\n    except OSError:\n        break\n"
        "if os.getpid() != me:\n    time.sleep(30)\n    os._exit(0)\n"
        "return float(sum(1 for p in os.listdir('/proc') if p.isdigit()) > 100)",
        scores=0.0,
    ),
    HostileProgram(
        "start 1,000 threads",
        "for _ in range(1000):\n    threading.Thread(target=time.sleep, args=(3,), daemon=True).start()\nreturn 1.0",
        fails="can't start new thread",
    ),
    HostileProgram(
        "burn four CPUs",
        "start, kids = time.monotonic(), []\nfor _ in range(4):\n    pid = os.fork()\n    if pid == 0:\n"
        "        end = time.monotonic() + 1.2\n        while time.monotonic() < end:\n            pass\n"
        "        os._exit(0)\n    kids.append(pid)\n"
        "used = sum(os.wait4(pid, 0)[2].ru_utime for pid in kids)\n"
        "return float(used / (time.monotonic() - start) > 1.3)",
        scores=0.0,
    ),
    # --- the pipe to the engine ---
    HostileProgram(
        "send half a reply frame and hang",
        "signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
        "os.write(reply_fd(), struct.pack('>I', 1000) + b'{{\"op\": \"res')\ntime.sleep(60)\nreturn 1.0",
        fails="timeout|within",
    ),
    HostileProgram(
        "send a forged 60 MB reply frame",
        "os.write(reply_fd(), struct.pack('>I', 60 << 20))\nos.write(reply_fd(), b' ' * (60 << 20))\nreturn 1.0",
        fails="larger than",
    ),
    HostileProgram(
        "send a reply of 60,000 values",
        "frame = json.dumps({{'op': 'result', 'value': [0] * 60000, 'restart': False}}).encode()\n"
        "os.write(reply_fd(), struct.pack('>I', len(frame)) + frame)\nreturn 1.0",
        fails="more than \\d+ values",
    ),
    HostileProgram(
        "stop itself (SIGSTOP)",
        "signal.signal(signal.SIGALRM, signal.SIG_IGN)\nos.kill(os.getpid(), signal.SIGSTOP)\nreturn 1.0",
        fails="timeout|within",
    ),
    HostileProgram(
        "import torch (allowed)",
        "import torch\nreturn float(torch.ones(3).sum().item() == 3.0)",
        scores=1.0,
        heavy=True,
    ),
]


def _port(url: str | None, default: int) -> int:
    return urlparse(url).port or default if url else default


@dataclass
class HostWorld:
    """What the programs go after: a POSTTRAIN_HOME with a secret key and a database, another run's folder,
    a web stand-in (its own process, with secrets in its environment) and listeners that record any
    connection. Use as a context manager."""

    root: Path
    secret: str = field(default_factory=lambda: f"posttrain-secret-{secrets.token_hex(8)}")
    web_pid: int = 0
    web_port: int = 0
    ray_port: int = 0
    connections: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.home_dir = self.root / "posttrain-home"
        self.secret_key = str(self.home_dir / "secret_key")
        self.database = str(self.home_dir / "db.sqlite3")
        self.other_run = str(self.home_dir / "storage" / "runs" / "0f0e0d0c-other-run")
        self.escaped = str(self.root / "escaped-marker")
        self.unix_socket = str(self.root / "host.sock")
        self.abstract_socket = f"posttrain-hostile-{secrets.token_hex(6)}"
        self.shm_name = f"posttrain-hostile-{secrets.token_hex(6)}"
        self.key_description = f"posttrain-hostile-key-{secrets.token_hex(6)}"
        self.home = str(Path.home())
        self.engine_pid = os.getpid()
        self.postgres_port = _port(os.environ.get("DATABASE_URL"), 5432)
        self.redis_port = _port(os.environ.get("REDIS_URL"), 6379)
        # The sandbox shows the home folder only as far as the Python runtime lies inside it.
        self.home_allowed = sorted(
            {
                Path(p).resolve().relative_to(Path.home()).parts[0]
                for p in (sys.base_prefix, sys.prefix)
                if Path(p).resolve().is_relative_to(Path.home())
            }
        )
        # The engine's (this process's) environment holds secrets too while the programs run.
        self.secret_env = {
            "POSTTRAIN_INGEST_TOKEN": self.secret,
            "POSTTRAIN_SECRET_KEY": self.secret,
            "DATABASE_URL": f"postgres://posttrain:{self.secret}@127.0.0.1:{self.postgres_port}/posttrain",
            "REDIS_URL": f"redis://:{self.secret}@127.0.0.1:{self.redis_port}/0",
        }
        self.secret_env_names = sorted(self.secret_env)
        self._saved_env: dict[str, str | None] = {}
        self._listeners: list[socket.socket] = []
        self._web: subprocess.Popen | None = None

    def __enter__(self) -> Self:
        Path(self.other_run).mkdir(parents=True)
        Path(self.secret_key).write_text(self.secret)
        Path(self.database).write_text(f"SQLite format 3 {self.secret}")
        (Path(self.other_run) / "events.jsonl").write_text(f'{{"token": "{self.secret}"}}\n')
        Path(f"/dev/shm/{self.shm_name}").write_text(self.secret)
        _plant_session_key(self.key_description, self.secret)
        for name, value in self.secret_env.items():
            self._saved_env[name] = os.environ.get(name)
            os.environ[name] = value
        self.ray_port = self._listen(socket.socket(), ("127.0.0.1", 0), "ray")
        self._listen(socket.socket(socket.AF_UNIX), self.unix_socket, "unix")
        self._listen(socket.socket(socket.AF_UNIX), f"\0{self.abstract_socket}", "abstract")
        self._start_web()
        return self

    def _listen(self, sock: socket.socket, address, name: str) -> int:
        sock.bind(address)
        sock.listen(16)
        self._listeners.append(sock)

        def accept() -> None:
            while True:
                try:
                    conn, _ = sock.accept()
                except OSError:
                    return
                self.connections.append(name)
                conn.close()

        threading.Thread(target=accept, daemon=True).start()
        return sock.getsockname()[1] if sock.family == socket.AF_INET else 0

    def _start_web(self) -> None:
        """A web server stand-in in its own process: it records connections in a file and holds secrets in
        its environment like the real one (DATABASE_URL, the secret key)."""
        self.web_log = self.root / "web-connections"
        code = textwrap.dedent(
            """
            import socket, sys
            s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", 0)); s.listen(16)
            print(s.getsockname()[1], flush=True)
            while True:
                conn, _ = s.accept()
                open(sys.argv[1], "a").write("connected\\n")
                conn.close()
            """
        )
        env = {**os.environ, **self.secret_env}
        self._web = subprocess.Popen(
            [sys.executable, "-c", code, str(self.web_log)], env=env, stdout=subprocess.PIPE, text=True
        )
        self.web_pid = self._web.pid
        self.web_port = int(self._web.stdout.readline())

    def __exit__(self, *exc) -> None:
        for name, value in self._saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        for sock in self._listeners:
            sock.close()
        if self._web is not None:
            self._web.kill()
            self._web.wait()
        Path(f"/dev/shm/{self.shm_name}").unlink(missing_ok=True)

    def source(self, body: str) -> str:
        values = {k: v for k, v in vars(self).items() if not k.startswith("_")}
        values.update(home_dir=self.home_dir, secret_key=self.secret_key)
        return textwrap.indent(body.format(**values), "    ")

    def reward_file(self, program: HostileProgram) -> str:
        return f"{PREAMBLE}\ndef attack():\n{self.source(program.body)}\n\n" + textwrap.dedent(
            """
            def reward_func(queries, prompts, labels, **kwargs):
                return [attack()] * len(queries)
            """
        )

    def environment_file(self, program: HostileProgram) -> str:
        return f"{PREAMBLE}\ndef attack():\n{self.source(program.body)}\n\n" + textwrap.dedent(
            """
            class Environment:
                def reset(self, prompt, label, metadata):
                    return None

                def step(self, action):
                    return None, attack(), True
            """
        )

    def assert_untouched(self, program: HostileProgram, outputs: list[str]) -> None:
        """The host after the program: nothing escaped, nothing leaked, the servers still up and unreached."""
        assert not Path(self.escaped).exists(), f"{program.name}: wrote {self.escaped} on the host"
        assert self._web is not None and self._web.poll() is None, f"{program.name}: the web server stand-in died"
        assert not self.web_log.exists(), f"{program.name}: reached the web server"
        assert not self.connections, f"{program.name}: reached {self.connections}"
        assert Path(self.secret_key).read_text() == self.secret
        for text in outputs:
            assert self.secret not in text, f"{program.name}: the secret leaked into {text[:200]!r}"


def _plant_session_key(description: str, secret: str) -> None:
    """Gives this process (the engine, in these tests) a session keyring of its own holding a key, as an
    engine's keyring may hold credentials: a sandbox it starts must not see it."""
    import pyseccomp

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    keyctl, add_key = (pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name) for name in ("keyctl", "add_key"))
    join_session_keyring, session_keyring = 1, -3
    assert libc.syscall(keyctl, join_session_keyring, b"posttrain-hostile-engine") >= 0, ctypes.get_errno()
    value = secret.encode()
    assert libc.syscall(add_key, b"user", description.encode(), value, len(value), session_keyring) >= 0


def wait_until(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()
