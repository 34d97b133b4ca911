"""Where the processes of a multi-process run listen: only where they must, loopback for one
node and the worker's own address in a gang (docs/design/training.md, "Multi-GPU and
multi-node").

A TCPStore server listens on every interface (`::`) whatever host name it is given, and it
asks for no credentials: whoever reaches it can join the run or write its keys. torchrun
would start two of them, the c10d rendezvous's and the store it shares with the ranks
(MASTER_ADDR:MASTER_PORT), and gloo and NCCL bind the address they find for the host name.
So instead:

- our launcher hosts the rendezvous store (`host_store`) on a socket bound to one address,
  127.0.0.1 for one node or the leader's own address in a gang, and torchrun joins it as a
  client (`is_host=0`);
- torchrun shares no store with the ranks (`TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`): global
  rank 0 hosts the process group's store on a socket bound to MASTER_ADDR, its node's
  `--local-addr` (`rank_store`);
- gloo and NCCL use the interface of that address (`GLOO_SOCKET_IFNAME`,
  `NCCL_SOCKET_IFNAME`): loopback on one node; in a gang the interface that holds the
  worker's address, unless the operator named one (`socket_env`).
"""

from __future__ import annotations

import ctypes
import ipaddress
import socket
import sys
from collections.abc import Mapping
from datetime import timedelta

import torch.distributed as dist

LOOPBACK = "127.0.0.1"
LOOPBACK_INTERFACE = "lo0" if sys.platform == "darwin" else "lo"
INTERFACE_SETTINGS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
STORE_TIMEOUT = timedelta(minutes=30)
"""As torch's own process-group store: how long a rank waits for the others' keys."""


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """`host:port` (an IPv6 address may stand in brackets)."""
    host, _, port = endpoint.rpartition(":")
    return host.removeprefix("[").removesuffix("]"), int(port)


def listener(host: str, port: int) -> socket.socket:
    """A listening TCP socket bound to `host` alone (the first address it resolves to)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        # A fixed rendezvous port is bound again by the next gang while the last one's
        # connections linger in TIME_WAIT.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


def serve_store(host: str, port: int, world_size: int | None = None) -> dist.TCPStore:
    """A TCPStore server listening on `host:port` only (port 0: a free one, `.port`)."""
    sock = listener(host, port)
    port = sock.getsockname()[1]
    # The store takes the socket over (and closes it when it is done).
    return dist.TCPStore(
        host,
        port,
        world_size,
        is_master=True,
        timeout=STORE_TIMEOUT,
        wait_for_workers=world_size is not None,
        master_listen_fd=sock.detach(),
        use_libuv=True,
    )


def host_store(endpoint: str) -> tuple[dist.TCPStore, str]:
    """The c10d rendezvous's store, served here at `endpoint`; and the endpoint with the
    port it got (port 0 asks for a free one)."""
    host, port = split_endpoint(endpoint)
    store = serve_store(host, port)
    return store, f"{host}:{store.port}"


def rank_store(rank: int, world_size: int, environ: Mapping[str, str]) -> dist.TCPStore:
    """The process group's store at MASTER_ADDR:MASTER_PORT: served by global rank 0 (bound
    to that address only), joined by the others."""
    host, port = environ["MASTER_ADDR"], int(environ["MASTER_PORT"])
    if rank == 0:
        return serve_store(host, port, world_size)
    return dist.TCPStore(host, port, world_size, is_master=False, timeout=STORE_TIMEOUT)


def socket_env(local_addr: str, gang: bool, environ: Mapping[str, str]) -> dict[str, str]:
    """The interface settings gloo and NCCL get: loopback for one node; in a gang, the
    interface holding `local_addr`, unless the operator set one (several NICs: `ib0`)."""
    if not gang:
        return dict.fromkeys(INTERFACE_SETTINGS, LOOPBACK_INTERFACE)
    interface = interface_of(local_addr)
    if interface is None:
        return {}
    return {name: interface for name in INTERFACE_SETTINGS if not environ.get(name)}


def interface_of(host: str) -> str | None:
    """The network interface holding `host`'s address on this machine, or None."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        address = ipaddress.ip_address(str(infos[0][4][0]).partition("%")[0])
    except (OSError, ValueError, IndexError):
        return None
    if address.is_loopback:
        return LOOPBACK_INTERFACE
    return next((name for name, held in interface_addresses() if held == address), None)


class _Ifaddrs(ctypes.Structure):
    """<ifaddrs.h>: one address of one interface, in a linked list."""


_Ifaddrs._fields_ = [
    ("next", ctypes.POINTER(_Ifaddrs)),
    ("name", ctypes.c_char_p),
    ("flags", ctypes.c_uint),
    ("addr", ctypes.c_void_p),
    ("netmask", ctypes.c_void_p),
    ("broadaddr", ctypes.c_void_p),
    ("data", ctypes.c_void_p),
]


def interface_addresses() -> list[tuple[str, ipaddress.IPv4Address | ipaddress.IPv6Address]]:
    """Every (interface, address) of this machine, from getifaddrs(3); empty but on Linux."""
    if not sys.platform.startswith("linux"):
        return []
    libc = ctypes.CDLL(None, use_errno=True)
    head = ctypes.POINTER(_Ifaddrs)()
    if libc.getifaddrs(ctypes.byref(head)) != 0:
        return []
    found: list[tuple[str, ipaddress.IPv4Address | ipaddress.IPv6Address]] = []
    try:
        node = head
        while node:
            entry = node.contents
            family = entry.addr and int.from_bytes(ctypes.string_at(entry.addr, 2), sys.byteorder)
            # struct sockaddr_in: family, port, address; sockaddr_in6: family, port, flow, address
            if family == socket.AF_INET:
                raw = ctypes.string_at(entry.addr, 8)
                found.append((entry.name.decode(), ipaddress.IPv4Address(raw[4:8])))
            elif family == socket.AF_INET6:
                raw = ctypes.string_at(entry.addr, 24)
                found.append((entry.name.decode(), ipaddress.IPv6Address(raw[8:24])))
            node = entry.next
    finally:
        libc.freeifaddrs(head)
    return found
