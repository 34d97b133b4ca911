"""The ranks' agreement on a stop (worker.training.parallel.AgreedStop) and what rank 0's run
makes of it (worker.training.ranks.drain_when_agreed): real processes, gloo on CPU.

A drain may be asked of a rank other than 0: one of rank 0's node that reads the worker's
stop file a moment after rank 0 did, or one of a gang member whose worker alone was
signalled. Rank 0's run must then drain as if it had asked itself: the stop's save on the
async path within the deadline, and the drain's report. Before, rank 0 started its drain
only from its own read of the stop file; `make soak`'s two-rank drain test caught the race
(no drain report) under load."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.support.ranks import spawn_ranks
from trainctl.worker.drain import Shutdown
from trainctl.worker.launch import DRAIN_FILE
from trainctl.worker.training.parallel import AgreedStop
from trainctl.worker.training.ranks import drain_when_agreed

WORLD = 2


def agree_program(rank: int, world: int, port: int, asker: int, workdir: str) -> None:
    """Two agreements: nobody asks, then only rank `asker` asks for a shutdown. Each rank
    writes what it saw, rank 0 its run's shutdown too."""
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=timedelta(seconds=60),
    )  # fmt: skip
    asked: list[str | None] = [None]
    shutdown, heard = Shutdown(30), []

    def on_agreed(reason: str) -> None:
        heard.append(reason)
        if rank == 0:
            drain_when_agreed(shutdown, Path(workdir))(reason)

    stop = AgreedStop(lambda: asked[0], torch.device("cpu"), on_agreed=on_agreed)
    quiet = stop()
    if rank == asker:
        asked[0] = "shutdown"
    stopped = stop()
    seen: dict[str, Any] = {"quiet": quiet, "stopped": stopped, "reason": stop.reason}
    seen["heard"] = heard
    seen |= {"drain_set": shutdown.is_set(), "since": shutdown.since, "now": time.monotonic()}
    (Path(workdir) / f"rank{rank}.json").write_text(json.dumps(seen))
    dist.destroy_process_group()


def agree(workdir: Path, asker: int) -> list[dict[str, Any]]:
    assert spawn_ranks(agree_program, WORLD, asker, str(workdir), timeout=120) == [0] * WORLD
    return [json.loads((workdir / f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.parametrize("asker", [0, 1], ids=["rank-0-asks", "rank-1-asks"])
def test_every_rank_stops_for_any_rank_s_shutdown_and_rank_0_s_run_drains_from_the_signal(
    tmp_path: Path, asker: int
) -> None:
    signalled = time.monotonic() - 5.0  # when this node's worker was told (its drain file)
    (tmp_path / DRAIN_FILE).write_text(repr(signalled))
    seen = agree(tmp_path, asker)
    for rank in seen:
        assert rank["quiet"] is False and rank["stopped"] is True
        assert rank["reason"] == "shutdown" and rank["heard"] == ["shutdown"]
    assert seen[0]["drain_set"] is True and seen[0]["since"] == signalled
    assert seen[1]["drain_set"] is False  # only rank 0 has a run to drain


def test_without_this_node_s_drain_file_rank_0_s_deadline_counts_from_the_agreement(
    tmp_path: Path,
) -> None:
    # A gang member's worker was signalled, not this node's: no drain file here.
    before = time.monotonic()
    leader = agree(tmp_path, asker=1)[0]
    assert leader["drain_set"] is True
    assert isinstance(leader["since"], float)
    assert before <= leader["since"] <= leader["now"]
