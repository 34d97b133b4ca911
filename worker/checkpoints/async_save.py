"""Asynchronous checkpointing: stage the state in CPU memory, write it in the background.

A captured state holds the live tensors (`worker.checkpoints.state.capture_checkpoint` copies
nothing); `snapshot` copies each of them, once, into a CPU buffer kept from the previous save,
in the dtype it is saved in. From a GPU the buffers are pinned and the copies non-blocking:
the training thread only queues them, in order with the steps it has queued, and the writer
thread waits for them (one CUDA event per device) before it reads a byte. Training kernels
queued after the save run after the copies on the same stream, so they cannot change a
tensor before it is copied. A background thread then writes, hashes, fsyncs and commits the
checkpoint exactly as a synchronous save does (`worker.checkpoints.state.write_checkpoint`), so what
lands in the store is the same, byte for byte, and becomes visible only complete.

At most one save is in flight: a new save first waits for the previous one (and with it for
its buffers). A failed write is re-raised on the training thread at the next `save`, `poll`
or `wait`, never swallowed.

A drain (worker.drain) waits for the save only until its deadline (`wait(until=...)`). A write
that has not reached its commit by then is abandoned: `commit_gate`, which the write runs
just before its commit, refuses it from then on, so the checkpoint never becomes visible,
however long the write thread stays stuck (in an upload to a store that stopped answering).
A write that reached its commit first is waited for: one rename or one PUT of a manifest.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from trainctl.worker.checkpoints.state import CheckpointState

Write = Callable[[CheckpointState], str]
"""Writes and commits a state; returns where it went, in words (`write_checkpoint`)."""


class SaveAbandoned(RuntimeError):
    """A background save did not reach its commit by the drain's deadline: it never will."""


_writing = threading.local()
"""The PendingSave a writer thread writes (`commit_gate` reads it)."""


@dataclass
class Stager:
    """Copies tensors into CPU buffers that it keeps from save to save.

    Every save has the same keys, shapes and dtypes, so after the first the copies land in
    memory that is already allocated (and, from a GPU, already pinned: allocating pinned
    memory costs more than the copy). `devices` collects the GPUs copied from, whose streams
    `copied` marks.
    """

    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    devices: set[torch.device] = field(default_factory=set)

    def tree(self, obj: Any, key: str) -> Any:
        """`obj` with every tensor replaced by its copy, in its own dtype."""
        if isinstance(obj, torch.Tensor):
            return self.tensor(obj, key, obj.dtype)
        if isinstance(obj, dict):
            return {k: self.tree(v, f"{key}/{k}") for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return type(obj)(self.tree(v, f"{key}/{i}") for i, v in enumerate(obj))
        return obj

    def tensor(self, t: torch.Tensor, key: str, dtype: torch.dtype) -> torch.Tensor:
        """`t`'s copy in `dtype`, in the buffer kept under `key`."""
        t = t.detach()
        buf = self.buffers.get(key)
        if buf is None or buf.shape != t.shape or buf.dtype != dtype:
            buf = torch.empty(t.shape, dtype=dtype, device="cpu", pin_memory=t.is_cuda)
            self.buffers[key] = buf
        if not t.is_cuda:
            return buf.copy_(t)  # a CPU copy_ casts as it copies: one pass
        if t.dtype != dtype:
            # A transfer cannot convert: torch casts a cross-device copy_ through a temporary
            # either way (a blocking one through a pageable host copy in the source dtype,
            # twice the bytes). Cast on the device, one tensor at a time, as a synchronous
            # save does (same bytes), and move only the saved ones.
            t = t.to(dtype)
        self.devices.add(t.device)
        return buf.copy_(t, non_blocking=True)

    def copied(self) -> list[torch.cuda.Event]:
        """Events on each GPU's current stream, after the copies queued there."""
        events = []
        for device in self.devices:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(device))
            events.append(event)
        self.devices.clear()
        return events


@dataclass
class PendingSave:
    state: CheckpointState
    info: dict[str, Any]
    copied: list[torch.cuda.Event] = field(default_factory=list)
    """Done once the staged state is complete in host memory (GPU copies are asynchronous)."""
    thread: threading.Thread | None = None
    where: str | None = None
    error: BaseException | None = None
    gate: threading.Lock = field(default_factory=threading.Lock)
    """Held while `abandoned` or `committing` is decided: one of them wins, never both."""
    abandoned: bool = False
    committing: bool = False
    committed_at: float | None = None
    """`time.monotonic()` when the commit was done."""

    def abandon(self) -> bool:
        """Refuse the commit from now on; False if the write reached it first."""
        with self.gate:
            self.abandoned = not self.committing
            return self.abandoned


@dataclass
class AsyncCheckpointer:
    """Writes one checkpoint at a time in a background thread.

    `save` returns the `info` of the saves that finished since the last call, for the
    caller to report on its own thread (callbacks there may touch the run store).
    """

    _stager: Stager = field(default_factory=Stager)
    _pending: PendingSave | None = None

    def snapshot(self, state: CheckpointState, info: dict[str, Any]) -> PendingSave:
        """Queue the one copy of each of `state`'s tensors into the buffers (see Stager)."""
        stage = self._stager
        model = {
            k: stage.tensor(t, f"model/{k}", state.saved_dtype(t)) for k, t in state.model.items()
        }
        optimizer = stage.tree(state.optimizer, "optimizer")
        # The staged weights are in the saved dtype already: host_weights leaves them be.
        staged = CheckpointState(
            state.experiment, state.tag, model, optimizer, state.metadata, files=state.files
        )
        return PendingSave(staged, info, stage.copied())

    def save(self, state: CheckpointState, write: Write, info: dict[str, Any]) -> list[dict]:
        """Stage `state` (captured from the live tensors) and write it in the background."""
        finished = self.wait()  # at most one in flight; its buffers are ours again after this
        pending = self.snapshot(state, info)
        pending.thread = threading.Thread(
            target=self._write, args=(pending, write), name="trainctl-checkpoint", daemon=True
        )
        self._pending = pending
        pending.thread.start()
        return finished

    @staticmethod
    def _write(pending: PendingSave, write: Write) -> None:
        _writing.pending = pending
        try:
            for event in pending.copied:
                event.synchronize()  # the GPU's copies into the buffers are complete
            pending.where = write(pending.state)
            pending.committed_at = time.monotonic()
        except BaseException as exc:  # re-raised on the training thread by wait()
            pending.error = exc

    @staticmethod
    def commit_gate() -> None:
        """Run by a write just before its commit (`before_commit`), on the writer thread:
        raises SaveAbandoned once the training thread gave up on this save; after it
        returns, the training thread waits for the commit instead."""
        pending: PendingSave | None = getattr(_writing, "pending", None)
        if pending is None:  # a synchronous save: nobody abandons it
            return
        with pending.gate:
            if pending.abandoned:
                raise SaveAbandoned("the drain's deadline passed before this save committed")
            pending.committing = True

    @property
    def in_flight(self) -> bool:
        return self._pending is not None

    def poll(self) -> list[dict]:
        """The finished save's info (or its error, raised) if it is done; else nothing."""
        p = self._pending
        if p is None or (p.thread is not None and p.thread.is_alive()):
            return []
        return self.wait()

    def wait(self, until: float | None = None) -> list[dict]:
        """Block until the save in flight is committed; raise its error if it failed.
        With `until` (`time.monotonic()`), abandon it if it has not reached its commit by
        then, and raise SaveAbandoned; its thread may go on writing, but never commits."""
        p, self._pending = self._pending, None
        if p is None:
            return []
        if p.thread is not None:
            p.thread.join(None if until is None else max(0.0, until - time.monotonic()))
            if p.thread.is_alive() and p.abandon():
                raise SaveAbandoned(
                    f"checkpoint {p.state.experiment}/{p.state.tag} did not commit by the "
                    "drain's deadline; it was abandoned, and the previous one stays the latest"
                )
            p.thread.join()  # it reached its commit first: one rename or PUT to wait for
        if p.error is not None:
            raise p.error
        return [{**p.info, "path": p.where, "committed_at": p.committed_at}]
