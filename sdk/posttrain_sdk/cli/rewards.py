"""`posttrain rewards`: reward functions of the registry."""

from __future__ import annotations

import json
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
from posttrain_sdk.errors import PosttrainError


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
