"""Where a gang listens (worker/rendezvous.py): two worker processes on this machine, as two
"nodes" advertising its non-loopback address, run a two-node CPU train run on PostgreSQL;
every TCP socket their process trees listen on while the ranks train is bound to that
address: not to every interface, not to loopback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.workers import Workers, wait_finished
from tests.support.databases import fresh_database
from tests.support.plans import enqueue, until_cancelled
from tests.support.polling import poll
from tests.support.sockets import assert_listen_at, listening
from trainctl.store.db.runs import RunStore
from trainctl.worker.rendezvous import interface_addresses


def own_address() -> str | None:
    """An IPv4 address of this machine other than loopback."""
    for _, address in interface_addresses():
        if address.version == 4 and not address.is_loopback:
            return str(address)
    return None


def test_a_gang_listens_at_its_workers_address_alone(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    address = own_address()
    if address is None:
        pytest.skip("this machine has no address but loopback")
    plan = until_cancelled("gang-exposure", nnodes=2)
    with fresh_database(request, "postgresql", tmp_path) as url, RunStore(url) as runs:
        runs.create_all()
        workers = Workers(tmp_path, url)
        try:
            procs = [
                workers.start(name, extra_args=["--node-name", name, "--address", address])
                for name in ("node-a", "node-b")
            ]
            run = enqueue(runs, plan)
            poll(
                lambda: (runs.get(run.id).progress["step"] or 0) >= 2,
                timeout=300,
                what=f"the gang to train; worker logs:\n{workers.logs()}",
            )
            seen = [s for proc in procs for s in listening(proc.pid)]
            runs.request_cancel(run.id)
            assert wait_finished(runs, run).state == "cancelled", workers.logs()
        finally:
            workers.close()

    # the leader's launcher (the rendezvous store), global rank 0 (the group's store, gloo),
    # the other rank (gloo)
    assert_listen_at(seen, address, processes=3)
