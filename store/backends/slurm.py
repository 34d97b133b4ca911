"""Slurm, the pure part (docs/design/backends.md, "Slurm"): what a run may ask of Slurm, the
`sbatch` command and batch script of one attempt, and `squeue --json` read tolerantly.

Nothing here runs a command: `service.backends.slurm` does, with argument lists, never a
shell. The batch script is the one text a shell reads; every value in it is quoted, and the
values a request may set are checked against a pattern first anyway, so a 422 names the
option before anything reaches Slurm.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ConfigDict, Field, StrictBool, field_validator

from trainctl.store.db.placement import Placement
from trainctl.store.text import TextChecked

NAME = r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}$"
"""A partition, account, QOS or reservation name: what Slurm's own names are made of."""
CONSTRAINT = r"^[A-Za-z0-9_.&|()\[\]*:,!-]{1,256}$"
"""A node feature expression (`--constraint`): features and & | [ ] ( ) * : , !"""
TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")
EXTRA_VALUE = re.compile(r"[^\x00-\x1f\x7f]{1,1024}")
"""Read with `fullmatch`: `$` in Python's `re` also matches before a final newline."""

SBATCH_EXTRAS = ("mem", "mem-per-cpu", "mem-per-gpu", "cpus-per-task", "nice", "licenses",
                 "mail-type", "mail-user", "gpus-per-node", "gpu-bind")  # fmt: skip
"""`sbatch` options a run may add: resources and notices, nothing that changes what runs or
where its output goes (those are trainctl's: --nodes, --output, --signal, --requeue ...)."""
SRUN_EXTRAS = ("container-image", "container-mounts", "container-workdir", "container-name",
               "container-env", "container-remap-root", "no-container-mount-home")  # fmt: skip
"""Options for the job's `srun`: pyxis/enroot's, so the worker runs in the cluster's
container (docs/scaling.md, "Running on Slurm")."""
FLAG_EXTRAS = ("container-remap-root", "no-container-mount-home")
"""Extras that take no value: given as `true`."""

SIGNAL_MARGIN_SECONDS = 15
"""Beyond the drain's own seconds, how early the job's signal is asked for before its time
limit: the worker's own stop after the save. Slurm sends it at its first check (every 30 s)
that finds the time left within the lead plus about 30 s: early, never late."""
SLURM_CHECK_SECONDS = 30
SBATCH_MAX_SIGNAL_SECONDS = 65535
JOB_NAME_PREFIX = "trainctl-"
JOB_STATES_ENDED = frozenset({"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED",
                              "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT",
                              "SPECIAL_EXIT", "REVOKED"})  # fmt: skip


class SlurmOptions(TextChecked):
    """What a run asks of Slurm: where it is charged and which nodes it may get. Unset
    fields take the service's defaults (TRAINCTL_SLURM_*)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    partition: str | None = Field(None, pattern=NAME, description="`--partition`.")
    account: str | None = Field(None, pattern=NAME, description="`--account`.")
    qos: str | None = Field(None, pattern=NAME, description="`--qos`.")
    reservation: str | None = Field(None, pattern=NAME, description="`--reservation`.")
    constraint: str | None = Field(
        None, pattern=CONSTRAINT, description="`--constraint`: node features, e.g. 'h100&ib'."
    )
    time_limit: str | None = Field(
        None,
        description="`--time` of each job (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or "
        "D-HH:MM:SS). A run longer than it drains before the limit and goes on in a new "
        "job without costing an attempt.",
    )
    exclusive: StrictBool = Field(False, description="`--exclusive`: whole nodes.")
    extra: dict[str, str] = Field(
        default_factory=dict,
        description="More options, by their Slurm name without dashes, from an allow-list: "
        f"for sbatch {', '.join(SBATCH_EXTRAS)}; for the job's srun {', '.join(SRUN_EXTRAS)} "
        f"({', '.join(FLAG_EXTRAS)} take 'true').",
    )

    @field_validator("time_limit")
    @classmethod
    def _time(cls, value: str | None) -> str | None:
        if value is not None:
            time_limit_seconds(value)  # raises ValueError naming the format
        return value

    @field_validator("extra")
    @classmethod
    def _extras(cls, value: dict[str, str]) -> dict[str, str]:
        allowed = (*SBATCH_EXTRAS, *SRUN_EXTRAS)
        for name, given in value.items():
            if name not in allowed:
                raise ValueError(
                    f"option {name!r} is not one a run may set; allowed: {', '.join(allowed)} "
                    "(the nodes, tasks, output, signal and requeue options are trainctl's)"
                )
            if name in FLAG_EXTRAS and given != "true":
                raise ValueError(f"option {name!r} takes no value: give 'true'")
            if not EXTRA_VALUE.fullmatch(given):
                raise ValueError(f"option {name!r}: 1 to 1024 characters, no control codes")
        return value


def time_limit_seconds(value: str) -> int:
    """Slurm's `--time` formats, in seconds; ValueError for anything else."""
    match = TIME.fullmatch(value)
    if match is None or value.count(":") > 2:
        raise ValueError(
            f"time_limit {value!r}: expected minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"
        )
    days, a, b, c = (int(g) if g is not None else None for g in match.groups())
    assert a is not None
    if days is not None:  # D-HH[:MM[:SS]]
        return days * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
    if c is not None:  # HH:MM:SS
        return a * 3600 + (b or 0) * 60 + c
    if b is not None:  # MM:SS
        return a * 60 + b
    return a * 60  # minutes


@dataclass(frozen=True)
class SlurmDefaults:
    """The service's settings a run's options fall back to (TRAINCTL_SLURM_*)."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit: str | None = None


def signal_lead_seconds(drain_seconds: float) -> int:
    """How long before its time limit a job is told to drain (`--signal=TERM@lead`)."""
    return min(int(drain_seconds) + SIGNAL_MARGIN_SECONDS, SBATCH_MAX_SIGNAL_SECONDS)


def check_time_limit(options: SlurmOptions | None, defaults: SlurmDefaults, drain: float) -> None:
    """Refuse a time limit that leaves no time to train between the job's start and its
    drain signal, which may come 30 s before the lead: every job of the chain would stop
    before its first step."""
    limit = (options.time_limit if options else None) or defaults.time_limit
    if limit is None:
        return
    lead = signal_lead_seconds(drain)
    least = lead + SLURM_CHECK_SECONDS + 30
    if time_limit_seconds(limit) < least:
        raise ValueError(
            f"slurm.time_limit {limit!r} leaves no time to train: each job is told to save "
            f"and stop {lead} s before its limit (TRAINCTL_DRAIN_SECONDS plus "
            f"{SIGNAL_MARGIN_SECONDS} s), and Slurm may tell it {SLURM_CHECK_SECONDS} s "
            f"sooner; give at least {least} s"
        )


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: int
    default: bool
    up: int | None = None
    """Its nodes a job may be given now (allocated or idle; not down, drained or failing)."""


def parse_partitions(sinfo: str) -> dict[str, Partition]:
    """`sinfo -h -s -o "%P %F"`: a partition per line, the default marked `*`, its nodes
    as allocated/idle/other/total."""
    found = {}
    for line in sinfo.splitlines():
        parts = line.split()
        if len(parts) != 2 or not parts[1].rsplit("/", 1)[-1].isdigit():
            continue
        name, default = parts[0].rstrip("*"), parts[0].endswith("*")
        counts = parts[1].split("/")
        up = int(counts[0]) + int(counts[1]) if len(counts) == 4 and counts[1].isdigit() else None
        found[name] = Partition(name, int(counts[-1]), default, up)
    return found


def check_partition(
    partitions: dict[str, Partition],
    placement: Placement,
    options: SlurmOptions | None,
    defaults: SlurmDefaults,
) -> None:
    """What Slurm would take and never run: a partition it does not have (sbatch refuses
    it), or more nodes than the partition has (sbatch accepts it, and the job pends for
    ever: PartitionNodeLimit). ValueError naming the field."""
    named = (options.partition if options else None) or defaults.partition
    where = "slurm.partition" if options and options.partition else "TRAINCTL_SLURM_PARTITION"
    if named is not None and named not in partitions:
        raise ValueError(
            f"{where} {named!r}: no such partition on this cluster "
            f"(it has {', '.join(sorted(partitions)) or 'none'})"
        )
    chosen = chosen_partition(partitions, options, defaults)
    fewest = placement.min_nnodes if placement.min_nnodes is not None else placement.nnodes
    if chosen is not None and fewest > chosen.nodes:  # an elastic gang runs on its fewest
        raise ValueError(
            f"nnodes {fewest}: partition {chosen.name!r} has {chosen.nodes} "
            f"node{'s' if chosen.nodes != 1 else ''}; the job would wait for ever"
        )


def chosen_partition(
    partitions: dict[str, Partition], options: SlurmOptions | None, defaults: SlurmDefaults
) -> Partition | None:
    """The partition a run's job goes to: its own, the service's, else the cluster's default."""
    named = (options.partition if options else None) or defaults.partition
    if named:
        return partitions.get(named)
    return next((p for p in partitions.values() if p.default), None)


def elastic_nodes(placement: Placement, up: int | None, waited: float) -> int | None:
    """How many nodes to ask Slurm for, for an attempt of an elastic gang (docs/design/
    placement.md, "Elastic gangs") whose partition has `up` nodes a job may be given (None:
    not known). All its `nnodes` where that many are up; after `shrink_after_seconds` in
    the queue, as many as are up down to `min_nnodes` (and `min_nnodes`, for Slurm to wait
    for, where fewer are up); None: not yet, the grace is still running. Slurm's own range
    (`--nodes=min-max`) is no help here: with cons_tres it gives the minimum at once."""
    if up is None or up >= placement.nnodes or placement.min_nnodes is None:
        return placement.nnodes
    fewest = placement.fewest(waited)
    if up >= fewest:
        return up
    return placement.min_nnodes if fewest < placement.nnodes else None


UP_STATES = ("idle", "alloc", "mix", "comp")
"""sinfo's short node states (%t) of a node a job may be given now, as `%F` counts it up
(allocated or idle); a suffix `*` (not responding) or a drain makes it down."""
STATE_FLAGS = "~#!%$@^-"
"""Suffixes of a short state that leave the node usable (powered down, rebooting soon ...)."""


def parse_node_states(sinfo: str) -> dict[str, dict[str, str]]:
    """`sinfo -h -N -o "%N %P %t"`: by partition (its default's `*` dropped), each node's
    state, its harmless suffixes dropped (`down*` stays as it is: not up)."""
    states: dict[str, dict[str, str]] = {}
    for line in sinfo.splitlines():
        parts = line.split()
        if len(parts) == 3:
            node, partition, state = parts
            states.setdefault(partition.rstrip("*"), {})[node] = state.rstrip(STATE_FLAGS)
    return states


def nodes_up(states: Mapping[str, str]) -> list[str]:
    """The nodes a job may be given now: allocated, mixed, completing or idle."""
    return [node for node, state in states.items() if state in UP_STATES]


def nodes_idle(states: Mapping[str, str]) -> list[str]:
    """The nodes no job holds, which a job may have at once."""
    return [node for node, state in states.items() if state == "idle"]


def nodes_to_exclude(avoid: Sequence[str], up: Sequence[str] | None, nnodes: int) -> list[str]:
    """The nodes of `avoid` (a run's stragglers': docs/design/hangs.md, "Stragglers") that an
    attempt's job is kept off (sbatch --exclude): all of them where the partition has
    `nnodes` up nodes besides them; else none, as where the nodes up are not known (`up`
    None): a job that excluded them would wait for nodes that are not there."""
    avoid = sorted(set(avoid))
    if not avoid or up is None or len(set(up) - set(avoid)) < nnodes:
        return []
    return avoid


def job_name(run_id: str) -> str:
    return f"{JOB_NAME_PREFIX}{run_id}"


def sbatch_command(
    run_id: str,
    attempt: int,
    placement: Placement,
    options: SlurmOptions | None,
    defaults: SlurmDefaults,
    *,
    drain_seconds: float,
    output: str,
    nnodes: int | None = None,
    exclude: Sequence[str] = (),
) -> list[str]:
    """`sbatch`'s arguments for one attempt of a run; the script comes on its stdin.
    `exclude`: nodes to keep it off (`nodes_to_exclude`)."""
    options = options or SlurmOptions()
    args = [
        "sbatch",
        "--parsable",
        f"--job-name={job_name(run_id)}",
        f"--comment=trainctl run {run_id} attempt {attempt}",
        f"--nodes={nnodes or placement.nnodes}",
        "--ntasks-per-node=1",
        "--no-requeue",  # trainctl decides what is retried, and from which checkpoint
        f"--signal=TERM@{signal_lead_seconds(drain_seconds)}",
        f"--output={output}",
        "--open-mode=append",
    ]
    if placement.gpus_per_node:
        args.append(f"--gres=gpu:{placement.gpus_per_node}")
    else:
        args.append(f"--cpus-per-task={placement.procs_per_node}")
    chosen = {
        "partition": options.partition or defaults.partition,
        "account": options.account or defaults.account,
        "qos": options.qos or defaults.qos,
        "reservation": options.reservation,
        "constraint": options.constraint,
        "time": options.time_limit or defaults.time_limit,
    }
    args += [f"--{name}={value}" for name, value in chosen.items() if value]
    if options.exclusive:
        args.append("--exclusive")
    if exclude:
        args.append(f"--exclude={','.join(exclude)}")
    for name, value in options.extra.items():
        if name in SBATCH_EXTRAS:
            if name == "cpus-per-task":
                args = [a for a in args if not a.startswith("--cpus-per-task=")]
            args.append(f"--{name}={value}")
    return args


def batch_script(run_id: str, worker: Sequence[str], options: SlurmOptions | None) -> str:
    """The job's script: one task per node, each a worker that serves this run and exits
    (`python -m trainctl.worker --slurm-run RUN`). `exec`: no shell stays between Slurm's
    signals and srun, which hands them to the tasks."""
    srun = ["srun", "--kill-on-bad-exit=1", "--ntasks-per-node=1"]
    for name, value in (options.extra if options else {}).items():
        if name in SRUN_EXTRAS:
            srun.append(f"--{name}" if name in FLAG_EXTRAS else f"--{name}={value}")
    command = [*srun, *worker, "--slurm-run", run_id]
    return "#!/bin/sh\nexec " + " ".join(shlex.quote(part) for part in command) + "\n"


# ---- squeue --json ------------------------------------------------------------------------


@dataclass(frozen=True)
class JobState:
    """One job as `squeue --json` shows it."""

    job_id: str
    state: str
    reason: str | None
    nodes: str | None
    name: str

    @property
    def ended(self) -> bool:
        return self.state in JOB_STATES_ENDED

    @property
    def pending(self) -> bool:
        return self.state == "PENDING"


def parse_squeue(payload: Mapping[str, Any]) -> dict[str, JobState]:
    """The jobs of `squeue --json`, by id. `job_state` is a string before Slurm 23.11 and a
    list after; `nodes` and `state_reason` may be missing or empty."""
    jobs: dict[str, JobState] = {}
    for job in payload.get("jobs") or []:
        if not isinstance(job, Mapping) or job.get("job_id") is None:
            continue
        raw = job.get("job_state")
        state = raw[0] if isinstance(raw, list) and raw else raw
        reason = job.get("state_reason")
        nodes = job.get("nodes")
        jobs[str(job["job_id"])] = JobState(
            job_id=str(job["job_id"]),
            state=str(state or "UNKNOWN").upper(),
            reason=str(reason) if reason and reason != "None" else None,
            nodes=str(nodes) if nodes else None,
            name=str(job.get("name") or ""),
        )
    return jobs
