"""Issue 23, class 10: the Host header is parsed as RFC 9110 has it (a host name, an IPv4
address or a bracketed IPv6 one, and an optional port; no userinfo) and its host compared
whole with the allow list. Sent raw over a socket, so that no client library tidies it."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from tests.service.serving import serve
from trainctl.service.app import create_app
from trainctl.service.middleware import parse_host
from trainctl.service.settings import Settings


@pytest.fixture(scope="module")
def port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A loopback service: it answers only to its loopback names."""
    app = create_app(Settings(data_dir=tmp_path_factory.mktemp("hosts"), workers=0))
    with serve(app) as url:
        yield int(url.rsplit(":", 1)[1])


def status_with_host(port: int, *hosts: str) -> int:
    """The status of GET /healthz sent with these Host header lines (raw bytes)."""
    lines = b"".join(b"Host: " + h.encode("latin-1") + b"\r\n" for h in hosts)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\n" + lines + b"Connection: close\r\n\r\n")
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    return int(answer.split(b" ", 2)[1])


SERVED = ["localhost", "LocalHost", "localhost:8000", "127.0.0.1", "127.0.0.1:1", "[::1]",
          "[::1]:8000", "[0:0:0:0:0:0:0:1]:80", "[::0001]"]  # fmt: skip
REFUSED = [
    "[::1].evil.com", "[::1]evil.com", "[::1]:80.evil.com", "[::1]@evil.com",
    "127.0.0.1:8000@evil.com", "127.0.0.1@evil.com", "user@localhost", "user:pw@127.0.0.1",
    "localhost.evil.com", "evil.com", "evil.localhost", "localhost.", "127.0.0.1.",
    "localhost:", "localhost:8000:80", "localhost:99999", "localhost:-1", "localhost:8o",
    "localhost: 80", "local host", "localhost/x", "localhost?x", "localhost#x",
    "localhost%2e", "127.1", "0x7f.0.0.1", "2130706433", "127.000.000.001",
    "[::1%25lo]", "[::1", "::1", "::1]", "[[::1]]", "[v1.x]", "[::ffff:127.0.0.1]",
    "", "\u00e9vil", "loc\u0430lhost".encode("utf-8").decode("latin-1"),
    "-localhost", "a" * 300,
]  # fmt: skip


@pytest.mark.parametrize("host", SERVED)
def test_the_loopback_names_with_or_without_a_port_are_served(port: int, host: str) -> None:
    assert status_with_host(port, host) == 200


@pytest.mark.parametrize("host", REFUSED)
def test_a_malformed_or_foreign_host_is_refused(port: int, host: str) -> None:
    assert status_with_host(port, host) == 400


def test_two_host_headers_are_refused_even_if_the_first_is_served(port: int) -> None:
    assert status_with_host(port, "localhost", "evil.com") == 400


def test_a_missing_host_header_is_refused(port: int) -> None:
    assert status_with_host(port) == 400


def test_parse_host_gives_the_host_or_none() -> None:
    assert parse_host("[0::1]:8000") == "::1"
    assert parse_host("LOCALHOST:80") == "localhost"
    assert parse_host("[::1].evil.com") is None
    assert parse_host("127.0.0.1:8000@evil.com") is None
    assert parse_host("localhost\n") is None  # `$` would match before a trailing newline
