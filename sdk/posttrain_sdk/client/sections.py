"""What every section of the client shares, and the registry sections' list / get by name / copy."""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, TypeVar

from posttrain_sdk.errors import FieldError, NotFound, PosttrainError
from posttrain_sdk.types import InProject

if TYPE_CHECKING:
    from posttrain_sdk.client.core import Client

_ApiT = TypeVar("_ApiT", bound=InProject)

ProjectRef = str | int  # a project's name or id


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
