"""Where a webhook may send: the URLs a webhook may name, and the hosts and addresses the
service will connect to (docs/design/webhooks.md, "Webhooks").

A webhook URL is `http` or `https`, a host name or IPv4 address, an optional port and a path
of printable ASCII; no user name or password (they would sit in the database and the API's
listings; a receiver checks the signature instead) and no fragment (it is never sent).
An IPv4 address is four decimal numbers without leading zeros: the other forms `inet_aton`
reads (octal `0177.0.0.1`, hexadecimal `0x7f.1`, shortened `127.1`, one number
`2130706433`) are read differently by other resolvers and URL parsers, so they are refused,
and so is a name whose last label is a number. `URL_PATTERN` states exactly that in the
OpenAPI schema, and `check_url` refuses the rest with a message that says which rule was
broken.

Where a delivery may connect is decided when it connects, against the address the
connection reached: a name can resolve elsewhere tomorrow. Without
`TRAINCTL_WEBHOOK_ALLOWED_HOSTS` any address is allowed but link-local, multicast,
unspecified and reserved ones and the cloud metadata services (`METADATA_ADDRESSES`), which
a request from inside a cloud VM could read credentials from, and every IPv6 address that
carries one of those inside it (`embedded_ipv4`: IPv4-mapped, -compatible and -translated
addresses, 6to4, NAT64, Teredo). An address or metadata name in the URL itself is refused at
registration already. Loopback and private networks stay allowed: receivers are often on
the same node or network. With the setting, only the hosts it lists are allowed.
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
_LAST_LABEL = r"[A-Za-z](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_IPV4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
_HOST = rf"(?:{_IPV4}|(?:{_LABEL}\.)*{_LAST_LABEL})"
_PORT = r"(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
URL_PATTERN = rf'^https?://{_HOST}(?::{_PORT})?(?:[/?][!-"$-~]*)?$'
"""http(s), a host (an IPv4 address in four decimal parts, or DNS labels of which the last
starts with a letter), a port 1-65535, then a path and query of printable ASCII without
spaces or '#'."""
URL_RULE = (
    "http:// or https://, a host name (its last label starting with a letter) or an IPv4 "
    "address in four decimal parts, an optional port (1-65535), then a path of printable "
    "ASCII without spaces or '#' (percent-encode other characters)"
)
_URL = re.compile(URL_PATTERN.removeprefix("^").removesuffix("$"))
_NUMBER = re.compile(r"[0-9]+|0[xX][0-9A-Fa-f]*")
"""A label that makes a host an IPv4 address to URL parsers (WHATWG's "ends in a number")."""

METADATA_ADDRESSES = tuple(
    ipaddress.ip_address(a)
    for a in (
        # AWS: IMDS over IPv6 on Nitro, and the EKS Pod Identity agent
        # (docs.aws.amazon.com: "instancedata-data-retrieval", "pod-id-how-it-works")
        "fd00:ec2::254",
        "fd00:ec2::23",
        # Google Cloud: the metadata server over IPv6 (cloud.google.com/compute/docs/metadata)
        "fd20:ce::254",
        # Azure: WireServer, the host's platform endpoint (learn.microsoft.com:
        # "what-is-ip-address-168-63-129-16")
        "168.63.129.16",
        # Alibaba Cloud (alibabacloud.com/help/ecs: "instance metadata")
        "100.100.100.200",
        # Oracle Cloud's endpoint of its classic instances (docs.oracle.com)
        "192.0.0.192",
    )
)
"""Cloud metadata services outside link-local. AWS, Google Cloud, Azure, Oracle, OpenStack,
DigitalOcean, Hetzner, IBM and others answer at 169.254.169.254 (and OpenStack at
fe80::a9fe:a9fe, Tencent Cloud at 169.254.0.23, AWS ECS at 169.254.170.2): link-local, all
refused as such."""
METADATA_NAMES = frozenset({"metadata.google.internal", "metadata.tencentyun.com"})
"""Names of metadata services, refused at registration (they resolve to the above)."""
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
        form = numeric_host_form(authority.partition(":")[0])
        raise ValueError(form or f"not a webhook URL: {URL_RULE}")
    return url


def numeric_host_form(host: str) -> str | None:
    """Why a host that parsers read as an IPv4 address is refused, naming its form; None for
    a four-part decimal address or a name."""
    labels = host.split(".")
    if not _NUMBER.fullmatch(labels[-1]) or re.fullmatch(_IPV4, host):
        return None
    if any(re.fullmatch(r"0[xX][0-9A-Fa-f]*", label) for label in labels):
        form = "with hexadecimal parts (as 0x7f.0.0.1)"
    elif any(len(label) > 1 and label.isdigit() and label[0] == "0" for label in labels):
        form = "with octal parts (as 0177.0.0.1)"
    elif len(labels) < 4 and all(label.isdigit() for label in labels):
        form = "in fewer than four parts (as 127.1 or 2130706433)"
    else:
        return (
            f"host {host!r} is no IPv4 address and no host name (a name's last label "
            "starts with a letter)"
        )
    return (
        f"host {host!r} is an IPv4 address written {form}, which resolvers and URL parsers "
        "read differently: write it as four decimal numbers without leading zeros (127.0.0.1)"
    )


def url_host(url: str) -> str:
    """The host of a URL `check_url` accepted, in lower case."""
    authority = re.split(r"[/?]", url.partition("://")[2], maxsplit=1)[0]
    return authority.partition(":")[0].lower()


def blocked_reason(address: IPAddress) -> str | None:
    """Why the default policy refuses `address`, or None when it allows it. An IPv6 address
    that carries a metadata or link-local IPv4 address (`embedded_ipv4`) is refused; one that
    only writes an IPv4 address in IPv6 (`ipv4_alias`) is judged as that address."""
    for carried in embedded_ipv4(address):
        if carried in METADATA_ADDRESSES or carried.is_link_local:
            return f"{_blocked(carried)} ({carried}, inside {address})"
    alias = ipv4_alias(address)
    return _blocked(alias if alias is not None else address)


def _blocked(address: IPAddress) -> str | None:
    if address in METADATA_ADDRESSES:
        return "a cloud metadata service's address"
    if address.is_loopback:  # IPv6's ::1 lies in a reserved block too
        return None
    for reason, refused in (
        ("a link-local address (where cloud metadata services answer)", address.is_link_local),
        ("a multicast address", address.is_multicast),
        ("an unspecified address", address.is_unspecified or address in _THIS_NETWORK),
        ("a reserved address", address.is_reserved),
    ):
        if refused:
            return reason
    return None


_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")  # Linux connects 0.0.0.0 to loopback
_NAT64 = ipaddress.ip_network("64:ff9b::/96")  # RFC 6052, the well-known prefix
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")  # RFC 8215, prefixes of /48 to /96
_COMPATIBLE = ipaddress.ip_network("::/96")  # RFC 4291's deprecated IPv4-compatible
_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")  # RFC 2765 (SIIT)
_MAPPED = ipaddress.ip_network("::ffff:0:0/96")


def embedded_ipv4(address: IPAddress) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries, where a connection to it may end up:
    IPv4-mapped, -compatible and -translated, NAT64 (the well-known prefix, and every
    prefix length of the local-use one: RFC 6052 and 8215), 6to4 and Teredo (its server and
    its client)."""
    if isinstance(address, ipaddress.IPv4Address):
        return []
    found = [a for a in (ipv4_alias(address), address.sixtofour) if a is not None]
    if address.teredo is not None:
        found.extend(address.teredo)  # ipaddress undoes the client's obfuscation
    if address in _NAT64_LOCAL:
        found.extend(_rfc6052(address, length) for length in (48, 56, 64))
    return found


def ipv4_alias(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address only stands for (IPv4-mapped, -compatible or
    -translated, or behind a NAT64 prefix of 96 bits), or None."""
    if isinstance(address, ipaddress.IPv4Address):
        return None
    compatible = address in _COMPATIBLE and int(address) > 1  # not :: nor ::1
    if compatible or any(address in n for n in (_MAPPED, _TRANSLATED, _NAT64, _NAT64_LOCAL)):
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _rfc6052(address: ipaddress.IPv6Address, prefix: int) -> ipaddress.IPv4Address:
    """The IPv4 address where RFC 6052 puts it behind a NAT64 prefix of `prefix` bits (48,
    56 or 64); bits 64-71 (the "u" octet) never hold any of it."""
    raw, start = address.packed, prefix // 8
    octets = [raw[i] for i in range(start, 16) if i != 8][:4]
    return ipaddress.IPv4Address(bytes(octets))


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
        """At registration: why `host` may not be named, or None. Without an allow-list, an
        address or a metadata service's name that no delivery could reach; a name's address
        is checked when a delivery connects."""
        address = _ip(host)
        if not self.restricted:
            reason = blocked_reason(address) if address is not None else None
            if reason is None and host in METADATA_NAMES:
                reason = "a cloud metadata service's name"
            return f"host {host} is {reason}; refused unless {SETTING} lists it" if reason else None
        if self._named(host):
            return None
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
        alias = ipv4_alias(address)
        return any((alias or address) in network for network in self.networks)


def _ip(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None
