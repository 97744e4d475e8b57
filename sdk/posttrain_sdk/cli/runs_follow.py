"""Following a run live (`posttrain runs follow`, `runs launch --follow`): its state, key metrics and progress."""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.console import Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from posttrain_sdk.cli.common import EXIT_REFUSED, _number, _table, out
from posttrain_sdk.client import Client
from posttrain_sdk.sse import Message

KEY_METRICS = ("reward/mean", "kl/mean", "policy/entropy", "response/length_mean", "policy/loss", "eval/reward/mean")


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
            state, reason = _apply_message(
                message, state, reason, latest, progress, task, run.total_steps, printed=not interactive and not as_json
            )
            if live:
                live.update(view())
    finally:
        if live:
            live.stop()
    if not as_json:
        out.print(f"run {run_id} {state}" + (f": {reason}" if reason and state != "succeeded" else ""), markup=False)
    if state != "succeeded":
        sys.exit(EXIT_REFUSED)


def _apply_message(
    message: Message,
    state: str,
    reason: str,
    latest: dict[str, Any],
    progress: Progress,
    task: TaskID,
    total_steps: int | None,
    *,
    printed: bool,
) -> tuple[str, str]:
    """One message of the run's stream: a new state (returned with its reason), metrics (into `latest`
    and the progress bar) or a log line; each printed as a line when `printed` (no live view, no JSON)."""
    if message.event == "state":
        state, reason = message.data["state"], message.data.get("reason") or ""
        if printed:
            out.print(f"state: {state}" + (f" ({reason})" if reason else ""), markup=False)
    elif message.event == "metrics":
        step = message.data["step"]
        values = message.data["values"]
        latest.update({k: values[k] for k in KEY_METRICS if k in values})
        progress.update(task, completed=step)
        if printed:
            shown = " ".join(f"{k}={_number(values[k])}" for k in KEY_METRICS if k in values)
            total = f"/{total_steps}" if total_steps else ""
            out.print(f"step {step}{total} {shown}".rstrip(), markup=False)
    elif message.event == "log" and printed:
        out.print(f"log: {message.data.get('message')}", markup=False)
    return state, reason
