"""`python -m trainctl.service.cli`: the same as the `trainctl` console script."""

from trainctl.service.cli import app

app(prog_name="trainctl")
