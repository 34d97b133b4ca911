"""`trainctl`: the command line for the trainctl service (typer + rich).

\b
    trainctl serve                                   # the API and its local workers
    trainctl data prepare corpus/ --out data/shards  # text -> .bin token shards
    trainctl submit train -e demo --steps 200 --data 'shards/train_*.bin' --watch
    trainctl runs list | show ID | logs ID -f | metrics ID | cancel ID | watch ID
    trainctl checkpoints list | latest | show EXP TAG | prune EXP | download | delete | export
    trainctl sample EXP TAG "def " --max-new-tokens 64      # the text as it is generated
    trainctl evaluate EXP TAG --tasks arc_easy,hellaswag --limit 100  # scores; evals tasks
    trainctl exports list | show EXP TAG | download EXP TAG -o DIR | delete EXP TAG
    trainctl workers | models
    trainctl webhooks add URL --events succeeded,failed | list | remove ID | deliveries ID

It talks to TRAINCTL_URL with TRAINCTL_API_TOKEN, or a profile of
~/.config/trainctl/config.toml. Data goes to stdout, progress to stderr. Errors print one
line, `error: ...`; exit codes: 1 run failed, 2 bad input, 3 no service or token refused.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Annotated

import typer

from trainctl.service.cli import (
    checkpoints,
    data,
    evals,
    exports,
    models,
    runs,
    sample,
    server,
    submit,
    tokens,
    webhooks,
    workers,
)
from trainctl.service.cli.common import CliGroup

app = typer.Typer(
    cls=CliGroup,
    name="trainctl",
    help=__doc__,
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def show_version(value: bool) -> None:
    if not value:
        return
    try:
        print(f"trainctl {version('trainctl')}")
    except PackageNotFoundError:  # imported from a checkout that was never installed
        print("trainctl (not installed)")
    raise typer.Exit()


@app.callback()
def main(
    ctx: typer.Context,
    url: Annotated[
        str | None,
        typer.Option(envvar="TRAINCTL_URL", help="The service (default http://127.0.0.1:8000)."),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="TRAINCTL_API_TOKEN",
            help="Bearer token. Prefer the env var or a profile: arguments show in `ps`.",
            show_default=False,
        ),
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option(
            envvar="TRAINCTL_PROFILE",
            help="A [profiles.NAME] of ~/.config/trainctl/config.toml (default: default).",
            show_default=False,
        ),
    ] = None,
    _version: Annotated[
        bool,
        typer.Option(
            "--version", callback=show_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    ctx.obj = {"url": url, "token": token, "profile": profile}


server.register(app)
app.add_typer(submit.app, name="submit")
app.add_typer(runs.app, name="runs")
app.add_typer(checkpoints.app, name="checkpoints")
app.add_typer(exports.app, name="exports")
sample.register(app)
evals.register(app)
workers.register(app)
models.register(app)
app.add_typer(data.app, name="data")
app.add_typer(tokens.app, name="tokens")
app.add_typer(webhooks.app, name="webhooks")
