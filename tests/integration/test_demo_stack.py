"""`make demo` on embedded defaults (SQLite, SQLite broker, local Ray head) serves a page you can log into,
and `make stop` ends exactly what it started."""

import http.cookiejar
import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.support.demo_builds import shared_demo_build
from tests.support.stack import REPO_ROOT, free_port

EXTERNAL_SERVERS = ("DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "RAY_ADDRESS")
# The session's Ray token (tests/conftest.py): the demo makes and uses its own.
SESSION_RAY_TOKEN = ("POSTTRAIN_RAY_TOKEN_FILE", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN")


@pytest.fixture
def built_demo(tmp_path_factory) -> Path:
    """The demo task as `make demo` builds it, built once for the suite (tests/support/demo_builds.py)."""
    return shared_demo_build(tmp_path_factory)


@pytest.fixture
def demo_env(tmp_path, built_demo):
    # The build already in place: make demo reuses a complete build (the path a second `make demo` takes), so
    # this test pays for the stack and not for a warm start the suite's other users of the same build already
    # paid for. The build itself is tested in tests/unit/engine/test_demo_build.py.
    shutil.copytree(built_demo, tmp_path / "demo" / "storage" / "imports" / "demo")
    env = {k: v for k, v in os.environ.items() if k not in EXTERNAL_SERVERS + SESSION_RAY_TOKEN}
    env.update(
        DEMO_HOME=str(tmp_path / "demo"),
        POSTTRAIN_PORT=str(free_port()),
        POSTTRAIN_RAY_DASHBOARD_PORT=str(free_port()),
        POSTTRAIN_RAY_GCS_PORT=str(free_port()),
        POSTTRAIN_RAY_AGENT_PORT=str(free_port()),
        POSTTRAIN_RAY_TMP=f"/tmp/pt-ray-demo-{os.getpid()}",
        # The real model's import is tested in tests/integration/test_run_lifecycle.py, its registration in
        # tests/unit/platform/test_demo_launch.py (a tiny GGUF): this test keeps to the stack, and to its time.
        DEMO_SMOLLM2="",
    )
    yield env
    subprocess.run(["make", "-s", "stop"], cwd=REPO_ROOT, env=env, timeout=120)


def _pids(demo_home: str) -> dict[str, int]:
    folder = os.path.join(demo_home, "pids")
    return {name[:-4]: int(open(os.path.join(folder, name)).read()) for name in os.listdir(folder)}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _processes_mentioning(text: str, within_s: float) -> list[str]:
    """Command lines of live processes that mention `text`, after waiting up to `within_s` for them to go."""
    deadline = time.monotonic() + within_s
    while True:
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmdline and str(os.getpid()) != entry:
                found.append(cmdline)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(1)


def _logs_tail(demo_home: str, lines: int = 30) -> str:
    """The last lines of each demo process's log, for a failure message: the test alone sees what went wrong."""
    folder = os.path.join(demo_home, "logs")
    if not os.path.isdir(folder):
        return "(no logs folder)"
    parts = []
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), errors="replace") as f:
            parts.append(f"--- {name} ---\n" + "".join(f.readlines()[-lines:]))
    return "\n".join(parts)


def _wait_for_demo_run_metrics(opener, base: str, demo_home: str, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    run: dict = {}
    while time.monotonic() < deadline:
        runs = json.load(opener.open(f"{base}/api/runs/"))["results"]
        if runs:
            run = runs[0]
            if run["state"] in ("failed", "cancelled"):
                detail = json.load(opener.open(f"{base}/api/runs/{run['id']}/"))
                raise AssertionError(
                    f"the demo run ended {run['state']}: {detail.get('state_reason')}\n{_logs_tail(demo_home)}"
                )
            series = json.load(opener.open(f"{base}/api/runs/{run['id']}/metrics/?names=eval/reward/mean"))["series"]
            if series["eval/reward/mean"]["steps"]:
                return run
        time.sleep(2)
    raise AssertionError(f"the demo run sent no metrics within {timeout_s:.0f} s: {run}\n{_logs_tail(demo_home)}")


def _assert_ray_is_behind_the_demos_own_token(demo_env: dict[str, str], make_output: str) -> None:
    """The demo's head runs with token authentication (docs/SECURITY.md, "Ray"), on a token made once next to the
    secret key and readable by this user only, which nothing printed."""
    token_file = Path(demo_env["DEMO_HOME"]) / "ray_token"
    assert token_file.stat().st_mode & 0o777 == 0o600
    ray = f"http://127.0.0.1:{demo_env['POSTTRAIN_RAY_DASHBOARD_PORT']}"
    with urllib.request.urlopen(f"{ray}/api/authentication_mode", timeout=10) as response:
        assert json.load(response)["authentication_mode"] == "token"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{ray}/api/jobs/", timeout=10)
    assert refused.value.code == 401
    token = token_file.read_text().strip()
    logs = Path(demo_env["DEMO_HOME"]) / "logs"
    assert token not in make_output and not any(token in log.read_text(errors="replace") for log in logs.iterdir())


# Its own deadlines (make demo, then the first metrics) end inside this limit, so a slow or stuck demo fails with
# the run's state and the demo's logs rather than a bare timeout.
@pytest.mark.slow  # the whole demo stack, once (SmolLM2's import is off here: DEMO_SMOLLM2="")
@pytest.mark.timeout(900)
def test_make_demo_serves_a_login_and_make_stop_ends_exactly_its_processes(demo_env, built_demo):
    began = time.monotonic()
    try:
        started = subprocess.run(
            ["make", "-s", "demo"], cwd=REPO_ROOT, env=demo_env, capture_output=True, text=True, timeout=420
        )
    except subprocess.TimeoutExpired as stuck:
        raise AssertionError(
            f"make demo took over 420 s:\n{stuck.output}\n{_logs_tail(demo_env['DEMO_HOME'])}"
        ) from stuck
    made_in = time.monotonic() - began
    assert started.returncode == 0, started.stdout + started.stderr
    # Built inside the default import root (<storage>/imports/), the one folder the platform reads server paths in.
    assets = os.path.join(demo_env["DEMO_HOME"], "storage", "imports", "demo")
    assert os.path.exists(os.path.join(assets, "run.yaml")), "demo assets were not built"
    with (
        open(os.path.join(assets, "manifest.json")) as reused,
        open(built_demo / "manifest.json") as shared,
    ):
        assert reused.read() == shared.read(), "make demo rebuilt a complete demo build instead of reusing it"
    username, password = re.search(r"login: (\S+) / (\S+)", started.stdout).groups()
    base = f"http://127.0.0.1:{demo_env['POSTTRAIN_PORT']}"
    assert base in started.stdout

    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    opener.open(f"{base}/login/").read()
    csrf = next(c.value for c in jar if c.name == "csrftoken")
    form = urllib.parse.urlencode({"username": username, "password": password, "csrfmiddlewaretoken": csrf}).encode()
    request = urllib.request.Request(f"{base}/login/", data=form, headers={"Referer": f"{base}/login/"})
    home = opener.open(request).read().decode()
    assert f"Welcome, {username}" in home

    with urllib.request.urlopen(f"{base}/api/health/", timeout=30) as response:
        anonymous = json.load(response)
    assert anonymous["status"] == "ok" and set(anonymous) == {"status", "checks"}, anonymous
    with opener.open(f"{base}/api/health/", timeout=30) as response:  # the demo's admin reads the details
        health = json.load(response)
    assert health["checks"]["database"]["detail"] == "sqlite"
    assert health["checks"]["broker"]["detail"].startswith("sqla+sqlite")
    _assert_ray_is_behind_the_demos_own_token(demo_env, started.stdout + started.stderr)

    # The demo experiment was launched: Celery -> Ray job -> engine -> events -> store.
    run = _wait_for_demo_run_metrics(opener, base, demo_env["DEMO_HOME"], timeout_s=700 - made_in)
    assert run["state"] == "running", run
    assert set(run["tags"]) == {"demo"}

    pids = _pids(demo_env["DEMO_HOME"])
    assert set(pids) == {"ray", "worker", "user_code", "web"}
    bystander = subprocess.Popen(["sleep", "300"])  # something the demo did not start
    try:
        stopped = subprocess.run(
            ["make", "-s", "stop"], cwd=REPO_ROOT, env=demo_env, capture_output=True, text=True, timeout=120
        )
        assert stopped.returncode == 0, stopped.stderr
        assert not any(_alive(pid) for pid in pids.values())
        assert _processes_mentioning(demo_env["DEMO_HOME"], within_s=30) == [], (
            "the demo run's engine outlived make stop"
        )
        assert bystander.poll() is None
    finally:
        bystander.kill()
