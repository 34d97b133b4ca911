"""The exit codes of `trainctl`, and the CLI's own errors (the service's are `ApiError`s).

0    it worked
1    the run failed or was cancelled (--watch, runs watch); or what was asked could not
     be done: not found (404), refused as it stands (409), a server error, a download
     that does not match its checksum, a declined confirmation
2    usage or bad input: an unknown command or option, a malformed spec or config file,
     a request the service rejected as invalid (400, 422), a missing optional extra
3    the service is unreachable, or refused the token (401, 403)
130  interrupted (Ctrl-C)
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NO_SERVICE = 3
EXIT_INTERRUPTED = 130

AUTH_REFUSED = frozenset({401, 403})
INVALID_REQUEST = frozenset({400, 422})


class BadInput(Exception):
    """What the user gave cannot be used (a malformed spec or config file): exit 2."""


class MissingExtra(BadInput):
    """A command needs a dependency that only an extra (`trainctl[server]`) installs."""
