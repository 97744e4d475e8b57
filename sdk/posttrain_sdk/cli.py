"""`posttrain`: the platform from the terminal. Tables for people, `--json` for scripts.

Exit codes: 0 done; 1 the server refused (the error names the field) or the followed run did not
succeed; 2 bad usage or a bad local file; 3 not logged in, or the token was refused; 4 the server
cannot be reached.

The project: `--project` (or POSTTRAIN_PROJECT), else the server's default (`posttrain projects use`).
With one, lists show that project only and creates go into it; without, lists show every project you
read, with a project column.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from functools import wraps
from pathlib import Path
from typing import Any

import click
from rich.cells import cell_len
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from posttrain_sdk import __version__, credentials
from posttrain_sdk.client import Client
from posttrain_sdk.errors import APIError, AuthError, NotLoggedIn, PosttrainError, ServerUnreachable
from posttrain_sdk.types import ApiObject, InProject, Project, Run

KEY_METRICS = ("reward/mean", "kl/mean", "policy/entropy", "response/length_mean", "policy/loss", "eval/reward/mean")
TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})
EXIT_REFUSED, EXIT_USAGE, EXIT_AUTH, EXIT_UNREACHABLE = 1, 2, 3, 4

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


PRIORITIES = ("low", "normal", "high", "urgent")
PROJECT_ROLES = ("owner", "maintainer", "member", "viewer")


def _fail(message: str, code: int) -> None:
    for line in message.splitlines() or [message]:
        err.print(f"error: {line}", markup=False, highlight=False)
    sys.exit(code)


def reports_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """The SDK's exceptions as one line per field error and the documented exit code."""

    @wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except (NotLoggedIn, AuthError) as exc:
            errors = getattr(exc, "errors", None)
            _fail("\n".join(str(e) for e in errors) if errors else str(exc), EXIT_AUTH)
        except ServerUnreachable as exc:
            _fail(str(exc), EXIT_UNREACHABLE)
        except APIError as exc:
            _fail("\n".join(str(e) for e in exc.errors), EXIT_REFUSED)
        except PosttrainError as exc:
            _fail(str(exc), EXIT_USAGE)

    return run


def _client(ctx: click.Context) -> Client:
    options = ctx.find_root().obj
    return Client(options.get("url"), options.get("token"), project=options.get("project"))


def _emit_json(value: Any) -> None:
    if isinstance(value, ApiObject):
        value = value.raw
    elif isinstance(value, list):
        value = [item.raw if isinstance(item, ApiObject) else item for item in value]
    click.echo(json.dumps(value, indent=2, ensure_ascii=False, default=str))


def _number(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


SHORT_ID = 8  # characters of an id in a table, as git and docker show them; `--wide` shows whole ones
MIN_SHORTENED = 8  # characters a shortened column keeps however narrow the terminal
COLUMN_GAP = 2


def _short(run_id: str, wide: bool) -> str:
    return run_id if wide else run_id[:SHORT_ID]


def _table(
    columns: Iterable[str],
    rows: Iterable[Iterable[Any]],
    title: str | None = None,
    *,
    shorten: Iterable[str] = (),
) -> Table:
    """A table for the terminal. With `shorten`, every row stays on one line of it: the other columns keep their
    width and the named ones (free text, such as names) share what is left, cut with an ellipsis; without, long
    values wrap inside their column."""
    columns = list(columns)
    cells = [[_number(v) if not isinstance(v, str) else v for v in row] for row in rows]
    natural = [max([cell_len(c), *(cell_len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    shortened = [i for i, c in enumerate(columns) if c in set(shorten)]
    limits: dict[int, int] = {}
    if shortened:
        kept = sum(w for i, w in enumerate(natural) if i not in shortened) + COLUMN_GAP * (len(columns) - 1)
        room = max(0, out.width - kept)
        wanted = sum(natural[i] for i in shortened)
        if wanted > room:
            limits = {i: max(MIN_SHORTENED, room * natural[i] // wanted) for i in shortened}
    table = Table(title=title, header_style="bold", box=None, pad_edge=False, padding=(0, COLUMN_GAP // 2))
    for i, column in enumerate(columns):
        if shortened:
            table.add_column(column, no_wrap=True, overflow="ellipsis", max_width=limits.get(i))
        else:
            table.add_column(column, overflow="fold")
    for row in cells:
        table.add_row(*row)
    return table


def _project_column(
    client: Client, columns: list[str], rows: Sequence[Sequence[Any]], items: Sequence[InProject]
) -> tuple[list[str], list[list[Any]]]:
    """A list of every project read (no project chosen) mixes projects: it gets a project column after the name."""
    if client.project is not None:
        return columns, [list(row) for row in rows]
    at = columns.index("name") + 1
    mixed = [[*row[:at], item.project_name or "—", *row[at:]] for row, item in zip(rows, items, strict=True)]
    return [*columns[:at], "project", *columns[at:]], mixed


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


@click.group()
@click.option("--url", envvar="POSTTRAIN_URL", help="The server (default: the one you logged in to last).")
@click.option("--token", envvar="POSTTRAIN_TOKEN", help="An API token instead of the stored one.")
@click.option(
    "--project",
    envvar="POSTTRAIN_PROJECT",
    help="The project (name or id) lists show and creates go into (default: `posttrain projects use`'s).",
)
@click.version_option(__version__, prog_name="posttrain")
@click.pass_context
def main(ctx: click.Context, url: str | None, token: str | None, project: str | None) -> None:
    """Posttrain from the terminal: runs, registry, experiments, and tracking of other engines' runs."""
    ctx.obj = {"url": url, "token": token, "project": project}


# -- login ----------------------------------------------------------------------------------------


def _server(ctx: click.Context, url: str | None) -> str:
    """The server a command names (`login --url`), else the global `--url` / POSTTRAIN_URL, else the last one."""
    return credentials.normalize_url(url or ctx.find_root().obj.get("url") or credentials.default_url())


server_option = click.option("--url", "server_url", help="The server (default: the one you logged in to last).")


@main.command()
@server_option
@click.option("--username", "-u", help="Prompted when not given.")
@click.option("--password-stdin", is_flag=True, help="Read the password from standard input.")
@click.option("--with-token", "token", help="Store this API token instead of asking for a password.")
@click.pass_context
@reports_errors
def login(
    ctx: click.Context, server_url: str | None, username: str | None, password_stdin: bool, token: str | None
) -> None:
    """Store your API token for the server (one per server, in ~/.config/posttrain, mode 0600)."""
    url = _server(ctx, server_url)
    if token is None:
        username = username or click.prompt("Username")
        password = sys.stdin.readline().rstrip("\n") if password_stdin else click.prompt("Password", hide_input=True)
        token = Client.obtain_token(url, username, password)
    me = Client(url, token).me()
    credentials.save_token(url, token, me["username"])
    out.print(f"Logged in to {url} as {me['username']} ({me.get('role') or 'no role'})", markup=False)


@main.command()
@server_option
@click.pass_context
@reports_errors
def logout(ctx: click.Context, server_url: str | None) -> None:
    """Forget the stored token of the server."""
    url = _server(ctx, server_url)
    removed = credentials.forget_token(url)
    out.print(f"Logged out of {url}" if removed else f"No token was stored for {url}", markup=False)


@main.command()
@json_option
@click.pass_context
@reports_errors
def whoami(ctx: click.Context, as_json: bool) -> None:
    """The user the token belongs to, and the project lists and creates use."""
    client = _client(ctx)
    me = client.me()
    if as_json:
        _emit_json({**me, "url": client.url, "project": client.project})
        return
    out.print(f"{me['username']} ({me.get('role') or 'no role'}) on {client.url}", markup=False)
    if client.project is not None:
        out.print(f"project: {client.project}", markup=False)
    else:
        out.print("project: none chosen; lists show every project you read (`posttrain projects use NAME`)")


# -- projects -------------------------------------------------------------------------------------


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


# -- runs -----------------------------------------------------------------------------------------


@main.group()
def runs() -> None:
    """List, inspect, launch, cancel, clone, resume, follow and export runs."""


def _run_id(client: Client, id_or_prefix: str) -> str:
    """A run's whole id from what was typed: the whole id, or a unique start of it (a short id from a table)."""
    return client.runs.resolve_id(id_or_prefix)


def _run_rows(items: list[Run], wide: bool) -> list[list[Any]]:
    """One row per run; narrow (the default) leaves the experiment out and keeps the creation time to the minute."""
    rows = []
    for r in items:
        created = (r.created_at or "").replace("T", " ")
        row = [
            _short(r.id, wide),
            r.name,
            r.state,
            r.engine if r.kind == "external" else (r.algorithm or "—"),
            *([r.experiment_name or "—"] if wide else []),
            f"{r.last_step}/{r.total_steps}" if r.total_steps else _number(r.last_step),
            _number(r.metric("reward/mean")),
            created[:19] if wide else created[5:16],
        ]
        rows.append(row)
    return rows


wide_option = click.option(
    "--wide", is_flag=True, help="Whole ids and every column (default: short ids, one line a row)."
)


@runs.command("ls")
@click.option("--state", multiple=True, help="Only runs in this state (repeatable).")
@click.option("--experiment", type=int, help="Only runs of this experiment (its id).")
@click.option("--tag", help="Only runs carrying this tag.")
@click.option("--kind", type=click.Choice(["native", "external"]), help="Our engine's runs, or tracked ones.")
@click.option("--search", "-q", help="Text in the name, note or experiment name.")
@click.option("--limit", type=int, default=50, show_default=True)
@wide_option
@json_option
@click.pass_context
@reports_errors
def runs_ls(ctx, state, experiment, tag, kind, search, limit, wide, as_json) -> None:
    """Runs, newest first. Any command taking a RUN_ID takes the short id shown here, or any unique start of one."""
    client = _client(ctx)
    found = client.runs.list(
        state=list(state) or None, experiment=experiment, tag=tag, kind=kind, search=search, limit=limit
    )
    if as_json:
        _emit_json(found)
        return
    columns = ["id", "name", "state", "algorithm", *(["experiment"] if wide else []), "step", "reward", "created"]
    columns, rows = _project_column(client, columns, _run_rows(found, wide), found)
    out.print(_table(columns, rows, shorten=() if wide else ("name",)))


@runs.command("show")
@click.argument("run_id")
@json_option
@click.pass_context
@reports_errors
def runs_show(ctx, run_id: str, as_json: bool) -> None:
    """One run: state, config summary and the last value of every metric."""
    client = _client(ctx)
    run = client.runs.get(_run_id(client, run_id))
    if as_json:
        _emit_json(run)
        return
    facts: list[tuple[str, str | None]] = [
        ("id", run.id),
        ("name", run.name),
        ("state", f"{run.state} — {run.state_reason}" if run.state_reason else run.state),
        ("kind", f"{run.kind} ({run.engine})"),
        ("project", run.project_name),
        ("experiment", f"{run.experiment_name} (#{run.experiment})"),
        ("step", f"{run.last_step}/{run.total_steps}" if run.total_steps else _number(run.last_step)),
    ]
    if run.kind != "external":
        facts += [("algorithm", run.algorithm or "—"), ("model", run.model_name), ("dataset", run.dataset_name)]
    facts.append(("tags", ", ".join(run.tags or []) or "—"))
    out.print(_table(["field", "value"], facts))
    summary = run.summary or {}
    if summary:
        rows = [
            (name, entry.get("last"), entry.get("min"), entry.get("max"), entry.get("step"))
            for name, entry in sorted(summary.items())
        ]
        out.print(_table(["metric", "last", "min", "max", "at step"], rows, title="Metrics"))


@runs.command("launch")
@click.argument("experiment", type=int)
@click.option("--seed", type=int)
@click.option("--tag", "tags", multiple=True)
@click.option("--note", default="")
@click.option("--priority", type=click.Choice(PRIORITIES), help="Default normal; urgent: admins only.")
@click.option("--follow", "then_follow", is_flag=True, help="Follow the run until it ends.")
@json_option
@click.pass_context
@reports_errors
def runs_launch(ctx, experiment: int, seed, tags, note, priority, then_follow: bool, as_json: bool) -> None:
    """A new run of an experiment (by id); it starts when the cluster can hold it."""
    client = _client(ctx)
    run = client.runs.launch(experiment, seed=seed, tags=list(tags), note=note, priority=priority)
    _report_new_run(run, as_json)
    if then_follow:
        _follow(client, run.id, as_json)


def _report_new_run(run: Run, as_json: bool) -> None:
    if as_json:
        _emit_json(run)
    else:
        out.print(f"{run.id}  {run.name}  {run.state}", markup=False)


@runs.command("priority")
@click.argument("run_id")
@click.argument("priority", type=click.Choice(PRIORITIES))
@json_option
@click.pass_context
@reports_errors
def runs_priority(ctx, run_id: str, priority: str, as_json: bool) -> None:
    """Change a run's priority (owners: low..high; admins: urgent too)."""
    client = _client(ctx)
    _report_new_run(client.runs.set_priority(_run_id(client, run_id), priority), as_json)


@main.group()
def queue() -> None:
    """The scheduler's queue."""


def _resources(value: dict[str, Any]) -> str:
    return ", ".join(f"{value.get(k, 0):g} {k}" for k in ("CPU", "GPU") if value.get(k) or k == "CPU")


@queue.command("ls")
@wide_option
@json_option
@click.pass_context
@reports_errors
def queue_ls(ctx, wide: bool, as_json: bool) -> None:
    """Waiting runs in the order they start, why each waits, the running runs and the cluster's nodes."""
    found = _client(ctx).runs.queue()
    if as_json:
        _emit_json(found)
        return
    waiting = [
        (
            r["queue_position"] or "held",
            _short(r["id"], wide),
            r["name"],
            r["owner"] or "—",
            r["priority"],
            _resources(r["resources"]),
            r["reason"],
            r["estimated_start"] or "—",
        )
        for r in found["waiting"]
    ]
    out.print(
        _table(
            ["#", "run", "name", "owner", "priority", "needs", "why it waits", "estimated start"],
            waiting,
            title="Waiting",
        )
    )
    running = [
        (
            _short(r["id"], wide),
            r["name"],
            r["state"],
            r["owner"] or "—",
            r["priority"],
            _resources(r["grant"]),
            f"{r['last_step'] or 0}/{r['total_steps'] or '?'}",
        )
        for r in found["running"]
    ]
    out.print(_table(["run", "name", "state", "owner", "priority", "granted", "steps"], running, title="Running"))
    nodes = [
        (
            n["node_id"] if wide else n["node_id"][:12],
            n["address"],
            f"{n['free']['CPU']:g}/{n['total']['CPU']:g}",
            f"{n['free']['GPU']:g}/{n['total']['GPU']:g}",
        )
        for n in found["cluster"]["nodes"]
    ]
    out.print(_table(["node", "address", "CPUs free/total", "GPUs free/total"], nodes, title="Cluster"))
    out.print(cluster_age(found["cluster"]), markup=False)


# A snapshot older than this was not refreshed by the reconcile (every 15 s by default): no worker reads Ray.
STALE_SNAPSHOT_S = 120.0


def cluster_age(cluster: dict[str, Any]) -> str:
    """How old the cluster's free/total figures are: the scheduler reads Ray, the CLI reads the scheduler."""
    age = cluster.get("age_s")
    if cluster.get("as_of") is None or age is None:
        return "The scheduler has not read the cluster yet (is a Celery worker running?)."
    line = f"Free after the scheduler's grants, as it read the cluster {age:.0f} s ago ({cluster['as_of']})."
    if age > STALE_SNAPSHOT_S:
        line += " Stale: no worker has read the cluster since; is a Celery worker with beat running?"
    return line


@runs.command("cancel")
@click.argument("run_id")
@json_option
@click.pass_context
@reports_errors
def runs_cancel(ctx, run_id: str, as_json: bool) -> None:
    """Ask a run to stop."""
    client = _client(ctx)
    run = client.runs.cancel(_run_id(client, run_id))
    _report_new_run(run, as_json)


@runs.command("clone")
@click.argument("run_id")
@click.option("--seed", type=int, help="Default: the source run's seed.")
@click.option("--tag", "tags", multiple=True, help="Default: the source run's tags.")
@click.option("--note", default="")
@click.option(
    "--project",
    "into",
    help="Clone into this project (its experiment, model, dataset and rewards copied there). Default: beside it.",
)
@json_option
@click.pass_context
@reports_errors
def runs_clone(ctx, run_id: str, seed, tags, note, into: str | None, as_json: bool) -> None:
    """A new run with exactly this run's config."""
    client = _client(ctx)
    run = client.runs.clone(_run_id(client, run_id), seed=seed, tags=list(tags) or None, note=note, project=into)
    _report_new_run(run, as_json)


@runs.command("resume")
@click.argument("run_id")
@click.option("--checkpoint", type=int, help="Checkpoint id (default: the latest still on disk).")
@json_option
@click.pass_context
@reports_errors
def runs_resume(ctx, run_id: str, checkpoint, as_json: bool) -> None:
    """A new run continuing this one from a checkpoint."""
    client = _client(ctx)
    run = client.runs.resume(_run_id(client, run_id), checkpoint)
    _report_new_run(run, as_json)


@runs.command("logs")
@click.argument("run_id")
@click.option("--tail", type=int, help="Characters from the end.")
@click.pass_context
@reports_errors
def runs_logs(ctx, run_id: str, tail) -> None:
    """The run's job log (an external run: the log lines its client sent)."""
    client = _client(ctx)
    click.echo(client.runs.logs(_run_id(client, run_id), tail=tail), nl=False)


@runs.command("export")
@click.argument("run_id")
@click.option("--format", "fmt", type=click.Choice(["csv", "jsonl"]), default="csv", show_default=True)
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), help="Default: <run id>.<format>.")
@click.pass_context
@reports_errors
def runs_export(ctx, run_id: str, fmt: str, output: Path | None) -> None:
    """Every raw metric point to a file."""
    client = _client(ctx)
    run_id = _run_id(client, run_id)
    path = client.runs.export(run_id, output or Path(f"{run_id}.{fmt}"), format=fmt)
    err.print(f"wrote {path}", markup=False)


@runs.command("rollouts")
@click.argument("run_id")
@click.option("--output", "-o", "directory", type=click.Path(file_okay=False, path_type=Path), required=True)
@click.option("--step", "steps", type=int, multiple=True, help="Only these steps (repeat the option).")
@click.pass_context
@reports_errors
def runs_rollouts(ctx, run_id: str, directory: Path, steps: tuple[int, ...]) -> None:
    """The run's rollouts as Parquet files, one per step (load them with datasets, pandas or DuckDB)."""
    written = _client(ctx).runs.rollouts(run_id, directory, steps=steps or None)
    err.print(f"wrote {len(written)} rollout files to {directory}", markup=False)


@runs.command("ledger")
@click.argument("run_id")
@click.option(
    "--output", "-o", type=click.Path(dir_okay=False, path_type=Path), help="Write the whole ledger (Parquet)."
)
@json_option
@click.pass_context
@reports_errors
def runs_ledger(ctx, run_id: str, output: Path | None, as_json: bool) -> None:
    """Every training row's fate per epoch (trained, filtered, dropped, in flight) and the run's resumes."""
    client = _client(ctx)
    run_id = _run_id(client, run_id)
    if output is not None:
        err.print(f"wrote {client.runs.ledger_file(run_id, output)}", markup=False)
        return
    ledger = client.runs.ledger(run_id)
    if as_json:
        _emit_json(ledger)
        return
    epochs = [
        (
            e["epoch"],
            e["rows"],
            e["trained"],
            _reasons(e["filtered"]),
            _reasons(e["dropped"]),
            e["in_flight"],
            e["not_drawn"],
            e["skipped"],
            e["duplicates"],
        )
        for e in ledger["epochs"]
    ]
    headers = ["epoch", "rows", "trained", "filtered", "dropped", "in flight", "not drawn", "skipped", "twice"]
    out.print(_table(headers, epochs, title="Prompt ledger"))
    resumes = [
        (
            r["checkpoint_step"],
            r["restored_in_flight"],
            r["lost_in_flight"],
            f"{r['redone_steps'][0]}-{r['redone_steps'][-1]}" if r["redone_steps"] else "—",
            r["redone_rows"],
            f"{r['seconds']:.1f}s",
        )
        for r in ledger["resumes"]
    ]
    if resumes:
        headers = ["from step", "restored in flight", "lost", "steps re-done", "rows re-done", "took"]
        out.print(_table(headers, resumes, title="Resumes"))


def _reasons(counts: dict[str, int]) -> str:
    return ", ".join(f"{reason} {n}" for reason, n in counts.items()) or "0"


@runs.command("replay", context_settings={"ignore_unknown_options": True})
@click.argument("run_dir", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--step", type=int, required=True)
@click.pass_context
def runs_replay(ctx, run_dir: Path, step: int) -> None:
    """Rebuild a step's update from its rollout file and the checkpoint before it, without generating,
    and print its loss, KL and grad norm beside what the run logged (needs the engine: `python -m
    rl_engine replay`)."""
    import subprocess
    import sys

    # The engine is a separate layer (torch): run its command rather than import it.
    command = [sys.executable, "-m", "rl_engine", "replay", str(run_dir), "--step", str(step)]
    ctx.exit(subprocess.call(command))


@runs.command("samples")
@click.argument("run_id")
@click.option("--step", type=int)
@click.option("--limit", type=int, default=20, show_default=True)
@json_option
@click.pass_context
@reports_errors
def runs_samples(ctx, run_id: str, step, limit: int, as_json: bool) -> None:
    """Rollouts of a run (prompt, response, reward)."""
    client = _client(ctx)
    found = client.runs.samples(_run_id(client, run_id), step=step, limit=limit)
    if as_json:
        _emit_json(found)
        return
    rows = [(s.step, s.index, s.prompt[-60:], s.response[:80], s.reward) for s in found]
    out.print(_table(["step", "index", "prompt", "response", "reward"], rows))


@runs.command("follow")
@click.argument("run_id")
@json_option
@click.pass_context
@reports_errors
def runs_follow(ctx, run_id: str, as_json: bool) -> None:
    """Live: state, key metrics and progress toward train.steps, until the run ends. Exit code 0
    when it succeeded, 1 when it failed or was cancelled."""
    client = _client(ctx)
    _follow(client, _run_id(client, run_id), as_json)


def _follow(client: Client, run_id: str, as_json: bool) -> None:
    run = client.runs.get(run_id)
    state, reason, step = run.state, run.state_reason, run.last_step
    latest: dict[str, Any] = {name: run.metric(name) for name in KEY_METRICS if run.metric(name) is not None}
    interactive = out.is_terminal and not as_json
    progress = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=out
    )
    task = progress.add_task(run.name, total=run.total_steps, completed=step or 0)

    def view() -> Group:
        table = _table(["state", *latest], [[state, *latest.values()]])
        return Group(progress, table, reason or "")

    live = Live(view(), console=out, refresh_per_second=4) if interactive else None
    if live:
        live.start()
    try:
        for message in client.runs.follow(run_id, after_seq=run.raw.get("last_seq") or 0):
            if as_json:
                click.echo(json.dumps({"event": message.event, "id": message.id, "data": message.data}))
            if message.event == "state":
                state, reason = message.data["state"], message.data.get("reason") or ""
                if not interactive and not as_json:
                    out.print(f"state: {state}" + (f" ({reason})" if reason else ""), markup=False)
            elif message.event == "metrics":
                step = message.data["step"]
                values = message.data["values"]
                latest.update({k: values[k] for k in KEY_METRICS if k in values})
                progress.update(task, completed=step)
                if not interactive and not as_json:
                    shown = " ".join(f"{k}={_number(values[k])}" for k in KEY_METRICS if k in values)
                    total = f"/{run.total_steps}" if run.total_steps else ""
                    out.print(f"step {step}{total} {shown}".rstrip(), markup=False)
            elif message.event == "log" and not interactive and not as_json:
                out.print(f"log: {message.data.get('message')}", markup=False)
            if live:
                live.update(view())
    finally:
        if live:
            live.stop()
    if not as_json:
        out.print(f"run {run_id} {state}" + (f": {reason}" if reason and state != "succeeded" else ""), markup=False)
    if state != "succeeded":
        sys.exit(EXIT_REFUSED)


# -- registry -------------------------------------------------------------------------------------


def _add_copy_command(group: click.Group, section: str, kind: str) -> None:
    """`posttrain <section> copy ID_OR_NAME --to PROJECT`: the same object in another project too."""

    @group.command("copy", help=f"The {kind} in another project too (you read it here and create there).")
    @click.argument("source", metavar="ID_OR_NAME")
    @click.option("--to", "target", required=True, help="The project to copy into (name or id).")
    @click.option("--name", help="Its name there (default: the same).")
    @json_option
    @click.pass_context
    @reports_errors
    def copy(ctx, source: str, target: str, name: str | None, as_json: bool) -> None:
        made = getattr(_client(ctx), section).copy(source, target, name=name)
        if as_json:
            _emit_json(made)
        else:
            out.print(f"{kind} {made.id} {made.name} in {made.project_name}", markup=False)


@main.group()
def datasets() -> None:
    """Prompt datasets of the registry."""


@datasets.command("push")
@click.argument("file", type=click.Path(path_type=Path))
@click.option("--name", help="Default: the file name.")
@click.option("--prompt-field", default="prompt", show_default=True)
@click.option("--label-field", default="label", show_default=True, help="Empty for a dataset without labels.")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "csv", "parquet"]), help="Default: from the suffix.")
@click.option("--description", default="")
@json_option
@click.pass_context
@reports_errors
def datasets_push(ctx, file: Path, name, prompt_field, label_field, fmt, description, as_json: bool) -> None:
    """Upload a JSONL, CSV or Parquet file (validated on the server; the same content is stored once)."""
    dataset = _client(ctx).datasets.push(
        file, name=name, prompt_field=prompt_field, label_field=label_field, format=fmt, description=description
    )
    if as_json:
        _emit_json(dataset)
    else:
        out.print(f"dataset {dataset.id} {dataset.name}: {dataset.row_count} rows ({dataset.format})", markup=False)


@datasets.command("ls")
@json_option
@click.pass_context
@reports_errors
def datasets_ls(ctx, as_json: bool) -> None:
    client = _client(ctx)
    found = client.datasets.list()
    if as_json:
        _emit_json(found)
        return
    rows = [(d.id, d.name, d.format, d.row_count, d.prompt_field, d.label_field or "—") for d in found]
    out.print(_table(*_project_column(client, ["id", "name", "format", "rows", "prompt", "label"], rows, found)))


_add_copy_command(datasets, "datasets", "dataset")


@main.group()
def rewards() -> None:
    """Reward functions of the registry."""


@rewards.command("push")
@click.argument("name")
@click.argument("file", required=False, type=click.Path(path_type=Path))
@click.option("--builtin", help="A builtin instead of a file: exact_match, boxed_math, regex, length_penalty.")
@click.option(
    "--kind", type=click.Choice(["builtin", "python", "http", "reward_model"]), help="Default: python for a file."
)
@click.option("--spec", "spec_json", help='The reward spec as JSON, e.g. \'{"pattern": "\\\\d+"}\'.')
@click.option("--description", default="")
@json_option
@click.pass_context
@reports_errors
def rewards_push(ctx, name: str, file: Path | None, builtin, kind, spec_json, description, as_json: bool) -> None:
    """A Python reward file (OpenRLHF's reward_func or verl's compute_score) or a builtin."""
    try:
        spec = json.loads(spec_json) if spec_json else {}
    except ValueError as exc:
        raise PosttrainError(f"--spec: not valid JSON: {exc}") from None
    if builtin:
        spec = {"type": builtin, **spec}
        kind = kind or "builtin"
    if file is None and not spec:
        raise PosttrainError("give a reward FILE, or --builtin / --spec")
    reward = _client(ctx).rewards.push(name, file, kind=kind, spec=spec, description=description)
    if as_json:
        _emit_json(reward)
    else:
        out.print(f"reward {reward.id} {reward.name} ({reward.kind})", markup=False)


@rewards.command("ls")
@json_option
@click.pass_context
@reports_errors
def rewards_ls(ctx, as_json: bool) -> None:
    client = _client(ctx)
    found = client.rewards.list()
    if as_json:
        _emit_json(found)
        return
    rows = [(r.id, r.name, r.kind, json.dumps(r.spec)) for r in found]
    out.print(_table(*_project_column(client, ["id", "name", "kind", "spec"], rows, found)))


_add_copy_command(rewards, "rewards", "reward")


@main.group()
def models() -> None:
    """Models of the registry."""


@models.command("register")
@click.argument("name")
@click.argument("path")
@click.option("--description", default="")
@json_option
@click.pass_context
@reports_errors
def models_register(ctx, name: str, path: str, description: str, as_json: bool) -> None:
    """Register a Hugging Face model folder (a path the server can read)."""
    model = _client(ctx).models.register(name, path, description=description)
    if as_json:
        _emit_json(model)
    else:
        out.print(
            f"model {model.id} {model.name}: {model.architecture}, {model.parameter_count} parameters", markup=False
        )


@models.command("import-gguf")
@click.argument("name")
@click.argument("file")
@click.option("--description", default="")
@click.option(
    "--server-path", is_flag=True, help="FILE is a path on the server (needs an admin's grant), not uploaded."
)
@click.option("--no-wait", is_flag=True, help="Print the import and return; do not wait for the conversion.")
@json_option
@click.pass_context
@reports_errors
def models_import_gguf(ctx, name: str, file: str, description: str, server_path: bool, no_wait: bool, as_json: bool):
    """Import a GGUF model file as NAME: the server converts it into a model folder (on its worker, sandboxed)."""
    if not server_path and not Path(file).is_file():
        _fail(f"file: no such file {file}", EXIT_USAGE)
    record = _client(ctx).models.import_gguf(
        file, name=name, description=description, server_path=server_path, wait=not no_wait
    )
    if as_json:
        _emit_json(record)
    elif record["state"] == "done":
        model = record["model"]
        out.print(f"model {model['id']} {model['name']}: imported from {record['source_name']}", markup=False)
    else:
        out.print(f"import {record['id']} {record['state']}: follow it at {record['url']}", markup=False)


@models.command("ls")
@json_option
@click.pass_context
@reports_errors
def models_ls(ctx, as_json: bool) -> None:
    client = _client(ctx)
    found = client.models.list()
    if as_json:
        _emit_json(found)
        return
    rows = [(m.id, m.name, m.architecture, m.parameter_count, m.path) for m in found]
    out.print(_table(*_project_column(client, ["id", "name", "architecture", "parameters", "path"], rows, found)))


_add_copy_command(models, "models", "model")


# -- experiments ----------------------------------------------------------------------------------


@main.group()
def experiments() -> None:
    """Experiments: a run config over registry assets."""


@experiments.command("create")
@click.option("--file", "-f", "file", required=True, type=click.Path(path_type=Path), help="The experiment YAML.")
@click.option("--launch", "then_launch", is_flag=True, help="Launch a run of it right away.")
@json_option
@click.pass_context
@reports_errors
def experiments_create(ctx, file: Path, then_launch: bool, as_json: bool) -> None:
    """From a YAML file: name, model, dataset, rewards (registry names or ids), optional project (it wins
    over --project) and config (the engine's run config without model.path, data and rewards)."""
    client = _client(ctx)
    experiment = client.experiments.create_from_yaml(file)
    run = client.runs.launch(experiment.id) if then_launch else None
    if as_json:
        _emit_json({"experiment": experiment.raw, **({"run": run.raw} if run else {})})
        return
    out.print(f"experiment {experiment.id} {experiment.name}", markup=False)
    if run:
        out.print(f"{run.id}  {run.name}  {run.state}", markup=False)


@experiments.command("ls")
@json_option
@click.pass_context
@reports_errors
def experiments_ls(ctx, as_json: bool) -> None:
    client = _client(ctx)
    found = client.experiments.list()
    if as_json:
        _emit_json(found)
        return
    rows = [(e.id, e.name, e.run_count, e.model or "external", e.dataset or "—") for e in found]
    out.print(_table(*_project_column(client, ["id", "name", "runs", "model", "dataset"], rows, found)))


# -- review ---------------------------------------------------------------------------------------


@main.group()
def review() -> None:
    """Review campaigns."""


@review.command("export")
@click.argument("campaign", type=int)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["trl", "openai", "prm", "ratings_jsonl", "ratings_csv"]),
    default="trl",
    show_default=True,
)
@click.option("--question", help="trl/openai: the pairwise question key (default: the first).")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.pass_context
@reports_errors
def review_export(ctx, campaign: int, fmt: str, question, output: Path) -> None:
    """A campaign's labels as preference pairs (TRL or OpenAI JSONL), step labels (PRM800K-style JSONL) or
    ratings."""
    path = _client(ctx).review.export(campaign, output, format=fmt, question=question)
    err.print(f"wrote {path}", markup=False)


# -- tracking other engines -----------------------------------------------------------------------


@main.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--experiment", required=True, help="The experiment that groups the runs (made on first use).")
@click.option("--project", "misplaced_project", hidden=True)  # the grouping name before projects existed
@click.option("--name", help="Default: the folder or file name.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["auto", "tensorboard", "verl"]),
    default="auto",
    show_default=True,
    help="tensorboard: event files (OpenRLHF --use_tensorboard, verl's tensorboard logger); verl: its file "
    "logger's JSONL (trainer.logger=[file]).",
)
@click.option("--engine", help="Shown on the run (default: verl for JSONL, openrlhf for event files).")
@click.option("--total-steps", type=int, help="For the progress bar.")
@click.option(
    "--idle-timeout",
    type=float,
    default=0,
    help="Finish when nothing new arrives for this many seconds (0: never; Ctrl-C ends).",
)
@click.option("--poll", type=float, default=2.0, show_default=True, help="Seconds between reads.")
@click.option("--dir", "run_dir", type=click.Path(path_type=Path), help="Where the run's local event log goes.")
@click.pass_context
@reports_errors
def track(
    ctx, path: Path, experiment, misplaced_project, name, fmt, engine, total_steps, idle_timeout, poll, run_dir
) -> None:
    """Follow a running job's logs into an external run: TensorBoard event files or verl's JSONL,
    their metric names mapped to Posttrain's (the README lists the map). The run goes into the global
    --project (`posttrain --project P track ...`), else the default one."""
    from posttrain_sdk.followers import follower_for
    from posttrain_sdk.tracking import init

    if misplaced_project is not None:
        raise click.UsageError(
            "--project names the Posttrain project and goes before the command (`posttrain --project P track "
            "PATH --experiment E`); --experiment names the experiment that groups the runs"
        )
    follower = follower_for(path, fmt)
    options = ctx.find_root().obj
    run = init(
        experiment,
        name or path.stem,
        {"source": str(path), "format": follower.format},
        project=options.get("project"),
        engine=engine or follower.engine,
        total_steps=total_steps,
        dir=run_dir,
        url=options.get("url"),
        token=options.get("token"),
    )
    err.print(f"tracking {path} ({follower.format}) into {run.url}", markup=False)
    idle_since = time.monotonic()
    try:
        while True:
            points = follower.poll()
            for step, values in points:
                run.log(values, step=step)
            if points:
                idle_since = time.monotonic()
            elif idle_timeout and time.monotonic() - idle_since >= idle_timeout:
                break
            time.sleep(poll)
    except KeyboardInterrupt:
        pass
    delivered = run.finish()
    err.print(
        f"run {run.id} finished ({'all events delivered' if delivered else f'events kept in {run.dir}'})", markup=False
    )


@main.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@reports_errors
def sync(run_dir: Path) -> None:
    """Send a tracked run's events that never reached the server (its folder under posttrain-runs/)."""
    from posttrain_sdk.tracking import sync as sync_run

    acknowledged, delivered = sync_run(run_dir)
    if not delivered:
        _fail(f"the server holds events up to seq {acknowledged}; the rest are still in {run_dir}", EXIT_UNREACHABLE)
    out.print(f"{run_dir}: the server holds every event (seq {acknowledged})", markup=False)


if __name__ == "__main__":
    main()
