"""`make soak`: what `make test` leaves out, and how long the fault rounds run.

One variable says both. TRAINCTL_SOAK_ROUNDS unset or 0 is `make test`: the fault-injection
tests run their short default rounds, and every test marked `soak` is skipped (tests/conftest.py).
Set, it is the number of rounds those tests run (`make soak` sets 300), and the `soak` tests run
too. One alone: `TRAINCTL_SOAK_ROUNDS=1 pytest tests/worker/training/test_fsdp.py`.

A test goes under `soak` when `make test` would not hold it within its 20 minutes on 2 cores
and another test of `make test` covers the same behaviour more cheaply: a second database, a
second architecture, a longer round of the same fault, a compile that takes minutes.

What `make test` still checks of them: mypy reads every test (pyproject's `packages`), so a
soak or gpu test that calls an API the way it no longer takes fails there, not weeks later in
`make soak` or on the first GPU (2026-12-07: `make soak` found three of its 26 tests broken,
one of them by a changed signature that mypy over tests/ names).
"""

from __future__ import annotations

import os


def rounds(default: int) -> int:
    """TRAINCTL_SOAK_ROUNDS, or `default` under `make test`."""
    return int(os.environ.get("TRAINCTL_SOAK_ROUNDS", "0")) or default


SOAK = rounds(0) > 0
SKIP_REASON = "make soak, or TRAINCTL_SOAK_ROUNDS=1 pytest <its file>"
