"""What every asset's writes share: names, uniqueness, deletes refused while in use, the storage root.

Every problem with the input raises Django's ValidationError keyed by the input field
(`{"path": ["no config.json in /x"]}`); deleting an asset an experiment uses raises AssetInUse; the
API answers them as 400 and 409 in the error contract (posttrain.core.api.errors)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import ValidationError
from django.db import IntegrityError, models, transaction
from django.db.models import ProtectedError

from posttrain.core.errors import AssetInUse
from posttrain.projects.models import Project

NAME_MAX_CHARS = 200
CHUNK_BYTES = 1024 * 1024


# --- shared -----------------------------------------------------------------------------------


def invalid(field: str, message: str | list[str]) -> ValidationError:
    return ValidationError({field: message})


def clean_name(name: str | None) -> str:
    name = (name or "").strip()
    if not name:
        raise invalid("name", "is required")
    if len(name) > NAME_MAX_CHARS:
        raise invalid("name", f"is {len(name)} characters long; at most {NAME_MAX_CHARS}")
    return name


def check_unique_name(
    model: type[models.Model], name: str, what: str, project: Project, exclude_pk: Any = None
) -> None:
    """Names are unique within a project (the same name in two projects is two objects)."""
    taken = model._default_manager.filter(project=project, name=name)
    if exclude_pk is not None:
        taken = taken.exclude(pk=exclude_pk)
    if taken.exists():
        raise invalid("name", f"a {what} named {name!r} already exists in project {project.name!r}")


def create_named(model: type[models.Model], what: str, **fields: Any) -> Any:
    """Create a row whose name is unique in its project; a concurrent duplicate is a field error, not a 500."""
    try:
        with transaction.atomic():
            return model._default_manager.create(**fields)
    except IntegrityError:
        check_unique_name(model, fields["name"], what, fields["project"])
        raise


def user_or_none(user: User | AnonymousUser | None) -> User | None:
    return user if isinstance(user, User) and user.is_authenticated else None


def update_name_and_description(
    obj: Any, what: str, name: str | None, description: str | None, *, unique_name: bool = True
) -> Any:
    fields = []
    if name is not None:
        name = clean_name(name)
        if unique_name:
            check_unique_name(type(obj), name, what, obj.project, exclude_pk=obj.pk)
        obj.name = name
        fields.append("name")
    if description is not None:
        obj.description = description
        fields.append("description")
    if fields:
        obj.save(update_fields=fields)
    return obj


def delete_unless_in_use(obj: Any, what: str) -> None:
    try:
        with transaction.atomic():
            obj.delete()
    except ProtectedError as exc:
        users = sorted({str(getattr(o, "experiment", o)) for o in exc.protected_objects})
        shown = ", ".join(repr(u) for u in users[:5]) + (", ..." if len(users) > 5 else "")
        raise AssetInUse(
            f"{what} {obj.name!r} is used by {len(users)} experiment(s) ({shown}); delete those experiments first"
        ) from None


def remove_tree_after_commit(folder: Path) -> None:
    transaction.on_commit(lambda: shutil.rmtree(folder, ignore_errors=True))


def storage_path(*parts: str) -> Path:
    return Path(settings.STORAGE_ROOT).joinpath(*parts)


def same_folder(folder: Path, store: Path) -> bool:
    """Whether `folder` is exactly the store folder (we only ever delete what we stored)."""
    return folder.resolve() == store.resolve()
