"""`posttrain track` and `sync`: other engines' runs (TensorBoard event files, verl's JSONL) tracked as external
runs, and a tracked run's undelivered events sent later."""

from __future__ import annotations

import time
from pathlib import Path

import click

from posttrain_sdk.cli.common import EXIT_UNREACHABLE, _fail, err, out, reports_errors
from posttrain_sdk.cli.root import main


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
