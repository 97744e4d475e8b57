"""`Client`: one server and token, the project chosen, the requests and pagination, and the sections
(projects, registry, experiments, runs, review) it carries."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import httpx

from posttrain_sdk import credentials
from posttrain_sdk.client.experiments import Experiments
from posttrain_sdk.client.projects import Projects
from posttrain_sdk.client.registry import Datasets, Models, Rewards
from posttrain_sdk.client.responses import _error_for
from posttrain_sdk.client.review import Review
from posttrain_sdk.client.runs import Runs
from posttrain_sdk.client.sections import ProjectRef
from posttrain_sdk.errors import AuthError, FieldError, ServerUnreachable

DEFAULT_TIMEOUT_S = 60.0
PAGE_SIZE = 200
PROJECT_ENV = "POSTTRAIN_PROJECT"


def _chosen_project(given: ProjectRef | None, stored: str | None) -> str | None:
    """The project argument, else POSTTRAIN_PROJECT, else the server's stored default; an empty one chooses none."""
    if given is None:
        given = os.environ.get(PROJECT_ENV)
    if given is None:
        given = stored
    text = str(given).strip() if given is not None else ""
    return text or None


class Client:
    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        project: ProjectRef | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ):
        found = credentials.resolve(url, token)
        self.url = found.url
        self.token = found.token
        self.project = _chosen_project(project, found.project)
        self._http = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Token {self.token}", "Accept": "application/json"},
            timeout=timeout_s,
            transport=transport,
        )
        self.projects = Projects(self)
        self.models = Models(self)
        self.datasets = Datasets(self)
        self.rewards = Rewards(self)
        self.experiments = Experiments(self)
        self.runs = Runs(self)
        self.review = Review(self)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- transport --------------------------------------------------------------------------------

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ServerUnreachable(f"cannot reach {self.url}: {exc}") from None
        if response.status_code == 401 or (response.status_code == 403 and "invalid token" in response.text.lower()):
            raise AuthError(
                response.status_code,
                [
                    FieldError(
                        "token",
                        f"the server refused the token for {self.url} (revoked or expired): "
                        "run `posttrain login` again",
                    )
                ],
            )
        if response.status_code >= 400:
            raise _error_for(response)
        return response

    def get(self, path: str, **params: Any) -> Any:
        clean = {k: v for k, v in params.items() if v is not None}
        return self.request("GET", path, params=clean).json()

    def post(self, path: str, body: Any = None) -> Any:
        response = self.request("POST", path, json={} if body is None else body)
        return response.json() if response.content else None

    def pages(
        self, path: str, limit: int | None = None, *, scoped: bool = True, **params: Any
    ) -> Iterator[dict[str, Any]]:
        """Every item of a paginated list (LimitOffsetPagination), `limit` at most. A list of project objects
        (`scoped`) shows the client's project only, when it has one."""
        if scoped and params.get("project") is None:
            params["project"] = self.project
        offset = 0
        while True:
            page_size = PAGE_SIZE if limit is None else min(PAGE_SIZE, limit - offset)
            if page_size <= 0:
                return
            page = self.get(path, limit=page_size, offset=offset, **params)
            items = page["results"] if isinstance(page, dict) else page
            yield from items
            offset += len(items)
            if not isinstance(page, dict) or not page.get("next") or not items:
                return

    def me(self) -> dict[str, Any]:
        return self.get("/api/auth/me/")

    def creating_in(self, project: ProjectRef | None) -> dict[str, str]:
        """The `project` field of a create: the one named, else the client's; none lets the server choose."""
        chosen = _chosen_project(project, None) if project is not None else self.project
        return {"project": chosen} if chosen is not None else {}

    @staticmethod
    def obtain_token(url: str, username: str, password: str, *, timeout_s: float = 30.0) -> str:
        """The user's API token for a username and password (`POST /api/auth/token/`)."""
        url = credentials.normalize_url(url)
        try:
            response = httpx.post(
                f"{url}/api/auth/token/", json={"username": username, "password": password}, timeout=timeout_s
            )
        except httpx.TransportError as exc:
            raise ServerUnreachable(f"cannot reach {url}: {exc}") from None
        if response.status_code >= 400:
            raise _error_for(response)
        return response.json()["token"]
