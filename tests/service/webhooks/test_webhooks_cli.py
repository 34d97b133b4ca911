"""`trainctl webhooks add|list|remove|deliveries` against the served app and a real receiver:
what each prints where, and its exit codes (service/cli/errors.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.service.cli.invoke import trainctl
from tests.service.webhooks.live import Live, fast_settings, live
from tests.service.webhooks.receiver import Receiver, dead_url


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Live]:
    with live(fast_settings(tmp_path, webhook_max_attempts=2)) as s:
        yield s


def add(service: Live, *args: str) -> dict[str, Any]:
    code, out, err = trainctl(service, "webhooks", "add", *args, "--json")
    assert code == 0, err
    created: dict[str, Any] = json.loads(out)
    return created


def test_add_prints_the_secret_alone_on_stdout_and_what_was_added_on_stderr(
    service: Live, receiver: Receiver
) -> None:
    code, out, err = trainctl(service, "webhooks", "add", receiver.url, "--events", "failed")

    assert code == 0
    assert out.startswith("whsec_") and out.count("\n") == 1
    assert err == (
        f"added webhook 1 for {receiver.url} on failed; its signing secret is not shown again:\n"
    )


def test_events_are_given_comma_separated_or_repeated(service: Live, receiver: Receiver) -> None:
    assert add(service, receiver.url)["events"] == ["cancelled", "failed", "succeeded"]
    assert add(service, receiver.url, "--events", "running,failed")["events"] == [
        "failed", "running"
    ]  # fmt: skip
    repeated = add(service, receiver.url, "--events", "queued", "--events", "succeeded")
    assert repeated["events"] == ["queued", "succeeded"]


def test_an_unknown_event_or_a_bad_url_is_exit_2_with_one_line(service: Live) -> None:
    code, out, err = trainctl(service, "webhooks", "add", "http://x.example/", "--events", "done")
    assert (code, out) == (2, "")
    assert err.startswith("error: ") and "unknown event 'done'" in err
    assert "queued, running, succeeded, failed, cancelled" in err

    code, out, err = trainctl(service, "webhooks", "add", "https://me:pw@x.example/")
    assert (code, out) == (2, "")
    assert "must not hold a user name or password" in err and "(HTTP 422" in err


@pytest.mark.slow
def test_list_shows_each_webhook_without_its_secret(service: Live, receiver: Receiver) -> None:
    code, out, err = trainctl(service, "webhooks", "list")
    assert (code, out) == (0, "") and "no webhooks" in err
    secret = add(service, receiver.url, "--events", "succeeded")["secret"]

    code, out, _ = trainctl(service, "webhooks", "list")
    header, row = out.splitlines()
    assert header.split() == ["ID", "URL", "EVENTS", "CREATED", "BY"]
    assert row.split()[:3] == ["1", receiver.url, "succeeded"]
    code, out, _ = trainctl(service, "webhooks", "list", "--json")
    assert [w["url"] for w in json.loads(out)] == [receiver.url] and secret not in out


@pytest.mark.slow
def test_deliveries_shows_every_attempt_of_the_log(service: Live, receiver: Receiver) -> None:
    receiver.statuses = [500]
    hook = add(service, receiver.url)
    dead = add(service, dead_url())
    code, out, err = trainctl(service, "webhooks", "deliveries", str(hook["id"]))
    assert (code, out) == (0, "") and "no deliveries yet" in err
    run = service.run_to_end()
    service.settled(hook["id"])
    service.settled(dead["id"])

    code, out, _ = trainctl(service, "webhooks", "deliveries", str(hook["id"]))
    lines = out.splitlines()
    assert lines[0].split() == [
        "TIME", "DELIVERY", "RUN", "EVENT", "ATTEMPT", "RESULT", "MS", "STATE"
    ]  # fmt: skip
    assert [line.split()[3:8] for line in lines[1:]] == [  # TIME is a date and a time
        [run.id, "succeeded", "1", "HTTP", "500"],
        [run.id, "succeeded", "2", "HTTP", "200"],
    ]
    code, out, _ = trainctl(service, "webhooks", "deliveries", str(dead["id"]), "--json")
    (delivery,) = json.loads(out)
    assert delivery["state"] == "failed"
    assert [a["error"].split(":")[0] for a in delivery["attempts"]] == ["ConnectError"] * 2


@pytest.mark.slow
def test_remove_then_remove_again_is_exit_1(service: Live, receiver: Receiver) -> None:
    hook = add(service, receiver.url)

    code, out, err = trainctl(service, "webhooks", "remove", str(hook["id"]))
    assert (code, out, err) == (0, "", f"removed webhook 1 ({receiver.url})\n")
    code, out, err = trainctl(service, "webhooks", "remove", str(hook["id"]))
    assert (code, out) == (1, "")
    assert (
        err == "error: webhook 1 does not exist; `trainctl webhooks list` shows them (HTTP 404)\n"
    )
    assert trainctl(service, "webhooks", "deliveries", "1")[0] == 1


@pytest.mark.slow
def test_without_a_service_every_command_is_exit_3() -> None:
    for args in (("add", "http://x.example/"), ("list",), ("remove", "1"), ("deliveries", "1")):
        code, _, err = trainctl(None, "webhooks", *args)
        assert code == 3 and "cannot reach trainctl" in err, args
