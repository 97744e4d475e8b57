"""`posttrain datasets`: prompt datasets of the registry."""

from __future__ import annotations

from pathlib import Path

import click

from posttrain_sdk.cli.common import (
    _add_copy_command,
    _client,
    _emit_json,
    _project_column,
    _table,
    json_option,
    out,
    reports_errors,
)
from posttrain_sdk.cli.root import main


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
