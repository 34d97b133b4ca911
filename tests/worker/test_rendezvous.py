"""Where the processes of a multi-process run listen (worker/rendezvous.py): a real worker
runs a two-process CPU train run, and every TCP socket its process tree listens on while
the ranks train is bound to loopback. A gang binds its workers' own address instead:
tests/e2e/test_gang_rendezvous.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.reliability.workers import Workers, wait_finished
from tests.support.plans import enqueue, until_cancelled
from tests.support.polling import poll
from tests.support.sockets import assert_listen_at, listening
from trainctl.store.db.runs import RunStore
from trainctl.worker.rendezvous import host_store, split_endpoint


@pytest.mark.slow  # torchrun and two ranks: the edit loop leaves it to make test
def test_a_two_process_run_listens_on_loopback_alone(tmp_path: Path, runs: RunStore) -> None:
    workers = Workers(tmp_path)
    try:
        worker = workers.start("worker")
        run = enqueue(runs, until_cancelled("exposure", nproc_per_node=2))
        poll(
            lambda: (runs.get(run.id).progress["step"] or 0) >= 2,
            timeout=300,
            what=f"the ranks to train; worker log:\n{workers.logs()}",
        )
        seen = listening(worker.pid)  # while the ranks train: every store and gloo is up
        runs.request_cancel(run.id)
        assert wait_finished(runs, run).state == "cancelled", workers.logs()
    finally:
        workers.close()

    # torchrun's launcher (the rendezvous store), rank 0 (the group's store, gloo), rank 1
    assert_listen_at(seen, "127.0.0.1", processes=3)


def test_the_rendezvous_store_listens_at_its_host_alone() -> None:
    store, endpoint = host_store("127.0.0.1:0")
    host, port = split_endpoint(endpoint)
    try:
        store.set("key", "value")
        mine = [s for s in listening(os.getpid()) if s.port == port]
    finally:
        del store
    assert host == "127.0.0.1" and [str(s.address) for s in mine] == ["127.0.0.1"]
