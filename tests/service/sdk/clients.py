"""What the SDK's tests share: a train request that a service without workers keeps queued, and
an async client of the served app in an event loop of its own."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
from fastapi import FastAPI

from trainctl.service.sdk.async_client import AsyncTrainctlClient

CPU_TRAIN = {"experiment": "exp", "steps": 20, "device": "cpu"}
T = TypeVar("T")


def run_async(server_app: FastAPI, scenario: Callable[[AsyncTrainctlClient], Awaitable[T]]) -> T:
    """`scenario` with an async client of the server, in an event loop of its own."""

    async def main() -> T:
        async with AsyncTrainctlClient(server_app.state.base_url, timeout=10) as api:
            return await scenario(api)

    return anyio.run(main)
