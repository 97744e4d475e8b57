"""The REST API of a Posttrain server, typed: registry, experiments, runs, review exports.

    import posttrain_sdk as posttrain

    client = posttrain.Client()                       # the server and token `posttrain login` stored
    client = posttrain.Client(project="vision")       # lists show one project; creates go into it
    dataset = client.datasets.push("prompts.jsonl", name="addition")
    run = client.runs.launch(experiment_id, seed=1)
    for message in client.runs.follow(run.id):        # live: metrics, state, end
        ...

Every refusal raises APIError (AuthError, NotFound, Conflict) whose `errors` name the field.

The project: `Client(project=...)` (a name or id), else POSTTRAIN_PROJECT, else the default stored for the
server by `posttrain projects use`; `project=""` chooses none. Without one, lists show every project you read
and creates go into the one project you can create in (the server asks which when there are several).
"""

from __future__ import annotations

import builtins
import os
import string
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
import yaml

from posttrain_sdk import credentials
from posttrain_sdk.errors import (
    APIError,
    AuthError,
    Conflict,
    FieldError,
    NotFound,
    PosttrainError,
    ServerUnreachable,
    field_errors,
)
from posttrain_sdk.sse import Message, read_stream
from posttrain_sdk.types import (
    Campaign,
    Dataset,
    Experiment,
    InProject,
    Member,
    Model,
    Project,
    Reward,
    Run,
    Sample,
)

_ApiT = TypeVar("_ApiT", bound=InProject)

DEFAULT_TIMEOUT_S = 60.0
PAGE_SIZE = 200
AMBIGUOUS_SHOWN = 10  # runs an ambiguous id prefix names
RECONNECT_DELAY_S = 1.0  # what EventSource waits (the stream's `retry:`)
IMPORT_POLL_S = 2.0  # how often a GGUF import is asked whether it ended
DATASET_SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".csv": "csv", ".parquet": "parquet"}
PROJECT_ENV = "POSTTRAIN_PROJECT"
ProjectRef = str | int  # a project's name or id


def _chosen_project(given: ProjectRef | None, stored: str | None) -> str | None:
    """The project argument, else POSTTRAIN_PROJECT, else the server's stored default; an empty one chooses none."""
    if given is None:
        given = os.environ.get(PROJECT_ENV)
    if given is None:
        given = stored
    text = str(given).strip() if given is not None else ""
    return text or None


def _error_for(response: httpx.Response) -> APIError:
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text.strip()[:500] or None
    errors = field_errors(body) or [FieldError("", f"HTTP {response.status_code} {response.reason_phrase}")]
    status = response.status_code
    if status in (401, 403):
        return AuthError(status, errors, body=body)
    if status == 404:
        return NotFound(status, errors, body=body)
    if status == 409:
        return Conflict(status, errors, body=body)
    return APIError(status, errors, body=body)


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


class _Section:
    def __init__(self, client: Client):
        self.client = client


def _one_by_name(
    section: str,
    client: Client,
    path: str,
    name_or_id: str | int,
    kind: type[_ApiT],
    project: ProjectRef | None = None,
) -> _ApiT:
    """A registry object by id, or by its exact name (the list filter matches parts of names) in `project`, else
    the client's project, else every project read: a name found in several of them is refused."""
    if isinstance(name_or_id, int) or str(name_or_id).isdigit():
        return kind.from_api(client.get(f"{path}{int(name_or_id)}/"))
    where = client.creating_in(project)
    items = client.pages(path, name=name_or_id, project=where.get("project"))
    matches = [item for item in items if item["name"] == name_or_id]
    if not matches:
        inside = f" in project {where['project']!r}" if where else ""
        raise NotFound(404, [FieldError(section, f"no {section} named {name_or_id!r}{inside}")])
    if len(matches) > 1:
        found_in = ", ".join(sorted({str(item.get("project_name")) for item in matches}))
        raise PosttrainError(
            f"{section}: {name_or_id!r} names a {section} in several projects ({found_in}): "
            "name the project (--project, project=) or give the id"
        )
    return kind.from_api(matches[0])


class _Registry(_Section, Generic[_ApiT]):
    """A registry section: list (by part of a name), get (by id, or exact name), copy into another project."""

    section: str
    path: str
    kind: type[_ApiT]

    def list(self, name: str | None = None) -> list[_ApiT]:
        return [self.kind.from_api(item) for item in self.client.pages(self.path, name=name)]

    def get(self, name_or_id: str | int, *, project: ProjectRef | None = None) -> _ApiT:
        """By id, or by name in `project` (default: the client's; without one, every project you read)."""
        return _one_by_name(self.section, self.client, self.path, name_or_id, self.kind, project)

    def copy(self, name_or_id: str | int, project: ProjectRef, *, name: str | None = None) -> _ApiT:
        """The object in `project` too (default name: the same); the server reads it here and creates there."""
        source = self.get(name_or_id)
        body = {"project": str(project), **({"name": name} if name else {})}
        return self.kind.from_api(self.client.post(f"{self.path}{source.raw['id']}/copy/", body))


# -- projects -------------------------------------------------------------------------------------


class Projects(_Section):
    """Projects you read, their members and roles (owner, maintainer, member, viewer)."""

    def list(self) -> list[Project]:
        return [Project.from_api(item) for item in self.client.get("/api/projects/")]

    def get(self, name_or_id: ProjectRef) -> Project:
        """A project by id or name (names never start with a digit)."""
        if isinstance(name_or_id, int) or str(name_or_id).isdigit():
            return Project.from_api(self.client.get(f"/api/projects/{int(name_or_id)}/"))
        for project in self.list():
            if project.name == name_or_id:
                return project
        raise NotFound(404, [FieldError("project", f"no project named {name_or_id!r}")])

    def create(self, name: str, *, description: str = "") -> Project:
        """A new project; you are its owner."""
        return Project.from_api(self.client.post("/api/projects/", {"name": name, "description": description}))

    def members(self, project: ProjectRef | None = None) -> builtins.list[Member]:
        """The members of `project` (default: the client's) and their roles."""
        found = self.client.get(f"/api/projects/{self._id(project)}/members/")
        return [Member.from_api(item) for item in found]

    def set_member(self, username: str, role: str, *, project: ProjectRef | None = None) -> Member:
        """Add a user to `project` (default: the client's) with `role`, or change their role."""
        path = self._member_path(project, username)
        return Member.from_api(self.client.request("PUT", path, json={"role": role}).json())

    def remove_member(self, username: str, *, project: ProjectRef | None = None) -> None:
        self.client.request("DELETE", self._member_path(project, username))

    def _member_path(self, project: ProjectRef | None, username: str) -> str:
        return f"/api/projects/{self._id(project)}/members/{quote(username, safe='')}/"

    def _id(self, project: ProjectRef | None) -> int:
        chosen = project if project is not None else self.client.project
        if chosen is None:
            raise PosttrainError("project: name the project (project=, --project, or `posttrain projects use`)")
        return self.get(chosen).id


# -- registry -------------------------------------------------------------------------------------


class Models(_Registry[Model]):
    section, path, kind = "model", "/api/models/", Model

    def register(self, name: str, path: str, *, description: str = "", project: ProjectRef | None = None) -> Model:
        """Register a Hugging Face model folder that the server can read (its path on the server)."""
        body = {"name": name, "path": str(path), "description": description, **self.client.creating_in(project)}
        return Model.from_api(self.client.post("/api/models/", body))

    def import_gguf(
        self,
        file: str | Path,
        *,
        name: str = "",
        description: str = "",
        project: ProjectRef | None = None,
        server_path: bool = False,
        wait: bool = True,
        poll_s: float = IMPORT_POLL_S,
    ) -> dict[str, Any]:
        """Import a GGUF file (uploaded, or `server_path`: a file the server reads, with an admin's grant): the server
        converts it into an ordinary model folder on its user-code worker, in the sandbox. Returns the import
        (`state`, `error`, `model`), once it ended when `wait`; a failed import raises APIError naming why."""
        fields = {"name": name, "description": description, **self.client.creating_in(project)}
        if server_path:
            record = self.client.post("/api/models/import-gguf/", {**fields, "path": str(file)})
        else:
            local = Path(file)
            if not local.is_file():
                raise PosttrainError(f"file: no such file {local}")
            with local.open("rb") as f:
                response = self.client.request(
                    "POST", "/api/models/import-gguf/", data=fields, files={"file": (local.name, f)}
                )
            record = response.json()
        while wait and record["state"] not in ("done", "failed"):
            time.sleep(poll_s)
            record = self.client.get(record["url"])
        if record["state"] == "failed":
            raise APIError(422, [FieldError("file", record.get("error") or "the import failed")], body=record)
        return record


class Datasets(_Registry[Dataset]):
    section, path, kind = "dataset", "/api/datasets/", Dataset

    def push(
        self,
        path: str | Path,
        *,
        name: str | None = None,
        prompt_field: str = "prompt",
        label_field: str | None = "label",
        format: str | None = None,
        description: str = "",
        project: ProjectRef | None = None,
    ) -> Dataset:
        """Upload a JSONL, CSV or Parquet file; the same content again (in the same project) returns the existing
        dataset."""
        path = Path(path)
        if not path.is_file():
            raise PosttrainError(f"file: no such file {path}")
        fields = {
            "name": name or path.stem,
            "prompt_field": prompt_field,
            "label_field": label_field or "",
            "description": description,
            **self.client.creating_in(project),
        }
        guessed = format or DATASET_SUFFIXES.get(path.suffix.lower())
        if guessed:
            fields["format"] = guessed
        with path.open("rb") as f:
            response = self.client.request("POST", "/api/datasets/", data=fields, files={"file": (path.name, f)})
        return Dataset.from_api(response.json())


class Rewards(_Registry[Reward]):
    section, path, kind = "reward", "/api/rewards/", Reward

    def push(
        self,
        name: str,
        path: str | Path | None = None,
        *,
        kind: str | None = None,
        spec: dict[str, Any] | None = None,
        description: str = "",
        project: ProjectRef | None = None,
    ) -> Reward:
        """A Python reward file (`reward_func` or verl's `compute_score`, checked in the server's
        sandbox) or a spec: `rewards.push("exact", spec={"type": "exact_match"})` is a builtin."""
        body: dict[str, Any] = {
            "name": name,
            "description": description,
            "spec": spec or {},
            **self.client.creating_in(project),
        }
        if path is not None:
            path = Path(path)
            if not path.is_file():
                raise PosttrainError(f"file: no such file {path}")
            body["kind"] = kind or "python"
            body["source"] = path.read_text(encoding="utf-8")
        else:
            body["kind"] = kind or "builtin"
        return Reward.from_api(self.client.post("/api/rewards/", body))


# -- experiments ----------------------------------------------------------------------------------


class Experiments(_Section):
    def create(
        self,
        name: str,
        *,
        model: str | int,
        dataset: str | int,
        rewards: list[Any],
        config: dict[str, Any] | None = None,
        description: str = "",
        project: ProjectRef | None = None,
    ) -> Experiment:
        """An experiment from registry names or ids (names are looked up in `project`, else the client's);
        `rewards` items are a name/id or `{"reward": name_or_id, "weight": w}`. The config is checked by the
        engine's schema."""
        resolved = []
        for i, item in enumerate(rewards or []):
            reward, weight = (item.get("reward"), item.get("weight", 1.0)) if isinstance(item, dict) else (item, 1.0)
            if reward is None:
                raise PosttrainError(f"rewards[{i}].reward: required")
            resolved.append({"reward": self.client.rewards.get(reward, project=project).id, "weight": weight})
        body = {
            "name": name,
            "description": description,
            "model": self.client.models.get(model, project=project).id,
            "dataset": self.client.datasets.get(dataset, project=project).id,
            "rewards": resolved,
            "config": config or {},
            **self.client.creating_in(project),
        }
        return Experiment.from_api(self.client.post("/api/experiments/", body))

    def create_from_yaml(self, path: str | Path) -> Experiment:
        """`name`, `model`, `dataset`, `rewards` (registry names or ids), optional `description` and `project`
        (it wins over the client's), and `config`: the engine run config without model.path, data and rewards."""
        path = Path(path)
        if not path.is_file():
            raise PosttrainError(f"file: no such file {path}")
        try:
            spec = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" (line {mark.line + 1})" if mark is not None else ""
            raise PosttrainError(f"{path}{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
        if not isinstance(spec, dict):
            raise PosttrainError(f"{path}: must be a mapping with name, model, dataset, rewards and config")
        missing = [key for key in ("name", "model", "dataset", "rewards") if key not in spec]
        if missing:
            raise PosttrainError(f"{path}: {missing[0]}: required")
        unknown = sorted(set(spec) - {"name", "description", "project", "model", "dataset", "rewards", "config"})
        if unknown:
            raise PosttrainError(f"{path}: {unknown[0]}: unknown key (engine settings go under `config:`)")
        return self.create(
            spec["name"],
            model=spec["model"],
            dataset=spec["dataset"],
            rewards=spec["rewards"] if isinstance(spec["rewards"], list) else [spec["rewards"]],
            config=spec.get("config") or {},
            description=spec.get("description") or "",
            project=spec.get("project"),
        )

    def list(self) -> list[Experiment]:
        return [Experiment.from_api(item) for item in self.client.pages("/api/experiments/")]

    def get(self, experiment_id: int) -> Experiment:
        return Experiment.from_api(self.client.get(f"/api/experiments/{int(experiment_id)}/"))


# -- runs -----------------------------------------------------------------------------------------


class Runs(_Section):
    # In this class body `list` is the method below: annotations after it name the builtin `builtins.list`.
    def list(
        self,
        *,
        state: str | list[str] | None = None,
        experiment: int | None = None,
        tag: str | None = None,
        kind: str | None = None,
        search: str | None = None,
        limit: int | None = 50,
    ) -> list[Run]:
        params: dict[str, Any] = {"experiment": experiment, "tag": tag, "kind": kind, "search": search}
        if state:
            params["state"] = [state] if isinstance(state, str) else list(state)
        return [Run.from_api(item) for item in self.client.pages("/api/runs/", limit=limit, **params)]

    def get(self, run_id: str) -> Run:
        return Run.from_api(self.client.get(f"/api/runs/{run_id}/"))

    def resolve_id(self, id_or_prefix: str) -> str:
        """The whole id of the one run whose id starts with `id_or_prefix` (a short id as tables show it, taken as
        git and docker take one; dashes optional); a whole id comes back as it is. The server finds the matches
        (`?id_prefix=`). No run: NotFound; several: PosttrainError naming them."""
        text = id_or_prefix.strip()
        digits = text.replace("-", "")
        if len(digits) == 32:
            return text
        if not digits or any(c not in string.hexdigits for c in digits):
            raise PosttrainError(f"run: {id_or_prefix!r} is not a run id nor the start of one (hex digits)")
        page = self.client.get("/api/runs/", id_prefix=text, limit=AMBIGUOUS_SHOWN + 1, ordering="-created_at")
        matches = [r for r in page["results"] if r["id"].replace("-", "").startswith(digits.lower())]
        if not matches:
            raise NotFound(404, [FieldError("run", f"no run id starts with {text!r}")])
        if len(matches) > 1:
            shown = ", ".join(f"{r['id']} ({r['name']}, {r['state']})" for r in matches[:AMBIGUOUS_SHOWN])
            more = page.get("count", len(matches)) - min(len(matches), AMBIGUOUS_SHOWN)
            raise PosttrainError(
                f"run: {text!r} is the start of {page.get('count', len(matches))} run ids; give more of the one "
                f"you mean: {shown}" + (f" and {more} more" if more > 0 else "")
            )
        return matches[0]["id"]

    def launch(
        self,
        experiment: int,
        *,
        seed: int | None = None,
        tags: builtins.list[str] | None = None,
        note: str = "",
        priority: str | None = None,
    ) -> Run:
        """A new run; `priority` low, normal (the default), high, or urgent (admins)."""
        body: dict[str, Any] = {
            "seed": seed,
            "tags": tags or [],
            "note": note,
            **({"priority": priority} if priority else {}),
        }
        return Run.from_api(self.client.post(f"/api/experiments/{int(experiment)}/launch/", body))

    def set_priority(self, run_id: str, priority: str) -> Run:
        return Run.from_api(self.client.post(f"/api/runs/{run_id}/priority/", {"priority": priority}))

    def queue(self) -> dict[str, Any]:
        """The scheduler's queue: `waiting` runs in order, `running` runs with grants, the `cluster`."""
        return self.client.get("/api/queue/")

    def cancel(self, run_id: str) -> Run:
        return Run.from_api(self.client.post(f"/api/runs/{run_id}/cancel/", {}))

    def clone(
        self,
        run_id: str,
        *,
        seed: int | None = None,
        tags: builtins.list[str] | None = None,
        note: str = "",
        project: ProjectRef | None = None,
    ) -> Run:
        """A new run with the run's config; into `project` (its experiment and assets copied there) when named,
        else beside the source (the client's project is not used: a clone stays put unless told)."""
        body: dict[str, Any] = {"seed": seed, "tags": tags, "note": note}
        if project is not None:
            body["project"] = str(project)
        return Run.from_api(self.client.post(f"/api/runs/{run_id}/clone/", body))

    def resume(self, run_id: str, checkpoint: int | None = None) -> Run:
        """A new run continuing this one from a checkpoint (default: its latest one still on disk)."""
        if checkpoint is None:
            available = [c for c in self.checkpoints(run_id) if c.get("available")]
            if not available:
                raise PosttrainError(f"checkpoint: run {run_id} has no checkpoint left to resume from")
            checkpoint = available[-1]["id"]
        return Run.from_api(self.client.post(f"/api/runs/{run_id}/resume/", {"checkpoint": checkpoint}))

    def checkpoints(self, run_id: str) -> builtins.list[dict[str, Any]]:
        return self.client.get(f"/api/runs/{run_id}/checkpoints/")

    def transitions(self, run_id: str) -> builtins.list[dict[str, Any]]:
        return self.client.get(f"/api/runs/{run_id}/transitions/")

    def metrics(
        self,
        run_id: str,
        names: builtins.list[str] | None = None,
        *,
        step_min: int | None = None,
        step_max: int | None = None,
    ) -> dict[str, dict[str, builtins.list]]:
        """Every stored point: {name: {"steps": [...], "values": [...]}} (non-finite values as None)."""
        answer = self.client.get(
            f"/api/runs/{run_id}/metrics/",
            names=",".join(names) if names else None,
            step_min=step_min,
            step_max=step_max,
        )
        return answer["series"]

    def series(
        self, run_id: str, names: builtins.list[str] | None = None, *, x: str = "step", max_points: int | None = None
    ) -> dict[str, Any]:
        """Chart series, downsampled on the server (M4) past `max_points`."""
        return self.client.get(
            f"/api/runs/{run_id}/series/", names=",".join(names) if names else None, x=x, max_points=max_points
        )

    def samples(
        self,
        run_id: str,
        *,
        step: int | None = None,
        min_reward: float | None = None,
        max_reward: float | None = None,
        min_advantage: float | None = None,
        max_advantage: float | None = None,
        min_length: int | None = None,
        max_length: int | None = None,
        q: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[Sample]:
        items = self.client.pages(
            f"/api/runs/{run_id}/samples/",
            limit=limit,
            scoped=False,
            step=step,
            min_reward=min_reward,
            max_reward=max_reward,
            min_advantage=min_advantage,
            max_advantage=max_advantage,
            min_length=min_length,
            max_length=max_length,
            q=q,
        )
        return [Sample.from_api(item) for item in items]

    def rollouts(
        self, run_id: str, directory: str | Path, *, steps: Iterable[int] | None = None
    ) -> builtins.list[Path]:
        """The run's rollout files (Parquet, one per step; `steps` narrows them) into `directory`, as
        stored: `datasets.load_dataset("parquet", data_files=...)`, pandas or DuckDB read them as they are."""
        wanted = None if steps is None else set(steps)
        listing = self.client.get(f"/api/runs/{run_id}/rollouts/")
        target = Path(directory)
        target.mkdir(parents=True, exist_ok=True)
        written = []
        for item in listing["files"]:
            if not item["available"] or (wanted is not None and item["step"] not in wanted):
                continue
            written.append(
                _download(self.client, f"/api/runs/{run_id}/rollouts/{item['name']}", {}, target / item["name"])
            )
        return written

    def ledger(self, run_id: str) -> dict[str, Any]:
        """The run's prompt ledger summed per epoch (trained; filtered and dropped by reason; in flight; not
        drawn; skipped and duplicates, both 0 when nothing was lost) and its resumes."""
        return self.client.get(f"/api/runs/{run_id}/ledger/")

    def ledger_file(self, run_id: str, path: str | Path) -> Path:
        """The whole ledger (Parquet, a row per (epoch, row) with its fate, step, samples and policy versions)."""
        return _download(self.client, f"/api/runs/{run_id}/ledger/file", {}, Path(path))

    def logs(self, run_id: str, *, tail: int | None = None) -> str:
        return self.client.get(f"/api/runs/{run_id}/logs/", tail=tail)["logs"]

    def export(self, run_id: str, path: str | Path, *, format: str = "csv") -> Path:
        """Every raw metric point to a CSV or JSONL file."""
        return _download(self.client, f"/api/runs/{run_id}/export/", {"format": format}, Path(path))

    def follow(self, run_id: str, *, after_seq: int = 0) -> Iterator[Message]:
        """The run's live stream: `state`, `metrics`, `samples`, `log`, `checkpoint` messages, ending
        after `end` (the run finished and everything was sent). Reconnects from the last seq seen."""
        last = after_seq
        while True:
            headers = {"Accept": "text/event-stream", "Last-Event-ID": str(last)}
            try:
                with self.client._http.stream(
                    "GET", f"/api/runs/{run_id}/stream/", headers=headers, timeout=httpx.Timeout(30.0, read=None)
                ) as response:
                    if response.status_code >= 400:
                        response.read()
                        raise _error_for(response)
                    for message in read_stream(response.iter_lines()):
                        if message.id is not None:
                            last = message.id
                        yield message
                        if message.event == "end":
                            return
            except httpx.TransportError:
                pass  # the server restarted or the stream timed out: reconnect from `last`
            _pause_before_reconnect()

    def track(self, experiment: str, name: str | None = None, **kwargs: Any) -> Any:
        """An external run in `experiment` (see posttrain_sdk.tracking.init) on this client's server, token and
        project (`project=` names another)."""
        from posttrain_sdk.tracking import init

        kwargs.setdefault("project", self.client.project if self.client.project is not None else "")
        return init(experiment, name, url=self.client.url, token=self.client.token, **kwargs)


def _pause_before_reconnect() -> None:
    time.sleep(RECONNECT_DELAY_S)


def _download(client: Client, path: str, params: dict[str, Any], target: Path) -> Path:
    try:
        with client._http.stream("GET", path, params=params) as response:
            if response.status_code >= 400:
                response.read()
                raise _error_for(response)
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("wb") as f:
                for chunk in response.iter_bytes():
                    f.write(chunk)
    except httpx.TransportError as exc:
        raise ServerUnreachable(f"cannot reach {client.url}: {exc}") from None
    return target


# -- review ---------------------------------------------------------------------------------------


class Review(_Section):
    def campaigns(self, state: str | None = None) -> list[Campaign]:
        return [Campaign.from_api(item) for item in self.client.pages("/api/review/campaigns/", state=state)]

    def export(
        self,
        campaign: int,
        path: str | Path,
        *,
        format: str = "trl",
        question: str | None = None,
    ) -> Path:
        """The campaign's labels: `trl` / `openai` preference pairs, `prm` step labels, `ratings_jsonl`,
        `ratings_csv`."""
        params = {"format": format, **({"question": question} if question else {})}
        return _download(self.client, f"/api/review/campaigns/{int(campaign)}/export/", params, Path(path))
