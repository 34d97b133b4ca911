"""Optimizers as the store knows them: the names their metrics have.

Metrics name each optimizer's learning rate `lr/<optimizer name>` (`lr/muon`, `lr/adamw`).
Event logs from before optimizers had names hold `lr_muon` and `lr_adamw`: readers see those
under the new names (`current_metric_names`).
"""

from __future__ import annotations

from typing import Any

LR_PREFIX = "lr/"
LEGACY_METRIC_NAMES = {"lr_muon": "lr/muon", "lr_adamw": "lr/adamw"}
"""Train metrics written before optimizers were named, and their names now."""


def lr_metric(optimizer: str) -> str:
    """The metric of one named optimizer's learning rate: `lr/muon`."""
    return f"{LR_PREFIX}{optimizer}"


def current_metric_names(data: dict[str, Any]) -> dict[str, Any]:
    """A metrics event's data with the names of old event logs replaced by today's."""
    if not LEGACY_METRIC_NAMES.keys() & data.keys():
        return data
    return {LEGACY_METRIC_NAMES.get(k, k): v for k, v in data.items()}
