"""Reward functions: a spec validated by the engine's schema; a python reward's code stored by content
hash after its import was checked in the engine's sandbox."""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path
from typing import Any

from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import ValidationError

from posttrain.core.outbound import outbound_policy
from posttrain.core.server_paths import open_checked, resolve_user_path
from posttrain.projects.models import Project
from posttrain.registry.model_files import ModelFolderError, inspect_model_folder
from posttrain.registry.models import ModelAsset, RewardFunction
from posttrain.registry.reward_specs import RewardSpecError, component_name, validate_reward_spec
from posttrain.registry.services.common import (
    check_unique_name,
    clean_name,
    create_named,
    delete_unless_in_use,
    invalid,
    storage_path,
    update_name_and_description,
    user_or_none,
)
from posttrain.registry.services.reward_try import reward_import_check

# A reward's code, not a data file: a server file over this size is refused before it is read.
MAX_SOURCE_BYTES = 1024 * 1024


def reward_create(
    name: str,
    kind: str,
    spec: dict[str, Any] | None,
    source: str = "",
    *,
    project: Project,
    description: str = "",
    user: User | AnonymousUser | None = None,
) -> RewardFunction:
    """Register a reward component. `spec` is validated with the engine's RewardSpec schema; a
    python reward's `source` is stored under `<storage>/rewards/<sha256>.py` (spec.path points at
    it) after a Celery worker imported it in the engine's sandbox (never this process: it waits)."""
    name = clean_name(name)
    check_unique_name(RewardFunction, name, "reward", project)
    spec = {} if spec is None else spec
    source = source or ""
    staged_source: Path | None = None
    from_server = False
    if kind == RewardFunction.Kind.PYTHON:
        if isinstance(spec, dict):  # else validation below names the problem
            from_server = bool(spec.get("path")) and not source
            spec, source = _python_spec(spec, source, user)
    elif source:
        raise invalid("source", f"only python rewards take source code, not kind {kind!r}")
    normalized = _validated_spec(kind, spec, name)
    if kind == RewardFunction.Kind.REWARD_MODEL:
        normalized["path"] = _reward_model_path(normalized["path"], project, user)
    if kind == RewardFunction.Kind.HTTP:
        _check_url(normalized["url"])
    if kind == RewardFunction.Kind.PYTHON:
        staged_source = _check_python_source(source, normalized, user, from_server=from_server)
    try:
        reward = create_named(
            RewardFunction,
            "reward",
            project=project,
            name=name,
            description=description,
            kind=kind,
            spec=normalized,
            source=source,
            created_by=user_or_none(user),
        )
    except BaseException:
        if staged_source is not None:
            staged_source.unlink(missing_ok=True)
        raise
    if staged_source is not None:
        os.replace(staged_source, normalized["path"])  # same content if it already exists
    return reward


def _validated_spec(kind: str, spec: Any, name: str) -> dict[str, Any]:
    """The spec normalized by the engine's RewardSpec schema, its component name defaulting to the reward's."""
    named = isinstance(spec, dict) and bool(spec.get("name"))
    try:
        return validate_reward_spec(kind, spec, default_name=component_name(name, kind))
    except RewardSpecError as exc:
        errors = exc.errors
        if not named and "spec.name" in errors:  # the name came from the reward's own name: say so there
            errors = {("name" if k == "spec.name" else k): v for k, v in errors.items()}
        raise ValidationError(errors) from None


def _python_spec(spec: dict[str, Any], source: str, user: User | AnonymousUser | None) -> tuple[dict[str, Any], str]:
    """The spec with path set to where the source will be stored, and the source text."""
    spec = dict(spec)
    given_path = spec.pop("path", None)
    if source and given_path:
        raise invalid("spec.path", "leave it out when sending source: the registry stores the code and sets the path")
    if not source and given_path:
        # A file on the server (inside an import root, by a user allowed to name one): its text is stored
        # like sent source, so later edits of the original cannot change what runs using this reward execute.
        file = resolve_user_path("spec.path", given_path, user, "file")
        if file.stat().st_size > MAX_SOURCE_BYTES:
            raise invalid("spec.path", f"{given_path} is over {MAX_SOURCE_BYTES // 1024} KiB: not a reward's code")
        with open_checked("spec.path", file) as handle:
            raw = handle.read(MAX_SOURCE_BYTES + 1)
        try:
            source = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise invalid("spec.path", f"{given_path} is not UTF-8 text") from None
    if not source.strip():
        raise invalid(
            "source", "is required for a python reward: code defining reward_func (OpenRLHF) or compute_score (verl)"
        )
    digest = hashlib.sha256(source.encode("utf-8")).hexdigest()
    spec["path"] = str(storage_path("rewards", f"{digest}.py"))
    return spec, source


def _check_python_source(
    source: str, spec: dict[str, Any], user: User | AnonymousUser | None, *, from_server: bool = False
) -> Path:
    """Write the code to a temporary file and have a worker import it in the engine's sandbox; returns
    the file, to be moved to spec.path once the reward row exists. The problems of a file from the server
    are not shown (they quote it: a NameError names its first word); sent source is the user's own."""
    final = Path(spec["path"])
    final.parent.mkdir(parents=True, exist_ok=True)
    staged = final.with_name(f".{uuid.uuid4().hex}.py")
    staged.write_text(source, encoding="utf-8")
    try:
        problems = reward_import_check(staged, spec, user)
    except BaseException:
        staged.unlink(missing_ok=True)
        raise
    if problems:
        staged.unlink(missing_ok=True)
        if from_server:
            raise invalid(
                "spec.path",
                f"the file does not import as a reward ({len(problems)} problem(s): a syntax error, an exception "
                "at import, or no reward_func / compute_score); the messages quote the file, so they are shown "
                "only for code sent as source",
            )
        raise invalid("source", problems)
    return staged


def _reward_model_path(path: str, project: Project, user: User | AnonymousUser | None) -> str:
    """A model's name in the reward's project or a HF folder on the server (an import root's), as the folder's
    path."""
    registered = ModelAsset.objects.filter(project=project, name=path).first()
    folder = registered.path if registered is not None else str(resolve_user_path("spec.path", path, user, "folder"))
    try:
        return str(inspect_model_folder(folder).path)
    except ModelFolderError as exc:
        raise invalid("spec.path", f"{exc} (give a registered model's name or a Hugging Face model folder)") from None


def _check_url(url: str) -> None:
    """A reward server's URL under the outbound policy now (it is checked again at every request)."""
    from rl_engine.spec.user_code import OutboundRefused

    try:
        outbound_policy().check_url(url, resolve="if_possible")
    except OutboundRefused as exc:
        raise invalid("spec.url", str(exc)) from None


def reward_update(reward: RewardFunction, *, name: str | None = None, description: str | None = None) -> RewardFunction:
    """Rename or redescribe; the component name in spec (the metric name) stays, so curves of
    earlier runs keep matching."""
    return update_name_and_description(reward, "reward", name, description)


def reward_delete(reward: RewardFunction) -> None:
    # The stored source file stays: another reward may hold the same code (same sha256).
    delete_unless_in_use(reward, "reward")


def reward_copy(
    reward: RewardFunction, project: Project, *, name: str | None = None, user: User | AnonymousUser | None = None
) -> RewardFunction:
    """The reward in another project too, with the same spec (a python reward's stored code is shared: it is
    stored by content). The caller checked that the user reads the source and creates in `project`."""
    name = clean_name(name or reward.name)
    check_unique_name(RewardFunction, name, "reward", project)
    return create_named(
        RewardFunction,
        "reward",
        project=project,
        name=name,
        description=reward.description,
        kind=reward.kind,
        spec=reward.spec,
        source=reward.source,
        created_by=user_or_none(user),
    )
