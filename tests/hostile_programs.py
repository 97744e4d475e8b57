"""Hostile user code, as a table: each program tries one thing a sandbox must stop. The same table runs as
a reward, as an environment (tests/unit/engine/test_sandbox_hostile.py) and through the reward's "Try it"
on a real Celery worker (tests/integration/test_try_it_sandbox.py).

A program is the body of `attack()`, which returns a number: 1.0 means the attack worked (it read the
secret, reached the server, ...). A program is contained when its sample fails with a reason matching
`fails` (the attack raised inside the sandbox), or when it scores `scores` without an error (the attack
ran and found nothing); some programs may end either way (a signal to PID 1 is refused when the platform
runs as root and ignored otherwise). Whatever it does, the host's own checks (`HostWorld.assert_untouched`) must hold:
no marker file written outside, no secret in any output, the stand-in servers alive and never connected to.
"""

from __future__ import annotations

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
import ctypes, os, signal, socket, subprocess, sys, time
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
        fails="No such process",
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


def wait_until(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()
