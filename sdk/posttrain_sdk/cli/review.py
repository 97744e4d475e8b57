"""`posttrain review`: review campaigns' labels exported for training."""

from __future__ import annotations

from pathlib import Path

import click

from posttrain_sdk.cli.common import _client, err, reports_errors
from posttrain_sdk.cli.root import main


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
