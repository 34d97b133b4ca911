"""Asynchronous sharded checkpoints: the CPU copy of the shards, then their write and the
commit on a thread of ours, over a gloo group of their own (docs/design/checkpoints.md, "Sharded
checkpoints", "Async"). The write and the commit are `worker.checkpoints.sharded`'s, as in a
synchronous save, so what lands in the store is the same.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from trainctl.store.checkpoints.store import CheckpointStore, Protection
from trainctl.worker.checkpoints.dcp_storage import StoreWriter
from trainctl.worker.checkpoints.sharded import (
    ShardedState,
    finish_save,
    one_process_quiet,
    open_stage,
)
from trainctl.worker.training.parallel import rank_and_world


@dataclass
class _Pending:
    thread: threading.Thread
    info: dict[str, Any]
    staged: threading.Event = field(default_factory=threading.Event)
    where: str | None = None
    error: BaseException | None = None


STAGINGS = ("blocking", "background")


class AsyncShardedCheckpointer:
    """Sharded saves in the background, one in flight (a collective to build: every rank).

    The state is copied into CPU buffers kept from save to save, then a thread of ours
    writes it (`dcp.save` over a gloo group of this checkpointer's) and agrees on the commit
    over the same group: what `dcp.async_save` does (stage, then save on a thread), by hand,
    so that the copy can also be made on that thread. `staging` says when it is made:

    - ``blocking`` (the default): `save` copies, then returns; the copy is the loop's whole
      stall.
    - ``background``: `save` returns at once and our thread copies; the caller must call
      `wait_staged` before anything changes the tensors (the next optimizer step), so the
      forward and backward passes in between hide the copy.

    `save`, `poll` and `wait` return the `info` of the saves committed since the last call,
    with `path` (where it is, in words) and `save_seconds` added, as `AsyncCheckpointer`'s do
    (the training loop reports them). A failed save is raised at the next `save`, `poll` or
    `wait`, never swallowed.
    """

    def __init__(self, staging: str = "blocking") -> None:
        if staging not in STAGINGS:
            raise ValueError(f"staging must be one of {', '.join(STAGINGS)}, not {staging!r}")
        self.staging = staging
        distributed = dist.is_available() and dist.is_initialized()
        self.group = dist.new_group(backend="gloo") if distributed else None
        self._storage: StoreWriter | None = None
        self._pending: _Pending | None = None

    def save(
        self,
        state: ShardedState,
        store: CheckpointStore,
        *,
        max_keep: int | None = 3,
        protected: Protection = frozenset(),
        before_commit: Callable[[], None] | None = None,
        after_commit: Callable[[], None] | None = None,
        info: dict[str, Any] | None = None,
    ) -> list[dict[str, Any]]:
        """Start writing `state`; return the saves finished since the last call."""
        finished = self.wait()
        started = time.perf_counter()
        rank, world = rank_and_world(self.group)
        writer = open_stage(store, state.experiment, state.tag, self.group)
        if self._storage is None:
            self._storage = StoreWriter(writer, rank)
        storage = self._storage  # the same stager: its CPU buffers are reused
        storage.writer, storage.hashes = writer, {}
        staged: dict[str, Any] | None = None
        if self.staging == "blocking":
            try:
                staged = storage.stage(state.state)
            except BaseException:
                writer.abort()
                raise

        def write() -> None:
            try:
                copy = staged if staged is not None else storage.stage(state.state)
                pending.staged.set()
                with one_process_quiet(world):
                    dcp.save(
                        copy, storage_writer=storage, process_group=self.group,
                        no_dist=world == 1,
                    )  # fmt: skip
                pending.where = finish_save(
                    state, store, writer, storage, self.group, max_keep=max_keep,
                    protected=protected, before_commit=before_commit, after_write=None,
                    after_commit=after_commit,
                )  # fmt: skip
                pending.info["save_seconds"] = time.perf_counter() - started
            except BaseException as exc:  # raised on the training thread by wait()
                writer.abort()
                pending.error = exc
            finally:
                pending.staged.set()

        thread = threading.Thread(target=write, name="trainctl-dcp-save", daemon=True)
        pending = _Pending(thread, dict(info or {}))
        if staged is not None:
            pending.staged.set()
        self._pending = pending
        pending.thread.start()
        return finished

    def wait_staged(self) -> None:
        """Block until the save in flight holds its own copy of the state: after this the
        tensors may change (call it before the optimizer step that follows a save)."""
        if self._pending is not None:
            self._pending.staged.wait()

    def poll(self) -> list[dict[str, Any]]:
        """The finished save (or its error, raised) if it is done; else nothing."""
        pending = self._pending
        if pending is None or pending.thread.is_alive():
            return []
        return self.wait()

    def wait(self) -> list[dict[str, Any]]:
        """Block until the save in flight is committed; raise its error if it failed."""
        pending, self._pending = self._pending, None
        if pending is None:
            return []
        pending.thread.join()
        if pending.error is not None:
            raise pending.error
        return [{**pending.info, "path": pending.where}]
