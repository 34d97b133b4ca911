"""trainctl: a training-control service for PyTorch language-model pre-training.

The SDK is imported from here: `from trainctl import Client, AsyncClient, ApiError`. The
service, the store and the worker are `trainctl.service`, `trainctl.store` and
`trainctl.worker` (docs/architecture.md, "Rooms").
"""

from __future__ import annotations

from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainctl.service.sdk.async_client import AsyncTrainctlClient as AsyncClient
    from trainctl.service.sdk.client import TrainctlClient as Client
    from trainctl.service.sdk.steps import (
        ApiError,
        Conflict,
        DownloadError,
        InvalidRequest,
        NotFound,
        StreamInterrupted,
        Unauthorized,
    )


def _installed_version(distribution: str = "trainctl") -> str:
    """The installed distribution's version; a source tree that was never installed has none."""
    try:
        return version(distribution)
    except PackageNotFoundError:
        return "0+unknown"


__version__ = _installed_version()

# Loaded on first use, not here: `import trainctl.worker` must not import the service's SDK
# (the rooms' walls, tests/test_architecture.py), and `import trainctl.store` not httpx.
_EXPORTS = {
    "Client": ("trainctl.service.sdk.client", "TrainctlClient"),
    "AsyncClient": ("trainctl.service.sdk.async_client", "AsyncTrainctlClient"),
    "ApiError": ("trainctl.service.sdk.steps", "ApiError"),
    "Conflict": ("trainctl.service.sdk.steps", "Conflict"),
    "DownloadError": ("trainctl.service.sdk.steps", "DownloadError"),
    "InvalidRequest": ("trainctl.service.sdk.steps", "InvalidRequest"),
    "NotFound": ("trainctl.service.sdk.steps", "NotFound"),
    "StreamInterrupted": ("trainctl.service.sdk.steps", "StreamInterrupted"),
    "Unauthorized": ("trainctl.service.sdk.steps", "Unauthorized"),
}
__all__ = [
    "ApiError",
    "AsyncClient",
    "Client",
    "Conflict",
    "DownloadError",
    "InvalidRequest",
    "NotFound",
    "StreamInterrupted",
    "Unauthorized",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'trainctl' has no attribute {name!r}")
    module, attribute = _EXPORTS[name]
    return getattr(import_module(module), attribute)
