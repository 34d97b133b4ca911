"""`python -m trainctl.service`: serve the API (and supervise local workers) with uvicorn.

`trainctl serve` is the same, and the command to use. This module takes the working folder
off `sys.path` before it imports anything but `os` and `sys` (docs/architecture.md, "Rooms");
what Python imports before it runs (the standard library modules `trainctl` itself needs) it
cannot protect.
"""

from __future__ import annotations

import os
import sys

# Before any other import (see above): `python -m` put the working folder first.
if not sys.flags.safe_path and sys.path and sys.path[0] == os.getcwd():
    del sys.path[0]

import argparse

import uvicorn

from trainctl.service.app import create_app
from trainctl.service.logs import configure_logging
from trainctl.service.middleware import H11WithHeaders
from trainctl.service.settings import get_settings, is_loopback

# On SIGTERM uvicorn waits for open responses to finish, and an event stream of a queued run
# never does: past this it cancels them (clients resume by event id), so the lifespan, which
# lets workers checkpoint and hand their runs back, is not left to Docker's SIGKILL.
GRACEFUL_SHUTDOWN_SECONDS = 5


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainctl.service", description=__doc__)
    parser.add_argument("--host", help="bind address (default: TRAINCTL_HOST, 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (default: TRAINCTL_PORT, 8000)")
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="allow a non-loopback host without TRAINCTL_API_TOKEN",
    )
    args = parser.parse_args(argv)
    settings = get_settings()
    host = args.host or settings.host
    port = args.port if args.port is not None else settings.port
    if not is_loopback(host) and settings.api_token is None and not args.insecure:
        print(
            f"refusing to serve on {host} without TRAINCTL_API_TOKEN (unset, empty or blank): "
            "anyone who can reach it could run jobs and delete checkpoints; set a token, bind "
            "127.0.0.1, or pass --insecure",
            file=sys.stderr,
        )
        return 2
    configure_logging()
    # Our middleware writes the access lines (with request ids); uvicorn's would repeat them.
    uvicorn.run(
        create_app(settings),
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        http=H11WithHeaders,  # its own 400s carry the security headers too
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
