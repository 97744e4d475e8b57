"""The fields a person sets on a run (seed, tags, note), checked with errors that name the field."""

from __future__ import annotations

from typing import Any

from posttrain.core.errors import InvalidInput

MAX_TAGS = 20
MAX_TAG_LENGTH = 50
MAX_NOTE_LENGTH = 20_000
MAX_SEED = 2**31 - 1


def clean_seed(seed: Any, default: int) -> int:
    if seed is None:
        return default
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise InvalidInput.one("seed", f"must be an integer between 0 and {MAX_SEED}")
    return seed


def clean_tags(tags: Any) -> list[str]:
    if tags is None:
        return []
    if not isinstance(tags, (list, tuple)):
        raise InvalidInput.one("tags", "must be a list of strings")
    cleaned: list[str] = []
    for i, tag in enumerate(tags):
        if not isinstance(tag, str) or not tag.strip():
            raise InvalidInput.one(f"tags[{i}]", "must be a non-empty string")
        tag = tag.strip()
        if len(tag) > MAX_TAG_LENGTH:
            raise InvalidInput.one(f"tags[{i}]", f"at most {MAX_TAG_LENGTH} characters")
        if tag not in cleaned:
            cleaned.append(tag)
    if len(cleaned) > MAX_TAGS:
        raise InvalidInput.one("tags", f"at most {MAX_TAGS} tags")
    return cleaned


def clean_note(note: Any) -> str:
    if note is None:
        return ""
    if not isinstance(note, str):
        raise InvalidInput.one("note", "must be a string")
    if len(note) > MAX_NOTE_LENGTH:
        raise InvalidInput.one("note", f"at most {MAX_NOTE_LENGTH} characters")
    return note


def may_set_urgent(user) -> bool:
    """Urgent is for admins and staff: it jumps every queue and may preempt anyone's run."""
    from posttrain.accounts.roles import Role
    from posttrain.accounts.selectors import user_roles

    return bool(user is not None and (getattr(user, "is_staff", False) or Role.ADMIN in user_roles(user)))


def clean_priority(priority: Any, user, default: str = "normal") -> str:
    from posttrain.core.errors import PermissionDenied
    from posttrain.runs.models import RunPriority

    if priority is None:
        return default
    if priority not in RunPriority.values:
        raise InvalidInput.one(
            "priority", f"must be one of {', '.join(RunPriority.values)}, got {str(priority)[:50]!r}"
        )
    if priority == RunPriority.URGENT and not may_set_urgent(user):
        raise PermissionDenied("only admins and staff may give a run urgent priority", loc="priority")
    return priority


def clean_preemptible(preemptible: Any, user) -> bool:
    """Opting out of preemption holds resources against higher priorities: admins decide who may
    (the `runs.launch_unpreemptible` permission, granted in the Django admin)."""
    from posttrain.core.errors import PermissionDenied

    if preemptible is None:
        return True
    if not isinstance(preemptible, bool):
        raise InvalidInput.one("preemptible", "must be true or false")
    if not preemptible and not (may_set_urgent(user) or user.has_perm("runs.launch_unpreemptible")):
        raise PermissionDenied(
            "you may not launch runs that are never preempted; an admin can grant it", loc="preemptible"
        )
    return preemptible
