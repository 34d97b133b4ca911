"""What a shared node meets from careless users and attackers, tried on the real service."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.conftest import Service
from trainctl import Client

TOKEN = "hardening-test-token"


def test_local_workers_do_not_inherit_the_api_token(service: Service) -> None:
    service.extra_env = {"TRAINCTL_API_TOKEN": TOKEN}
    service.start(workers=1)
    with Client(service.url, token=TOKEN) as api:
        [worker] = api.workers()

    environ = Path(f"/proc/{worker.pid}/environ").read_bytes().split(b"\0")

    assert not [v for v in environ if v.startswith(b"TRAINCTL_API_TOKEN=")]
    assert TOKEN.encode() not in b"\0".join(environ)
    assert any(v.startswith(b"TRAINCTL_DATABASE_URL=") for v in environ)  # what it does need
