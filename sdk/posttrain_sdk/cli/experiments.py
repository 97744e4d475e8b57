"""`posttrain experiments`: a run config over registry assets, created from YAML."""

from __future__ import annotations

from pathlib import Path

import click

from posttrain_sdk.cli.common import _client, _emit_json, _project_column, _table, json_option, out, reports_errors
from posttrain_sdk.cli.root import main


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
