"""A storage in memory (docs/design/checkpoints.md, "Checkpoint store", "Storage"): the second
implementation of the seam, which the store's own tests run against beside the POSIX one.

It is a real storage, safe across threads: entries are immutable dicts of bytes, a commit
swaps one into place under a lock (so it is atomic, and replacing a tag is one step), a
delete pops it, and the guard is a re-entrant lock per experiment. What it cannot share is
the memory of another process: it is for tests and for a process that keeps its own store.
"""

from __future__ import annotations

import io
import itertools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from trainctl.store.checkpoints.storage import Complete
from trainctl.store.names import validate_name

_SCHEME = "memory://"


class MemoryReader(io.BytesIO):
    """A file of an entry: its bytes, which no later commit changes."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.size = len(data)
        self.local_path: str | None = None


class MemorySink:
    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if self.closed:
            raise ValueError("write to a closed file")
        view = memoryview(data).cast("B")
        self.data += view  # a copy: the caller may reuse its buffer
        return view.nbytes

    def close(self) -> None:
        self.closed = True


@dataclass(frozen=True)
class _Entry:
    files: dict[str, bytes]
    committed_at: float


class MemoryStage:
    def __init__(self, storage: MemoryStorage, experiment: str, tag: str, number: int) -> None:
        self.storage, self.experiment, self.tag = storage, experiment, tag
        self.name = f".staging-{tag}-{number}"
        self.sinks: dict[str, MemorySink] = {}

    def create(self, name: str) -> MemorySink:
        validate_name("file", name)
        if name in self.sinks:
            raise FileExistsError(f"{self.storage.describe(self.experiment, self.name, name)}")
        sink = self.sinks[name] = MemorySink()
        return sink

    @property
    def key(self) -> str:
        return self.name

    def commit(self, *, replace: bool = True) -> None:
        assert all(s.closed for s in self.sinks.values()), "commit before every file was closed"
        entry = _Entry({n: bytes(s.data) for n, s in self.sinks.items()}, self.storage.clock())
        self.storage._commit(self, entry, replace)

    def abort(self) -> None:
        self.storage._forget(self)
        self.sinks.clear()


class MemoryJoined:
    """A stage of this storage that another writer owns (`MemoryStorage.join`)."""

    def __init__(self, stage: MemoryStage) -> None:
        self.stage = stage
        self.created: list[str] = []

    @property
    def key(self) -> str:
        return self.stage.name

    def create(self, name: str) -> MemorySink:
        sink = self.stage.create(name)
        self.created.append(name)
        return sink

    def commit(self, *, replace: bool = True) -> None:
        raise RuntimeError(f"{self.stage.name}: only the writer that made a stage commits it")

    def abort(self) -> None:
        for name in self.created:
            self.stage.sinks.pop(name, None)
        self.created.clear()


class MemoryStorage:
    """Entries in dicts; `clock` stamps each commit (`committed_at`)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.RLock()  # the dicts below, and `reading`
        self._experiments: dict[str, dict[str, _Entry]] = {}
        self._stages: dict[str, list[MemoryStage]] = {}
        self._guards: dict[str, threading.RLock] = {}
        self._numbers = itertools.count(1)

    def describe(
        self, experiment: str | None = None, tag: str | None = None, name: str | None = None
    ) -> str:
        parts = []
        for part in (experiment, tag, name):
            if part is None:
                break
            parts.append(part)
        return _SCHEME + "/".join(parts)

    def experiments(self) -> list[str]:
        with self._lock:
            return sorted(self._experiments)

    def tags(self, experiment: str) -> list[str]:
        validate_name("experiment", experiment)
        with self._lock:
            return sorted(self._experiments.get(experiment, {}))

    def exists(self, experiment: str, tag: str | None = None) -> bool:
        validate_name("experiment", experiment)
        with self._lock:
            entries = self._experiments.get(experiment)
            if tag is None or entries is None:
                return entries is not None
            return validate_name("tag", tag) in entries

    def _entry(self, experiment: str, tag: str) -> _Entry | None:
        validate_name("experiment", experiment)
        validate_name("tag", tag)
        with self._lock:
            return self._experiments.get(experiment, {}).get(tag)

    def open(self, experiment: str, tag: str, name: str) -> MemoryReader:
        entry = self._entry(experiment, tag)
        data = entry.files.get(validate_name("file", name)) if entry is not None else None
        if data is None:
            raise FileNotFoundError(f"{self.describe(experiment, tag, name)}: no such file")
        return MemoryReader(data)

    @contextmanager
    def reading(self, experiment: str) -> Iterator[None]:
        with self._lock:
            yield

    def url(self, experiment: str, tag: str, name: str, expires: int) -> str | None:
        return None  # nothing outside this process can read it

    def adopt(self, experiment: str, tag: str, folder: Path) -> bool:
        return False  # a folder is on disk, and these entries are not: write it through `stage`

    def committed_at(self, experiment: str, tag: str) -> float | None:
        entry = self._entry(experiment, tag)
        return entry.committed_at if entry is not None else None

    def stage(self, experiment: str, tag: str) -> MemoryStage:
        stage = MemoryStage(
            self, validate_name("experiment", experiment), validate_name("tag", tag),
            next(self._numbers),
        )  # fmt: skip
        with self._lock:
            self._experiments.setdefault(experiment, {})
            self._stages.setdefault(experiment, []).append(stage)
        return stage

    def join(self, experiment: str, tag: str, key: str) -> MemoryJoined:
        with self._lock:
            for stage in self._stages.get(validate_name("experiment", experiment), []):
                if stage.name == key and stage.tag == tag:
                    return MemoryJoined(stage)
        raise FileNotFoundError(f"{self.describe(experiment, key)}: no such stage in progress")

    def _commit(self, stage: MemoryStage, entry: _Entry, replace: bool) -> None:
        """A stage's commit: one swap of the tag's entry, under the lock."""
        with self._lock:
            entries = self._experiments[stage.experiment]
            if not replace and stage.tag in entries:
                where = self.describe(stage.experiment, stage.tag)
                raise FileExistsError(f"{where}: the entry exists")
            entries[stage.tag] = entry
            self._forget(stage)

    def _forget(self, stage: MemoryStage) -> None:
        with self._lock:
            stages = self._stages.get(stage.experiment, [])
            if stage in stages:
                stages.remove(stage)

    def delete(self, experiment: str, tag: str) -> bool:
        validate_name("experiment", experiment)
        validate_name("tag", tag)
        with self._lock:
            return self._experiments.get(experiment, {}).pop(tag, None) is not None

    def cleanup(self, experiment: str | None, complete: Complete) -> list[tuple[str, str]]:
        """Stages never committed nor aborted (their writer is gone). A commit here is one
        step, so no entry is ever left aside for `complete` to judge."""
        with self._lock:
            names = [experiment] if experiment is not None else sorted(self._stages)
            left = [s for name in names for s in self._stages.pop(name, [])]
        for stage in left:
            stage.sinks.clear()
        return [(s.experiment, s.name) for s in left]

    @contextmanager
    def guard(self, experiment: str) -> Iterator[None]:
        validate_name("experiment", experiment)
        with self._lock:
            lock = self._guards.setdefault(experiment, threading.RLock())
        with lock:
            yield
