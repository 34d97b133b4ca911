"""trainctl: a training-control service for PyTorch language-model pre-training.

The SDK is imported from here: `from trainctl import Client, AsyncClient, ApiError`. The
service, the store and the worker are `trainctl.service`, `trainctl.store` and
`trainctl.worker` (docs/architecture.md, "Rooms").
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainctl.service.async_client import AsyncTrainctlClient as AsyncClient
    from trainctl.service.client import TrainctlClient as Client
    from trainctl.service.sdk_steps import ApiError, DownloadError

# Loaded on first use, not here: `import trainctl.worker` must not import the service's SDK
# (the rooms' walls, tests/test_architecture.py), and `import trainctl.store` not httpx.
_EXPORTS = {
    "Client": ("trainctl.service.client", "TrainctlClient"),
    "AsyncClient": ("trainctl.service.async_client", "AsyncTrainctlClient"),
    "ApiError": ("trainctl.service.sdk_steps", "ApiError"),
    "DownloadError": ("trainctl.service.sdk_steps", "DownloadError"),
}
__all__ = ["ApiError", "AsyncClient", "Client", "DownloadError"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'trainctl' has no attribute {name!r}")
    module, attribute = _EXPORTS[name]
    return getattr(import_module(module), attribute)
