"""Registries: the one place where a second implementation of something plugs in (run kinds,
optimizer kinds), by name, as torchtitan registers its model specs (docs/design/kinds.md,
"Run kinds"; docs/design/training.md, "Optimizers").

A `Registry` maps names to records and refuses a name registered twice, so two plug-ins
cannot silently replace each other (or a built-in). It loads the records plug-ins declare
under its entry-point group (`[project.entry-points."trainctl.run_kinds"]` in their
`pyproject.toml`) the first time it is read. `RegisteredName` is
the pydantic type of a field naming a record: its JSON schema lists the registered names as
an enum, read when the schema is made (after the plug-ins are loaded), not when the model is
defined. A `Ref` names a module's attribute without importing the module until it is asked
for.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from importlib import import_module
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

log = logging.getLogger(__name__)

T = TypeVar("T")
F = TypeVar("F")


class Ref(Generic[F]):
    """`module:attribute`, imported when first asked for: a record can name a function of a
    module its readers need not load (a run kind's resolver, for the CLI), and a field the
    registry its names are checked against (a run kind's name, for the SDK)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._loaded: F | None = None

    def load(self) -> F:
        if self._loaded is None:
            module, _, name = self.target.partition(":")
            self._loaded = getattr(import_module(module), name)
        return self._loaded

    def __repr__(self) -> str:
        return f"Ref({self.target!r})"


class UnknownName(KeyError):
    """A name no record is registered under; the message lists those that are."""

    def __str__(self) -> str:
        return str(self.args[0])


class Registry(Generic[T]):
    """Records of one sort by name, in the order they were registered."""

    def __init__(self, what: str, group: str | None = None) -> None:
        self.what = what
        """What the records are, in words: 'run kind'."""
        self.group = group
        """The entry-point group plug-ins declare records under; None: built-ins only."""
        self._items: dict[str, T] = {}
        self._plugins_loaded = group is None
        self._lock = threading.RLock()

    def register(self, name: str, item: T) -> T:
        with self._lock:
            if name in self._items:
                raise ValueError(f"{self.what} {name!r} is registered already")
            self._items[name] = item
        return item

    def unregister(self, name: str) -> None:
        """Forget a record (tests register records of their own and remove them after)."""
        with self._lock:
            self._items.pop(name, None)

    def get(self, name: str) -> T:
        self._load_plugins()
        try:
            return self._items[name]
        except KeyError:
            raise UnknownName(
                f"unknown {self.what} {name!r}; expected one of: {', '.join(self._items)}"
            ) from None

    def __contains__(self, name: object) -> bool:
        self._load_plugins()
        return name in self._items

    def __iter__(self) -> Iterator[T]:
        self._load_plugins()
        return iter(list(self._items.values()))

    def names(self) -> tuple[str, ...]:
        self._load_plugins()
        return tuple(self._items)

    def _load_plugins(self) -> None:
        if self._plugins_loaded:
            return
        with self._lock:
            if self._plugins_loaded:
                return
            self._plugins_loaded = True  # first: a plug-in that reads the registry recurses
            for point in entry_points(group=self.group or ""):
                # A broken plug-in must not take the service down with it: it is left out,
                # and the log says why.
                try:
                    self.register(point.name, point.load())
                except Exception:
                    log.exception("%s plug-in %r (%s) not loaded", self.what, point.name, point)


class RegisteredName:
    """`Annotated[str, RegisteredName(registry)]`: a field naming a registered record.

    `check=False` publishes the same schema but accepts any name: for what a client reads
    from a server, which may have plug-ins the client has not (the SDK must not refuse a run
    of a kind it does not know). `registry` may be a `Ref` to it, loaded when a name is
    checked or the schema made: a model of the SDK names run kinds without importing them."""

    def __init__(self, registry: Registry[Any] | Ref[Registry[Any]], *, check: bool = True) -> None:
        self._registry = registry
        self.check = check

    @property
    def registry(self) -> Registry[Any]:
        return self._registry.load() if isinstance(self._registry, Ref) else self._registry

    def _check(self, value: str) -> str:
        if self.check and value not in self.registry:
            # Worded as pydantic words a Literal's error, which this type stands in for.
            names = [repr(n) for n in self.registry.names()]
            expected = " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)
            raise PydanticCustomError(
                "literal_error", "Input should be {expected}", {"expected": expected}
            )
        return value

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(
            self._check, core_schema.str_schema(strict=True)
        )

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {"enum": list(self.registry.names()), "type": "string"}
