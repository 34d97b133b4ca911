"""A rank that fails because a peer went away (worker.training.ranks.peer_lost) makes its
gang member's worker requeue the run as a new attempt ("another node went away"), where a
rank's own fault fails the attempt with its error. Real gloo errors, from real processes:
a peer that exits mid-run, and one that hangs past the group's timeout.

`make soak`'s gang test (tests/e2e/test_multinode.py, a leader killed mid-run) once failed
with a gloo error that the old three signs did not know: every gloo transport error is
about a connection to a peer."""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.support.ranks import spawn_ranks
from trainctl.worker.training.ranks import peer_lost

TIMEOUT_SECONDS = 3


def peer_program(rank: int, world: int, port: int, fault: str, out: str) -> None:
    """Rank 0 goes away (`exit`) or stops answering (`hang`) after a few all-reduces; rank 1
    writes what its next one raised, and whether `peer_lost` calls it a peer's loss."""
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=timedelta(seconds=TIMEOUT_SECONDS),
    )  # fmt: skip
    values = torch.zeros(8)
    for _ in range(3):
        dist.all_reduce(values)
    if rank == 0:
        if fault == "hang":
            time.sleep(TIMEOUT_SECONDS * 4)
        os._exit(0)
    try:  # waits on the peer until it is gone, or until the group's timeout
        dist.all_reduce(values)
        seen: dict[str, Any] = {"raised": None}
    except Exception as exc:
        seen = {"raised": str(exc), "peer_lost": peer_lost(exc)}
    Path(out).write_text(json.dumps(seen))
    os._exit(0)  # gloo aborts at a normal exit with a pair still waiting


@pytest.mark.parametrize("fault", ["exit", "hang"])
def test_a_gloo_error_for_a_peer_gone_or_hung_is_a_peer_lost(tmp_path: Path, fault: str) -> None:
    out = tmp_path / "seen.json"
    spawn_ranks(peer_program, 2, fault, str(out), timeout=60)
    seen = json.loads(out.read_text())
    assert seen["raised"] is not None, "the peer's loss went unnoticed"
    assert seen["peer_lost"], seen["raised"]


def test_a_rank_s_own_fault_is_not_a_peer_lost() -> None:
    assert not peer_lost(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not peer_lost(ValueError("the batch holds token ids above the vocabulary"))
