"""Asynchronous checkpointing: copy the state to CPU memory, write it in the background.

The training loop stalls only for the copy (a memcpy into buffers kept from the previous
save); a background thread then writes, hashes, fsyncs and commits the checkpoint exactly as
a synchronous save does (`worker.checkpoint.write_checkpoint`), so what lands on disk is the
same, byte for byte, and becomes visible only complete.

At most one save is in flight: a new save first waits for the previous one. A failed write
is re-raised on the training thread at the next `save`, `poll` or `wait`, never swallowed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from worker.checkpoint import CheckpointState

Write = Callable[[CheckpointState], Path]


def copy_tree(obj: Any, buffers: dict[str, torch.Tensor], key: str = "") -> Any:
    """`obj` with every tensor copied into a CPU buffer of `buffers` (made on first use).

    Buffers are reused from save to save (same keys, shapes and dtypes every time), so a
    copy is a plain memcpy into memory that is already mapped; on CUDA they are pinned and
    the copies asynchronous until one synchronize at the end of `snapshot`.
    """
    if isinstance(obj, torch.Tensor):
        buf = buffers.get(key)
        if buf is None or buf.shape != obj.shape or buf.dtype != obj.dtype:
            pin = obj.is_cuda
            buf = torch.empty(obj.shape, dtype=obj.dtype, device="cpu", pin_memory=pin)
            buffers[key] = buf
        return buf.copy_(obj.detach(), non_blocking=obj.is_cuda)
    if isinstance(obj, dict):
        return {k: copy_tree(v, buffers, f"{key}/{k}") for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(copy_tree(v, buffers, f"{key}/{i}") for i, v in enumerate(obj))
    return obj


@dataclass
class PendingSave:
    state: CheckpointState
    info: dict[str, Any]
    thread: threading.Thread | None = None
    path: Path | None = None
    error: BaseException | None = None


@dataclass
class AsyncCheckpointer:
    """Writes one checkpoint at a time in a background thread.

    `save` returns the `info` of the saves that finished since the last call, for the
    caller to report on its own thread (callbacks there may touch the run store).
    """

    _buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    _pending: PendingSave | None = None

    def snapshot(self, state: CheckpointState) -> CheckpointState:
        model = copy_tree(state.model, self._buffers, "model")
        optimizer = copy_tree(state.optimizer, self._buffers, "optimizer")
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the pinned copies are complete before the thread reads
        return CheckpointState(state.experiment, state.tag, model, optimizer, state.metadata)

    def save(self, state: CheckpointState, write: Write, info: dict[str, Any]) -> list[dict]:
        """Copy `state` (captured from the live tensors) and write it in the background."""
        finished = self.wait()  # at most one in flight; its buffers are ours again after this
        pending = PendingSave(self.snapshot(state), info)
        pending.thread = threading.Thread(
            target=self._write, args=(pending, write), name="trainctl-checkpoint", daemon=True
        )
        self._pending = pending
        pending.thread.start()
        return finished

    @staticmethod
    def _write(pending: PendingSave, write: Write) -> None:
        try:
            pending.path = write(pending.state)
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
        return [{**p.info, "path": str(p.path)}]
