"""The client's project, against a fake server (httpx's MockTransport): the argument, else POSTTRAIN_PROJECT, else
the default `posttrain projects use` stored for the server; lists of project objects name it, creates send it,
copies and clones name their target, and tracking sends its experiment apart from its project."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from posttrain_sdk import Client, PosttrainError, cli, credentials, tracking

URL = "http://posttrain.test"
TOKEN = "t0ken"


class FakeServer:
    """Records every request. Lists answer the rows registered for their path (filtered by `?project=`, as the
    server does); a POST answers its JSON body back with an id; `answers` overrides a path's answer."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.rows: dict[str, list[dict[str, Any]]] = {}
        self.answers: dict[tuple[str, str], Callable[[httpx.Request], httpx.Response]] = {}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.get((request.method, request.url.path))
        if answer is not None:
            return answer(request)
        if request.method == "GET":
            rows = self.rows.get(request.url.path, [])
            project = request.url.params.get("project")
            shown = [row for row in rows if project is None or row.get("project_name") == project]
            if request.url.path == "/api/projects/":
                return httpx.Response(200, json=shown)
            return httpx.Response(200, json={"count": len(shown), "next": None, "results": shown})
        body = json.loads(request.content) if request.headers.get("content-type") == "application/json" else {}
        return httpx.Response(201, json={"id": 7, **body})

    def sent(self, method: str, path: str) -> list[httpx.Request]:
        return [r for r in self.requests if r.method == method and r.url.path == path]

    def params(self, path: str) -> list[dict[str, str]]:
        return [dict(r.url.params) for r in self.sent("GET", path)]

    def body(self, method: str, path: str) -> dict[str, Any]:
        (request,) = self.sent(method, path)
        return json.loads(request.content)


@pytest.fixture(autouse=True)
def config(monkeypatch, tmp_path):
    """A credentials file of the test's own; nothing from the environment."""
    for name in ("POSTTRAIN_PROJECT", "POSTTRAIN_URL", "POSTTRAIN_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("POSTTRAIN_CONFIG_DIR", str(tmp_path / "config"))
    return tmp_path / "config"


@pytest.fixture
def server() -> FakeServer:
    return FakeServer()


def client_of(server: FakeServer, **kwargs: Any) -> Client:
    return Client(URL, TOKEN, transport=httpx.MockTransport(server), **kwargs)


def registry_row(name: str, project: str, row_id: int = 3) -> dict[str, Any]:
    return {"id": row_id, "name": name, "project": 1, "project_name": project}


def test_the_project_is_the_argument_else_the_environment_else_the_servers_stored_default(server, monkeypatch):
    assert client_of(server).project is None
    credentials.save_token(URL, TOKEN, "ada")
    credentials.save_project(URL, "stored")
    assert client_of(server).project == "stored"
    credentials.save_token(URL, "new-token", "ada")  # logging in again keeps it
    assert client_of(server).project == "stored"
    monkeypatch.setenv("POSTTRAIN_PROJECT", "from-env")
    assert client_of(server).project == "from-env"
    assert client_of(server, project="given").project == "given"
    assert client_of(server, project=12).project == "12"
    assert client_of(server, project="").project is None  # none chosen: every project
    credentials.save_project(URL, None)
    monkeypatch.delenv("POSTTRAIN_PROJECT")
    assert client_of(server).project is None


def test_lists_of_project_objects_show_the_clients_project_only(server):
    client = client_of(server, project="vision")
    client.datasets.list()
    client.models.list(name="tiny")
    client.rewards.list()
    client.experiments.list()
    client.runs.list(kind="external")
    client.review.campaigns()
    client.runs.samples("3f2a1b9c-5d6e-4f70-8a9b-0c1d2e3f4a5b")
    for path in ("/api/datasets/", "/api/models/", "/api/rewards/", "/api/experiments/", "/api/runs/"):
        assert server.params(path)[0]["project"] == "vision", path
    assert server.params("/api/review/campaigns/")[0]["project"] == "vision"
    samples = server.params("/api/runs/3f2a1b9c-5d6e-4f70-8a9b-0c1d2e3f4a5b/samples/")
    assert "project" not in samples[0]  # a run's rollouts are no list of project objects


def test_without_a_project_lists_show_every_project_and_creates_let_the_server_choose(server, tmp_path):
    client = client_of(server)
    client.datasets.list()
    client.rewards.push("exact", spec={"type": "exact_match"})
    assert "project" not in server.params("/api/datasets/")[0]
    assert "project" not in server.body("POST", "/api/rewards/")


def test_creates_go_into_the_clients_project_or_the_one_named(server, tmp_path):
    data = tmp_path / "sums.jsonl"
    data.write_text('{"prompt": "1+1=", "label": "2"}\n')
    client = client_of(server, project="vision")
    client.models.register("tiny", "/srv/models/tiny")
    client.rewards.push("exact", spec={"type": "exact_match"}, project="audio")
    server.answers["POST", "/api/datasets/"] = lambda request: httpx.Response(201, json={"id": 9, "name": "sums"})
    client.datasets.push(data)
    assert server.body("POST", "/api/models/")["project"] == "vision"
    assert server.body("POST", "/api/rewards/")["project"] == "audio"
    (upload,) = server.sent("POST", "/api/datasets/")
    assert b'name="project"\r\n\r\nvision\r\n' in upload.read()  # a form field of the multipart upload


def test_an_experiment_yamls_project_wins_and_its_names_are_found_there(server, tmp_path):
    server.rows = {
        "/api/models/": [registry_row("tiny", "vision", 1), registry_row("tiny", "audio", 2)],
        "/api/datasets/": [registry_row("sums", "audio", 4)],
        "/api/rewards/": [registry_row("exact", "audio", 5)],
    }
    spec = tmp_path / "experiment.yaml"
    spec.write_text("name: sums grpo\nproject: audio\nmodel: tiny\ndataset: sums\nrewards: [exact]\n")
    client_of(server, project="vision").experiments.create_from_yaml(spec)
    assert [p["project"] for p in server.params("/api/models/")] == ["audio"]
    body = server.body("POST", "/api/experiments/")
    assert (body["project"], body["model"], body["dataset"], body["rewards"]) == (
        "audio",
        2,
        4,
        [{"reward": 5, "weight": 1.0}],
    )


def test_a_name_found_in_several_projects_is_refused_naming_them(server):
    server.rows["/api/datasets/"] = [registry_row("sums", "vision", 1), registry_row("sums", "audio", 2)]
    with pytest.raises(PosttrainError, match=r"'sums' names a dataset in several projects \(audio, vision\)"):
        client_of(server).datasets.get("sums")
    assert client_of(server, project="audio").datasets.get("sums").id == 2


def test_copies_and_clones_name_their_target_project(server):
    server.rows["/api/rewards/"] = [registry_row("exact", "vision", 5)]
    client = client_of(server, project="vision")
    client.rewards.copy("exact", "audio", name="exact-audio")
    assert server.body("POST", "/api/rewards/5/copy/") == {"project": "audio", "name": "exact-audio"}
    run = "3f2a1b9c-5d6e-4f70-8a9b-0c1d2e3f4a5b"
    client.runs.clone(run)
    assert "project" not in server.body("POST", f"/api/runs/{run}/clone/")  # a clone stays beside its source
    server.requests.clear()
    client.runs.clone(run, project="audio")
    assert server.body("POST", f"/api/runs/{run}/clone/")["project"] == "audio"


def test_members_are_managed_by_project_name(server):
    server.rows["/api/projects/"] = [{"id": 3, "name": "vision", "role": "owner"}]
    server.answers["PUT", "/api/projects/3/members/grace/"] = lambda request: httpx.Response(
        200, json={"username": "grace", "role": "member", "added_at": "2026-12-04T18:00:00Z"}
    )
    server.answers["DELETE", "/api/projects/3/members/grace/"] = lambda request: httpx.Response(204)
    client = client_of(server)
    assert client.projects.set_member("grace", "member", project="vision").role == "member"
    assert server.body("PUT", "/api/projects/3/members/grace/") == {"role": "member"}
    with pytest.raises(PosttrainError, match="project: name the project"):
        client.projects.remove_member("grace")
    client_of(server, project="vision").projects.remove_member("grace")
    assert len(server.sent("DELETE", "/api/projects/3/members/grace/")) == 1


def test_tracking_sends_the_experiment_apart_from_the_project(server, monkeypatch):
    monkeypatch.setattr(tracking, "Client", partial(Client, transport=httpx.MockTransport(server)))
    server.answers["POST", "/api/runs/external/"] = lambda request: httpx.Response(
        404, json={"errors": [{"loc": "project", "msg": "no project named 'gsm8k-grpo'"}]}
    )
    with pytest.raises(PosttrainError) as missing:
        tracking.init("gsm8k trl", project="gsm8k-grpo", url=URL, token=TOKEN)
    assert server.body("POST", "/api/runs/external/")["experiment"] == "gsm8k trl"
    assert server.body("POST", "/api/runs/external/")["project"] == "gsm8k-grpo"
    assert "project= names a Posttrain project" in str(missing.value)
    with pytest.raises(PosttrainError, match="experiment: required"):
        tracking.init(project="gsm8k-grpo", url=URL, token=TOKEN)  # the keyword's meaning before projects


def test_cli_tables_show_a_project_column_only_where_lists_mix_projects(server, monkeypatch):
    # The commands' client is made in cli/common.py (`_client`).
    monkeypatch.setattr(cli.common, "Client", partial(Client, transport=httpx.MockTransport(server)))
    server.rows["/api/datasets/"] = [
        {**registry_row("sums", "vision", 1), "format": "jsonl", "row_count": 8, "prompt_field": "prompt"},
        {**registry_row("words", "audio", 2), "format": "csv", "row_count": 3, "prompt_field": "prompt"},
    ]
    runner = CliRunner()
    mixed = runner.invoke(cli.main, ["--url", URL, "--token", TOKEN, "datasets", "ls"])
    assert mixed.exit_code == 0, mixed.output
    header, *rows = mixed.output.splitlines()
    assert header.split()[:3] == ["id", "name", "project"] and rows[1].split()[:3] == ["2", "words", "audio"]
    one = runner.invoke(cli.main, ["--url", URL, "--token", TOKEN, "--project", "vision", "datasets", "ls"])
    header, *rows = one.output.splitlines()
    assert "project" not in header.split() and len(rows) == 1 and rows[0].split()[:2] == ["1", "sums"]


def test_track_takes_the_experiment_and_says_where_project_goes_now(tmp_path):
    runner = CliRunner()
    old = runner.invoke(cli.main, ["--url", URL, "--token", TOKEN, "track", str(tmp_path), "--project", "gsm8k"])
    assert old.exit_code == 2 and "Missing option '--experiment'" in old.output
    both = ["track", str(tmp_path), "--experiment", "gsm8k", "--project", "math"]
    misplaced = runner.invoke(cli.main, ["--url", URL, "--token", TOKEN, *both])
    assert misplaced.exit_code == 2 and "goes before the command (`posttrain --project P track" in misplaced.output
