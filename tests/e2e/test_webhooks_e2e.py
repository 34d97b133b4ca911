"""Webhooks end to end: the real service (`python -m trainctl.service`) and its worker train a
tiny run, and a real receiver on loopback gets the signed notification; the service restarts
and the next run's notification comes, none twice."""

from __future__ import annotations

from tests.service.webhooks.receiver import Receiver, signature_is_valid
from tests.support.polling import poll
from tests.support.service_process import Service
from trainctl.service.schemas import DeliveryPublic, RunPublic
from trainctl.service.sdk.client import TrainctlClient
from trainctl.store.vocabulary import TERMINAL_STATES

TINY_TRAIN = {
    "steps": 2,
    "data": {"source": "synthetic"},
    "batch": {"micro_batch_size": 2, "seq_len": 16},
}
FAST = {"TRAINCTL_WEBHOOK_POLL_SECONDS": "0.1", "TRAINCTL_WEBHOOK_RETRY_SECONDS": "0.2"}


def train(client: TrainctlClient, experiment: str) -> RunPublic:
    run = client.submit("train", {"experiment": experiment, **TINY_TRAIN})
    done: RunPublic = poll(
        lambda: (r := client.get_run(run.id)).state in TERMINAL_STATES and r,
        timeout=600,
        what=f"run {run.id} to finish",
    )
    assert done.state == "succeeded", done.error
    return done


def settled(client: TrainctlClient, webhook_id: int, count: int) -> list[DeliveryPublic]:
    """The webhook's deliveries once there are `count`, each answered with a 2xx."""
    deliveries: list[DeliveryPublic] = poll(
        lambda: (
            len(d := client.webhook_deliveries(webhook_id)) == count
            and all(x.state == "succeeded" for x in d)
            and d
        ),
        timeout=60,
        what=f"{count} deliveries to succeed",
    )
    return deliveries


def test_a_trained_run_is_notified_signed_and_a_restart_repeats_nothing(
    service: Service,
) -> None:
    service.extra_env.update(FAST)
    with Receiver(statuses=[502]) as receiver:  # the first attempt fails: it is retried
        service.start(workers=1)
        with TrainctlClient(service.url) as client:
            webhook = client.create_webhook(receiver.url, ["running", "succeeded"])
            first = train(client, "hooks-1")
            settled(client, webhook.id, 2)  # recorded: a stop now cuts no send short
        assert service.stop()

        service.start(workers=1)
        with TrainctlClient(service.url) as client:
            second = train(client, "hooks-2")
            deliveries = settled(client, webhook.id, 4)

    for request in receiver.received:
        assert signature_is_valid(webhook.secret, request.headers["X-Trainctl-Signature"],
                                  request.body)  # fmt: skip
        assert request.headers["X-Trainctl-Delivery"] == request.payload["delivery_id"]
    notified = [(r.payload["run"]["id"], r.payload["event"]) for r in receiver.received]
    assert sorted(set(notified)) == sorted(
        [(first.id, "running"), (first.id, "succeeded"),
         (second.id, "running"), (second.id, "succeeded")]
    )  # fmt: skip
    ids = [r.headers["X-Trainctl-Delivery"] for r in receiver.received]
    assert len(ids) == 5 and len(set(ids)) == 4  # the 502 was retried under its own id
    assert sorted({d.id for d in deliveries}) == sorted(set(ids))
    ended = next(r.payload for r in receiver.received if r.payload["event"] == "succeeded")
    assert ended["run"]["result"]["step"] == 2 and ended["run"]["state"] == "succeeded"
    retried = next(d for d in deliveries if len(d.attempts) == 2)
    assert [a.status_code for a in retried.attempts] == [502, 200]
