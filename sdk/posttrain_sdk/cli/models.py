"""`posttrain models`: models of the registry, registered from a folder or imported from a GGUF file."""

from __future__ import annotations

from pathlib import Path

import click

from posttrain_sdk.cli.common import (
    EXIT_USAGE,
    _add_copy_command,
    _client,
    _emit_json,
    _fail,
    _project_column,
    _table,
    json_option,
    out,
    reports_errors,
)
from posttrain_sdk.cli.root import main


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
