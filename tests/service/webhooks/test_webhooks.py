"""Webhooks against a real receiver (receiver.py), which checks each POST's signature the way
docs/operations.md "Notifications" tells receivers to. The service is served by uvicorn with its
dispatcher (live.py); runs change state through the run store, as a worker changes them
(tests/e2e/test_webhooks_e2e.py does it with a real worker)."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.service.webhooks.live import Live, fast_settings, live
from tests.service.webhooks.receiver import (
    DOCUMENTED_VERIFY,
    Receiver,
    dead_url,
    signature_is_valid,
)
from trainctl.service.webhooks.signing import sign
from trainctl.store.db.runs import RunStore


def test_the_documented_check_accepts_what_the_service_signs_and_nothing_else() -> None:
    body, now = b'{"event":"failed"}', int(time.time())
    header = sign("whsec_1", body, timestamp=now)

    assert DOCUMENTED_VERIFY("whsec_1", body, header)
    assert not DOCUMENTED_VERIFY("whsec_2", body, header)
    assert not DOCUMENTED_VERIFY("whsec_1", body + b" ", header)
    assert not DOCUMENTED_VERIFY("whsec_1", body, sign("whsec_1", body, timestamp=now - 301))
    for malformed in ("", "garbage", "v1=abc", f"t={now}", f"t={now},t={now},{header}"):
        assert not DOCUMENTED_VERIFY("whsec_1", body, malformed), malformed


# --- notifications ----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_finished_run_is_posted_signed_with_its_delivery_id_and_public_shape(
    service: Live, receiver: Receiver
) -> None:
    webhook = service.add_webhook(receiver.url)
    run = service.run_to_end("succeeded")

    (delivery,) = service.settled(webhook["id"])
    (request,) = receiver.received  # `running` is not a default event: only the end came
    payload = request.payload
    assert request.path == "/hook"
    assert request.headers["Content-Type"] == "application/json"
    assert signature_is_valid(webhook["secret"], request.headers["X-Trainctl-Signature"],
                              request.body)  # fmt: skip
    assert not signature_is_valid("whsec_another", request.headers["X-Trainctl-Signature"],
                                  request.body)  # fmt: skip
    assert request.headers["X-Trainctl-Delivery"] == payload["delivery_id"] == delivery["id"]
    assert request.headers["X-Trainctl-Event"] == "succeeded"
    assert (payload["event"], payload["previous"]) == ("succeeded", "running")
    assert payload["run"] == service.get(f"/runs/{run.id}").json()  # the run's public shape
    assert payload["evals"] == {}  # never scored
    assert (delivery["run_id"], delivery["event"], delivery["state"]) == (
        run.id, "succeeded", "succeeded"
    )  # fmt: skip
    assert [(a["attempt"], a["status_code"], a["error"]) for a in delivery["attempts"]] == [
        (1, 200, None)
    ]


@pytest.mark.slow
def test_a_scored_run_is_posted_with_each_tasks_newest_scores_and_their_step(
    service: Live, receiver: Receiver
) -> None:
    webhook = service.add_webhook(receiver.url)
    scored = [  # two checkpoints scored as the run went on: MMLU only at the first
        {"kind": "eval", "step": 10, "evaluate_run": "e1", "eval/arc_easy/acc": 0.25,
         "eval/arc_easy/acc_norm": 0.5, "eval/mmlu_anatomy/acc": 0.375},
        {"kind": "train", "step": 15, "loss": 2.0},
        {"kind": "eval", "step": 20, "evaluate_run": "e2", "eval/arc_easy/acc": 0.625,
         "eval/arc_easy/acc_norm": 0.75},
    ]  # fmt: skip
    service.run_to_end("succeeded", metrics=scored)

    service.settled(webhook["id"])
    (request,) = receiver.received

    assert request.payload["evals"] == {
        "arc_easy": {"step": 20, "metrics": {"acc": 0.625, "acc_norm": 0.75}},
        "mmlu_anatomy": {"step": 10, "metrics": {"acc": 0.375}},
    }


@pytest.mark.slow
def test_events_choose_which_state_changes_are_posted(service: Live, receiver: Receiver) -> None:
    webhook = service.add_webhook(receiver.url, events=["running", "failed"])
    assert webhook["events"] == ["failed", "running"]
    service.run_to_end("succeeded")
    failed = service.run_to_end("failed")

    service.settled(webhook["id"], count=3)

    events = [(r.payload["run"]["id"], r.payload["event"]) for r in receiver.received]
    assert len(events) == 3 and (failed.id, "failed") in events
    assert [e for _, e in events].count("running") == 2


@pytest.mark.slow
def test_a_straggler_and_a_hang_are_posted_as_alerts_with_their_data(
    service: Live, receiver: Receiver
) -> None:
    webhook = service.add_webhook(receiver.url, events=["straggler", "hang"])
    run = service.runs.enqueue("benchmark", "hooks", {"steps": 1})
    assert service.runs.claim("test-worker", lease_seconds=60) is not None
    slow = {"step": 20, "slowdowns": {"1": 0.5}, "threshold": 0.2, "window": 20}
    hang = {"ranks": [1, 0], "step": 30, "phase": "a training step", "late_seconds": 0.2}
    for message, data in (("rank 1 is slow", {"straggler": slow}), ("saved", {}),
                          ("rank 1 hung", {"hang": hang})):  # fmt: skip
        service.runs.append_event(run.id, "log", {"level": "warning", "message": message, **data})
    service.runs.finish(run.id, "test-worker", 1, "failed", error="it broke")

    service.settled(webhook["id"], count=2)

    got = sorted(
        (r.payload["event"], r.payload["previous"], r.payload["reason"], r.payload["alert"])
        for r in receiver.received
    )
    assert got == [
        ("hang", "running", "rank 1 hung", hang),
        ("straggler", "running", "rank 1 is slow", slow),
    ]  # and no delivery for the other log line or for `failed`, which it did not ask for


def test_a_loss_health_intervention_is_posted_to_the_webhooks_that_ask_for_health(
    service: Live, receiver: Receiver
) -> None:
    webhook = service.add_webhook(receiver.url, events=["health", "succeeded"])
    health = {"step": 13, "loss": 6.3, "reason": "spike", "action": "rewind", "statistic": 5.4,
              "window": [24, 26], "rewound_to": 8}  # fmt: skip
    lines: list[dict[str, Any]] = [
        {"level": "info", "message": "saved checkpoint e/step_8 at step 8"},  # not notified
        {"level": "warning", "message": "health: step 13: rewound", "health": health},
    ]
    run = service.run_to_end("succeeded", logs=lines)

    service.settled(webhook["id"], count=2)

    # Deliveries of one run may arrive in any order (each webhook sends several at once).
    got = {r.headers["X-Trainctl-Event"]: r.payload for r in receiver.received}
    first, last = got["health"], got["succeeded"]
    assert (first["event"], first["previous"], first["alert"]) == ("health", "running", health)
    assert first["reason"] == "health: step 13: rewound" and first["run"]["id"] == run.id
    assert (last["event"], last["alert"]) == ("succeeded", None)


@pytest.mark.slow
def test_a_receiver_that_fails_is_retried_with_the_same_delivery_id_and_logged(
    service: Live, receiver: Receiver
) -> None:
    receiver.statuses = [500, 503]
    webhook = service.add_webhook(receiver.url)
    service.run_to_end()

    (delivery,) = service.settled(webhook["id"])

    assert delivery["state"] == "succeeded"
    assert [(a["attempt"], a["status_code"]) for a in delivery["attempts"]] == [
        (1, 500), (2, 503), (3, 200)
    ]  # fmt: skip
    assert all(a["duration_ms"] >= 0 and a["started_at"] for a in delivery["attempts"])
    assert {r.headers["X-Trainctl-Delivery"] for r in receiver.received} == {delivery["id"]}
    assert len({r.body for r in receiver.received}) == 1  # every attempt sends the same body


@pytest.mark.slow
def test_a_receiver_that_never_answers_2xx_is_given_up_after_the_attempts(
    service: Live, receiver: Receiver
) -> None:
    receiver.statuses = [500, 500, 500, 500]
    webhook = service.add_webhook(receiver.url)
    service.run_to_end()

    (delivery,) = service.settled(webhook["id"])

    assert delivery["state"] == "failed" and delivery["next_attempt_at"] is None
    assert [a["status_code"] for a in delivery["attempts"]] == [500, 500, 500]


@pytest.mark.slow
def test_a_dead_receiver_is_retried_logged_and_given_up(service: Live) -> None:
    webhook = service.add_webhook(dead_url())
    service.run_to_end()

    (delivery,) = service.settled(webhook["id"])

    assert delivery["state"] == "failed"
    assert len(delivery["attempts"]) == 3
    for attempt in delivery["attempts"]:
        assert attempt["status_code"] is None and attempt["error"].startswith("ConnectError")


@pytest.mark.slow
def test_a_slow_receiver_never_blocks_the_api(tmp_path: Path, receiver: Receiver) -> None:
    with live(fast_settings(tmp_path, webhook_timeout_seconds=1.0)) as service:
        slow_receiver_never_blocks_the_api(service, receiver)


def slow_receiver_never_blocks_the_api(service: Live, receiver: Receiver) -> None:
    receiver.hold.clear()  # each POST waits: longer than the service's 1 s timeout
    webhook = service.add_webhook(receiver.url, events=["succeeded"])
    service.run_to_end()
    assert receiver.holding.wait(timeout=30), "the delivery never came"

    # The delivery is in flight, its receiver silent: the API answers all the same.
    assert service.get("/healthz").status_code == 200
    assert service.get("/runs").status_code == 200
    assert service.post("/webhooks", {"url": receiver.url}).status_code == 201
    in_flight = service.deliveries(webhook["id"])
    assert in_flight[0]["state"] == "pending"

    (delivery,) = service.settled(webhook["id"])
    assert delivery["state"] == "failed"
    assert [a["error"] for a in delivery["attempts"]] == ["no answer within 1 s"] * 3
    assert all(a["duration_ms"] < 10_000 for a in delivery["attempts"])


@pytest.mark.slow
def test_a_removed_webhook_gets_nothing_more(service: Live, receiver: Receiver) -> None:
    webhook = service.add_webhook(receiver.url)
    removed = httpx.delete(f"{service.url}/webhooks/{webhook['id']}", timeout=10)
    assert removed.status_code == 200 and removed.json()["url"] == receiver.url
    kept = service.add_webhook(receiver.url, events=["failed"])
    service.run_to_end("failed")

    service.settled(kept["id"])

    assert [r.headers["X-Trainctl-Delivery"] for r in receiver.received] == [
        d["id"] for d in service.deliveries(kept["id"])
    ]
    assert service.get(f"/webhooks/{webhook['id']}/deliveries").status_code == 404
    assert httpx.delete(f"{service.url}/webhooks/{webhook['id']}").status_code == 404


@pytest.mark.slow
def test_a_webhook_hears_only_of_changes_after_it_was_registered(
    service: Live, receiver: Receiver
) -> None:
    before = service.run_to_end()
    webhook = service.add_webhook(receiver.url)
    after = service.run_to_end()

    (delivery,) = service.settled(webhook["id"])

    assert delivery["run_id"] == after.id != before.id
    assert [r.payload["run"]["id"] for r in receiver.received] == [after.id]


@pytest.mark.slow
def test_a_restart_neither_loses_nor_repeats_a_notification(
    tmp_path: Path, receiver: Receiver
) -> None:
    settings = fast_settings(tmp_path)
    with live(settings) as first:
        webhook = first.add_webhook(receiver.url)
        one = first.run_to_end()
        first.settled(webhook["id"])
    # While no service runs, a run ends (a worker on another node finishing it).
    with RunStore(settings.db_url) as runs:
        two = Live("", runs).run_to_end("failed")

    with live(settings) as second:
        three = second.run_to_end("cancelled")
        deliveries = second.settled(webhook["id"], count=3)

    ids = [r.headers["X-Trainctl-Delivery"] for r in receiver.received]
    assert len(ids) == len(set(ids)) == 3
    assert sorted(r.payload["run"]["id"] for r in receiver.received) == sorted(
        [one.id, two.id, three.id]
    )
    assert sorted(d["id"] for d in deliveries) == sorted(ids)


@pytest.mark.slow
def test_two_services_on_one_database_send_each_notification_once(
    database_url: str, tmp_path: Path, receiver: Receiver
) -> None:
    """Only the lease holder dispatches; both read the same event log."""
    first = fast_settings(tmp_path / "a", database_url=database_url)
    second = fast_settings(tmp_path / "b", database_url=database_url)
    with live(first) as a, live(second) as b:
        webhook = a.add_webhook(receiver.url, events=["running", "succeeded"])
        for _ in range(3):
            b.run_to_end()
        deliveries = b.settled(webhook["id"], count=6)

    # One delivery per state change, made by one service, and every request the receiver
    # got is an attempt one of them recorded: none was sent by both.
    assert len(deliveries) == 6 and all(d["state"] == "succeeded" for d in deliveries)
    ids = [r.headers["X-Trainctl-Delivery"] for r in receiver.received]
    assert Counter(ids) == {d["id"]: len(d["attempts"]) for d in deliveries}


@pytest.mark.slow
def test_a_host_the_allow_list_no_longer_names_is_refused_where_it_connects(
    tmp_path: Path, receiver: Receiver
) -> None:
    """Registered while any host was allowed; the operator then narrowed the list."""
    with live(fast_settings(tmp_path)) as open_service:
        webhook = open_service.add_webhook(receiver.url)

    narrowed = fast_settings(tmp_path, webhook_allowed_hosts="hooks.example.com,10.0.0.0/8")
    with live(narrowed) as service:
        refused = service.post("/webhooks", {"url": receiver.url})
        assert refused.status_code == 422
        assert "not in TRAINCTL_WEBHOOK_ALLOWED_HOSTS" in refused.json()["detail"]
        service.run_to_end()
        (delivery,) = service.settled(webhook["id"])

    assert receiver.received == []  # nothing was written to the refused address
    assert delivery["attempts"][0]["error"] == (
        "refused: 127.0.0.1 (127.0.0.1) is not in TRAINCTL_WEBHOOK_ALLOWED_HOSTS"
    )
