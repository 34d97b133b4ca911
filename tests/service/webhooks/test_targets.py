"""Where a webhook may not send (service/webhooks/targets.py): every address that is, or
carries inside it, a cloud metadata or link-local address, refused where a delivery connects
and, written in the URL, at registration; and IPv4 addresses in the forms that resolvers
read differently, refused at registration naming the form."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from trainctl.service.app import create_app
from trainctl.service.settings import Settings
from trainctl.service.webhooks.targets import HostPolicy, blocked_reason

REFUSED = [
    ("168.63.129.16", "metadata"),  # Azure's WireServer
    ("100.100.100.200", "metadata"),  # Alibaba Cloud
    ("192.0.0.192", "metadata"),  # Oracle Cloud (classic)
    ("fd20:ce::254", "metadata"),  # Google Cloud over IPv6
    ("fd00:ec2::254", "metadata"),  # AWS over IPv6
    ("fd00:ec2::23", "metadata"),  # AWS EKS Pod Identity over IPv6
    ("169.254.169.254", "link-local"),  # AWS, Google, Azure, Oracle, OpenStack, ...
    ("169.254.170.2", "link-local"),  # AWS ECS task credentials
    ("fe80::a9fe:a9fe", "link-local"),  # OpenStack over IPv6
    ("::ffff:169.254.169.254", "inside"),  # IPv4-mapped
    ("::ffff:168.63.129.16", "inside"),
    ("::a9fe:a9fe", "inside"),  # IPv4-compatible
    ("::ffff:0:a9fe:a9fe", "inside"),  # IPv4-translated
    ("2002:a9fe:a9fe::1", "inside"),  # 6to4
    ("2002:a83f:8110::", "inside"),  # 6to4 of the WireServer
    ("64:ff9b::a9fe:a9fe", "inside"),  # NAT64, the well-known prefix
    ("64:ff9b:1::a9fe:a9fe", "inside"),  # NAT64, a local-use /96
    ("64:ff9b:1:a9fe:a9:fe00::", "inside"),  # NAT64, a local-use /48
    ("2001:0:4136:e378:8000:63bf:5601:5601", "inside"),  # Teredo, its client
    ("2001:0:a9fe:a9fe::1", "inside"),  # Teredo, its server
]
ALLOWED = [
    "127.0.0.1", "::1", "::ffff:127.0.0.1", "10.1.2.3", "8.8.8.8", "64:ff9b::808:808",
    "64:ff9b:1::808:808", "2002:808:808::1", "2001:db8::1", "fd00::2",
]  # fmt: skip


@pytest.mark.parametrize(("address", "why"), REFUSED)
def test_an_address_that_is_or_carries_a_metadata_or_link_local_one_is_refused(
    address: str, why: str
) -> None:
    reason = blocked_reason(ipaddress.ip_address(address))

    assert reason is not None and why in reason, reason
    connected = HostPolicy.parse([]).check_address("hook.example", ipaddress.ip_address(address))
    assert connected is not None and "refused unless TRAINCTL_WEBHOOK_ALLOWED_HOSTS" in connected


@pytest.mark.parametrize("address", ALLOWED)
def test_loopback_private_and_public_addresses_stay_allowed(address: str) -> None:
    assert blocked_reason(ipaddress.ip_address(address)) is None


def test_an_operator_may_still_list_a_refused_address() -> None:
    policy = HostPolicy.parse(["168.63.129.16"])

    assert policy.check_host("168.63.129.16") is None
    assert policy.check_address("168.63.129.16", ipaddress.ip_address("168.63.129.16")) is None


# --- at registration --------------------------------------------------------------------------

BOOT = "bootstrap-token"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(data_dir=tmp_path, workers=0, api_token=BOOT)
    with TestClient(create_app(settings), base_url="http://localhost") as client:
        yield client


def register(api: TestClient, url: str) -> tuple[int, str]:
    answer = api.post("/webhooks", json={"url": url}, headers={"Authorization": f"Bearer {BOOT}"})
    return answer.status_code, str(answer.json().get("detail", ""))


@pytest.mark.parametrize(
    ("host", "why"),
    [
        ("168.63.129.16", "a cloud metadata service's address"),
        ("169.254.169.254", "a link-local address"),
        ("100.100.100.200", "a cloud metadata service's address"),
        ("metadata.google.internal", "a cloud metadata service's name"),
        ("0.0.0.0", "an unspecified address"),
        ("224.0.0.1", "a multicast address"),
    ],
)
def test_a_refused_address_or_metadata_name_in_the_url_is_a_422_at_registration(
    api: TestClient, host: str, why: str
) -> None:
    status, detail = register(api, f"http://{host}:8080/hook")

    assert status == 422 and why in detail, detail
    assert "TRAINCTL_WEBHOOK_ALLOWED_HOSTS" in detail


@pytest.mark.parametrize(
    ("host", "form"),
    [
        ("0177.0.0.1", "octal"),
        ("0251.0376.0251.0376", "octal"),
        ("10.0.0.010", "octal"),
        ("0x7f.0.0.1", "hexadecimal"),
        ("0x7f.1", "hexadecimal"),
        ("0xa9fea9fe", "hexadecimal"),
        ("127.1", "fewer than four parts"),
        ("169.254.43518", "fewer than four parts"),
        ("2130706433", "fewer than four parts"),
        ("1.2.3.4.5", "no IPv4 address and no host name"),
        ("hooks.example.123", "no IPv4 address and no host name"),
    ],
)
def test_an_ipv4_address_in_a_form_resolvers_disagree_on_is_a_422_naming_it(
    api: TestClient, host: str, form: str
) -> None:
    status, detail = register(api, f"http://{host}/hook")

    assert status == 422 and form in detail, detail


@pytest.mark.parametrize("host", ["127.0.0.1", "10.0.0.10", "hooks.example.com", "localhost"])
def test_four_part_decimal_addresses_and_names_are_registered(api: TestClient, host: str) -> None:
    assert register(api, f"http://{host}:9/hook")[0] == 201
