"""`posttrain login`, `logout` and `whoami`: the token stored per server, and whose it is."""

from __future__ import annotations

import sys

import click

from posttrain_sdk import credentials
from posttrain_sdk.cli.common import _client, _emit_json, _server, json_option, out, reports_errors, server_option
from posttrain_sdk.cli.root import main
from posttrain_sdk.client import Client


@main.command()
@server_option
@click.option("--username", "-u", help="Prompted when not given.")
@click.option("--password-stdin", is_flag=True, help="Read the password from standard input.")
@click.option("--with-token", "token", help="Store this API token instead of asking for a password.")
@click.pass_context
@reports_errors
def login(
    ctx: click.Context, server_url: str | None, username: str | None, password_stdin: bool, token: str | None
) -> None:
    """Store your API token for the server (one per server, in ~/.config/posttrain, mode 0600)."""
    url = _server(ctx, server_url)
    if token is None:
        username = username or click.prompt("Username")
        password = sys.stdin.readline().rstrip("\n") if password_stdin else click.prompt("Password", hide_input=True)
        token = Client.obtain_token(url, username, password)
    me = Client(url, token).me()
    credentials.save_token(url, token, me["username"])
    out.print(f"Logged in to {url} as {me['username']} ({me.get('role') or 'no role'})", markup=False)


@main.command()
@server_option
@click.pass_context
@reports_errors
def logout(ctx: click.Context, server_url: str | None) -> None:
    """Forget the stored token of the server."""
    url = _server(ctx, server_url)
    removed = credentials.forget_token(url)
    out.print(f"Logged out of {url}" if removed else f"No token was stored for {url}", markup=False)


@main.command()
@json_option
@click.pass_context
@reports_errors
def whoami(ctx: click.Context, as_json: bool) -> None:
    """The user the token belongs to, and the project lists and creates use."""
    client = _client(ctx)
    me = client.me()
    if as_json:
        _emit_json({**me, "url": client.url, "project": client.project})
        return
    out.print(f"{me['username']} ({me.get('role') or 'no role'}) on {client.url}", markup=False)
    if client.project is not None:
        out.print(f"project: {client.project}", markup=False)
    else:
        out.print("project: none chosen; lists show every project you read (`posttrain projects use NAME`)")
