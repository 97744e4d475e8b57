"""Peak memory of the whole demo stack (web, Celery worker, Ray head, the run's engine with vLLM) while the demo
run trains with the vLLM rollout backend, against the issue's goal: under 8 GiB on the 24 GiB machine.

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2 .venv/bin/python bench/stack_memory.py [--steps 30] [--timeout-s 900]
        [--interval-s 1] [--assets .demo/assets] [--rollout vllm|transformers] [--keep-home]

The stack is started as `make demo` starts it (migrate, ensure_admin, `scripts/demo.sh start`, `manage.py
demo_launch --set backends.rollout=vllm`), but in a temporary POSTTRAIN_HOME on free ports, with a Ray temp dir of
its own and the embedded defaults (SQLite, SQLite broker): a demo already running on 8000/8265/6390/52365 is not
touched. `scripts/demo.sh stop` with the same environment ends it, on success, error, Ctrl-C or SIGTERM alike.

Every --interval-s a sampler thread reads, for each process of the stack, PSS from /proc/<pid>/smaps_rollup (shared
pages, e.g. torch's libraries mapped by many processes, are split between their users instead of counted once per
process as RSS does) and RSS from /proc/<pid>/status. The stack's processes are the descendants of the three
process-group leaders in $POSTTRAIN_HOME/pids; the tree is built from the parent pid in every /proc/<pid>/stat
(/proc/<pid>/task/<tid>/children needs a kernel built with CONFIG_PROC_CHILDREN). A process belongs to
`engine` when its environment holds the run's POSTTRAIN_RUN_ID (the Ray job's runtime env: the job's supervisor
actor, the driver `python -m rl_engine train`, vLLM's EngineCore and Worker, any actor of the run) or its parent
does; else to the component of the pid file it descends from (`web`, `worker`, `user_code`, `ray`). Processes carrying the run
id outside those trees are counted in `engine` too and listed in `engine_outside_tree`: while the run trains there
are none (the driver is a child of Ray's JobSupervisor, vLLM's EngineCore a child of the driver); after the cancel,
vLLM's processes outlive the driver for a moment, reparented to pid 1.

The window runs from just before the stack starts until the run has logged --steps training steps (the demo
evaluates at step 20; `--rollout transformers` measures the plain demo, e.g. a smoke run on a tiny build, whose
heads are too narrow for vLLM's CPU attention), then the run is cancelled through the REST API as a user would, and ends when it is
cancelled. Prints one JSON document on stdout (progress on stderr); exits 1 when the run failed or timed out.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's root: `bench`, the engine, the SDK

from bench import _servers
from bench._machine import MachineLoad
from bench._servers import REPO, free_port

PYTHON = REPO / ".venv" / "bin" / "python"
GiB = 2**30
KiB = 1024
GOAL_GIB = 8
COMPONENTS = ("web", "worker", "user_code", "ray", "engine")
ROLLOUTS = ("vllm", "transformers")
# Settings that would point the bench's stack at someone else's servers or folders.
FOREIGN_ENV = ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "RAY_ADDRESS")
TERMINAL = ("succeeded", "failed", "cancelled")


def log(message: str) -> None:
    print(f"[bench stack_memory] {message}", file=sys.stderr, flush=True)


class BenchError(Exception):
    """The run could not be measured as asked (it failed, or timed out); the JSON carries the reason."""


# --- /proc -------------------------------------------------------------------------------------------------------


def _read(path: str) -> str | None:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:  # the process is gone (or was never ours to read)
        return None


def process_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, start time in clock ticks) of every live process."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _read(f"/proc/{entry}/stat")):
            fields = stat.rsplit(")", 1)[1].split()  # after the name: state ppid ... starttime (field 22)
            table[int(entry)] = (int(fields[1]), int(fields[19]))
    return table


def kib_field(text: str | None, name: str) -> int:
    for line in (text or "").splitlines():
        if line.startswith(name):
            return int(line.split()[1])
    return 0


def environ_has(pid: int, entry: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return entry in b"\0" + f.read()
    except OSError:
        return False


def command_line(pid: int) -> str:
    text = (_read(f"/proc/{pid}/cmdline") or "").replace("\0", " ").strip()
    return text[:120] or f"[{(_read(f'/proc/{pid}/comm') or '?').strip()}]"


def system_used_kib() -> int:
    """MemTotal - MemAvailable: what the whole machine uses (other work included)."""
    meminfo = _read("/proc/meminfo")
    return kib_field(meminfo, "MemTotal:") - kib_field(meminfo, "MemAvailable:")


# --- sampling ----------------------------------------------------------------------------------------------------


@dataclass
class Process:
    pid: int
    component: str
    pss_kib: int
    rss_kib: int
    command: str


@dataclass
class Peak:
    total_pss_kib: int = 0
    at_s: float = 0.0
    phase: str = ""
    components_kib: dict[str, int] = field(default_factory=dict)
    processes: list[Process] = field(default_factory=list)


class Sampler(threading.Thread):
    """Samples the stack's memory every `interval_s` until stopped; keeps the peaks, not the series."""

    def __init__(self, pids_dir: Path, interval_s: float):
        super().__init__(daemon=True)
        self.pids_dir, self.interval_s = pids_dir, interval_s
        self.started = time.monotonic()
        self.phase = "stack_start"
        self.run_id: str | None = None
        self.peak = Peak()
        self.component_peak_kib = dict.fromkeys(COMPONENTS, 0)
        self.phase_peak_kib: dict[str, int] = {}
        self.rss_peak_kib = 0
        self.used_before_kib = system_used_kib()
        self.used_peak_kib = self.used_before_kib
        self.samples = 0
        self.failed_samples = 0
        self.seen: dict[tuple[int, int], str] = {}  # (pid, start time) -> command line, for the cleanup check
        self.outside_tree: dict[int, dict[str, Any]] = {}
        self.step = 0  # the run's last logged step, as the main thread last polled it
        self.by_step: dict[int, dict[str, int]] = {}  # step -> PSS per component at the first sample after it
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            try:
                self.sample()
            except Exception as exc:  # a sample lost is reported, not a silently dead sampler
                self.failed_samples += 1
                log(f"sample failed: {type(exc).__name__}: {exc}")
            self._done.wait(self.interval_s)

    def stop(self) -> None:
        self._done.set()
        self.join()

    def roots(self) -> dict[int, str]:
        roots = {}
        for name in ("web", "worker", "user_code", "ray"):
            text = _read(str(self.pids_dir / f"{name}.pid"))
            if text and text.strip().isdigit():
                roots[int(text)] = name
        return roots

    def stack(self, table: dict[int, tuple[int, int]]) -> dict[int, str]:
        """pid -> component of every process of the stack."""
        children: dict[int, list[int]] = {}
        for pid, (parent, _) in table.items():
            children.setdefault(parent, []).append(pid)
        run_entry = f"\0POSTTRAIN_RUN_ID={self.run_id or ''}".encode()  # before the run is known: any run
        found: dict[int, str] = {}
        todo = [(pid, name) for pid, name in self.roots().items() if pid in table]
        while todo:
            pid, inherited = todo.pop()
            component = "engine" if inherited == "engine" or environ_has(pid, run_entry) else inherited
            found[pid] = component
            todo += [(child, component) for child in children.get(pid, [])]
        if self.run_id:  # the run's processes that Ray or vLLM may have started outside the tree
            for pid in table.keys() - found.keys():
                if environ_has(pid, run_entry):
                    found[pid] = "engine"
                    self.outside_tree.setdefault(
                        pid, {"pid": pid, "parent": table[pid][0], "phase": self.phase, "command": command_line(pid)}
                    )
        return found

    def sample(self) -> None:
        table = process_table()
        processes = []
        for pid, component in self.stack(table).items():
            pss = kib_field(_read(f"/proc/{pid}/smaps_rollup"), "Pss:")
            rss = kib_field(_read(f"/proc/{pid}/status"), "VmRSS:")
            processes.append(Process(pid, component, pss, rss, command_line(pid)))
            self.seen[(pid, table[pid][1])] = processes[-1].command
        by_component = {c: sum(p.pss_kib for p in processes if p.component == c) for c in COMPONENTS}
        total = sum(by_component.values())
        self.samples += 1
        for c, kib in by_component.items():
            self.component_peak_kib[c] = max(self.component_peak_kib[c], kib)
        self.phase_peak_kib[self.phase] = max(self.phase_peak_kib.get(self.phase, 0), total)
        self.rss_peak_kib = max(self.rss_peak_kib, sum(p.rss_kib for p in processes))
        self.used_peak_kib = max(self.used_peak_kib, system_used_kib())
        if self.phase == "training":
            self.by_step.setdefault(self.step, by_component)
        if total > self.peak.total_pss_kib:
            self.peak = Peak(total, time.monotonic() - self.started, self.phase, by_component, processes)

    def every_5th_step(self) -> dict[int, dict[str, int]]:
        """The samples at the first step seen at or after 1, 5, 10, ...: whether memory still grows while training
        (polling skips steps now and then, so a multiple of 5 may be missing)."""
        chosen, mark = {}, 1
        for step, kib in sorted(self.by_step.items()):
            if step >= mark:
                chosen[step] = kib
                mark = (step // 5 + 1) * 5
        return chosen

    def report(self) -> dict[str, Any]:
        gib = lambda kib: round(kib * KiB / GiB, 3)  # noqa: E731
        top = sorted(self.peak.processes, key=lambda p: -p.pss_kib)[:15]
        return {
            "peak_total_pss_gib": gib(self.peak.total_pss_kib),
            "peak_at_s": round(self.peak.at_s, 1),
            "peak_phase": self.peak.phase,
            "peak_components_pss_gib": {c: gib(k) for c, k in self.peak.components_kib.items()},
            "component_peak_pss_gib": {c: gib(k) for c, k in self.component_peak_kib.items()},
            "phase_peak_total_pss_gib": {p: gib(k) for p, k in self.phase_peak_kib.items()},
            "peak_total_rss_gib": gib(self.rss_peak_kib),
            "system_used_before_gib": gib(self.used_before_kib),
            "system_used_increase_gib": gib(self.used_peak_kib - self.used_before_kib),
            "peak_processes": [
                {
                    "component": p.component,
                    "pid": p.pid,
                    "pss_mib": round(p.pss_kib / KiB),
                    "rss_mib": round(p.rss_kib / KiB),
                    "command": p.command,
                }
                for p in top
            ],
            "processes_at_peak": len(self.peak.processes),
            "pss_gib_by_step": {
                step: {"total": gib(sum(kib.values())), "engine": gib(kib["engine"])}
                for step, kib in self.every_5th_step().items()
            },
            "engine_outside_tree": list(self.outside_tree.values()),
            "samples": self.samples,
            "failed_samples": self.failed_samples,
        }


# --- the stack ---------------------------------------------------------------------------------------------------


def stack_env(home: Path) -> dict[str, str]:
    """`make demo`'s environment on embedded defaults, in `home`, on free ports."""
    env = {k: v for k, v in os.environ.items() if k not in FOREIGN_ENV and not k.startswith("POSTTRAIN_")}
    env.update(
        POSTTRAIN_HOME=str(home),
        POSTTRAIN_PORT=str(free_port()),
        POSTTRAIN_RAY_DASHBOARD_PORT=str(free_port()),
        POSTTRAIN_RAY_GCS_PORT=str(free_port()),
        POSTTRAIN_RAY_AGENT_PORT=str(free_port()),
        # Ray's unix sockets live under its temp dir, whose path must stay short.
        POSTTRAIN_RAY_TMP=f"/tmp/pt-ray-mem-{os.getpid()}",
        OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"),
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        RAY_AUTH_MODE="token",  # as shipped: scripts/demo.sh starts the head with the home's own token file
        PYTHONDONTWRITEBYTECODE="1",
    )
    return env


def run_checked(command: list[str], env: dict[str, str]) -> str:
    """Runs a setup command; returns its stdout (its stderr goes to ours). Fails with the command's output."""
    done = subprocess.run(command, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise BenchError(f"{' '.join(command[1:4])} exited {done.returncode}: {done.stdout.strip()[-500:]}")
    return done.stdout


def manage(env: dict[str, str], *args: str) -> str:
    return run_checked([str(PYTHON), "manage.py", *args], env)


DEMO_SH = REPO / "scripts" / "demo.sh"


def demo_sh(env: dict[str, str], action: str) -> int:
    """`scripts/demo.sh start|stop`; its report goes to stderr."""
    return subprocess.run([str(DEMO_SH), action], cwd=REPO, env=env, stdout=sys.stderr).returncode


def ensure_demo_build(assets: Path, env: dict[str, str]) -> None:
    """The demo build in `assets`, used as it is when there is one (e.g. a tiny build for a quick look); else
    built as `make demo` builds it."""
    if not (assets / "manifest.json").exists():
        run_checked([str(PYTHON), "-m", "rl_engine", "demo", "build", str(assets)], env)


def line_value(text: str, prefix: str) -> str:
    """The first word after `prefix` in a command's output."""
    for line in text.splitlines():
        if prefix in line:
            return line.split(prefix, 1)[1].split()[0]
    raise BenchError(f"no {prefix!r} in: {text.strip()}")


class Api:
    """The platform's REST API with a researcher's token, as a user's script would call it."""

    def __init__(self, base: str, token: str):
        self.base, self.token = base, token

    def call(self, path: str, method: str = "GET") -> dict[str, Any]:
        request = urllib.request.Request(
            self.base + path, method=method, headers={"Authorization": f"Token {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.load(response)


def wait_for_steps(
    api: Api, run_id: str, steps: int, deadline: float, sampler: Sampler, marks: dict[str, float]
) -> dict[str, Any]:
    """Polls the run until it has logged `steps` training steps; the sampler's phase follows the run."""
    last = -1
    while True:
        run = api.call(f"/api/runs/{run_id}/")
        step = sampler.step = run["last_step"] or 0
        if run["state"] == "running":
            marks.setdefault("run_running_s", time.monotonic() - sampler.started)
        if step >= 1 and sampler.phase != "training":
            marks["first_step_s"] = time.monotonic() - sampler.started
            sampler.phase = "training"
        if step != last:
            log(f"run {run['state']}, step {step}/{steps}")
            last = step
        if run["state"] in TERMINAL:
            raise BenchError(f"the run ended {run['state']} at step {step}: {run['state_reason']}")
        if step >= steps:
            return run
        if time.monotonic() > deadline:
            raise BenchError(f"timed out: the run was {run['state']} at step {step} of {steps} (--timeout-s)")
        time.sleep(1)


def cancel(api: Api, run_id: str, wait_s: float = 120) -> str:
    """Cancels the run as a user does (POST /api/runs/<id>/cancel/); returns its state once settled."""
    state = api.call(f"/api/runs/{run_id}/cancel/", method="POST")["state"]
    deadline = time.monotonic() + wait_s
    while state not in TERMINAL and time.monotonic() < deadline:
        time.sleep(2)
        state = api.call(f"/api/runs/{run_id}/")["state"]
    return state


def stop_stack(env: dict[str, str], sampler: Sampler, grace_s: float = 30) -> list[str]:
    """`scripts/demo.sh stop`, then waits for every process the sampler saw to go. What is still there after
    `grace_s` (it was this stack's: same pid and start time) is killed and returned."""
    demo_sh(env, "stop")
    deadline = time.monotonic() + grace_s
    while True:
        table = process_table()
        alive = {pid: cmd for (pid, start), cmd in sampler.seen.items() if table.get(pid, (0, -1))[1] == start}
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(1)
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return [f"{pid} {cmd}" for pid, cmd in alive.items()]


def measure(args: argparse.Namespace, home: Path, report: dict[str, Any]) -> None:
    env = stack_env(home)
    env["POSTTRAIN_IMPORT_ROOTS"] = str(args.assets)  # the platform registers server files from there only
    report["ports"] = {
        k: int(env[k])
        for k in (
            "POSTTRAIN_PORT",
            "POSTTRAIN_RAY_DASHBOARD_PORT",
            "POSTTRAIN_RAY_GCS_PORT",
            "POSTTRAIN_RAY_AGENT_PORT",
        )
    }
    log(f"demo assets in {args.assets}")
    ensure_demo_build(args.assets, env)
    manage(env, "migrate", "--noinput", "-v0")
    manage(env, "ensure_admin")
    token = line_value(manage(env, "create_user", "stack-bench", "--role", "researcher", "--token"), "API token: ")
    manage(env, "project_member", "default", "stack-bench", "maintainer")  # it cancels the demo run it measured
    overrides = [f"backends.rollout={args.rollout}"]

    sampler = Sampler(home / "pids", args.interval_s)
    marks: dict[str, float] = {}
    sampler.start()
    stack_stopped = _servers.on_stop_run([str(DEMO_SH), "stop"], env=env)
    try:
        log(f"starting the stack in {home} (web port {env['POSTTRAIN_PORT']})")
        if demo_sh(env, "start") != 0:
            raise BenchError(f"scripts/demo.sh start failed; see {home / 'logs'} (--keep-home keeps it)")
        marks["stack_up_s"] = time.monotonic() - sampler.started
        sampler.phase = "run_start"
        launched = manage(env, "demo_launch", str(args.assets), *[a for o in overrides for a in ("--set", o)])
        run_id = sampler.run_id = line_value(launched, "demo run launched: ")
        report["run"] = {"id": run_id, "overrides": overrides}
        log(f"run {run_id} launched with {' '.join(overrides)}")
        api = Api(f"http://127.0.0.1:{env['POSTTRAIN_PORT']}", token)
        deadline = sampler.started + args.timeout_s
        try:
            run = wait_for_steps(api, run_id, args.steps, deadline, sampler, marks)
        finally:  # what the run got to, also when it failed or timed out
            detail = api.call(f"/api/runs/{run_id}/")
            report["run"].update(
                steps=detail["last_step"] or 0,
                state=detail["state"],
                rollout_backend=detail["resolved_config"]["backends"]["rollout"],
                # Only the vLLM backend reports the sampled tokens' log-probs (rl_engine/trainer.py: rollout_logprob_gap).
                vllm_logprob_metric="rollout/logprob_diff_max" in detail["summary"],
                last_eval_step=detail["summary"].get("eval/reward/mean", {}).get("step"),
            )
        marks["steps_done_s"] = time.monotonic() - sampler.started
        sampler.phase = "cancel"
        log(f"step {run['last_step']} reached; cancelling the run")
        report["run"]["final_state"] = cancel(api, run_id)
        marks["cancelled_s"] = time.monotonic() - sampler.started
    finally:
        try:
            sampler.stop()
            report.update(sampler.report())
            report["under_goal"] = report["peak_total_pss_gib"] < GOAL_GIB
            report["timeline_s"] = {k: round(v, 1) for k, v in marks.items()}
        finally:  # whatever went wrong above, the stack goes
            log("stopping the stack")
            report["leftovers_killed"] = stop_stack(env, sampler)
            stack_stopped()


def main() -> int:
    parser = argparse.ArgumentParser(description="Peak memory of the whole demo stack with the vLLM rollout backend.")
    parser.add_argument("--steps", type=int, default=30, help="training steps to measure (the demo evaluates at 20)")
    parser.add_argument("--timeout-s", type=float, default=900, help="from the stack's start to --steps")
    parser.add_argument("--interval-s", type=float, default=1.0, help="between memory samples")
    parser.add_argument(
        "--assets",
        type=Path,
        default=REPO / ".demo" / "assets",
        help="a demo build, used as it is; made by `python -m rl_engine demo build` if it has no manifest.json",
    )
    parser.add_argument(
        "--rollout", choices=ROLLOUTS, default="vllm", help="the run's rollout backend (transformers: the plain demo)"
    )
    parser.add_argument("--keep-home", action="store_true", help="keep the temporary POSTTRAIN_HOME (logs, SQLite)")
    args = parser.parse_args()
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    args.assets = args.assets.resolve()

    report: dict[str, Any] = {
        "bench": "stack_memory",
        "goal_gib": GOAL_GIB,
        "under_goal": False,
        "steps": args.steps,
        "rollout": args.rollout,
        "cpus": os.cpu_count(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "mem_total_gib": round(kib_field(_read("/proc/meminfo"), "MemTotal:") * KiB / GiB, 1),
        "interval_s": args.interval_s,
    }
    return measure_in_a_home(measure, args, report, "pt-stack-mem-")


def measure_in_a_home(
    measure: Callable[[argparse.Namespace, Path, dict[str, Any]], None],
    args: argparse.Namespace,
    report: dict[str, Any],
    prefix: str,
) -> int:
    """`measure(args, home, report)` in a temporary POSTTRAIN_HOME (kept with --keep-home), stdout kept for the JSON
    (whatever the commands print goes to stderr); then the document, with `error` (a bench error, or the stop that
    interrupted it), the wall time and the machine's load. Returns the exit status."""
    json_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    started = time.monotonic()
    machine = MachineLoad()
    home = Path(tempfile.mkdtemp(prefix=prefix))
    report["error"] = None
    try:
        measure(args, home, report)
    except (BenchError, OSError) as exc:  # OSError: the platform's API did not answer
        report["error"] = str(exc) if isinstance(exc, BenchError) else f"{type(exc).__name__}: {exc}"
        log(f"error: {report['error']}")
    except KeyboardInterrupt as stopped:  # Ctrl-C, SIGTERM or SIGHUP, after measure() stopped the stack
        report["error"] = f"interrupted ({stopped})"
    finally:
        if args.keep_home:
            report["home"] = str(home)
        else:
            shutil.rmtree(stack_env(home)["POSTTRAIN_RAY_TMP"], ignore_errors=True)
            shutil.rmtree(home, ignore_errors=True)
    report["wall_s"] = round(time.monotonic() - started, 1)
    report["machine"] = machine.report()
    print(json.dumps(report, indent=1), file=json_out, flush=True)
    return 1 if report["error"] else 0


if __name__ == "__main__":
    _servers.run_bench(main)
