"""`trainctl`: the command line for the trainctl service (typer + rich).

\b
    trainctl serve                                   # the API and its local workers
    trainctl data prepare corpus/ --out data/shards  # text -> .bin token shards
    trainctl submit train -e demo --steps 200 --data 'shards/train_*.bin' --watch
    trainctl runs list | show ID | cancel ID | watch ID
    trainctl checkpoints list | latest | show EXP TAG | prune EXP | download EXP TAG

It reads TRAINCTL_URL and TRAINCTL_API_TOKEN (or --url/--token). Errors print one line,
`error: ...`, and exit non-zero.
"""

from __future__ import annotations

from typing import Annotated

import typer

from trainctl.service.cli import checkpoints, data, runs, server, submit
from trainctl.service.cli.common import CliGroup

app = typer.Typer(
    cls=CliGroup,
    name="trainctl",
    help=__doc__,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.callback()
def main(
    ctx: typer.Context,
    url: Annotated[
        str | None,
        typer.Option(envvar="TRAINCTL_URL", help="The service (default http://127.0.0.1:8000)."),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(envvar="TRAINCTL_API_TOKEN", help="Bearer token.", show_default=False),
    ] = None,
) -> None:
    ctx.obj = {"url": url, "token": token}


server.register(app)
app.add_typer(submit.app, name="submit")
app.add_typer(runs.app, name="runs")
app.add_typer(checkpoints.app, name="checkpoints")
app.add_typer(data.app, name="data")
