"""`posttrain projects`: projects, their members and roles, and the default project."""

from __future__ import annotations

import click

from posttrain_sdk import credentials
from posttrain_sdk.cli.common import _client, _emit_json, _server, _table, err, json_option, out, reports_errors
from posttrain_sdk.cli.root import main
from posttrain_sdk.errors import PosttrainError
from posttrain_sdk.types import Project

PROJECT_ROLES = ("owner", "maintainer", "member", "viewer")


@main.group()
def projects() -> None:
    """Projects, their members and roles (owner, maintainer, member, viewer), and your default one."""


@projects.command("ls")
@json_option
@click.pass_context
@reports_errors
def projects_ls(ctx, as_json: bool) -> None:
    """The projects you read and your role in each; * marks the one in use."""
    client = _client(ctx)
    found = client.projects.list()
    if as_json:
        _emit_json(found)
        return
    chosen = client.project

    def in_use(project: Project) -> str:
        return "*" if chosen in (project.name, str(project.id)) else ""

    rows = [(in_use(p), p.id, p.name, p.role or "admin", p.member_count, p.description) for p in found]
    out.print(_table(["", "id", "name", "role", "members", "description"], rows, shorten=("description",)))


@projects.command("create")
@click.argument("name")
@click.option("--description", default="")
@json_option
@click.pass_context
@reports_errors
def projects_create(ctx, name: str, description: str, as_json: bool) -> None:
    """A new project; you are its owner."""
    project = _client(ctx).projects.create(name, description=description)
    if as_json:
        _emit_json(project)
    else:
        out.print(f"project {project.id} {project.name} (you are its {project.role})", markup=False)


@projects.command("members")
@click.argument("project")
@json_option
@click.pass_context
@reports_errors
def projects_members(ctx, project: str, as_json: bool) -> None:
    """A project's members and their roles."""
    found = _client(ctx).projects.members(project)
    if as_json:
        _emit_json(found)
    else:
        out.print(_table(["username", "role", "added"], [(m.username, m.role, m.added_at[:10]) for m in found]))


@projects.command("add")
@click.argument("project")
@click.argument("username")
@click.argument("role", type=click.Choice(PROJECT_ROLES))
@json_option
@click.pass_context
@reports_errors
def projects_add(ctx, project: str, username: str, role: str, as_json: bool) -> None:
    """Add a user to a project, or change their role (owners and maintainers; only an owner makes an owner)."""
    member = _client(ctx).projects.set_member(username, role, project=project)
    if as_json:
        _emit_json(member)
    else:
        out.print(f"{member.username} is {member.role} in {project}", markup=False)


@projects.command("remove")
@click.argument("project")
@click.argument("username")
@click.pass_context
@reports_errors
def projects_remove(ctx, project: str, username: str) -> None:
    """Take a user out of a project (what they made stays); anyone may leave."""
    _client(ctx).projects.remove_member(username, project=project)
    out.print(f"{username} is no longer in {project}", markup=False)


@projects.command("use")
@click.argument("name", required=False)
@click.option("--clear", is_flag=True, help="Forget the default: lists show every project you read again.")
@click.pass_context
@reports_errors
def projects_use(ctx, name: str | None, clear: bool) -> None:
    """The default project on this server (stored beside its token): lists show it, creates go into it.
    --project and POSTTRAIN_PROJECT override it."""
    if clear == (name is not None):
        raise PosttrainError("give a project NAME, or --clear")
    if clear:
        url = _server(ctx, None)
        credentials.save_project(url, None)
        out.print(f"no default project on {url}", markup=False)
        return
    client = _client(ctx)
    project = client.projects.get(str(name))
    credentials.save_project(client.url, project.name)
    out.print(f"default project on {client.url}: {project.name}", markup=False)
    if ctx.find_root().obj.get("project"):
        err.print("note: --project / POSTTRAIN_PROJECT is set, and overrides it", markup=False)
