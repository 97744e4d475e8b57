"""The permission matrix: every endpoint under /api/ × every site role × every relation of a researcher to the
object's project (docs/SECURITY.md, "Projects and ownership").

MATRIX must list every endpoint the URL resolver serves under /api/: a new endpoint without an entry fails
`test_every_api_endpoint_is_in_the_matrix`, so nobody ships an endpoint whose access was never decided. Each
entry says which site roles pass the role check, how the project rule governs it (`kind`), and how to make the
object it acts on, in a project of its own for every cell (a DELETE or a state change never leaks into the next).

The cells of an endpoint of a project object: the site roles anonymous, annotator, reviewer and admin, and six
researchers, each related to the object's project in one way:

    owner, maintainer   of the project
    creator             a member who made the object
    member              another member
    viewer              a viewer of the project
    outsider            a researcher of another project only

"Allowed" means the permission checks passed: any status but 401/403/404 and never a 500 (an empty body may
well be a 400, a state a 409). "Refused" is 401/403 in the error contract; "hidden" is 404, the answer to an id
that does not exist, so another project's ids reveal nothing. Lists are checked for what they show: the object
is in every reader's list and absent from the outsider's.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from rest_framework.test import APIClient

from tests.support.stack import free_port
from tests.unit.platform.helpers import (
    PASSWORD,
    a_dataset_row,
    a_model_row,
    a_reward_row,
    an_experiment,
    api_endpoints,
    join,
)

pytestmark = pytest.mark.django_db

ANONYMOUS, ANNOTATOR, REVIEWER, RESEARCHER, ADMIN = "anonymous", "annotator", "reviewer", "researcher", "admin"
ROLES = (ANONYMOUS, ANNOTATOR, REVIEWER, RESEARCHER, ADMIN)
RELATIONS = ("owner", "maintainer", "creator", "member", "viewer", "outsider")

EVERYONE = frozenset(ROLES)
SIGNED_IN = frozenset({ANNOTATOR, REVIEWER, RESEARCHER, ADMIN})
RESEARCH = frozenset({RESEARCHER, ADMIN})
ANNOTATION = frozenset({ANNOTATOR, ADMIN})  # review work: the queue and its items
ADJUDICATION = frozenset({REVIEWER, ADMIN})  # deciding items whose annotators disagree
NOBODY: frozenset[str] = frozenset()  # machine-only: the run's own bearer token, never a user session

OK, REFUSED, HIDDEN = "allowed", "refused", "hidden"

# How the project rule governs an endpoint, as the outcome for each relation.
NONE = "none"  # not a project object: the site role decides (and assignment, for the review queues)
READ = "read"  # reads the object
LIST = "list"  # lists objects: the reader's list holds it, the outsider's does not
NEW = "new"  # creates in a project (named with ?project=)
USE = "use"  # makes the user's own new object from it (a launch, a try, a copy, a clone) in its project
WRITE = "write"  # changes or deletes it
MANAGE = "manage"  # a project's members and settings
OWN = "own"  # deletes a project
RUNS_PARAM = "runs_param"  # reads the runs named in `?runs=`: another project's run is an unknown id (400)

_ALL_READ = {"owner": OK, "maintainer": OK, "creator": OK, "member": OK, "viewer": OK, "outsider": HIDDEN}
_CREATE = {**_ALL_READ, "viewer": REFUSED}
EXPECTED: dict[str, dict[str, str]] = {
    READ: _ALL_READ,
    LIST: {**_ALL_READ, "outsider": OK},
    RUNS_PARAM: _ALL_READ,
    NEW: _CREATE,
    USE: _CREATE,
    WRITE: {**_CREATE, "member": REFUSED},
    MANAGE: {**_CREATE, "creator": REFUSED, "member": REFUSED},
    OWN: {**_CREATE, "maintainer": REFUSED, "creator": REFUSED, "member": REFUSED},
}


@dataclass
class Cell:
    """Where one cell's object lives: a project of its own, the researcher who made the object."""

    project: Any
    creator: Any
    bystander: Any  # a member nobody asks about (the one a membership DELETE removes)


Make = Callable[[Cell], dict[str, Any]]  # the route parameters of the cell's object


# --- objects, each made in the cell's project by its creator ----------------------------------------------


def _owned(cell: Cell) -> dict[str, Any]:
    return {"project": cell.project, "created_by": cell.creator}


def a_model(cell: Cell) -> dict[str, Any]:
    return {"pk": a_model_row(**_owned(cell)).pk}


def a_model_import(cell: Cell) -> dict[str, Any]:
    from posttrain.registry.models import ModelImport

    record = ModelImport.objects.create(name="imported", source_name="model.gguf", state="failed", **_owned(cell))
    return {"import_id": record.pk}


def a_dataset(cell: Cell) -> dict[str, Any]:
    return {"pk": a_dataset_row(**_owned(cell)).pk}


def a_reward(cell: Cell) -> dict[str, Any]:
    return {"pk": a_reward_row(**_owned(cell)).pk}


def an_experiment_of(cell: Cell) -> dict[str, Any]:
    return {"pk": an_experiment(rewards=[a_reward_row(**_owned(cell))], **_owned(cell)).pk}


def _run(cell: Cell, state: str = "running") -> Any:
    from posttrain.runs.models import Run

    experiment = an_experiment(rewards=[a_reward_row(**_owned(cell))], **_owned(cell))
    return Run.objects.create(experiment=experiment, state=state, **_owned(cell))


def a_run(cell: Cell) -> dict[str, Any]:
    return {"pk": _run(cell).pk}


def a_finished_run(cell: Cell) -> dict[str, Any]:
    """A run that ended: its live stream sends what is stored, then `end`, and the response ends."""
    return {"pk": _run(cell, "succeeded").pk}


ROLLOUT_FILE = "step_00000001.parquet"


def a_run_file(cell: Cell) -> dict[str, Any]:
    return {"pk": _run(cell).pk, "name": ROLLOUT_FILE}


def _campaign(cell: Cell) -> Any:
    """A review campaign nobody is assigned to: annotators reach it only by assignment (404 otherwise)."""
    from posttrain.review.models import Campaign

    return Campaign.objects.create(
        name="c",
        questions=[{"key": "ok", "kind": "pass_fail", "label": "OK?", "required": True, "help": ""}],
        source={},
        **_owned(cell),
    )


def a_campaign(cell: Cell) -> dict[str, Any]:
    return {"pk": _campaign(cell).pk}


def _review_item(cell: Cell) -> Any:
    from posttrain.review.models import ReviewItem, ReviewRollout

    campaign = _campaign(cell)
    rollout = ReviewRollout.objects.create(campaign=campaign, run=_run(cell), step=0, index=0, prompt="p", response="r")
    return ReviewItem.objects.create(campaign=campaign, position=0, rollout_a=rollout)


def a_review_item(cell: Cell) -> dict[str, Any]:
    return {"pk": _review_item(cell).pk}


def a_gold_item(cell: Cell) -> dict[str, Any]:
    item = _review_item(cell)
    return {"pk": item.campaign_id, "item_id": item.pk}


def a_judge_run(cell: Cell) -> dict[str, Any]:
    """A finished judge run over a campaign (its agreement is empty: nobody judged)."""
    from posttrain.review.models import JudgeRun

    reward = a_reward_row(**_owned(cell))
    judge = JudgeRun.objects.create(
        campaign=_campaign(cell), reward=reward, reward_name=reward.name, spec=reward.spec, state="done", **_owned(cell)
    )
    return {"pk": judge.pk}


def a_reward_trial(cell: Cell) -> dict[str, Any]:
    from posttrain.registry.models import RewardTrial

    reward = a_reward_row(**_owned(cell))
    trial = RewardTrial.objects.create(kind="try", reward=reward, spec=reward.spec, state="done", result=None)
    return {"pk": reward.pk, "trial_id": trial.pk}


def _environment(cell: Cell) -> Any:
    from posttrain.registry.models import Environment

    return Environment.objects.create(
        name=f"env-{Environment.objects.count()}",
        package="reasoning_gym",
        env_id="basic_arithmetic",
        size=4,
        **_owned(cell),
    )


def an_environment(cell: Cell) -> dict[str, Any]:
    return {"pk": _environment(cell).pk}


def an_environment_trial(cell: Cell) -> dict[str, Any]:
    from posttrain.registry.models import EnvironmentTrial

    environment = _environment(cell)
    trial = EnvironmentTrial.objects.create(environment=environment, moves=["4"], state="done")
    return {"pk": environment.pk, "trial_id": trial.pk}


def a_reward_probe(cell: Cell) -> dict[str, Any]:
    from posttrain.registry.models import RewardProbe

    reward = a_reward_row(**_owned(cell))
    probe = RewardProbe.objects.create(reward=reward, dataset=a_dataset_row(**_owned(cell)), state="failed", error="x")
    return {"pk": reward.pk, "probe_id": probe.pk}


def the_project(cell: Cell) -> dict[str, Any]:
    return {"pk": cell.project.pk}


def a_membership(cell: Cell) -> dict[str, Any]:
    return {"pk": cell.project.pk, "username": cell.bystander.username}


def nothing(cell: Cell) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class Access:
    roles: frozenset[str]  # the site roles that pass the role check
    kind: str = NONE
    make: Make = nothing  # the cell's object, as route parameters
    listed: Make | None = None  # LIST: the object the list must show to readers (and hide from the outsider)
    found_404: str = ""  # a 404 whose message holds this is an allowed answer (the object has no such file)


MATRIX: dict[str, Access] = {
    # Public: no data behind them (the API's description is served to anyone, drf-spectacular's default).
    "GET /api/health/": Access(EVERYONE),
    "POST /api/auth/token/": Access(EVERYONE),
    "GET /api/schema/": Access(EVERYONE),
    "GET /api/docs/": Access(EVERYONE),
    # Any signed-in user.
    "GET /api/auth/me/": Access(SIGNED_IN),
    # Projects: any researcher makes one; its owners and maintainers manage it.
    "GET /api/projects/": Access(RESEARCH, LIST, listed=the_project),
    "POST /api/projects/": Access(RESEARCH),
    "GET /api/projects/current/": Access(RESEARCH),
    "PUT /api/projects/current/": Access(RESEARCH),
    "GET /api/projects/{pk}/": Access(RESEARCH, READ, the_project),
    "PATCH /api/projects/{pk}/": Access(RESEARCH, MANAGE, the_project),
    "DELETE /api/projects/{pk}/": Access(RESEARCH, OWN, the_project),
    "GET /api/projects/{pk}/members/": Access(RESEARCH, READ, the_project),
    "PUT /api/projects/{pk}/members/{username}/": Access(RESEARCH, MANAGE, a_membership),
    "DELETE /api/projects/{pk}/members/{username}/": Access(RESEARCH, MANAGE, a_membership),
    # Registry.
    "GET /api/models/": Access(RESEARCH, LIST, listed=a_model),
    "POST /api/models/": Access(RESEARCH, NEW),
    "GET /api/models/{pk}/": Access(RESEARCH, READ, a_model),
    "PATCH /api/models/{pk}/": Access(RESEARCH, WRITE, a_model),
    "DELETE /api/models/{pk}/": Access(RESEARCH, WRITE, a_model),
    "POST /api/models/{pk}/copy/": Access(RESEARCH, USE, a_model),
    "POST /api/models/import-gguf/": Access(RESEARCH, NEW),
    "GET /api/models/imports/{import_id}/": Access(RESEARCH, READ, a_model_import),
    "GET /api/datasets/": Access(RESEARCH, LIST, listed=a_dataset),
    "POST /api/datasets/": Access(RESEARCH, NEW),
    "GET /api/datasets/{pk}/": Access(RESEARCH, READ, a_dataset),
    "PATCH /api/datasets/{pk}/": Access(RESEARCH, WRITE, a_dataset),
    "DELETE /api/datasets/{pk}/": Access(RESEARCH, WRITE, a_dataset),
    "GET /api/datasets/{pk}/preview/": Access(RESEARCH, READ, a_dataset),
    "POST /api/datasets/{pk}/copy/": Access(RESEARCH, USE, a_dataset),
    "GET /api/rewards/": Access(RESEARCH, LIST, listed=a_reward),
    "POST /api/rewards/": Access(RESEARCH, NEW),
    "GET /api/rewards/{pk}/": Access(RESEARCH, READ, a_reward),
    "PATCH /api/rewards/{pk}/": Access(RESEARCH, WRITE, a_reward),
    "DELETE /api/rewards/{pk}/": Access(RESEARCH, WRITE, a_reward),
    "POST /api/rewards/{pk}/copy/": Access(RESEARCH, USE, a_reward),
    "POST /api/rewards/{pk}/try/": Access(RESEARCH, USE, a_reward),
    "GET /api/rewards/{pk}/trials/{trial_id}/": Access(RESEARCH, READ, a_reward_trial),
    "GET /api/rewards/{pk}/probes/": Access(RESEARCH, READ, a_reward),
    "POST /api/rewards/{pk}/probes/": Access(RESEARCH, USE, a_reward),
    "GET /api/rewards/{pk}/probes/{probe_id}/": Access(RESEARCH, READ, a_reward_probe),
    "GET /api/environments/": Access(RESEARCH, LIST, listed=an_environment),
    "POST /api/environments/": Access(RESEARCH, NEW),
    "POST /api/environments/mix/": Access(RESEARCH, NEW),
    "GET /api/environments/{pk}/": Access(RESEARCH, READ, an_environment),
    "DELETE /api/environments/{pk}/": Access(RESEARCH, WRITE, an_environment),
    "POST /api/environments/{pk}/try/": Access(RESEARCH, USE, an_environment),
    "GET /api/environments/{pk}/trials/{trial_id}/": Access(RESEARCH, READ, an_environment_trial),
    # Experiments and runs.
    "GET /api/experiments/": Access(RESEARCH, LIST, listed=an_experiment_of),
    "POST /api/experiments/": Access(RESEARCH, NEW),
    "GET /api/experiments/{pk}/": Access(RESEARCH, READ, an_experiment_of),
    "PATCH /api/experiments/{pk}/": Access(RESEARCH, WRITE, an_experiment_of),
    "POST /api/experiments/{pk}/launch/": Access(RESEARCH, USE, an_experiment_of),
    "POST /api/experiments/validate/": Access(RESEARCH, NEW),
    "GET /api/config/schema/": Access(RESEARCH),
    "POST /api/config/yaml/": Access(RESEARCH),
    "GET /api/runs/": Access(RESEARCH, LIST, listed=a_run),
    "POST /api/runs/external/": Access(RESEARCH, NEW),
    "GET /api/runs/{pk}/": Access(RESEARCH, READ, a_run),
    "PATCH /api/runs/{pk}/": Access(RESEARCH, WRITE, a_run),
    "POST /api/runs/{pk}/cancel/": Access(RESEARCH, WRITE, a_run),
    "POST /api/runs/{pk}/priority/": Access(RESEARCH, WRITE, a_run),
    "GET /api/queue/": Access(RESEARCH),
    "GET /api/queue/stats/": Access(RESEARCH),
    "GET /api/queue/metrics": Access(RESEARCH),
    "GET /api/queue/metrics/": Access(RESEARCH),
    "POST /api/runs/{pk}/clone/": Access(RESEARCH, USE, a_run),
    "POST /api/runs/{pk}/resume/": Access(RESEARCH, USE, a_run),
    "POST /api/runs/{pk}/register-checkpoint/": Access(RESEARCH, USE, a_run),
    "GET /api/runs/{pk}/metrics/": Access(RESEARCH, READ, a_run),
    "GET /api/runs/{pk}/samples/": Access(RESEARCH, READ, a_run),
    "GET /api/runs/{pk}/sample-tokens/": Access(RESEARCH, READ, a_run),
    "GET /api/runs/{pk}/ledger/": Access(RESEARCH, READ, a_run, found_404="has no prompt ledger"),
    "GET /api/runs/{pk}/ledger/file": Access(RESEARCH, READ, a_run, found_404="has no prompt ledger"),
    "GET /api/runs/{pk}/rollouts/": Access(RESEARCH, READ, a_run),
    "GET /api/runs/{pk}/rollouts/{name}": Access(RESEARCH, READ, a_run_file, found_404="has no rollout file"),
    "PUT /api/runs/{pk}/rollouts/{name}/upload": Access(NOBODY, make=a_run_file),
    "GET /api/runs/{pk}/checkpoints/": Access(RESEARCH, READ, a_run),
    "GET /api/runs/{pk}/transitions/": Access(RESEARCH, READ, a_run),
    "GET /api/runs/{pk}/logs/": Access(RESEARCH, READ, a_run),
    "GET /api/runs/{pk}/stream/": Access(RESEARCH, READ, a_finished_run),
    "GET /api/runs/{pk}/alerts/": Access(RESEARCH, READ, a_run),
    "GET /api/runs/{pk}/series/": Access(RESEARCH, READ, a_run),
    "GET /api/runs/{pk}/export/": Access(RESEARCH, READ, a_run),
    "GET /api/compare/": Access(RESEARCH, RUNS_PARAM, a_run),
    "GET /api/compare/prompts/": Access(RESEARCH, RUNS_PARAM, a_run),
    "GET /api/compare/samples/": Access(RESEARCH, RUNS_PARAM, a_run),
    # Review: researchers run campaigns; annotators (and admins) work their queue, reviewers adjudicate.
    "GET /api/review/campaigns/": Access(RESEARCH, LIST, listed=a_campaign),
    "POST /api/review/campaigns/": Access(RESEARCH, NEW),
    "GET /api/review/campaigns/{pk}/": Access(RESEARCH, READ, a_campaign),
    "PATCH /api/review/campaigns/{pk}/": Access(RESEARCH, WRITE, a_campaign),
    "POST /api/review/campaigns/{pk}/activate/": Access(RESEARCH, WRITE, a_campaign),
    "POST /api/review/campaigns/{pk}/close/": Access(RESEARCH, WRITE, a_campaign),
    "GET /api/review/campaigns/{pk}/items/": Access(RESEARCH, READ, a_campaign),
    "GET /api/review/campaigns/{pk}/results/": Access(RESEARCH, READ, a_campaign),
    "GET /api/review/campaigns/{pk}/agreement/": Access(RESEARCH, READ, a_campaign),
    "GET /api/review/campaigns/{pk}/export/": Access(RESEARCH, READ, a_campaign),
    "POST /api/review/campaigns/{pk}/export/register/": Access(RESEARCH, USE, a_campaign),
    "GET /api/review/annotators/": Access(RESEARCH),
    "GET /api/review/reviewers/": Access(RESEARCH),
    "PUT /api/review/campaigns/{pk}/items/{item_id}/gold/": Access(RESEARCH, WRITE, a_gold_item),
    "DELETE /api/review/campaigns/{pk}/items/{item_id}/gold/": Access(RESEARCH, WRITE, a_gold_item),
    "GET /api/review/campaigns/{pk}/judges/": Access(RESEARCH, READ, a_campaign),
    "POST /api/review/campaigns/{pk}/judges/": Access(RESEARCH, WRITE, a_campaign),
    "GET /api/review/judge-runs/": Access(RESEARCH, LIST, listed=a_judge_run),
    "POST /api/review/judge-runs/": Access(RESEARCH, NEW),
    "GET /api/review/judge-runs/{pk}/": Access(RESEARCH, READ, a_judge_run),
    "GET /api/review/judge-runs/{pk}/agreement/": Access(RESEARCH, READ, a_judge_run),
    "POST /api/review/judge-runs/{pk}/register/": Access(RESEARCH, USE, a_judge_run),
    "GET /api/review/queue/": Access(ANNOTATION),
    "POST /api/review/campaigns/{pk}/next/": Access(ANNOTATION, make=a_campaign),
    "POST /api/review/items/{pk}/judgement/": Access(ANNOTATION, make=a_review_item),
    "POST /api/review/items/{pk}/skip/": Access(ANNOTATION, make=a_review_item),
    "POST /api/review/items/{pk}/release/": Access(ANNOTATION, make=a_review_item),
    "GET /api/review/adjudication/": Access(ADJUDICATION),
    "POST /api/review/campaigns/{pk}/adjudicate/next/": Access(ADJUDICATION, make=a_campaign),
    "POST /api/review/items/{pk}/decision/": Access(ADJUDICATION, make=a_review_item),
    "POST /api/review/items/{pk}/review-release/": Access(ADJUDICATION, make=a_review_item),
    # Event ingestion: the engine with its run's token only; no role gets in with a session.
    "POST /api/runs/{pk}/events": Access(NOBODY, make=a_run),
    "POST /api/runs/{pk}/events/": Access(NOBODY, make=a_run),
}

ENDPOINTS = {endpoint.key: endpoint for endpoint in api_endpoints()}


def test_every_api_endpoint_is_in_the_matrix():
    missing = sorted(set(ENDPOINTS) - set(MATRIX))
    assert not missing, f"endpoints without a permission-matrix entry (add them to MATRIX): {missing}"


def test_every_matrix_entry_is_a_real_endpoint():
    stale = sorted(set(MATRIX) - set(ENDPOINTS))
    assert not stale, f"matrix entries no URL serves any more: {stale}"


def test_every_unsafe_endpoint_of_a_project_object_is_governed_by_the_project_rule():
    """An unsafe method on a route with an object id is a project decision (or the review queues' assignment,
    or a machine's token): the matrix says which, so none is decided by the site role alone by oversight."""
    by_role_alone = sorted(
        key
        for key, access in MATRIX.items()
        if not key.startswith(("GET ", "HEAD "))
        and "{pk}" in key
        and access.kind == NONE
        and access.roles not in (ANNOTATION, ADJUDICATION, NOBODY)
    )
    assert not by_role_alone, f"unsafe endpoints of an object with no project rule: {by_role_alone}"


# --- the cells -----------------------------------------------------------------------------------------


class People:
    """The users of one endpoint's cells: every site role, and the researchers of every relation."""

    def __init__(self) -> None:
        from posttrain.accounts.services import user_create
        from posttrain.projects.models import Project

        self.by_role = {role: user_create(f"{role}-user", PASSWORD, role) for role in ROLES if role != ANONYMOUS}
        self.related = {relation: user_create(f"{relation}-user", PASSWORD, RESEARCHER) for relation in RELATIONS}
        self.bystander = user_create("bystander", PASSWORD, RESEARCHER)
        elsewhere = Project.objects.create(name="elsewhere")
        join(self.related["outsider"], "member", elsewhere)
        self.count = 0
        self.clients: dict[Any, APIClient] = {}

    def cell(self) -> Cell:
        """A project of its own, with the researchers in their roles (the creator a member, the outsider not)."""
        from posttrain.projects.models import Membership, Project

        self.count += 1
        project = Project.objects.create(name=f"cell-{self.count}")
        roles = {
            "owner": "owner",
            "maintainer": "maintainer",
            "creator": "member",
            "member": "member",
            "viewer": "viewer",
        }
        members = [(self.related[relation], role) for relation, role in roles.items()]
        # The researcher of the role dimension is a member too; the bystander is the one a membership DELETE removes.
        members += [(self.bystander, "member"), (self.by_role[RESEARCHER], "member")]
        Membership.objects.bulk_create(Membership(project=project, user=user, role=role) for user, role in members)
        return Cell(project=project, creator=self.related["creator"], bystander=self.bystander)

    def client(self, user: Any | None) -> APIClient:
        """One signed-in client per user for all of the endpoint's cells (a login is a session row)."""
        key = user.pk if user is not None else None
        if key not in self.clients:
            self.clients[key] = APIClient()
            if user is not None:
                self.clients[key].force_login(user)
        return self.clients[key]


def _call(client: APIClient, method: str, url: str):
    if method in ("POST", "PUT", "PATCH"):
        return getattr(client, method.lower())(url, {}, format="json")
    return getattr(client, method.lower())(url)


def _message(response) -> str:
    if response.streaming:
        return ""
    try:
        return " ".join(e.get("msg", "") for e in response.json().get("errors", []))
    except ValueError:
        return ""


def _verdict(response, access: Access) -> str:
    status = response.status_code
    if status in (401, 403):
        return REFUSED
    # Not a project object: a 404 is the endpoint's own answer (a campaign the annotator is not assigned to).
    hidden = access.kind != NONE and not (access.found_404 and access.found_404 in _message(response))
    return HIDDEN if status == 404 and hidden else OK


def _body(response) -> bytes:
    """The answer's bytes; a stream's are not read (a live stream ends only with its run)."""
    return b"" if response.streaming else response.content


def _lists(response, params: dict[str, Any]) -> bool:
    """Whether a list answer shows the object (its id, as the compact JSON writes it)."""
    pk = params["pk"]
    shown = f'"{pk}"' if not isinstance(pk, int) else str(pk)
    return re.search(rf'"id":\s*{re.escape(shown)}[,}}]', _body(response).decode()) is not None


@dataclass(frozen=True)
class Outcome:
    who: str
    expected: str
    got: str
    detail: str


def _try(people: People, key: str, who: str, user: Any | None, expected: str) -> Outcome | None:
    access = MATRIX[key]
    endpoint = ENDPOINTS[key]
    cell = people.cell()
    params = access.make(cell)
    listed = access.listed(cell) if access.listed else None
    url = endpoint.url(**params)
    if access.kind == NEW:
        url += f"?project={cell.project.name}"
    if access.kind == RUNS_PARAM:
        url = f"{url}?runs={params['pk']}"
    response = _call(people.client(user), endpoint.method, url)
    detail = f"{response.status_code} {_body(response)[:200]!r}"
    if response.status_code == 500:
        return Outcome(who, expected, "500", detail)
    got = _verdict(response, access)
    if access.kind == RUNS_PARAM and response.status_code == 400 and "no run with id" in _message(response):
        got = HIDDEN  # an unknown run to this user: the same answer as an id that does not exist
    if got != expected:
        return Outcome(who, expected, got, detail)
    if listed is not None and got == OK:
        shows = _lists(response, listed)
        if shows != (who != "outsider"):
            return Outcome(who, "listed" if who != "outsider" else "not listed", "the opposite", detail)
    return None


def _role_expectation(access: Access, role: str) -> str:
    if role not in access.roles:
        return REFUSED
    return OK


@pytest.mark.parametrize("key", sorted(MATRIX))
def test_endpoint_access(key: str, settings):
    settings.RAY_ADDRESS = f"http://127.0.0.1:{free_port()}"  # health answers fast without Ray
    settings.HEALTH_CHECK_TIMEOUT_S = 0.5
    if key not in ENDPOINTS:
        pytest.skip("not served (reported by test_every_matrix_entry_is_a_real_endpoint)")
    access = MATRIX[key]
    people = People()
    wrong: list[Outcome] = []
    for role in ROLES:
        if role == RESEARCHER and access.kind != NONE:
            continue  # the researchers' cells are the relations below
        user = None if role == ANONYMOUS else people.by_role[role]
        outcome = _try(people, key, role, user, _role_expectation(access, role))
        wrong += [outcome] if outcome else []
    if access.kind != NONE:
        for relation in RELATIONS:
            expected = EXPECTED[access.kind][relation] if RESEARCHER in access.roles else REFUSED
            outcome = _try(people, key, relation, people.related[relation], expected)
            wrong += [outcome] if outcome else []
    assert not wrong, "\n".join(f"{key} as {o.who}: expected {o.expected}, got {o.got}: {o.detail}" for o in wrong)
