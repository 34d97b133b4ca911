"""Where the processes of a multi-process run listen: only where they must, loopback for one
node and the worker's own address in a gang (docs/architecture.md, "Multi-GPU and
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

import fcntl
import ipaddress
import socket
import struct
import sys
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

LOOPBACK = "127.0.0.1"
LOOPBACK_INTERFACE = "lo0" if sys.platform == "darwin" else "lo"
INTERFACE_SETTINGS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
STORE_TIMEOUT = timedelta(minutes=30)
"""As torch's own process-group store: how long a rank waits for the others' keys."""
_SIOCGIFADDR = 0x8915  # <linux/sockios.h>: an interface's IPv4 address


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
    """The network interface holding `host`'s address on this machine (Linux), or None."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        address = ipaddress.ip_address(infos[0][4][0])
    except (OSError, ValueError, IndexError):
        return None
    if address.is_loopback:
        return LOOPBACK_INTERFACE
    if isinstance(address, ipaddress.IPv6Address):
        return _ipv6_interface(address)
    for _, name in socket.if_nameindex():
        if _ipv4_of(name) == address:
            return name
    return None


def _ipv4_of(interface: str) -> ipaddress.IPv4Address | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            answer = fcntl.ioctl(
                sock.fileno(), _SIOCGIFADDR, struct.pack("256s", interface[:15].encode())
            )
        except OSError:
            return None
    return ipaddress.IPv4Address(answer[20:24])


def _ipv6_interface(address: ipaddress.IPv6Address) -> str | None:
    """From /proc/net/if_inet6: `<address hex> <index> <prefix> <scope> <flags> <name>`."""
    try:
        lines = Path("/proc/net/if_inet6").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) == 6 and fields[0] == address.exploded.replace(":", ""):
            return fields[5]
    return None
