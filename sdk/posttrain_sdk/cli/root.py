"""`posttrain`'s root group: the global --url, --token and --project every command reads from the context."""

from __future__ import annotations

import click

from posttrain_sdk import __version__


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
