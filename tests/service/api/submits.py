"""Submitting runs over HTTP, as the API tests do it."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

CPU_TRAIN = {"experiment": "exp", "steps": 100, "device": "cpu"}
"""A train run a service without GPUs takes; without workers it stays queued."""


def submit(client: TestClient, kind: str, body: Any, **headers: str) -> Any:
    """POST /runs/{kind}: the response, whatever its status."""
    return client.post(f"/runs/{kind}", json=body, headers=headers)
