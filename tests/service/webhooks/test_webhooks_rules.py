"""The rules of webhooks, one by one: which URLs a webhook may name, where a delivery may
connect, the signature scheme, the dispatcher's cursor over the event log, the retry
schedule, and who may manage webhooks (service/webhooks, store/db/webhooks.py)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st

from trainctl.service.app import create_app
from trainctl.service.settings import Settings
from trainctl.service.webhooks.dispatcher import next_cursor
from trainctl.service.webhooks.signing import SignatureError, sign, verify
from trainctl.service.webhooks.targets import (
    URL_PATTERN,
    HostPolicy,
    blocked_reason,
    check_url,
    url_host,
)
from trainctl.store.db.webhooks import RetryPolicy

# --- URLs -------------------------------------------------------------------------------------

# JSON Schema's `$` is the very end of the string (Python's `\Z`): the pattern as validators
# and generators read it.
ECMA_URL_PATTERN = URL_PATTERN.removesuffix("$") + r"\Z"


@given(st.from_regex(ECMA_URL_PATTERN, fullmatch=True).filter(lambda u: len(u) <= 2000))
def test_every_url_the_published_pattern_allows_is_accepted_and_sendable(url: str) -> None:
    assert check_url(url) == url
    parsed = httpx.URL(url)
    assert parsed.scheme in ("http", "https") and parsed.host == url_host(url)
    httpx.Request("POST", url)  # httpx can send it


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("ftp://example.com/hook", "starts with http:// or https://"),
        ("example.com/hook", "starts with http:// or https://"),
        ("HTTP://example.com/hook", "starts with http:// or https://"),
        ("https://user:secret@example.com/hook", "must not hold a user name or password"),
        ("https://token@example.com/hook", "must not hold a user name or password"),
        ("https://example.com/hook#part", "no fragment"),
        ("https://example.com:0/hook", "not a webhook URL"),
        ("https://example.com:65536/hook", "not a webhook URL"),
        ("https://exa mple.com/hook", "not a webhook URL"),
        ("https://example.com/a hook", "not a webhook URL"),
        ("https://[::1]:8080/hook", "not a webhook URL"),
        ("https:///hook", "not a webhook URL"),
        ("https://-example.com/", "not a webhook URL"),
        ("https://example.com/hook\n", "not a webhook URL"),
        ("https://example.com/é", "not a webhook URL"),
    ],
)
def test_a_url_a_webhook_may_not_name_is_refused_saying_why(url: str, why: str) -> None:
    assert not re.search(ECMA_URL_PATTERN, url)
    with pytest.raises(ValueError, match=re.escape(why)):
        check_url(url)


# --- where a delivery may connect -------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "refused"),
    [
        ("127.0.0.1", None),
        ("::1", None),
        ("10.1.2.3", None),
        ("192.168.0.7", None),
        ("8.8.8.8", None),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("::ffff:169.254.169.254", "link-local"),
        ("fd00:ec2::254", "cloud metadata"),
        ("100.100.100.200", "cloud metadata"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("240.0.0.1", "reserved"),
    ],
)
def test_the_default_policy_refuses_metadata_link_local_and_unroutable_addresses(
    address: str, refused: str | None
) -> None:
    reason = blocked_reason(ipaddress.ip_address(address))

    assert (reason is None) == (refused is None)
    if refused is not None:
        assert reason is not None and refused in reason


def test_an_allow_list_admits_its_names_suffixes_and_networks_only() -> None:
    policy = HostPolicy.parse(["hooks.example.com", "*.corp.example", "10.0.0.0/8", "::1"])
    loopback = ipaddress.ip_address("127.0.0.1")

    for host in ("hooks.example.com", "ci.corp.example", "10.9.8.7", "::1"):
        assert policy.check_host(host) is None, host
    for host in ("corp.example", "example.com", "127.0.0.1", "localhost"):
        assert "not in TRAINCTL_WEBHOOK_ALLOWED_HOSTS" in (policy.check_host(host) or ""), host
    # A listed name may resolve anywhere: the operator named it. Others only into a network.
    assert policy.check_address("hooks.example.com", loopback) is None
    assert policy.check_address("other.example", ipaddress.ip_address("10.0.0.1")) is None
    assert policy.check_address("other.example", loopback) is not None


def test_without_an_allow_list_any_host_is_registered_and_addresses_decide() -> None:
    policy = HostPolicy.parse([])
    metadata = ipaddress.ip_address("169.254.169.254")

    assert policy.check_host("meta.example") is None  # a name: refused where it connects
    assert "link-local" in (policy.check_host("169.254.169.254") or "")  # an address: now
    assert policy.check_address("localhost", ipaddress.ip_address("127.0.0.1")) is None
    assert "169.254.169.254, a link-local" in (policy.check_address("meta", metadata) or "")


def test_a_bad_allow_list_entry_stops_the_service_naming_it() -> None:
    with pytest.raises(ValueError, match="'not a host' is neither"):
        Settings(webhook_allowed_hosts="example.com, not a host")


# --- the signature ----------------------------------------------------------------------------


def test_a_signature_verifies_only_with_its_secret_body_and_a_fresh_timestamp() -> None:
    body, now = b'{"event":"succeeded"}', 1_800_000_000
    header = sign("whsec_1", body, timestamp=now)

    assert header.startswith(f"t={now},v1=")
    assert verify("whsec_1", body, header, now=now + 299) == now
    for secret, sent, at, why in [
        ("whsec_2", body, now, "no v1 signature matches"),
        ("whsec_1", body + b" ", now, "no v1 signature matches"),
        ("whsec_1", body, now + 301, "more than 300 s from now"),
        ("whsec_1", body, now - 301, "more than 300 s from now"),
    ]:
        with pytest.raises(SignatureError, match=why):
            verify(secret, sent, header, now=at)


def test_a_replayed_body_with_a_new_timestamp_does_not_verify() -> None:
    body, now = b"{}", 1_800_000_000
    mac = sign("whsec_1", body, timestamp=now).partition("v1=")[2]

    with pytest.raises(SignatureError, match="no v1 signature matches"):
        verify("whsec_1", body, f"t={now + 600},v1={mac}", now=now + 600)


@pytest.mark.parametrize("header", ["", "v1=abc", "t=1,t=2,v1=abc", "t=١٢,v1=abc", "t=1"])
def test_a_malformed_signature_header_is_refused(header: str) -> None:
    with pytest.raises(SignatureError, match="malformed"):
        verify("whsec_1", b"{}", header, now=1)


def test_a_header_with_several_signatures_verifies_when_one_matches() -> None:
    body = b"{}"
    good = sign("whsec_1", body, timestamp=10)

    assert verify("whsec_1", body, f"{good},v1=deadbeef", now=10) == 10


# --- the cursor over the event log ------------------------------------------------------------


def test_the_cursor_moves_over_contiguous_ids_and_waits_at_a_young_gap() -> None:
    gaps: dict[int, float] = {}

    assert next_cursor(10, [11, 12, 13], gaps, now=0.0, grace=60) == 13
    assert next_cursor(10, [11, 13, 14], gaps, now=0.0, grace=60) == 11  # 12 may still commit
    assert gaps == {13: 0.0}
    assert next_cursor(11, [13, 14], gaps, now=59.0, grace=60) == 11
    assert next_cursor(11, [12, 13, 14], gaps, now=59.5, grace=60) == 14  # it did
    assert gaps == {}


def test_a_gap_older_than_the_grace_is_a_rolled_back_id_and_passed() -> None:
    gaps: dict[int, float] = {}

    assert next_cursor(0, [1, 3], gaps, now=100.0, grace=60) == 1
    assert next_cursor(1, [3, 4], gaps, now=160.0, grace=60) == 4
    assert gaps == {}


def test_retries_wait_longer_each_time_up_to_the_cap() -> None:
    retry = RetryPolicy(max_attempts=10, base_seconds=10, max_seconds=3600)

    assert [retry.delay(n) for n in range(1, 10)] == [
        10, 20, 40, 80, 160, 320, 640, 1280, 2560
    ]  # fmt: skip
    assert retry.delay(12) == 3600 and retry.delay(10_000) == 3600


# --- the API: who may, and what is refused ----------------------------------------------------

BOOT = "bootstrap-token"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(data_dir=tmp_path, workers=0, api_token=BOOT)
    with TestClient(create_app(settings), base_url="http://localhost") as client:
        yield client


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def token(api: TestClient, scope: str) -> str:
    created = api.post("/tokens", json={"name": scope, "scope": scope}, headers=auth(BOOT))
    value: str = created.json()["token"]
    return value


def test_only_admins_manage_webhooks_or_read_them(api: TestClient) -> None:
    hook = {"url": "http://localhost:9/hook"}
    for scope in ("read", "submit"):
        headers = auth(token(api, scope))
        assert api.post("/webhooks", json=hook, headers=headers).status_code == 403
        assert api.get("/webhooks", headers=headers).status_code == 403
        assert api.get("/webhooks/1/deliveries", headers=headers).status_code == 403
        assert api.delete("/webhooks/1", headers=headers).status_code == 403
    assert api.get("/webhooks").status_code == 401

    created = api.post("/webhooks", json=hook, headers=auth(BOOT))
    assert created.status_code == 201
    assert created.json()["created_by"] == "bootstrap"
    assert created.json()["secret"].startswith("whsec_")


def test_the_secret_is_shown_once_and_never_listed(api: TestClient) -> None:
    secret = api.post("/webhooks", json={"url": "http://localhost:9/"}, headers=auth(BOOT))
    listed = api.get("/webhooks", headers=auth(BOOT))

    assert secret.json()["secret"] not in listed.text
    assert "secret" not in listed.json()["items"][0]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("body", "why"),
    [
        ({"url": "https://u:p@example.com/"}, "must not hold a user name or password"),
        ({"url": "file:///etc/passwd"}, "starts with http:// or https://"),
        ({"url": "https://example.com/", "events": []}, "at least 1 item"),
        ({"url": "https://example.com/", "events": ["finished"]}, "body.events.0"),
        ({"url": "https://example.com/", "secret": "mine"}, "body.secret"),
        ({"url": 7}, "body.url"),
    ],
)
def test_a_webhook_that_cannot_be_registered_is_a_422_naming_the_rule(
    api: TestClient, body: dict[str, object], why: str
) -> None:
    response = api.post("/webhooks", json=body, headers=auth(BOOT))

    assert response.status_code == 422
    assert why in response.json()["detail"]


def test_duplicate_events_are_kept_once(api: TestClient) -> None:
    body = {"url": "https://example.com/", "events": ["failed", "failed", "running"]}

    assert api.post("/webhooks", json=body, headers=auth(BOOT)).json()["events"] == [
        "failed",
        "running",
    ]
