"""The permission matrix: every endpoint under /api/ × every role (docs/ARCHITECTURE.md, "Roles").

MATRIX must list every endpoint the URL resolver serves under /api/: a new endpoint without an
entry fails `test_every_api_endpoint_is_in_the_matrix`, so nobody ships an endpoint whose access
was never decided. Each entry says which roles may call it and, for routes with parameters, how
to make an object to call it on. "Allowed" means the permission check passed: any status but
401/403 (an empty body may well be a 400) and never a 500. "Refused" means 401 or 403 with a
JSON `detail`.

To add endpoints (e.g. runs): add `"METHOD /api/route/{pk}/": Access(RESEARCH, pk=a_run)` rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from rest_framework.test import APIClient

from tests.support.stack import free_port
from tests.unit.platform.helpers import a_dataset_row, a_model_row, a_reward_row, an_experiment, api_endpoints

pytestmark = pytest.mark.django_db

ANONYMOUS, ANNOTATOR, REVIEWER, RESEARCHER, ADMIN = "anonymous", "annotator", "reviewer", "researcher", "admin"
ROLES = (ANONYMOUS, ANNOTATOR, REVIEWER, RESEARCHER, ADMIN)

EVERYONE = frozenset(ROLES)
SIGNED_IN = frozenset({ANNOTATOR, REVIEWER, RESEARCHER, ADMIN})
RESEARCH = frozenset({RESEARCHER, ADMIN})
ANNOTATION = frozenset({ANNOTATOR, ADMIN})  # review work: the queue and its items
ADJUDICATION = frozenset({REVIEWER, ADMIN})  # deciding items whose annotators disagree


# Objects for `{pk}` are made fresh for each test (a DELETE removes its own).
a_model, a_dataset, a_reward = a_model_row, a_dataset_row, a_reward_row


def a_run() -> Any:
    from posttrain.runs.models import Run

    return Run.objects.create(experiment=an_experiment(rewards=[a_reward_row()]), state="running")


def a_finished_run() -> Any:
    """A run that ended: its live stream sends what is stored, then `end`, and the response ends."""
    from posttrain.runs.models import Run

    return Run.objects.create(experiment=an_experiment(rewards=[a_reward_row()]), state="succeeded")


def a_campaign() -> Any:
    """A review campaign nobody is assigned to: annotators reach it only by assignment (404 otherwise)."""
    from posttrain.review.models import Campaign

    return Campaign.objects.create(
        name="c",
        questions=[{"key": "ok", "kind": "pass_fail", "label": "OK?", "required": True, "help": ""}],
        source={},
    )


def a_review_item() -> Any:
    from posttrain.review.models import ReviewItem, ReviewRollout

    campaign = a_campaign()
    rollout = ReviewRollout.objects.create(campaign=campaign, run=a_run(), step=0, index=0, prompt="p", response="r")
    return ReviewItem.objects.create(campaign=campaign, position=0, rollout_a=rollout)


def a_gold_item() -> dict[str, Any]:
    """Route parameters of an item of a campaign (to mark it gold)."""
    item = a_review_item()
    return {"pk": item.campaign_id, "item_id": item.pk}


def a_judge_run() -> Any:
    """A finished judge run over a campaign (its agreement is empty: nobody judged)."""
    from posttrain.review.models import JudgeRun

    reward = a_reward_row()
    return JudgeRun.objects.create(
        campaign=a_campaign(), reward=reward, reward_name=reward.name, spec=reward.spec, state="done"
    )


ROLLOUT_FILE = "step_00000001.parquet"
NOBODY: frozenset[str] = frozenset()  # machine-only: the run's own bearer token, never a user session


def a_reward_trial() -> dict[str, Any]:
    """Route parameters of a finished "Try it" of a reward."""
    from posttrain.registry.models import RewardTrial

    reward = a_reward_row()
    trial = RewardTrial.objects.create(kind="try", reward=reward, spec=reward.spec, state="done", result=None)
    return {"pk": reward.pk, "trial_id": trial.pk}


def an_environment() -> Any:
    from posttrain.registry.models import Environment

    return Environment.objects.create(
        name=f"env-{Environment.objects.count()}", package="reasoning_gym", env_id="basic_arithmetic", size=4
    )


def an_environment_trial() -> dict[str, Any]:
    """Route parameters of a finished "Try it" of an environment."""
    from posttrain.registry.models import EnvironmentTrial

    environment = an_environment()
    trial = EnvironmentTrial.objects.create(environment=environment, moves=["4"], state="done")
    return {"pk": environment.pk, "trial_id": trial.pk}


def a_reward_probe() -> dict[str, Any]:
    """Route parameters of a finished probe of a reward."""
    from posttrain.registry.models import RewardProbe

    reward = a_reward_row()
    probe = RewardProbe.objects.create(reward=reward, dataset=a_dataset_row(), state="failed", error="x")
    return {"pk": reward.pk, "probe_id": probe.pk}


@dataclass(frozen=True)
class Access:
    allowed: frozenset[str]
    pk: Callable[[], Any] | None = None  # makes the object for `{pk}`
    params: Callable[[], dict[str, Any]] | None = None  # or every route parameter, for deeper routes


MATRIX: dict[str, Access] = {
    # Public: no data behind them (the API's description is served to anyone, drf-spectacular's default).
    "GET /api/health/": Access(EVERYONE),
    "POST /api/auth/token/": Access(EVERYONE),
    "GET /api/schema/": Access(EVERYONE),
    "GET /api/docs/": Access(EVERYONE),
    # Any signed-in user.
    "GET /api/auth/me/": Access(SIGNED_IN),
    # Registry: researchers and admins.
    "GET /api/models/": Access(RESEARCH),
    "POST /api/models/": Access(RESEARCH),
    "GET /api/models/{pk}/": Access(RESEARCH, pk=a_model),
    "PATCH /api/models/{pk}/": Access(RESEARCH, pk=a_model),
    "DELETE /api/models/{pk}/": Access(RESEARCH, pk=a_model),
    "GET /api/datasets/": Access(RESEARCH),
    "POST /api/datasets/": Access(RESEARCH),
    "GET /api/datasets/{pk}/": Access(RESEARCH, pk=a_dataset),
    "PATCH /api/datasets/{pk}/": Access(RESEARCH, pk=a_dataset),
    "DELETE /api/datasets/{pk}/": Access(RESEARCH, pk=a_dataset),
    "GET /api/datasets/{pk}/preview/": Access(RESEARCH, pk=a_dataset),
    "GET /api/rewards/": Access(RESEARCH),
    "POST /api/rewards/": Access(RESEARCH),
    "GET /api/rewards/{pk}/": Access(RESEARCH, pk=a_reward),
    "PATCH /api/rewards/{pk}/": Access(RESEARCH, pk=a_reward),
    "DELETE /api/rewards/{pk}/": Access(RESEARCH, pk=a_reward),
    "POST /api/rewards/{pk}/try/": Access(RESEARCH, pk=a_reward),
    "GET /api/rewards/{pk}/trials/{trial_id}/": Access(RESEARCH, params=a_reward_trial),
    "GET /api/environments/": Access(RESEARCH),
    "POST /api/environments/": Access(RESEARCH),
    "POST /api/environments/mix/": Access(RESEARCH),
    "GET /api/environments/{pk}/": Access(RESEARCH, pk=an_environment),
    "DELETE /api/environments/{pk}/": Access(RESEARCH, pk=an_environment),
    "POST /api/environments/{pk}/try/": Access(RESEARCH, pk=an_environment),
    "GET /api/environments/{pk}/trials/{trial_id}/": Access(RESEARCH, params=an_environment_trial),
    "GET /api/rewards/{pk}/probes/": Access(RESEARCH, pk=a_reward),
    "POST /api/rewards/{pk}/probes/": Access(RESEARCH, pk=a_reward),
    "GET /api/rewards/{pk}/probes/{probe_id}/": Access(RESEARCH, params=a_reward_probe),
    # Experiments and runs: researchers and admins.
    "GET /api/experiments/": Access(RESEARCH),
    "POST /api/experiments/": Access(RESEARCH),
    "GET /api/experiments/{pk}/": Access(RESEARCH, pk=an_experiment),
    "PATCH /api/experiments/{pk}/": Access(RESEARCH, pk=an_experiment),
    "POST /api/experiments/{pk}/launch/": Access(RESEARCH, pk=an_experiment),
    "POST /api/experiments/validate/": Access(RESEARCH),
    "GET /api/config/schema/": Access(RESEARCH),
    "POST /api/config/yaml/": Access(RESEARCH),
    "GET /api/runs/": Access(RESEARCH),
    "POST /api/runs/external/": Access(RESEARCH),
    "GET /api/runs/{pk}/": Access(RESEARCH, pk=a_run),
    "PATCH /api/runs/{pk}/": Access(RESEARCH, pk=a_run),
    "POST /api/runs/{pk}/cancel/": Access(RESEARCH, pk=a_run),
    "POST /api/runs/{pk}/priority/": Access(RESEARCH, pk=a_run),
    "GET /api/queue/": Access(RESEARCH),
    "GET /api/queue/stats/": Access(RESEARCH),
    "GET /api/queue/metrics": Access(RESEARCH),
    "GET /api/queue/metrics/": Access(RESEARCH),
    "POST /api/runs/{pk}/clone/": Access(RESEARCH, pk=a_run),
    "POST /api/runs/{pk}/resume/": Access(RESEARCH, pk=a_run),
    "POST /api/runs/{pk}/register-checkpoint/": Access(RESEARCH, pk=a_run),
    "GET /api/runs/{pk}/metrics/": Access(RESEARCH, pk=a_run),
    "GET /api/runs/{pk}/samples/": Access(RESEARCH, pk=a_run),
    "GET /api/runs/{pk}/sample-tokens/": Access(RESEARCH, pk=a_run),
    "GET /api/runs/{pk}/rollouts/": Access(RESEARCH, pk=a_run),
    "GET /api/runs/{pk}/rollouts/{name}": Access(RESEARCH, params=lambda: {"pk": a_run().pk, "name": ROLLOUT_FILE}),
    "PUT /api/runs/{pk}/rollouts/{name}/upload": Access(
        NOBODY, params=lambda: {"pk": a_run().pk, "name": ROLLOUT_FILE}
    ),
    "GET /api/runs/{pk}/checkpoints/": Access(RESEARCH, pk=a_run),
    "GET /api/runs/{pk}/transitions/": Access(RESEARCH, pk=a_run),
    "GET /api/runs/{pk}/logs/": Access(RESEARCH, pk=a_run),
    "GET /api/runs/{pk}/stream/": Access(RESEARCH, pk=a_finished_run),
    "GET /api/runs/{pk}/alerts/": Access(RESEARCH, pk=a_run),
    "GET /api/runs/{pk}/series/": Access(RESEARCH, pk=a_run),
    "GET /api/runs/{pk}/export/": Access(RESEARCH, pk=a_run),
    "GET /api/compare/": Access(RESEARCH),
    "GET /api/compare/prompts/": Access(RESEARCH),
    "GET /api/compare/samples/": Access(RESEARCH),
    # Annotator review: researchers and admins run campaigns; annotators (and admins) work their queue.
    "GET /api/review/campaigns/": Access(RESEARCH),
    "POST /api/review/campaigns/": Access(RESEARCH),
    "GET /api/review/campaigns/{pk}/": Access(RESEARCH, pk=a_campaign),
    "PATCH /api/review/campaigns/{pk}/": Access(RESEARCH, pk=a_campaign),
    "POST /api/review/campaigns/{pk}/activate/": Access(RESEARCH, pk=a_campaign),
    "POST /api/review/campaigns/{pk}/close/": Access(RESEARCH, pk=a_campaign),
    "GET /api/review/campaigns/{pk}/items/": Access(RESEARCH, pk=a_campaign),
    "GET /api/review/campaigns/{pk}/results/": Access(RESEARCH, pk=a_campaign),
    "GET /api/review/campaigns/{pk}/agreement/": Access(RESEARCH, pk=a_campaign),
    "GET /api/review/campaigns/{pk}/export/": Access(RESEARCH, pk=a_campaign),
    "POST /api/review/campaigns/{pk}/export/register/": Access(RESEARCH, pk=a_campaign),
    "GET /api/review/annotators/": Access(RESEARCH),
    "GET /api/review/reviewers/": Access(RESEARCH),
    "PUT /api/review/campaigns/{pk}/items/{item_id}/gold/": Access(RESEARCH, params=a_gold_item),
    "DELETE /api/review/campaigns/{pk}/items/{item_id}/gold/": Access(RESEARCH, params=a_gold_item),
    "GET /api/review/campaigns/{pk}/judges/": Access(RESEARCH, pk=a_campaign),
    "POST /api/review/campaigns/{pk}/judges/": Access(RESEARCH, pk=a_campaign),
    "GET /api/review/judge-runs/": Access(RESEARCH),
    "POST /api/review/judge-runs/": Access(RESEARCH),
    "GET /api/review/judge-runs/{pk}/": Access(RESEARCH, pk=a_judge_run),
    "GET /api/review/judge-runs/{pk}/agreement/": Access(RESEARCH, pk=a_judge_run),
    "POST /api/review/judge-runs/{pk}/register/": Access(RESEARCH, pk=a_judge_run),
    "GET /api/review/queue/": Access(ANNOTATION),
    "POST /api/review/campaigns/{pk}/next/": Access(ANNOTATION, pk=a_campaign),
    "POST /api/review/items/{pk}/judgement/": Access(ANNOTATION, pk=a_review_item),
    "POST /api/review/items/{pk}/skip/": Access(ANNOTATION, pk=a_review_item),
    "POST /api/review/items/{pk}/release/": Access(ANNOTATION, pk=a_review_item),
    "GET /api/review/adjudication/": Access(ADJUDICATION),
    "POST /api/review/campaigns/{pk}/adjudicate/next/": Access(ADJUDICATION, pk=a_campaign),
    "POST /api/review/items/{pk}/decision/": Access(ADJUDICATION, pk=a_review_item),
    "POST /api/review/items/{pk}/review-release/": Access(ADJUDICATION, pk=a_review_item),
    # Event ingestion: the engine with its run's token only; no role gets in with a session.
    "POST /api/runs/{pk}/events": Access(NOBODY, pk=a_run),
    "POST /api/runs/{pk}/events/": Access(NOBODY, pk=a_run),
}

ENDPOINTS = {endpoint.key: endpoint for endpoint in api_endpoints()}


def test_every_api_endpoint_is_in_the_matrix():
    missing = sorted(set(ENDPOINTS) - set(MATRIX))
    assert not missing, f"endpoints without a permission-matrix entry (add them to MATRIX): {missing}"


def test_every_matrix_entry_is_a_real_endpoint():
    stale = sorted(set(MATRIX) - set(ENDPOINTS))
    assert not stale, f"matrix entries no URL serves any more: {stale}"


def test_the_matrix_covers_the_registry():
    assert {"POST /api/models/", "POST /api/datasets/", "POST /api/rewards/{pk}/try/"} <= set(ENDPOINTS)


def _call(client: APIClient, method: str, url: str):
    if method in ("POST", "PUT", "PATCH"):
        return getattr(client, method.lower())(url, {}, format="json")
    return getattr(client, method.lower())(url)


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("key", sorted(MATRIX))
def test_role_access(key: str, role: str, client_for, settings):
    settings.RAY_ADDRESS = f"http://127.0.0.1:{free_port()}"  # health answers fast without Ray
    settings.HEALTH_CHECK_TIMEOUT_S = 0.5
    access = MATRIX[key]
    endpoint = ENDPOINTS.get(key)
    if endpoint is None:
        pytest.skip("not served (reported by test_every_matrix_entry_is_a_real_endpoint)")
    client = client_for(role)
    params = access.params() if access.params else {"pk": access.pk().pk} if access.pk else {}
    response = _call(client, endpoint.method, endpoint.url(**params))
    # 500 is a crash; a deliberate 503 (health without Ray) is an answer.
    assert response.status_code != 500, f"{key} as {role}: {response.status_code}"
    if role in access.allowed:
        assert response.status_code not in (401, 403), (
            f"{key} refused {role}: {response.status_code} {response.content[:300]!r}"
        )
    else:
        assert response.status_code in (401, 403), f"{key} let {role} in: {response.status_code}"
        assert "errors" in response.json()
