"""`trainctl tokens create|list|revoke`: API tokens with names and scopes (admin only)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from trainctl.service.cli.common import client, console, err_console, print_json
from trainctl.service.schemas import TokenPublic
from trainctl.store.vocabulary import Scope

app = typer.Typer(no_args_is_help=True, help="API tokens: who may read, submit or administer.")
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def table(items: list[TokenPublic]) -> Table:
    t = Table("NAME", "SCOPE", "CREATED", "BY", "LAST USED", box=None)
    for token in items:
        last = token.last_used_at.strftime("%Y-%m-%d %H:%M") if token.last_used_at else "never"
        t.add_row(token.name, token.scope, token.created_at.strftime("%Y-%m-%d %H:%M"),
                  token.created_by or "", last)  # fmt: skip
    return t


@app.command("create")
def create_token(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Who holds it: a person, a team, a pipeline.")],
    scope: Annotated[
        Scope, typer.Option(help="read: GETs; submit: also runs; admin: everything.")
    ] = "submit",
    as_json: AsJson = False,
) -> None:
    """Create a token and print it: it is shown this once."""
    with client(ctx) as api:
        created = api.create_token(name, scope)
    if as_json:
        print_json(created)
        return
    # The token alone on stdout, so that `trainctl tokens create ci > ci.token` keeps it.
    err_console.print(f"created token {created.name!r} ({created.scope}); it is not shown again:")
    console.print(created.token, soft_wrap=True)


@app.command("list")
def list_tokens(ctx: typer.Context, as_json: AsJson = False) -> None:
    """List tokens: name, scope, when created and last used (never the tokens themselves)."""
    with client(ctx) as api:
        items = api.list_tokens()
    if as_json:
        print_json(items)
    elif items:
        console.print(table(items))
    else:
        err_console.print("no tokens besides TRAINCTL_API_TOKEN")


@app.command("revoke")
def revoke_token(
    ctx: typer.Context, name: Annotated[str, typer.Argument(help="The token's name.")]
) -> None:
    """Revoke a token: requests with it are refused from now on."""
    with client(ctx) as api:
        revoked = api.revoke_token(name)
    err_console.print(f"revoked token {revoked.name!r} ({revoked.scope})")
