import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from tests.support.pages import foreign_assets

pytestmark = pytest.mark.django_db


@pytest.fixture
def roleless_user():
    """A signed-in user with no role: the pages log them in, the APIs refuse them."""
    return get_user_model().objects.create_user(username="ada", password="a-long-passphrase")


def test_home_redirects_anonymous_users_to_login(client):
    response = client.get(reverse("home"))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login"))


def test_login_with_right_password_opens_the_home_page(client, roleless_user):
    response = client.post(reverse("login"), {"username": "ada", "password": "a-long-passphrase"}, follow=True)
    assert response.status_code == 200
    assert response.context["user"].is_authenticated
    assert b"Welcome, ada" in response.content


def test_login_with_wrong_password_is_refused_with_a_message(client, roleless_user):
    response = client.post(reverse("login"), {"username": "ada", "password": "nope"})
    assert response.status_code == 200
    assert not response.context["user"].is_authenticated
    assert b"match. Please try again" in response.content


def test_logout_ends_the_session(client, roleless_user):
    client.force_login(roleless_user)
    response = client.post(reverse("logout"))
    assert response.status_code == 302
    assert client.get(reverse("home")).status_code == 302


def test_admin_is_open_to_staff_only(client, roleless_user, admin_user):
    client.force_login(roleless_user)
    assert client.get("/admin/").status_code == 302  # sent to the admin login
    client.force_login(admin_user)
    assert client.get("/admin/").status_code == 200


def test_openapi_schema_describes_the_health_endpoint(client, roleless_user):
    client.force_login(roleless_user)
    response = client.get(reverse("api-schema"), {"format": "json"})
    assert response.status_code == 200
    schema = response.json()
    assert schema["info"]["title"] == "Posttrain API"
    assert "/api/health/" in schema["paths"]


def test_api_docs_page_serves_swagger_ui_from_our_own_static_files(client, roleless_user):
    client.force_login(roleless_user)
    response = client.get(reverse("api-docs"))
    assert response.status_code == 200
    body = response.content.decode()
    assert "swagger-ui" in body
    assert foreign_assets(body) == []  # no script or stylesheet from another host


def test_debug_is_off_unless_asked_for(settings):
    import os

    if os.environ.get("POSTTRAIN_DEBUG") is None:
        assert settings.DEBUG is False
