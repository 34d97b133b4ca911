"""Fault injection for the worker processes that tests/reliability starts; nothing else.

Python imports `sitecustomize` at start-up from sys.path, and the tests put this folder on
PYTHONPATH for their worker only. While the file named by TRAINCTL_FAULT_STORE_FULL exists,
every fsync of a file under TRAINCTL_FAULT_UNDER fails with ENOSPC, the way a full disk
reports delayed writes.
"""

from __future__ import annotations

import errno
import os
from typing import Any


def _inject_a_full_store(under: str, switch: str) -> None:
    real_fsync = os.fsync

    def fsync(fd: Any) -> None:
        number = fd if isinstance(fd, int) else fd.fileno()
        path = os.readlink(f"/proc/self/fd/{number}")
        if os.path.exists(switch) and path.startswith(under + os.sep):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        real_fsync(fd)

    os.fsync = fsync


_UNDER = os.environ.get("TRAINCTL_FAULT_UNDER")
_SWITCH = os.environ.get("TRAINCTL_FAULT_STORE_FULL")
if _UNDER and _SWITCH:
    _inject_a_full_store(_UNDER, _SWITCH)
