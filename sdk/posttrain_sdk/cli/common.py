"""What the command modules share: exit codes, the consoles, how errors are reported, the client, JSON and table
output, the shared options, and the registry's copy command."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Sequence
from functools import wraps
from typing import Any

import click
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table

from posttrain_sdk import credentials
from posttrain_sdk.client import Client
from posttrain_sdk.errors import APIError, AuthError, NotLoggedIn, PosttrainError, ServerUnreachable
from posttrain_sdk.types import ApiObject, InProject

EXIT_REFUSED, EXIT_USAGE, EXIT_AUTH, EXIT_UNREACHABLE = 1, 2, 3, 4

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


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


wide_option = click.option(
    "--wide", is_flag=True, help="Whole ids and every column (default: short ids, one line a row)."
)


def _server(ctx: click.Context, url: str | None) -> str:
    """The server a command names (`login --url`), else the global `--url` / POSTTRAIN_URL, else the last one."""
    return credentials.normalize_url(url or ctx.find_root().obj.get("url") or credentials.default_url())


server_option = click.option("--url", "server_url", help="The server (default: the one you logged in to last).")


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
