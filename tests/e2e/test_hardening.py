"""What a shared node meets from careless users and attackers, tried on the real service."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.support.service_process import Service
from trainctl import Client

TOKEN = "hardening-test-token"


def test_local_workers_do_not_inherit_the_api_token(service: Service) -> None:
    mlflow = "http://trainctl:s3cret@127.0.0.1:9/"  # the service's; it may hold a password
    service.extra_env = {"TRAINCTL_API_TOKEN": TOKEN, "TRAINCTL_MLFLOW_URI": mlflow}
    service.start(workers=1)
    with Client(service.url, token=TOKEN) as api:
        [worker] = api.workers()

    environ = Path(f"/proc/{worker.pid}/environ").read_bytes().split(b"\0")

    assert not [v for v in environ if v.startswith(b"TRAINCTL_API_TOKEN=")]
    assert TOKEN.encode() not in b"\0".join(environ)
    assert b"s3cret" not in b"\0".join(environ)
    assert any(v.startswith(b"TRAINCTL_DATABASE_URL=") for v in environ)  # what it does need


def test_a_loopback_service_answers_only_to_its_own_host_names(service: Service) -> None:
    """DNS rebinding: a page on attacker.example resolves its name to 127.0.0.1; the browser
    then sends the attacker's host name, which the service refuses."""
    service.start(workers=0)

    rebound = httpx.get(f"{service.url}/runs", headers={"Host": "attacker.example:8000"})
    own = [httpx.get(f"{service.url}/runs", headers={"Host": h}) for h in LOCAL_HOSTS]

    assert rebound.status_code == 400
    assert "'attacker.example' is not one this service answers to" in rebound.json()["detail"]
    assert [r.status_code for r in own] == [200] * len(LOCAL_HOSTS)


LOCAL_HOSTS = ["localhost", "127.0.0.1:8000", "[::1]:8000", "LOCALHOST"]


def test_every_answer_carries_the_security_headers(service: Service) -> None:
    service.start(workers=0)

    for path in ["/", "/static/dashboard.js", "/runs", "/nope"]:
        headers = httpx.get(f"{service.url}{path}").headers
        assert headers["X-Frame-Options"] == "DENY", path
        assert headers["X-Content-Type-Options"] == "nosniff", path
        assert "frame-ancestors 'none'" in headers["Content-Security-Policy"], path
        assert "script-src 'self'" in headers["Content-Security-Policy"], path
