"""Asynchronous checkpointing: stage the state in CPU memory, write it in the background.

A captured state holds the live tensors (`worker.checkpoint.capture_checkpoint` copies
nothing); `snapshot` copies each of them, once, into a CPU buffer kept from the previous save,
in the dtype it is saved in. From a GPU the buffers are pinned and the copies non-blocking:
the training thread only queues them, in order with the steps it has queued, and the writer
thread waits for them (one CUDA event per device) before it reads a byte. Training kernels
queued after the save run after the copies on the same stream, so they cannot change a
tensor before it is copied. A background thread then writes, hashes, fsyncs and commits the
checkpoint exactly as a synchronous save does (`worker.checkpoint.write_checkpoint`), so what
lands in the store is the same, byte for byte, and becomes visible only complete.

At most one save is in flight: a new save first waits for the previous one (and with it for
its buffers). A failed write is re-raised on the training thread at the next `save`, `poll`
or `wait`, never swallowed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from trainctl.worker.checkpoint import CheckpointState

Write = Callable[[CheckpointState], str]
"""Writes and commits a state; returns where it went, in words (`write_checkpoint`)."""


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
        try:
            for event in pending.copied:
                event.synchronize()  # the GPU's copies into the buffers are complete
            pending.where = write(pending.state)
        except BaseException as exc:  # re-raised on the training thread by wait()
            pending.error = exc

    @property
    def in_flight(self) -> bool:
        return self._pending is not None

    def poll(self) -> list[dict]:
        """The finished save's info (or its error, raised) if it is done; else nothing."""
        p = self._pending
        if p is None or (p.thread is not None and p.thread.is_alive()):
            return []
        return self.wait()

    def wait(self) -> list[dict]:
        """Block until the save in flight is committed; raise its error if it failed."""
        p, self._pending = self._pending, None
        if p is None:
            return []
        if p.thread is not None:
            p.thread.join()
        if p.error is not None:
            raise p.error
        return [{**p.info, "path": p.where}]
