"""Every setting of a worker, once: its variable (`TRAINCTL_<NAME>`), its flag, its default
and what it does (docs/design/runs.md, "Runs").

One field list serves every reader and writer. The worker reads its flags and environment
(`WorkerSettings.from_args`); the service's `Settings` embeds the share a node's workers
have in common (`NodeSettings`), and its supervisor writes them into each local worker's
environment (`NodeSettings.worker_settings`, `WorkerSettings.environ`); a multi-process run's
ranks get them in their job file, the secrets beside it in their environment
(`WorkerSettings.job_values`, `secrets`; worker.launch). So a new worker setting is one field
here and its row in docs/operations.md's settings table, and tests/store/test_worker_settings.py
checks that each field reaches all of them.

The worker's extra has pydantic but not pydantic-settings (the service's): the environment is
read here, from the fields, by the service's rules (the prefix; an empty variable is unset).
"""

from __future__ import annotations

import argparse
import os
import socket
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.fields import FieldInfo

from trainctl.store.checkpoints.s3 import parse_url
from trainctl.store.db.queue import GANG_RESERVE_SECONDS
from trainctl.store.layout import (
    CACHE_BYTES,
    DRAIN_SECONDS,
    HEARTBEAT_SECONDS,
    LEASE_SECONDS,
    POLL_SECONDS,
    DataLayout,
)

PREFIX = "TRAINCTL_"


@dataclass(frozen=True)
class Flag:
    """A setting's flag where it is not `--<name>` (`worker_nice` is `--nice`)."""

    name: str


@dataclass(frozen=True)
class Secret:
    """A setting that may hold a password: it travels in environments, never in a file."""


SECRET = Secret()

WorkerNice = Annotated[
    int,
    Field(
        ge=0,
        le=19,
        description="Niceness a worker adds to itself before any thread starts: training "
        "yields the CPU to whatever else the node serves.",
    ),
    Flag("--nice"),
]
"""Its own type, for its defaults differ: a worker by hand is not niced, the service's local
workers are (service.settings)."""


class NodeSettings(BaseModel):
    """The settings every worker of a node shares with the others and with the service that
    starts them: the service's `Settings` embeds these fields, and hands them on."""

    data_dir: Path = Field(Path("data"), description="SQLite file, checkpoints and logs.")
    database_url: Annotated[str | None, SECRET] = Field(
        None, description="SQLAlchemy URL of the run queue; default SQLite in data_dir."
    )
    storage_url: str | None = Field(
        None,
        examples=["s3://bucket/prefix"],
        description="s3://bucket/prefix: checkpoints and exports in that bucket (credentials "
        "and AWS_ENDPOINT_URL from the AWS environment); default the data_dir's folders.",
    )
    cache_dir: Path | None = Field(
        None, description="Local copies of files read from the bucket; default data_dir/cache."
    )
    cache_bytes: int = Field(
        CACHE_BYTES,
        ge=1,
        description="The most cache_dir holds: past it, the least recently used files go.",
    )
    worker_nice: WorkerNice = 0
    worker_memory_bytes: Annotated[int | None, Flag("--memory-bytes")] = Field(
        None,
        ge=1,
        description="The most memory a worker's runs may use, below its GPU's or the host's. "
        "Workers report it as their memory, and a transformers or plug-in model is admitted "
        "against it at claim with its real parameter count.",
    )
    lease_seconds: float = Field(LEASE_SECONDS, gt=0, le=3600, description="Run lease of a worker.")
    heartbeat_seconds: float = Field(
        HEARTBEAT_SECONDS, gt=0, le=600, description="Worker heartbeat period."
    )
    poll_seconds: float = Field(
        POLL_SECONDS, gt=0, le=60, description="How often an idle worker asks the queue for a run."
    )
    drain_seconds: float = Field(
        DRAIN_SECONDS,
        gt=0,
        le=3600,
        description="How long a run has, from SIGTERM or a drain request, to save its "
        "checkpoint and go back to the queue; the service's stop waits this long for its "
        "workers.",
    )
    node_name: str | None = Field(
        None,
        description="The node a worker is on; workers of one node share it (placement keeps a "
        "gang on one node, or spreads it). Default: the host name.",
    )
    worker_address: Annotated[str | None, Flag("--address")] = Field(
        None,
        description="The address gang members on other nodes reach a worker at (torchrun's "
        "rendezvous). Default: the host's fully qualified name.",
    )
    rendezvous_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="The TCP port a gang a worker leads meets on (torchrun's c10d rendezvous); "
        "0: a free port each time. Fix it where a firewall must allow it.",
    )
    gang_reserve_seconds: float = Field(
        GANG_RESERVE_SECONDS,
        ge=0,
        description="After a gang has waited this long, workers that could join it take no "
        "smaller run behind it.",
    )
    max_queued_runs: int = Field(
        1000, ge=1, le=1_000_000, description="Runs that may wait at once; beyond, 429."
    )
    max_queued_runs_per_token: int = Field(
        100, ge=1, le=1_000_000, description="Runs one API token may have waiting; beyond, 429."
    )

    @field_validator("storage_url")
    @classmethod
    def _check_storage_url(cls, v: str | None) -> str | None:
        if v is not None:
            parse_url(v)  # a ValueError that names the URL and the form it must have
        return v

    @property
    def layout(self) -> DataLayout:
        return DataLayout(self.data_dir, self.storage_url, self.cache_dir, self.cache_bytes)

    @property
    def db_url(self) -> str:
        return self.database_url or self.layout.sqlite_url

    @property
    def checkpoint_dir(self) -> Path:
        return self.layout.checkpoints

    def worker_settings(self, worker_id: str) -> WorkerSettings:
        """The settings of worker `worker_id` started here (service.supervisor)."""
        shared = {name: getattr(self, name) for name in NodeSettings.model_fields}
        return WorkerSettings(**shared, worker_id=worker_id).resolved()


class WorkerSettings(NodeSettings):
    """Every setting of one worker process: its node's, and its own name."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    worker_id: str = Field(
        "",
        description="The worker's name in /workers and in its runs' events. Default: "
        "<host>-<pid>-<random>; the service names each local worker.",
    )

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], **given: Any) -> WorkerSettings:
        """The settings in `environ`'s TRAINCTL_ variables, where `given` names none."""
        read = {
            name: environ[variable(name)]
            for name in cls.model_fields
            if environ.get(variable(name))  # empty is unset, as compose and `docker -e` pass it
        }
        return cls.model_validate({**read, **given})

    @classmethod
    def from_job(cls, values: Mapping[str, Any], environ: Mapping[str, str]) -> WorkerSettings:
        """A child's reading of the `job_values` its parent wrote, with the `secrets` from
        the environment it was given: the values beat whatever else that environment holds."""
        return cls.from_environ(environ, **values)

    @classmethod
    def from_args(
        cls,
        argv: Sequence[str] | None = None,
        environ: Mapping[str, str] | None = None,
        *,
        prog: str | None = None,
        description: str | None = None,
    ) -> WorkerSettings:
        """A worker's reading, flags before variables before defaults, completed for this
        process (`resolved`, `named`). A bad value stops it (exit 2), naming where it came
        from and what it must be."""
        parser = cls.parser(prog, description)
        given = {k: v for k, v in vars(parser.parse_args(argv)).items() if v is not None}
        try:
            settings = cls.from_environ(os.environ if environ is None else environ, **given)
        except ValidationError as exc:
            refuse(parser, exc, given)
        return settings.resolved().named()

    @classmethod
    def parser(cls, prog: str | None, description: str | None) -> argparse.ArgumentParser:
        """The worker's command line, one flag a field; each value is read as its field's."""
        p = argparse.ArgumentParser(prog=prog, description=description)
        for name, field in cls.model_fields.items():
            default = field.get_default(call_default_factory=True)
            shown = "unset" if default in (None, "") else default
            help_text = f"{field.description} ({variable(name)}; default {shown})"
            option = flag(name, field)
            p.add_argument(
                option,
                dest=name,
                default=None,
                metavar=option.lstrip("-").replace("-", "_").upper(),
                help=help_text.replace("%", "%%"),
            )
        return p

    def resolved(self) -> WorkerSettings:
        """The same settings for a process started in another folder: the folders absolute,
        and the database URL spelled out (the default names the data dir's file)."""
        cache = self.cache_dir.resolve() if self.cache_dir is not None else None
        update = {"data_dir": self.data_dir.resolve(), "cache_dir": cache}
        return self.model_copy(update={**update, "database_url": self.db_url})

    @property
    def node(self) -> str:
        """The node this worker is on, as it registers it: `node_name`, else the host name."""
        return self.node_name or socket.gethostname()

    def named(self) -> WorkerSettings:
        """This process's own name, node and address where the settings leave them to it."""
        host = socket.gethostname()
        return self.model_copy(
            update={
                "worker_id": self.worker_id or f"{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}",
                "node_name": self.node,
                "worker_address": self.worker_address or socket.getfqdn(),
            }
        )

    def environ(self) -> dict[str, str]:
        """Every setting given a value, as the variables `from_environ` reads back; an unset
        one is left out, and its reader's default is the same."""
        return {
            variable(name): str(value) for name, value in self if value is not None and value != ""
        }

    def secrets(self) -> dict[str, str]:
        """The variables of the settings that may hold a password (`job_values` has the rest)."""
        hidden = {variable(name) for name in secret_names(type(self))}
        return {k: v for k, v in self.environ().items() if k in hidden}

    def job_values(self) -> dict[str, Any]:
        """The settings a file may hold, as JSON: all but the secrets (`from_job`)."""
        return self.model_dump(mode="json", exclude=secret_names(type(self)))


def variable(name: str) -> str:
    """The environment variable of setting `name`: the service's prefix, in capitals."""
    return f"{PREFIX}{name.upper()}"


def inherited(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` less every worker setting: a child process gets those from its parent's
    settings (`WorkerSettings.environ`, `secrets`), never by inheritance alone, which would
    hand it the parent's environment rather than what the parent was given."""
    left_out = set(map(variable, WorkerSettings.model_fields))
    return {k: v for k, v in environ.items() if k not in left_out}


def flag(name: str, field: FieldInfo) -> str:
    return next(
        (m.name for m in field.metadata if isinstance(m, Flag)), f"--{name}".replace("_", "-")
    )


def secret_names(model: type[BaseModel]) -> set[str]:
    return {name for name, f in model.model_fields.items() if SECRET in f.metadata}


def bounds(field: FieldInfo) -> str | None:
    """What a field's constraints ask, in words: "between 0 and 19", "above 0"."""
    found = {
        word: getattr(m, attr)
        for m in field.metadata
        for kind, word, attr in LIMITS
        if isinstance(m, kind)
    }
    if "at least" in found and "at most" in found:
        return f"between {found['at least']} and {found['at most']}"
    return " and ".join(f"{word} {limit}" for word, limit in found.items()) or None


LIMITS = ((Gt, "above", "gt"), (Ge, "at least", "ge"), (Le, "at most", "le"), (Lt, "below", "lt"))
BOUND_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}


def refuse(
    parser: argparse.ArgumentParser, exc: ValidationError, given: Mapping[str, Any]
) -> NoReturn:
    """Stop the worker at start on a bad setting, naming the flag or the variable it came from."""
    fields = WorkerSettings.model_fields
    problems = []
    for error in exc.errors():
        name = str(error["loc"][0]) if error["loc"] else ""
        field = fields.get(name)
        if field is None:
            problems.append(error["msg"])
            continue
        source = flag(name, field) if name in given else variable(name)
        wanted = bounds(field) if error["type"] in BOUND_ERRORS else None
        if wanted:
            problems.append(f"{source} must be {wanted}, got {error['input']}")
        elif error["type"] == "value_error":  # a validator's own message, naming the value
            problems.append(f"{source}: {error['ctx']['error']}")
        else:
            problems.append(f"{source}: {error['msg']}, got {error['input']!r}")
    parser.error("; ".join(problems))
