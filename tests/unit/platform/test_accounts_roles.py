"""Roles (admin, researcher, reviewer, annotator as Django groups), API tokens and the create_user command."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from posttrain.accounts.selectors import user_role, user_roles
from posttrain.accounts.services import user_create, user_set_role
from tests.unit.platform.helpers import PASSWORD

pytestmark = pytest.mark.django_db


ROLES = {"admin", "researcher", "reviewer", "annotator"}


def test_the_role_groups_exist_after_migrate():
    assert set(Group.objects.values_list("name", flat=True)) >= ROLES


@pytest.mark.django_db(transaction=True)
def test_the_role_groups_survive_a_flush():
    # A flush empties every table and sends post_migrate (a transactional test's teardown does the same).
    call_command("flush", interactive=False, verbosity=0)
    assert set(Group.objects.values_list("name", flat=True)) >= ROLES


def test_a_reviewer_adjudicates_but_neither_annotates_nor_manages_campaigns(client_for):
    reviewer = client_for("reviewer")
    assert reviewer.get("/api/review/adjudication/").status_code == 200
    assert reviewer.get("/api/review/queue/").status_code == 403
    refused = reviewer.get("/api/review/campaigns/")
    assert refused.json()["errors"][0]["msg"] == (
        "Only researchers and admins may use this endpoint; your role is reviewer."
    )


def test_setting_a_role_replaces_the_previous_one():
    user = user_create("ada", PASSWORD, "annotator")
    assert user_roles(user) == {"annotator"}
    user_set_role(user, "researcher")
    assert set(user.groups.values_list("name", flat=True)) == {"researcher"}
    assert user_role(user) == "researcher"


def test_the_admin_role_opens_the_admin_site_and_losing_it_closes_it():
    user = user_create("root", PASSWORD, "admin")
    assert user.is_staff and user.is_superuser
    user_set_role(user, "researcher")
    user.refresh_from_db()
    assert not user.is_staff and not user.is_superuser


def test_a_superuser_without_groups_counts_as_admin():
    user = get_user_model().objects.create_superuser("boss", "", PASSWORD)
    assert user_role(user) == "admin"


@pytest.mark.parametrize(
    ("args", "field", "words"),
    [
        (("ada", PASSWORD, "owner"), "role", "unknown role 'owner'"),
        (("ada", "123", "researcher"), "password", "too short"),
        (("", PASSWORD, "researcher"), "username", "required"),
    ],
    ids=["unknown-role", "weak-password", "no-username"],
)
def test_user_create_refuses_bad_input_naming_the_field(args, field, words):
    with pytest.raises(ValidationError) as exc:
        user_create(*args)
    assert words in " ".join(exc.value.message_dict[field])


def test_create_user_command_prints_the_generated_password_and_a_token(capsys):
    call_command("create_user", "grace", "--role", "researcher", "--token")
    out = capsys.readouterr().out
    password = out.split("password: ")[1].split()[0]
    token = out.split("API token: ")[1].strip()
    client = APIClient()
    assert client.post("/api/auth/token/", {"username": "grace", "password": password}, format="json").json() == {
        "token": token
    }


def test_create_user_command_refuses_an_existing_user():
    user_create("grace", PASSWORD, "annotator")
    with pytest.raises(CommandError, match="username: a user named 'grace' already exists"):
        call_command("create_user", "grace", "--role", "researcher", "--password", PASSWORD)


def test_a_script_gets_a_token_and_uses_it_instead_of_a_session(make_user):
    make_user("researcher", "ada")
    client = APIClient()
    token = client.post("/api/auth/token/", {"username": "ada", "password": PASSWORD}, format="json").json()["token"]
    assert client.get("/api/models/").status_code == 403
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert client.get("/api/models/").status_code == 200
    assert client.get("/api/auth/me/").json()["role"] == "researcher"


def test_a_wrong_password_gets_no_token(make_user):
    make_user("researcher", "ada")
    response = APIClient().post("/api/auth/token/", {"username": "ada", "password": "wrong"}, format="json")
    assert response.status_code == 400
    [error] = response.json()["errors"]
    assert error["loc"] == "" and "Unable to log in" in error["msg"]


def test_an_annotator_is_refused_the_registry_with_a_message_naming_the_role(client_for):
    response = client_for("annotator").get("/api/rewards/")
    assert response.status_code == 403
    assert response.json() == {
        "errors": [{"loc": "", "msg": "Only researchers and admins may use this endpoint; your role is annotator."}]
    }


def test_a_user_without_a_role_is_refused_the_registry(db):
    client = APIClient()
    client.force_login(get_user_model().objects.create_user("nobody", password=PASSWORD))
    response = client.get("/api/models/")
    assert response.status_code == 403
    assert "ask an admin" in response.json()["errors"][0]["msg"]


def test_anonymous_requests_get_a_json_403():
    response = APIClient().get("/api/datasets/")
    assert response.status_code == 403
    assert response.json() == {"errors": [{"loc": "", "msg": "Authentication credentials were not provided."}]}


def test_openapi_schema_documents_the_registry_and_the_token_endpoint(researcher_client):
    schema = researcher_client.get("/api/schema/", {"format": "json"}).json()
    paths = schema["paths"]
    for path in (
        "/api/models/",
        "/api/datasets/",
        "/api/datasets/{id}/preview/",
        "/api/rewards/{id}/try/",
        "/api/auth/token/",
    ):
        assert path in paths, path
    upload = paths["/api/datasets/"]["post"]["requestBody"]["content"]
    assert {"multipart/form-data", "application/json"} <= set(upload)
    assert "format" in [p["name"] for p in paths["/api/datasets/"]["get"]["parameters"]]
    assert "Token" in paths["/api/auth/token/"]["post"]["description"]
