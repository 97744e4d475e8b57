"""`posttrain runs`: list, inspect, launch, cancel, clone, resume, follow and export runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from posttrain_sdk.cli.common import (
    _client,
    _emit_json,
    _number,
    _project_column,
    _short,
    _table,
    err,
    json_option,
    out,
    reports_errors,
    wide_option,
)
from posttrain_sdk.cli.root import main
from posttrain_sdk.cli.runs_follow import _follow
from posttrain_sdk.client import Client
from posttrain_sdk.types import Run

PRIORITIES = ("low", "normal", "high", "urgent")


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
