"""Projects and ownership (docs/SECURITY.md, "Projects and ownership"): two researchers in two projects and one
shared project. Every endpoint × role × relation is tried in test_permission_matrix.py; these follow the cases
the platform was attacked with, and what projects add: membership, copies across projects, the switcher, the
queue."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from rest_framework.test import APIClient

from posttrain.projects.models import Membership, Project
from posttrain.registry.models import Dataset, ModelAsset, RewardFunction
from posttrain.runs.models import Experiment, Run
from tests.support.pages import without_tokens
from tests.unit.platform.helpers import (
    BASE_CONFIG,
    a_researcher,
    an_experiment,
    join,
    registry_rows,
    single_campaign,
)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_dispatch")]


def client_of(user: Any) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


@pytest.fixture
def lab(tmp_path) -> dict[str, Any]:
    """Ada owns project "alpha", Bob owns "beta"; both are members of "shared". Ada's experiment in alpha (its
    registry rows hers), and a run of it."""
    from posttrain.runs import services

    ada, bob = a_researcher("ada", role="viewer"), a_researcher("bob", role="viewer")
    alpha, beta, shared = (Project.objects.create(name=name) for name in ("alpha", "beta", "shared"))
    join(ada, "owner", alpha)
    join(bob, "owner", beta)
    join(ada, "member", shared)
    join(bob, "member", shared)
    rows = registry_rows(tmp_path, [(f"{i}+1=", str(i + 1)) for i in range(8)])
    for row in (rows["model"], rows["dataset"], rows["exact"]):
        type(row).objects.filter(pk=row.pk).update(project=alpha, created_by=ada)
        row.refresh_from_db()
    experiment = services.experiment_create(
        project=alpha,
        name="ada's sums",
        model=rows["model"],
        dataset=rows["dataset"],
        rewards=[(rows["exact"], 1.0)],
        config=BASE_CONFIG,
        user=ada,
        webhook_url="",
    )
    run = services.run_launch(experiment, user=ada)
    return {"ada": ada, "bob": bob, "alpha": alpha, "beta": beta, "shared": shared, "run": run, **rows}


def test_a_researcher_makes_a_project_and_is_its_owner(lab):
    client = client_of(lab["bob"])
    made = client.post("/api/projects/", {"name": "gamma", "description": "bob's"}, format="json")
    assert made.status_code == 201 and made.json()["role"] == "owner" and made.json()["member_count"] == 1
    taken = client.post("/api/projects/", {"name": "Alpha"}, format="json")
    assert taken.status_code == 400 and taken.json()["errors"][0]["loc"] == "name"
    bad = client.post("/api/projects/", {"name": "no spaces"}, format="json")
    assert bad.status_code == 400 and bad.json()["errors"][0]["loc"] == "name"


def test_another_projects_work_is_invisible_and_unwritable(lab):
    """What researcher B did to researcher A's work before projects: each is now a 404, as for an id that does
    not exist (B cannot even tell it exists)."""
    bob, run = client_of(lab["bob"]), lab["run"]
    attempts = [
        ("post", f"/api/runs/{run.pk}/cancel/", {}),
        ("patch", f"/api/runs/{run.pk}/", {"note": "mine now", "tags": ["x"]}),
        ("patch", f"/api/datasets/{lab['dataset'].pk}/", {"name": "gone"}),
        ("delete", f"/api/rewards/{lab['exact'].pk}/", None),
        ("patch", f"/api/experiments/{run.experiment_id}/", {"webhook_url": "https://bob.example/hook"}),
        ("post", f"/api/experiments/{run.experiment_id}/launch/", {}),
        ("post", f"/api/runs/{run.pk}/clone/", {"project": "beta"}),
        ("post", f"/api/runs/{run.pk}/resume/", {"checkpoint": 1}),
        ("get", f"/api/runs/{run.pk}/", None),
        ("get", f"/api/runs/{run.pk}/samples/", None),
        ("post", f"/api/datasets/{lab['dataset'].pk}/copy/", {"project": "beta"}),
    ]
    for method, url, body in attempts:
        response = getattr(bob, method)(url, body, format="json") if body is not None else getattr(bob, method)(url)
        assert response.status_code == 404, (method, url, response.status_code, response.content[:200])
    run.refresh_from_db()
    assert run.state == "queued" and run.note == "" and run.tags == []
    assert Dataset.objects.get(pk=lab["dataset"].pk).name != "gone"
    assert RewardFunction.objects.filter(pk=lab["exact"].pk).exists()
    assert Experiment.objects.get(pk=run.experiment_id).webhook_url == ""
    listed = bob.get("/api/runs/").json()
    assert listed["count"] == 0
    compared = bob.get(f"/api/compare/?runs={run.pk}")
    assert compared.status_code == 400 and "no run with id" in compared.json()["errors"][0]["msg"]


def test_in_a_shared_project_a_member_reads_everything_and_changes_only_their_own(lab):
    ada, bob, shared = lab["ada"], lab["bob"], lab["shared"]
    experiment = an_experiment(project=shared, created_by=ada)
    ada_run = Run.objects.create(experiment=experiment, project=shared, created_by=ada, state="running")
    bobs = client_of(bob)
    assert bobs.get(f"/api/runs/{ada_run.pk}/").status_code == 200
    refused = bobs.post(f"/api/runs/{ada_run.pk}/cancel/", {}, format="json")
    assert refused.status_code == 403
    assert "only its creator or a maintainer or owner of project 'shared'" in refused.json()["errors"][0]["msg"]
    assert bobs.patch(f"/api/runs/{ada_run.pk}/", {"note": "x"}, format="json").status_code == 403
    bob_run = Run.objects.create(experiment=experiment, project=shared, created_by=bob, state="running")
    assert bobs.patch(f"/api/runs/{bob_run.pk}/", {"note": "mine"}, format="json").status_code == 200
    # A maintainer writes every object of the project.
    Membership.objects.filter(project=shared, user=bob).update(role="maintainer")
    assert client_of(bob).patch(f"/api/runs/{ada_run.pk}/", {"note": "tidied"}, format="json").status_code == 200


def test_the_last_owner_stays_and_only_an_owner_makes_an_owner(lab):
    alpha = lab["alpha"]
    carol = a_researcher("carol", role="viewer")
    ada = client_of(lab["ada"])
    assert ada.put(f"/api/projects/{alpha.pk}/members/carol/", {"role": "maintainer"}, format="json").status_code == 200
    carols = client_of(carol)
    assert carols.put(f"/api/projects/{alpha.pk}/members/bob/", {"role": "member"}, format="json").status_code == 200
    refused = carols.put(f"/api/projects/{alpha.pk}/members/bob/", {"role": "owner"}, format="json")
    assert refused.status_code == 403 and "only an owner" in refused.json()["errors"][0]["msg"]
    assert carols.delete(f"/api/projects/{alpha.pk}/members/ada/").status_code == 403  # an owner
    last = ada.put(f"/api/projects/{alpha.pk}/members/ada/", {"role": "member"}, format="json")
    assert last.status_code == 409 and "last owner" in last.json()["errors"][0]["msg"]
    assert ada.delete(f"/api/projects/{alpha.pk}/members/ada/").status_code == 409
    members = {m["username"]: m["role"] for m in ada.get(f"/api/projects/{alpha.pk}/members/").json()}
    assert members == {"ada": "owner", "bob": "member", "carol": "maintainer"}
    assert carols.delete(f"/api/projects/{alpha.pk}/members/carol/").status_code == 204  # anyone may leave
    unknown = ada.put(f"/api/projects/{alpha.pk}/members/nobody/", {"role": "member"}, format="json")
    assert unknown.status_code == 404 and unknown.json()["errors"][0]["loc"] == "username"


def test_an_empty_project_is_deleted_by_its_owner_and_a_full_one_is_kept(lab):
    ada = client_of(lab["ada"])
    kept = ada.delete(f"/api/projects/{lab['alpha'].pk}/")
    assert kept.status_code == 409 and Project.objects.filter(name="alpha").exists()
    empty = ada.post("/api/projects/", {"name": "scratch"}, format="json").json()
    assert ada.delete(f"/api/projects/{empty['id']}/").status_code == 204


def test_cloning_a_run_into_another_project_copies_its_experiment_and_assets_there(lab):
    ada, run = lab["ada"], lab["run"]
    join(ada, "member", lab["beta"])
    cloned = client_of(ada).post(f"/api/runs/{run.pk}/clone/", {"project": "beta", "seed": 3}, format="json")
    assert cloned.status_code == 201, cloned.content
    new = Run.objects.select_related("experiment").get(pk=cloned.json()["id"])
    assert new.project == lab["beta"] and new.experiment.project == lab["beta"] and new.created_by == ada
    assert new.resolved_config["model"] == run.resolved_config["model"] and new.seed == 3
    copied = new.experiment
    assert copied.model.project == lab["beta"] and copied.model.path == lab["model"].path
    assert copied.dataset.project == lab["beta"] and copied.dataset.sha256 == lab["dataset"].sha256
    assert [r.project for r in copied.rewards.all()] == [lab["beta"]]
    # A second clone reuses the copies (the same folder, content and spec under the same names).
    again = client_of(ada).post(f"/api/runs/{run.pk}/clone/", {"project": "beta"}, format="json")
    assert again.status_code == 201
    assert ModelAsset.objects.filter(project=lab["beta"]).count() == 1
    assert Dataset.objects.filter(project=lab["beta"]).count() == 1


def test_copying_into_a_project_needs_a_role_that_creates_there(lab):
    ada = client_of(lab["ada"])
    join(lab["ada"], "viewer", lab["beta"])
    viewer = ada.post(f"/api/datasets/{lab['dataset'].pk}/copy/", {"project": "beta"}, format="json")
    assert viewer.status_code == 403 and "viewer" in viewer.json()["errors"][0]["msg"]
    unknown = ada.post(f"/api/datasets/{lab['dataset'].pk}/copy/", {"project": "gamma"}, format="json")
    assert unknown.status_code == 404 and unknown.json()["errors"][0]["loc"] == "project"


def test_a_copied_dataset_shares_the_stored_file_which_outlives_one_copy(
    lab, storage, django_capture_on_commit_callbacks
):
    dataset = lab["dataset"]
    copy = client_of(lab["ada"]).post(f"/api/datasets/{dataset.pk}/copy/", {"project": "shared"}, format="json")
    assert (
        copy.status_code == 201 and copy.json()["sha256"] == dataset.sha256 and copy.json()["project_name"] == "shared"
    )
    again = client_of(lab["ada"]).post(f"/api/datasets/{dataset.pk}/copy/", {"project": "shared"}, format="json")
    assert again.status_code == 200 and again.json()["id"] == copy.json()["id"]
    from pathlib import Path

    from posttrain.registry.services import dataset_delete

    stored = Path(dataset.path)
    assert stored.exists()
    Experiment.objects.filter(dataset=dataset).delete()
    with django_capture_on_commit_callbacks(execute=True):
        dataset_delete(Dataset.objects.get(pk=dataset.pk))
    assert stored.exists()  # the copy in "shared" still reads it


def test_an_experiment_refers_only_to_its_own_projects_registry_objects(lab):
    ada = client_of(lab["ada"])
    body = {
        "project": "shared",
        "name": "mixed",
        "model": lab["model"].pk,
        "dataset": lab["dataset"].pk,
        "rewards": [{"reward": lab["exact"].pk, "weight": 1.0}],
        "config": BASE_CONFIG,
    }
    refused = ada.post("/api/experiments/", body, format="json")
    assert refused.status_code == 400
    assert {e["loc"] for e in refused.json()["errors"]} == {"model", "dataset", "rewards[0].reward"}
    assert "copy it into 'shared' first" in refused.json()["errors"][0]["msg"]
    # Another project's object the user cannot read is an id that does not exist.
    bobs = client_of(lab["bob"]).post("/api/experiments/", {**body, "project": "beta"}, format="json")
    assert bobs.status_code == 400 and "object does not exist" in json.dumps(bobs.json())


def test_lists_follow_the_switcher_and_the_project_parameter(lab):
    ada, run = client_of(lab["ada"]), lab["run"]
    shared_experiment = an_experiment(project=lab["shared"], created_by=lab["bob"])
    shared_run = Run.objects.create(experiment=shared_experiment, project=lab["shared"], state="running")
    ids = lambda answer: {r["id"] for r in answer.json()["results"]}  # noqa: E731
    assert ids(ada.get("/api/runs/")) == {str(run.pk), str(shared_run.pk)}
    assert ids(ada.get("/api/runs/?project=shared")) == {str(shared_run.pk)}
    assert ada.get("/api/runs/?project=beta").status_code == 404  # not hers to read
    switched = ada.put("/api/projects/current/", {"project": "alpha"}, format="json")
    assert switched.status_code == 200 and switched.json()["project"]["name"] == "alpha"
    assert ids(ada.get("/api/runs/")) == {str(run.pk)}
    page = without_tokens(ada.get("/runs/").content.decode())
    assert 'data-testid="project-switcher"' in page and "alpha (owner)" in page and "beta" not in page
    # What the session creates goes in the switcher's project.
    made = ada.post(
        "/api/rewards/", {"name": "mine", "kind": "builtin", "spec": {"type": "exact_match"}}, format="json"
    )
    assert made.status_code == 201 and made.json()["project_name"] == "alpha"
    assert ada.put("/api/projects/current/", {"project": None}, format="json").json()["project"] is None
    assert ids(ada.get("/api/runs/")) == {str(run.pk), str(shared_run.pk)}


def test_a_token_client_in_several_projects_names_the_one_it_creates_in(lab):
    ada = APIClient()
    from rest_framework.authtoken.models import Token

    ada.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=lab['ada']).key}")
    body = {"name": "r", "kind": "builtin", "spec": {"type": "exact_match"}}
    unnamed = ada.post("/api/rewards/", body, format="json")
    assert unnamed.status_code == 400 and unnamed.json()["errors"][0]["loc"] == "project"
    assert "alpha" in unnamed.json()["errors"][0]["msg"] and "shared" in unnamed.json()["errors"][0]["msg"]
    assert ada.post("/api/rewards/?project=shared", body, format="json").status_code == 201


def test_the_queue_shows_another_projects_runs_without_their_names(lab):
    answer = client_of(lab["bob"]).get("/api/queue/").json()
    (waiting,) = answer["waiting"]
    assert waiting["hidden"] is True and waiting["id"] is None and waiting["owner"] is None
    assert waiting["name"] == "a run of another project" and waiting["reason"] == "waiting"
    (own_view,) = client_of(lab["ada"]).get("/api/queue/").json()["waiting"]
    assert own_view["id"] == str(lab["run"].pk) and own_view["project"] == "alpha" and own_view["owner"] == "ada"


def test_a_campaign_samples_only_runs_its_maker_reads(lab):
    from posttrain.core.errors import InvalidInput

    with pytest.raises(InvalidInput) as refused:
        single_campaign([lab["run"]], [], user=lab["bob"], activate=False)
    assert refused.value.errors[0]["loc"] == "source.runs[0]"


def test_an_admin_sets_members_from_the_command_line(lab):
    call_command("project_member", "lab", "ada", "owner", "--create")
    assert Membership.objects.get(project__name="lab", user=lab["ada"]).role == "owner"
    call_command("project_member", "lab", "bob", "member")
    call_command("project_member", "lab", "bob", "--remove")
    assert not Membership.objects.filter(project__name="lab", user=lab["bob"]).exists()
    with pytest.raises(CommandError, match="last owner"):
        call_command("project_member", "lab", "ada", "--remove")
    with pytest.raises(CommandError, match="no project named"):
        call_command("project_member", "nope", "ada", "member")
