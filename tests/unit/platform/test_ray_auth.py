"""Ray's token authentication, the platform's side (docs/SECURITY.md, "Ray"): the token made once next to the
secret key and private, the header every request to Ray carries, a refusal named without the token, the job's
environment without any of it, and the admin's opt-out said loudly. Against a real Ray head:
tests/integration/test_ray_auth.py."""

from __future__ import annotations

import json
import logging
import stat
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import StringIO
from pathlib import Path

import pytest
from django.apps import apps
from django.core.management import call_command
from django.core.management.base import CommandError

from posttrain.core.errors import InvalidInput
from posttrain.core.ray_auth import DISABLED_WARNING, RayTokenUnavailable, ray_auth_headers

TOKEN = "f" * 64


@pytest.fixture
def token_file(settings, tmp_path: Path) -> Path:
    """An operator's token file (POSTTRAIN_RAY_TOKEN_FILE) outside the state folder."""
    path = tmp_path / "cluster" / "ray_token"
    path.parent.mkdir()
    path.write_text(TOKEN + "\n")
    settings.RAY_AUTH_MODE = "token"
    settings.RAY_TOKEN_FILE = path
    return path


class _FakeRayHead(BaseHTTPRequestHandler):
    """Ray's dashboard as the platform sees it: `/api/authentication_mode` for anyone, the rest for the token."""

    mode = "token"
    seen: list[str | None] = []

    def do_GET(self):
        type(self).seen.append(self.headers.get("Authorization"))
        if self.path == "/api/authentication_mode":
            self._answer(200, {"authentication_mode": self.mode})
        elif self.mode == "token" and self.headers.get("Authorization") is None:
            self._answer(401, "Unauthorized: Missing authentication token")
        elif self.mode == "token" and self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self._answer(403, "Forbidden: Invalid authentication token")
        elif self.path == "/api/version":
            self._answer(200, {"ray_version": "2.60.0"})
        elif self.path.startswith("/api/cluster_status"):
            self._answer(200, {"data": {"clusterStatus": {"loadMetricsReport": {"usageByNode": {}}}}})
        else:
            self._answer(404, "Job does not exist")

    def _answer(self, status: int, body) -> None:
        data = (json.dumps(body) if not isinstance(body, str) else body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def ray_head(settings) -> Iterator[type[_FakeRayHead]]:
    _FakeRayHead.mode, _FakeRayHead.seen = "token", []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeRayHead)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    settings.RAY_ADDRESS = f"http://127.0.0.1:{server.server_port}"
    yield _FakeRayHead
    server.shutdown()
    server.server_close()


def test_the_token_is_made_once_next_to_the_secret_key_readable_by_this_user_only(monkeypatch, tmp_path):
    from posttrain import settings as settings_module

    monkeypatch.setattr(settings_module, "STATE_DIR", tmp_path)
    made = settings_module._state_secret("ray_token", lambda: "first")
    again = settings_module._state_secret("ray_token", lambda: "second")
    assert made == again == tmp_path / "ray_token"
    assert made.read_text() == "first"
    assert stat.S_IMODE(made.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["ray_token"]  # no draft left behind


def test_every_request_to_ray_carries_the_clusters_token_unless_an_admin_turned_it_off(token_file, settings):
    assert ray_auth_headers() == {"Authorization": f"Bearer {TOKEN}"}
    token_file.write_text("0" * 64)  # replaced on disk: used from the next request on, no restart
    assert ray_auth_headers() == {"Authorization": f"Bearer {'0' * 64}"}
    settings.RAY_AUTH_MODE = "disabled"
    assert ray_auth_headers() == {}


@pytest.mark.parametrize("content", [None, "", "  \n"])
def test_a_token_file_that_is_missing_or_empty_is_named_by_its_setting(token_file, content):
    if content is None:
        token_file.unlink()
    else:
        token_file.write_text(content)
    with pytest.raises(RayTokenUnavailable) as refused:
        ray_auth_headers()
    assert "POSTTRAIN_RAY_TOKEN_FILE" in str(refused.value)
    assert str(token_file) not in str(refused.value)


def test_the_jobs_environment_holds_nothing_of_rays_authentication(experiment, token_file, tmp_path):
    from tests.unit.platform.helpers import make_run
    from workers.ray_jobs import engine_env

    env = engine_env(make_run(experiment), tmp_path / "ingest_token")
    assert not [name for name in env if name.startswith("RAY_")]
    assert TOKEN not in json.dumps(env) and str(token_file) not in json.dumps(env)


def test_the_jobs_client_refused_by_ray_waits_and_names_the_setting_not_the_token(token_file, monkeypatch):
    from ray.exceptions import AuthenticationError

    from posttrain.core.errors import JobsUnavailable
    from workers import ray_jobs

    def refusing(address, authorization):
        raise AuthenticationError("Authentication failed: Forbidden: Invalid authentication token")

    monkeypatch.setattr(ray_jobs, "_client", refusing)
    with pytest.raises(JobsUnavailable) as refused:
        ray_jobs.stop(type("Run", (), {"ray_job_id": "r1"})())
    assert "403" in str(refused.value) and "POSTTRAIN_RAY_TOKEN_FILE" in str(refused.value)
    assert TOKEN not in str(refused.value)


def test_the_schedulers_cluster_reads_carry_the_token_and_a_wrong_one_is_named(ray_head, token_file):
    from posttrain.core.errors import JobsUnavailable
    from workers.ray_cluster import cluster_view

    assert cluster_view().nodes == []
    assert ray_head.seen[-1] == f"Bearer {TOKEN}"
    token_file.write_text("0" * 64)
    with pytest.raises(JobsUnavailable) as refused:
        cluster_view()
    assert "refused the platform's token (403)" in str(refused.value) and "0" * 64 not in str(refused.value)


def test_job_logs_are_read_with_the_token_and_a_refusal_is_named_not_quoted(ray_head, token_file, experiment):
    from posttrain.core.errors import DispatchError
    from posttrain.telemetry.selectors import run_job_logs
    from tests.unit.platform.helpers import make_run

    run = make_run(experiment)
    assert run_job_logs(run) == {"logs": "", "truncated": False, "job": None}  # Ray has no such job
    assert ray_head.seen[-1] == f"Bearer {TOKEN}"
    token_file.write_text("0" * 64)
    with pytest.raises(DispatchError) as refused:
        run_job_logs(run)
    assert "refused the platform's token (403)" in str(refused.value) and "0" * 64 not in str(refused.value)


@pytest.mark.django_db
def test_health_says_what_the_head_enforces_and_warns_when_it_is_nothing(ray_head, token_file, settings):
    from posttrain.core.selectors import system_health

    report = system_health()
    assert report.ray.ok and report.ray.detail == "ray 2.60.0"
    assert report.as_dict(details=True)["ray_auth"] == "token"
    assert "ray_auth" not in report.as_dict(details=False)  # an admin's detail
    assert not [w for w in report.warnings if w.startswith("ray:")]

    token_file.write_text("0" * 64)
    report = system_health()
    assert not report.ray.ok and "refused the platform's token (403)" in report.ray.detail

    ray_head.mode = "disabled"
    settings.RAY_AUTH_MODE = "disabled"
    report = system_health()
    assert report.ray.ok and report.ray_auth == "disabled"
    assert f"ray: {DISABLED_WARNING}" in report.warnings

    settings.RAY_ADDRESS = "http://127.0.0.1:9"  # nothing answers: unknown, and the ray check says why
    assert system_health().ray_auth == "unknown"


def test_an_admins_opt_out_is_logged_by_every_platform_process(settings, caplog):
    settings.RAY_AUTH_MODE = "disabled"
    with caplog.at_level(logging.WARNING, logger="posttrain.ray"):
        apps.get_app_config("core").ready()
    assert any(
        "RAY_AUTH_MODE=disabled" in r.getMessage() and DISABLED_WARNING in r.getMessage() for r in caplog.records
    )
    caplog.clear()
    settings.RAY_AUTH_MODE = "token"
    apps.get_app_config("core").ready()
    assert not caplog.records


def test_the_start_script_learns_the_token_files_path_never_the_token(token_file, settings):
    out = StringIO()
    call_command("ray_auth", stdout=out)
    assert out.getvalue().strip() == f"token {token_file}"
    assert TOKEN not in out.getvalue()
    settings.RAY_AUTH_MODE = "disabled"
    out = StringIO()
    call_command("ray_auth", stdout=out)
    assert out.getvalue().strip() == "disabled"
    settings.RAY_AUTH_MODE = "token"
    token_file.unlink()
    with pytest.raises(CommandError, match="POSTTRAIN_RAY_TOKEN_FILE"):
        call_command("ray_auth", stdout=StringIO())


def test_no_server_path_reads_the_ray_token_wherever_the_operator_keeps_it(token_file, settings, researcher):
    from posttrain.core.server_paths import resolve_user_path
    from tests.unit.platform.helpers import grant_server_paths

    settings.IMPORT_ROOTS = [token_file.parent.parent]  # an admin opened the folder the token file is in
    user = grant_server_paths(researcher)
    link = token_file.parent.parent / "looks-harmless.txt"
    link.hardlink_to(token_file)
    for path in (token_file, link, token_file.parent):
        with pytest.raises(InvalidInput):
            resolve_user_path("spec.path", str(path), user, "any")
