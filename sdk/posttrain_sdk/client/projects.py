"""The projects section: projects you read, their members and roles."""

from __future__ import annotations

import builtins
from urllib.parse import quote

from posttrain_sdk.client.sections import ProjectRef, _Section
from posttrain_sdk.errors import FieldError, NotFound, PosttrainError
from posttrain_sdk.types import Member, Project


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
