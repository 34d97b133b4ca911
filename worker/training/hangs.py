"""Hangs and stragglers, worker half (docs/design/hangs.md; the settings and statistics are
`store.training.hangs`).

**Hangs.** Every rank of a torchrun launch owns a slot of a small shared file in the launch's
folder (`ProgressBoard`): its pid, its step, and the monotonic time by which it must show
progress again (its deadline). It rewrites the slot at each step boundary (`RankPulse`, a
few bytes into a memory map, no collective and no host-device sync), with a deadline learned
from its own step times, or with the allowance around a validation, sample or save. The
worker process that launched the ranks reads the board while it watches torchrun
(`worker.launch.watch`); once a deadline has passed (`overdue`), it has every local rank
write its Python stacks (faulthandler, registered on SIGUSR1 in each rank), puts them in the
run's events, kills the ranks and raises `RanksHung`, which requeues the run as a new attempt,
as a lost gang member does. Each gang member's worker watches its own node's ranks: the
ranks of the others stop at their next collective, miss their own deadlines, and are dumped
by their workers too.

**Stragglers.** Each rank times its own work of a step: from the step's start to the last
micro-batch's backward, where DDP starts averaging the gradients and the fast ranks start
waiting for the slow one (`OwnClock`; on a GPU with CUDA events, read after the step's own
sync). The times ride on the all-reduce the ranks make at every step boundary anyway
(`worker.training.parallel.AgreedStop`), so rank 0 learns every rank's and reports the slow
ones (`StragglerWatch`).

**Test hooks.** `TRAINCTL_TEST_RANK_FAULT` makes a rank misbehave on purpose, for the tests of
these mechanisms only (`RankFault`).
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import mmap
import os
import signal
import struct
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import torch
import torch.distributed as dist

from trainctl.store.processes import OUTERMOST_FRAME
from trainctl.store.training.hangs import HangOptions, StragglerOptions, step_timeout, stragglers
from trainctl.worker.training.parallel import rank_and_world

BOARD_FILE = "progress"
STACKS_FILE = "stacks-{rank}.txt"
SLOT = struct.Struct("<qqqdd")
"""A rank's slot: pid, global rank, step, deadline (time.monotonic(); 0: not watched, as
before training or after it), and the phase's code (`PHASES`)."""
PHASES = {0.0: "a training step", 1.0: "a validation, sample or save"}
DUMP_WAIT_SECONDS = 5.0
"""How long the worker waits for the ranks' stacks once it has asked for them."""
STACK_SIGNAL = signal.SIGUSR1
FAULT_VARIABLE = "TRAINCTL_TEST_RANK_FAULT"


class RanksHung(RuntimeError):
    """A rank of this node made no progress within its timeout: the attempt was stopped."""


# ---- the board: one slot per local rank ----------------------------------------------------


class ProgressBoard:
    """The launch folder's progress file, mapped: `nproc` slots of `SLOT`."""

    def __init__(self, path: Path, nproc: int) -> None:
        self.nproc = nproc
        with open(path, "r+b") as f:
            self.map = mmap.mmap(f.fileno(), nproc * SLOT.size)

    @classmethod
    def create(cls, folder: Path, nproc: int) -> ProgressBoard:
        (folder / BOARD_FILE).write_bytes(bytes(nproc * SLOT.size))
        return cls(folder / BOARD_FILE, nproc)

    def write(self, local_rank: int, rank: int, step: int, deadline: float, phase: float) -> None:
        SLOT.pack_into(self.map, local_rank * SLOT.size, os.getpid(), rank, step, deadline, phase)

    def slots(self) -> Iterator[tuple[int, int, int, float, float]]:
        for i in range(self.nproc):
            yield SLOT.unpack_from(self.map, i * SLOT.size)


@dataclass(frozen=True)
class Hang:
    """What the watch saw: the overdue ranks and every local rank's pid."""

    overdue: list[tuple[int, int, str, float]]
    """(rank, step, phase, seconds past its deadline), the longest overdue first."""
    pids: dict[int, int]
    """Each local rank that has written its slot: rank -> pid."""

    def describe(self) -> str:
        rank, step, phase, late = self.overdue[0]
        others = [r for r, *_ in self.overdue[1:]]
        also = f"; also overdue: rank(s) {others}" if others else ""
        return (
            f"rank {rank} made no progress in {phase} after step {step} for {late:.1f} s "
            f"past its timeout{also}"
        )


def overdue(board: ProgressBoard, now: float | None = None) -> Hang | None:
    """The hang the board shows at `now`, if a watched rank is past its deadline."""
    now = time.monotonic() if now is None else now
    slots = [s for s in board.slots() if s[0] > 0]
    late = [
        (rank, step, PHASES.get(phase, "a step"), now - deadline)
        for _, rank, step, deadline, phase in slots
        if 0 < deadline < now
    ]
    if not late:
        return None
    late.sort(key=lambda x: -x[3])
    return Hang(late, {rank: pid for pid, rank, *_ in slots})


def dump_stacks(hang: Hang, folder: Path) -> dict[int, str]:
    """Ask every local rank for its Python stacks (faulthandler, `register_stack_dump`) and
    return them by rank. A rank stopped (SIGSTOP) gets SIGCONT too: a pending signal is
    handled only once it runs again, and it is about to be killed anyway."""
    for pid in hang.pids.values():
        with contextlib.suppress(ProcessLookupError):
            signal_main_thread(pid, STACK_SIGNAL)
            os.kill(pid, signal.SIGCONT)
    files = {rank: folder / STACKS_FILE.format(rank=rank) for rank in hang.pids}
    until = time.monotonic() + DUMP_WAIT_SECONDS
    while True:
        stacks = {r: f.read_text(errors="replace") if f.exists() else "" for r, f in files.items()}
        if all(map(dump_complete, stacks.values())) or time.monotonic() >= until:
            return stacks
        time.sleep(0.05)


def signal_main_thread(pid: int, sig: int) -> None:
    """Send `sig` to the main thread of process `pid` (tgkill; its thread id is its pid). A
    signal sent to the process goes to whichever of its threads the kernel picks: to a rank
    that was stopped, the first to run again, while its main thread, the one whose stack
    says where the rank was, goes on running Python (a CI run dumped a stopped rank already
    a step further on). Sent to the main thread, it is handled before that thread runs on."""
    try:
        tgkill = ctypes.CDLL(None, use_errno=True).tgkill
    except AttributeError:  # a C library without tgkill (glibc < 2.30): the process, then
        os.kill(pid, sig)
        return
    if tgkill(pid, pid, sig) != 0:
        error = ctypes.get_errno()
        raise OSError(error, os.strerror(error))  # ESRCH: a ProcessLookupError


def dump_complete(stacks: str) -> bool:
    """Whether a rank has written all of its dump. faulthandler writes it in many small
    writes, threads newest first, so the main thread comes last and its outermost frame is
    the dump's last line: a rank paused by the scheduler midway leaves a file that merely
    stops growing for a while (an earlier wait for "no longer growing" cut rank 1's stack
    off above the frame where it stopped, on a loaded CI machine)."""
    return stacks.rstrip("\n").endswith(OUTERMOST_FRAME)


def kill_ranks(hang: Hang) -> None:
    """End the local ranks at once: a hung one answers nothing else (torchrun then ends)."""
    for pid in hang.pids.values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def register_stack_dump(folder: Path, rank: int) -> IO[str]:
    """In a rank: write every thread's Python stack to its stacks file on SIGUSR1. The
    handler is faulthandler's, in C, so it answers even while the rank waits inside a
    collective. The file stays open for the rank's life."""
    out = open(folder / STACKS_FILE.format(rank=rank), "w")  # noqa: SIM115
    faulthandler.register(STACK_SIGNAL, file=out, all_threads=True)
    return out


# ---- a rank's side ---------------------------------------------------------------------------


class NoPulse:
    """A Trainer's pulse where nobody watches (one process, tests, benchmarks)."""

    def start_step(self, step: int) -> None:
        pass

    def stepped(self, seconds: float) -> None:
        pass

    def section(self, step: int) -> None:
        pass

    def done(self) -> None:
        pass


class RankPulse(NoPulse):
    """A rank's slot, rewritten at each step boundary with its next deadline."""

    def __init__(self, board: ProgressBoard, local_rank: int, rank: int, options: HangOptions):
        self.board, self.local_rank, self.rank, self.options = board, local_rank, rank, options
        self.times: deque[float] = deque(maxlen=options.window)
        self.timeout = step_timeout([], options)

    def start_step(self, step: int) -> None:
        self.board.write(self.local_rank, self.rank, step, time.monotonic() + self.timeout, 0.0)

    def stepped(self, seconds: float) -> None:
        self.times.append(seconds)
        self.timeout = step_timeout(self.times, self.options)

    def section(self, step: int) -> None:
        deadline = time.monotonic() + self.timeout + self.options.allowance_seconds
        self.board.write(self.local_rank, self.rank, step, deadline, 1.0)

    def done(self) -> None:
        self.board.write(self.local_rank, self.rank, 0, 0.0, 0.0)


class OwnClock:
    """A rank's own work in a step: from `begin` to `end` (before the last backward, where
    the gradients' all-reduce starts). On a GPU, CUDA events, read after the step's own
    sync (the `.tolist()` of its loss), so timing it adds none."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.started = self.ended = 0.0
        self.events: tuple[Any, Any] | None = None

    def begin(self) -> None:
        if self.cuda:
            self.events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(True))
            self.events[0].record()
        else:
            self.started = time.perf_counter()

    def end(self) -> None:
        if self.events is not None:
            self.events[1].record()
        else:
            self.ended = time.perf_counter()

    def seconds(self) -> float:
        """The last step's; call after the step's sync."""
        if self.events is not None:
            return float(self.events[0].elapsed_time(self.events[1])) / 1000
        return self.ended - self.started


class StragglerWatch:
    """Rank 0's: every rank's own step times, and a report whenever the set of stragglers
    changes (`report(slow)`: rank -> slowdown, {} once they caught up)."""

    def __init__(
        self,
        options: StragglerOptions,
        world: int,
        report: Callable[[dict[int, float]], None],
    ) -> None:
        self.options, self.report = options, report
        self.times = [deque[float](maxlen=options.window) for _ in range(world)]
        self.step = 0
        self.slow: dict[int, float] = {}

    def observe(self, own_seconds: list[float]) -> None:
        self.step += 1
        for times, seconds in zip(self.times, own_seconds, strict=True):
            times.append(seconds)
        if self.step < self.options.window:
            return
        slow = stragglers(self.times, self.options)
        if slow.keys() != self.slow.keys():
            self.report(slow)
        self.slow = slow


def straggler_report(
    slow: dict[int, float], step: int, options: StragglerOptions, nodes: Sequence[str]
) -> tuple[str, dict[str, Any]]:
    """A change of the stragglers, in words and as the log event's `straggler` field (the
    service's /metrics and the dashboard read it): `slowdowns` by rank, {} once none is, and
    the node of each (`nodes`: every rank's). A run that avoids its stragglers' nodes
    (`options.avoid`) names them in `avoid_nodes`, which the run store records on the run for
    its next placement ([] once none is slow)."""
    data: dict[str, Any] = {
        "step": step,
        "slowdowns": {str(r): round(x, 4) for r, x in sorted(slow.items())},
        "nodes": {str(r): nodes[r] for r in sorted(slow)},
        "threshold": options.threshold,
        "window": options.window,
    }
    if options.avoid:
        data["avoid_nodes"] = sorted({nodes[r] for r in slow})
    if not slow:
        return f"no straggler any more at step {step}", data
    ranks = ", ".join(f"rank {r} on {nodes[r]} ({x:+.0%})" for r, x in sorted(slow.items()))
    avoid = "; the next attempt avoids its nodes where it can" if options.avoid else ""
    return (
        f"straggler at step {step}: {ranks} slower than the other ranks over the last "
        f"{options.window} steps (own work before the gradient all-reduce){avoid}",
        data,
    )


def rank_nodes(node: str) -> list[str]:
    """Every rank's node, by rank (an all-gather, once per launch, that every rank calls):
    torchrun's rendezvous numbers the nodes in the order they joined, so only the ranks
    know which node each rank is on."""
    rank, world = rank_and_world()
    if world == 1:
        return [node]
    nodes: list[Any] = [None] * world
    dist.all_gather_object(nodes, node)
    assert nodes[rank] == node
    return [str(n) for n in nodes]


@dataclass
class RankWatches:
    """What a rank's Trainer does for the hang and straggler watches; nothing by default."""

    pulse: NoPulse = field(default_factory=NoPulse)
    own: OwnClock | None = None
    """Times the rank's own work of each step, for the straggler watch."""
    fault: RankFault | None = None


# ---- test hooks --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankFault:
    """The faults a test asks of one rank, in TRAINCTL_TEST_RANK_FAULT (never set outside the
    tests of this module's mechanisms), comma-separated: `<rank>:slow:<seconds>` sleeps that
    long in each step's own work, `<rank>:stop:<step>` stops the rank (SIGSTOP, as a debugger
    or a stuck device would) as it starts the step after `<step>`, in an attempt that trained
    a step (so that the attempt resumed from that step's checkpoint goes on)."""

    slow_seconds: float = 0.0
    stop_after: int | None = None

    @classmethod
    def from_env(cls, rank: int) -> RankFault | None:
        mine = [
            (action, float(value))
            for who, action, value in (
                f.split(":") for f in os.environ.get(FAULT_VARIABLE, "").split(",") if f
            )
            if int(who) == rank
        ]
        if not mine:
            return None
        faults = dict(mine)
        stop = faults.get("stop")
        return cls(faults.get("slow", 0.0), int(stop) if stop is not None else None)

    def maybe_slow(self) -> None:
        if self.slow_seconds:
            time.sleep(self.slow_seconds)

    def maybe_stop(self, step: int, trained: int) -> None:
        if step == self.stop_after and trained > 0:
            os.kill(os.getpid(), signal.SIGSTOP)
