"""Records registered for one test only: a plug-in's, put in the registries as its entry points
would put them, and taken out after (trainctl.store.registry)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from trainctl.store.registry import Registry


@contextmanager
def registered(*records: tuple[Registry[Any], str, Any]) -> Iterator[None]:
    """Each (registry, name, record) registered while the block runs."""
    done: list[tuple[Registry[Any], str]] = []
    try:
        for registry, name, record in records:
            registry.register(name, record)
            done.append((registry, name))
        yield
    finally:
        for registry, name in done:
            registry.unregister(name)
