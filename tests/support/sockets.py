"""What a tree of processes listens on, read from /proc (Linux): each listening TCP socket
of the process or its descendants, with the address it is bound to."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

_LISTEN = "0A"  # the TCP state LISTEN in /proc/net/tcp{,6}


@dataclass(frozen=True)
class Listening:
    pid: int
    command: str
    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    port: int


def process_tree(root: int) -> list[int]:
    """`root` and every live process below it."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(parent, []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(parents.get(pid, []))
    return tree


def listening(root: int) -> list[Listening]:
    """The TCP sockets `root`'s process tree listens on."""
    owners: dict[str, int] = {}
    for pid in process_tree(root):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                owners[target[len("socket:[") : -1]] = pid
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != _LISTEN or fields[9] not in owners:
                continue
            pid = owners[fields[9]]
            address, port = fields[1].split(":")
            found.append(Listening(pid, _command(pid), _address(address), int(port, 16)))
    return found


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """/proc writes each 32-bit word of the address in the host's (little-endian) order."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return "?"


def assert_listen_at(seen: list[Listening], address: str, processes: int) -> None:
    """Every socket in `seen` is bound to `address`, in at least `processes` processes (so
    that the check saw what it is about)."""
    described = "\n".join(f"{s.address}:{s.port} {s.command[:120]}" for s in seen)
    assert len({s.pid for s in seen}) >= processes, described
    assert {str(s.address) for s in seen} == {address}, described
