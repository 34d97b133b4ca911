"""`python -m service.cli`: the same as the `trainctl` console script."""

from service.cli import app

app(prog_name="trainctl")
