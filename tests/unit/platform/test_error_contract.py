"""The error contract: every API error, whoever raised it, is `{"errors": [{"loc", "msg"}]}` (plus a
conflict's context), and the OpenAPI schema describes that body once."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import InterfaceError, OperationalError
from django.test import AsyncClient
from rest_framework import exceptions
from rest_framework.test import APIClient

from posttrain.core.api.errors import api_exception_handler, field_errors
from posttrain.core.errors import Conflict, IllegalTransition, InvalidInput, SeqConflict


def handled(exc: Exception):
    response = api_exception_handler(exc, {})
    return response.status_code, response.data, response


def test_drfs_nested_validation_errors_name_each_field_by_its_path():
    detail = {
        "name": ["is required"],
        "rewards": [{}, {"weight": ["must be positive"]}],
        "non_field_errors": ["give a model or a checkpoint"],
        "config": {"rollout": {"stop": {1: ["not a string"]}}},
    }
    assert field_errors(detail) == [
        {"loc": "name", "msg": "is required"},
        {"loc": "rewards[1].weight", "msg": "must be positive"},
        {"loc": "", "msg": "give a model or a checkpoint"},
        {"loc": "config.rollout.stop[1]", "msg": "not a string"},
    ]


def test_a_services_django_validation_error_is_a_400_naming_its_fields():
    status, body, _ = handled(DjangoValidationError({"spec.pattern": ["invalid regular expression"], "__all__": "x"}))
    assert status == 400
    assert body == {"errors": [{"loc": "spec.pattern", "msg": "invalid regular expression"}, {"loc": "", "msg": "x"}]}
    assert handled(DjangoValidationError("no field"))[1] == {"errors": [{"loc": "", "msg": "no field"}]}


@pytest.mark.parametrize(
    ("exc", "status", "msg"),
    [
        (exceptions.NotAuthenticated(), 401, "Authentication credentials were not provided."),
        (exceptions.PermissionDenied("your role is annotator"), 403, "your role is annotator"),
        (DjangoPermissionDenied("not yours"), 403, "not yours"),
        (exceptions.MethodNotAllowed("PUT"), 405, 'Method "PUT" not allowed.'),
        (exceptions.ParseError("JSON parse error - Expecting value"), 400, "JSON parse error - Expecting value"),
        (exceptions.Throttled(wait=7), 429, "Request was throttled. Expected available in 7 seconds."),
    ],
)
def test_drfs_and_djangos_own_errors_take_the_same_shape(exc, status, msg):
    code, body, _ = handled(exc)
    assert (code, body) == (status, {"errors": [{"loc": "", "msg": msg}]})


def test_a_throttled_answer_still_says_when_to_come_back():
    assert handled(exceptions.Throttled(wait=7))[2]["Retry-After"] == "7"


def test_conflicts_carry_what_the_client_needs_to_recover():
    assert handled(IllegalTransition("cannot cancel a run that is succeeded", "succeeded"))[:2] == (
        409,
        {"errors": [{"loc": "", "msg": "cannot cancel a run that is succeeded"}], "state": "succeeded"},
    )
    assert handled(SeqConflict(4, "expected seq 4"))[1]["expected_seq"] == 4
    assert handled(Conflict("in use"))[1] == {"errors": [{"loc": "", "msg": "in use"}]}


def test_invalid_input_keeps_every_error_and_reads_as_one_line():
    exc = InvalidInput([{"loc": "x", "msg": "bad"}, {"msg": "worse"}])
    assert str(exc) == "x: bad; worse"
    assert handled(exc)[1] == {"errors": [{"loc": "x", "msg": "bad"}, {"loc": "", "msg": "worse"}]}


@pytest.mark.parametrize("exc", [OperationalError("connection refused"), InterfaceError("connection already closed")])
def test_a_database_outage_is_a_503_that_says_when_to_retry_not_a_500(exc):
    status, body, response = handled(exc)
    assert status == 503
    assert body == {"errors": [{"loc": "", "msg": "the database cannot be reached just now; retry in 5 s"}]}
    assert response["Retry-After"] == "5"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/api/runs/1/stream/",
            b'{"errors": [{"loc": "", "msg": "the database cannot be reached just now; retry in 5 s"}]}',
        ),
        ("/runs/", b"the database cannot be reached just now; retry in 5 s"),
    ],
)
def test_pages_and_streams_answer_a_database_outage_with_a_503_too(path, body):
    from django.test import RequestFactory

    from posttrain.core.middleware import DatabaseUnavailableMiddleware

    middleware = DatabaseUnavailableMiddleware(lambda request: None)
    response = middleware.process_exception(RequestFactory().get(path), OperationalError("connection refused"))
    assert (response.status_code, response.content, response["Retry-After"]) == (503, body, "5")
    assert middleware.process_exception(RequestFactory().get(path), KeyError("x")) is None


def test_the_outage_middleware_stays_async_for_async_views():
    from asgiref.sync import iscoroutinefunction

    from posttrain.core.middleware import DatabaseUnavailableMiddleware

    async def view(request):
        return None

    assert iscoroutinefunction(DatabaseUnavailableMiddleware(view))
    assert not iscoroutinefunction(DatabaseUnavailableMiddleware(lambda request: None))


def test_anything_else_is_a_bug_and_left_to_become_a_500():
    assert api_exception_handler(KeyError("x"), {}) is None


@pytest.mark.django_db
def test_an_unknown_object_a_wrong_method_and_broken_json_answer_the_contract(researcher_client):
    missing = researcher_client.get("/api/models/999999/")
    assert (missing.status_code, missing.json()) == (
        404,
        {"errors": [{"loc": "", "msg": "No ModelAsset matches the given query."}]},
    )
    wrong = researcher_client.put("/api/models/", {}, format="json")
    assert (wrong.status_code, wrong.json()) == (405, {"errors": [{"loc": "", "msg": 'Method "PUT" not allowed.'}]})
    broken = researcher_client.post("/api/models/", data="{", content_type="application/json")
    assert broken.status_code == 400
    [error] = broken.json()["errors"]
    assert error["loc"] == "" and error["msg"].startswith("JSON parse error")


@pytest.mark.django_db
def test_a_wrong_api_token_answers_the_contract():
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token not-a-token")
    response = client.get("/api/models/")
    # 403, not 401: session authentication comes first and sends no challenge.
    assert (response.status_code, response.json()) == (403, {"errors": [{"loc": "", "msg": "Invalid token."}]})


@pytest.mark.django_db
def test_every_error_response_in_the_openapi_schema_is_the_one_errors_body(researcher_client):
    schema = researcher_client.get("/api/schema/", {"format": "json"}).json()
    errors = schema["components"]["schemas"]["Errors"]
    assert errors["required"] == ["errors"] and {"state", "expected_seq"} <= set(errors["properties"])
    assert set(schema["components"]["schemas"]["FieldError"]["properties"]) == {"loc", "msg"}
    documented = 0
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            for code, response in operation["responses"].items():
                if code[0] in "45":
                    documented += 1
                    body = response["content"]["application/json"]["schema"]
                    assert body == {"$ref": "#/components/schemas/Errors"}, (method, path, code)
                    assert response["description"], (method, path, code)
    assert documented > 100


@pytest.mark.django_db
def test_endpoints_list_the_errors_their_kind_answers(researcher_client):
    paths = researcher_client.get("/api/schema/", {"format": "json"}).json()["paths"]
    assert {"400", "403", "404", "409"} <= set(paths["/api/runs/{id}/cancel/"]["post"]["responses"])
    assert {"400", "401", "403", "404", "409", "413"} <= set(paths["/api/runs/{id}/events/"]["post"]["responses"])
    assert "404" not in paths["/api/models/"]["get"]["responses"]
    assert "403" not in paths["/api/health/"]["get"]["responses"]


def test_the_browser_streams_refusals_answer_the_contract_though_it_is_no_drf_view():
    url = "/api/runs/6f1c1b2e-0000-4000-8000-000000000000/stream/"
    response = async_to_sync(AsyncClient().post)(url, {})
    assert (response.status_code, response["Allow"]) == (405, "GET")
    assert response.json() == {"errors": [{"loc": "", "msg": 'Method "POST" not allowed.'}]}
