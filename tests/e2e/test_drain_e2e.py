"""POST /workers/{id}/drain against the real service and its supervised worker: the run saves
and is requeued without using an attempt, the worker exits and its supervisor does not start
it again (docs/operations.md, "Preemption and drain")."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.runs import wait_step
from tests.support.polling import poll
from tests.support.service_process import Service
from trainctl.service.sdk.client import TrainctlClient

TOKEN = "drain-test-admin"
STEPS = 100_000  # never reached: the drain ends the attempt


@pytest.mark.slow
def test_a_drained_worker_hands_its_run_back_exits_and_is_not_restarted(service: Service) -> None:
    service.extra_env = {"TRAINCTL_API_TOKEN": TOKEN}
    service.start()
    with TrainctlClient(service.url, TOKEN) as admin:
        drain_mid_run(service, admin)


def drain_mid_run(service: Service, admin: TrainctlClient) -> None:
    submitter = admin.create_token("submitter", "submit").token
    run = admin.submit_train(
        experiment="drained", steps=STEPS, checkpoint_every=STEPS, val_every=STEPS,
        model={"preset": "tiny"}, data={"source": "synthetic"},
        batch={"micro_batch_size": 2, "seq_len": 32}, val_batches=1,
    )  # fmt: skip
    wait_step(admin, run.id, 3)
    (worker,) = admin.workers()

    drain = f"{service.url}/workers/{worker.id}/drain"
    refused = httpx.post(drain, headers={"Authorization": f"Bearer {submitter}"})
    assert refused.status_code == 403, refused.text
    unknown = httpx.post(f"{service.url}/workers/nobody/drain", headers=admin_header())
    assert unknown.status_code == 404
    assert "worker 'nobody' is not registered" in unknown.json()["detail"]
    drained = admin.drain_worker(worker.id)
    assert drained.draining and drained.current_run_id == run.id

    requeued = poll(lambda: (r := admin.get_run(run.id)).state == "queued" and r, what="requeue")
    assert requeued.attempt == 1 and (requeued.progress.step or 0) >= 3
    poll(lambda: admin.workers() == [], what="the drained worker to exit")
    poll(lambda: "drained; not restarted" in service.log_tail(), what="the supervisor's word")
    assert service.log_tail(10**6).count("started worker") == 1
    assert admin.get_run(run.id).state == "queued"  # nobody left to claim it


def admin_header() -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKEN}"}
