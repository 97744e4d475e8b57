"""The checks of a campaign's inputs: names and texts, bounds, kind, annotators and reviewers with their
roles, the runs, judge pool and gold dataset the user reads, and the alerts rule's pointers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.contrib.auth.models import User

from posttrain.accounts.roles import Role
from posttrain.accounts.selectors import user_roles
from posttrain.core.errors import InvalidInput
from posttrain.projects.access import readable
from posttrain.registry.models import Dataset
from posttrain.review.models import CampaignKind, JudgeRun
from posttrain.runs.models import Run
from posttrain.telemetry.alerts import run_alerts

NAME_MAX_CHARS = 200
TEXT_MAX_CHARS = 20_000
MAX_OVERLAP = 20
MAX_RATING_SPREAD = 100
MIN_LOCK_TTL_S = 30
MAX_LOCK_TTL_S = 24 * 3600
ANNOTATOR_ROLES = frozenset({Role.ANNOTATOR, Role.ADMIN})
REVIEWER_ROLES = frozenset({Role.REVIEWER, Role.ADMIN})


def _collect(errors: list[dict[str, str]], check, *args: Any) -> Any:
    """Run one validation, keeping its field errors so the caller reports all of them at once."""
    try:
        return check(*args)
    except InvalidInput as exc:
        errors.extend(exc.errors)
        return None


def _clean_text(value: Any, loc: str, *, limit: int, required: bool = False) -> str:
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise InvalidInput.one(loc, "must be a string")
    value = value.strip()
    if required and not value:
        raise InvalidInput.one(loc, "is required")
    if len(value) > limit:
        raise InvalidInput.one(loc, f"is {len(value)} characters long; at most {limit}")
    if "\x00" in value:
        raise InvalidInput.one(loc, "must not contain NUL characters")
    return value


def _bounded_int(value: Any, loc: str, low: int, high: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput.one(loc, f"must be an integer from {low} to {high} ({what})")
    return value


def _check_kind(kind: Any) -> str:
    if kind not in CampaignKind.values:
        raise InvalidInput.one("kind", f"must be one of {', '.join(CampaignKind.values)}, got {kind!r}"[:300])
    return kind


def _check_people(users: Sequence[User], loc: str, roles: frozenset[str], role: str) -> list[User]:
    errors = []
    for i, user in enumerate(users):
        if not user_roles(user) & roles:
            errors.append({"loc": f"{loc}[{i}]", "msg": f"{user.get_username()!r} does not have the {role} role"})
    if errors:
        raise InvalidInput(errors)
    return list({user.pk: user for user in users}.values())


def _check_annotators(users: Sequence[User]) -> list[User]:
    return _check_people(users, "annotators", ANNOTATOR_ROLES, "annotator")


def _check_reviewers(users: Sequence[User]) -> list[User]:
    return _check_people(users, "reviewers", REVIEWER_ROLES, "reviewer")


def _check_runs(run_ids: list[str], user: User | None) -> None:
    """Every run exists and the user reads it (one they may not read is answered as one that does not exist)."""
    found = {str(pk) for pk in readable(Run.objects.filter(pk__in=run_ids), user).values_list("pk", flat=True)}
    missing = [
        {"loc": f"source.runs[{i}]", "msg": f"no run with id {run_id}"}
        for i, run_id in enumerate(run_ids)
        if run_id not in found
    ]
    if missing:
        raise InvalidInput(missing)


def _alert_pointers(source: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs' current alerts as the alerts rule's pointers: each alert's step, and the rollouts that show
    it as `indices` when the alert names examples (a hacking signal's; None: k of the step at random)."""
    pointers = [
        {
            "run": run_id,
            "step": alert.step,
            "indices": list(alert.examples) if alert.examples else None,
            "code": alert.code,
        }
        for run_id in source["runs"]
        for alert in run_alerts(run_id)
    ]
    if not pointers:
        raise InvalidInput.one("source.rule", "the runs have no alerts: choose another rule")
    return pointers


def _check_readable_inputs(source: dict[str, Any], gold: dict[str, Any] | None, user: User | None) -> None:
    """The judge pool and the gold dataset a campaign names are ones the user reads: a campaign copies from them."""
    judge_run = source.get("judge_run")
    if judge_run is not None and not readable(JudgeRun.objects.filter(pk=judge_run), user).exists():
        raise InvalidInput.one("source.judge_run", f"no judge run {judge_run} over runs' rollouts")
    if gold is not None and not readable(Dataset.objects.filter(pk=gold["dataset"]), user).exists():
        raise InvalidInput.one("gold.dataset", f"no dataset with id {gold['dataset']}")
