"""Where a webhook may send: the URLs a webhook may name, and the hosts and addresses the
service will connect to (docs/architecture.md, "Webhooks").

A webhook URL is `http` or `https`, a host name or IPv4 address, an optional port and a path
of printable ASCII; no user name or password (they would sit in the database and the API's
listings; a receiver checks the signature instead) and no fragment (it is never sent).
`URL_PATTERN` states exactly that in the OpenAPI schema, and `check_url` refuses the rest
with a message that says which rule was broken.

Where a delivery may connect is decided when it connects, against the address the
connection reached, not at registration: a name can resolve elsewhere tomorrow. Without
`TRAINCTL_WEBHOOK_ALLOWED_HOSTS` any address is allowed but link-local, multicast,
unspecified and reserved ones and the cloud metadata services (they answer on link-local
addresses, or on the few listed in `METADATA_NETWORKS`), which a request from inside a cloud
VM could read credentials from. Loopback and private networks stay allowed: receivers are
often on the same node or network. With the setting, only the hosts it lists are allowed.
Stdlib only: the settings read it.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

MAX_URL_LENGTH = 2000
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_PORT = r"(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
URL_PATTERN = rf'^https?://{_LABEL}(?:\.{_LABEL})*(?::{_PORT})?(?:[/?][!-"$-~]*)?$'
"""http(s), a host of DNS labels (an IPv4 address is one too), a port 1-65535, then a path and
query of printable ASCII without spaces or '#'."""
URL_RULE = (
    "http:// or https://, a host name or IPv4 address, an optional port (1-65535), then a "
    "path of printable ASCII without spaces or '#' (percent-encode other characters)"
)
_URL = re.compile(URL_PATTERN.removeprefix("^").removesuffix("$"))

METADATA_NETWORKS = tuple(
    ipaddress.ip_network(n) for n in ("fd00:ec2::254/128", "100.100.100.200/32")
)
"""Metadata services outside link-local: AWS's IPv6 address and Alibaba Cloud's."""
SETTING = "TRAINCTL_WEBHOOK_ALLOWED_HOSTS"


def check_url(url: str) -> str:
    """The URL if a webhook may name it; else a ValueError saying which rule it breaks."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("http", "https"):
        raise ValueError(f"a webhook URL starts with http:// or https://, got {url[:40]!r}")
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    if "@" in authority:
        raise ValueError(
            "a webhook URL must not hold a user name or password: the service keeps URLs in "
            "its database and lists them; receivers check the signature instead"
        )
    if "#" in rest:
        raise ValueError("a webhook URL has no fragment (#...): it would never be sent")
    if not _URL.fullmatch(url):
        raise ValueError(f"not a webhook URL: {URL_RULE}")
    return url


def url_host(url: str) -> str:
    """The host of a URL `check_url` accepted, in lower case."""
    authority = re.split(r"[/?]", url.partition("://")[2], maxsplit=1)[0]
    return authority.partition(":")[0].lower()


def blocked_reason(address: IPAddress) -> str | None:
    """Why the default policy refuses `address`, or None when it allows it."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if any(address in network for network in METADATA_NETWORKS):
        return "a cloud metadata service's address"
    if address.is_loopback:  # IPv6's ::1 lies in a reserved block too
        return None
    for reason, refused in (
        ("link-local (where cloud metadata services answer)", address.is_link_local),
        ("multicast", address.is_multicast),
        ("unspecified", address.is_unspecified),
        ("reserved", address.is_reserved),
    ):
        if refused:
            return f"a {reason} address"
    return None


@dataclass(frozen=True)
class HostPolicy:
    """`TRAINCTL_WEBHOOK_ALLOWED_HOSTS`, read: exact names, `*.` suffixes, IP networks."""

    names: frozenset[str] = frozenset()
    suffixes: tuple[str, ...] = ()
    """`.example.com` for `*.example.com`: any name below it (not the name itself)."""
    networks: tuple[IPNetwork, ...] = field(default=())

    @classmethod
    def parse(cls, entries: Iterable[str]) -> HostPolicy:
        names: set[str] = set()
        suffixes: list[str] = []
        networks: list[IPNetwork] = []
        for entry in (e.strip().lower() for e in entries):
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry))
                continue
            except ValueError:
                pass
            name = entry.removeprefix("*.")
            if not re.fullmatch(rf"{_LABEL}(?:\.{_LABEL})*", name):
                raise ValueError(
                    f"{SETTING}: {entry!r} is neither a host name, '*.' and a domain, an IP "
                    "address nor a network (10.0.0.0/8)"
                )
            if entry.startswith("*."):
                suffixes.append("." + name)
            else:
                names.add(name)
        return cls(frozenset(names), tuple(suffixes), tuple(networks))

    @property
    def restricted(self) -> bool:
        return bool(self.names or self.suffixes or self.networks)

    def check_host(self, host: str) -> str | None:
        """At registration: why `host` may not be named, or None. Only the allow-list is
        checked here; addresses are checked when a delivery connects."""
        if not self.restricted or self._named(host):
            return None
        address = _ip(host)
        if address is not None and self._in_networks(address):
            return None
        return f"host {host!r} is not in {SETTING}; the service's operator can add it there"

    def check_address(self, host: str, address: IPAddress) -> str | None:
        """When a delivery has connected: why it may not send to `address`, or None."""
        if self.restricted:
            if self._named(host) or self._in_networks(address):
                return None
            return f"{host} ({address}) is not in {SETTING}"
        reason = blocked_reason(address)
        if reason is None:
            return None
        return f"{host} is {address}, {reason}; refused unless {SETTING} lists it"

    def _named(self, host: str) -> bool:
        return host in self.names or host.endswith(self.suffixes)

    def _in_networks(self, address: IPAddress) -> bool:
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        return any(address in network for network in self.networks)


def _ip(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None
