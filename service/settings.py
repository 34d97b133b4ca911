"""Service settings from the environment (TRAINCTL_ prefix), read once per process.

The workers' settings are not declared here: `Settings` embeds the node's share of them
(store.worker_settings `NodeSettings`), and the supervisor hands them to its local workers."""

from __future__ import annotations

import ipaddress
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from trainctl.service.webhooks.targets import HostPolicy
from trainctl.store.backends.slurm import NAME as SLURM_NAME
from trainctl.store.backends.slurm import SlurmDefaults, time_limit_seconds
from trainctl.store.specs import MLFLOW_SETTING, WANDB_SETTING, Tracker
from trainctl.store.training.memory import LARGEST_GPU_MEMORY_BYTES
from trainctl.store.worker_settings import NodeSettings, WorkerNice

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve anywhere


class Settings(NodeSettings, BaseSettings):
    # An empty variable is unset: Compose and shell scripts write `TRAINCTL_WORKERS=` for "no
    # value", and a default beats failing to start on `int("")`.
    model_config = SettingsConfigDict(env_prefix="TRAINCTL_", extra="ignore", env_ignore_empty=True)

    host: str = Field("127.0.0.1", description="Address the API binds.")
    port: int = Field(8000, ge=0, le=65535, description="Port the API binds.")
    downloads: Literal["stream", "redirect"] = Field(
        "stream",
        description="File downloads of checkpoints and exports: stream through the service, or "
        "redirect (307) to a short-lived presigned URL of the bucket where storage_url has one.",
    )
    download_url_seconds: int = Field(
        300, ge=1, le=7 * 24 * 3600, description="How long a redirect's presigned URL is valid."
    )
    backend: Literal["local", "slurm"] = Field(
        "local",
        description="How runs reach workers: local, workers (this service's own, and any "
        "started by hand) claim them from the queue; slurm, each attempt is one Slurm job "
        "whose tasks run it, and no local worker starts (docs/scaling.md, 'Running on Slurm').",
    )
    slurm_partition: str | None = Field(
        None, pattern=SLURM_NAME, description="Slurm: the partition of a run that names none."
    )
    slurm_account: str | None = Field(
        None, pattern=SLURM_NAME, description="Slurm: the account of a run that names none."
    )
    slurm_qos: str | None = Field(
        None, pattern=SLURM_NAME, description="Slurm: the QOS of a run that names none."
    )
    slurm_time_limit: str | None = Field(
        None,
        description="Slurm: each job's time limit for a run that names none (Slurm's --time "
        "formats); unset: the partition's.",
    )
    slurm_poll_seconds: float = Field(
        5.0, gt=0, le=600, description="Slurm: how often squeue is read and queued runs submitted."
    )
    workers: int | None = Field(
        None,
        ge=0,
        le=64,
        description="Local worker processes; default one per GPU, one on CPU (none with the "
        "slurm backend).",
    )
    gpus_per_worker: int = Field(
        1,
        ge=1,
        le=64,
        description="GPUs each local worker sees: runs with nproc_per_node up to this many.",
    )
    # The service's own default: its local workers share the node with the API.
    worker_nice: WorkerNice = 10
    worker_healthy_seconds: float = Field(
        60.0,
        gt=0,
        le=86400,
        description="A local worker that exits sooner after its start crashed quickly: it is "
        "restarted after a backoff. One that lived longer is restarted at once.",
    )
    worker_restart_delay_seconds: float = Field(
        2.0,
        gt=0,
        le=3600,
        description="Wait before restarting a local worker after its first quick crash; "
        "doubles with each further quick crash in a row.",
    )
    worker_restart_delay_max_seconds: float = Field(
        30.0, gt=0, le=3600, description="Longest wait between restarts of a local worker."
    )
    worker_max_quick_crashes: int = Field(
        10,
        ge=1,
        le=100,
        description="Quick crashes in a row after which a local worker is no longer restarted "
        "(until the service restarts) and is reported.",
    )
    api_token: SecretStr | None = Field(
        None,
        description="Bearer token required when set; surrounding whitespace is dropped, and a "
        "blank token is no token.",
    )
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Host header values served (comma-separated, '*' for any); default: the "
        "loopback names when bound to a loopback address, any otherwise (a token guards it).",
    )
    data_roots: Annotated[list[Path], NoDecode] = Field(
        default_factory=list,
        description="Folders specs may read training data from (os.pathsep-separated).",
    )
    reap_seconds: float = Field(2.0, gt=0, le=600, description="How often leases are checked.")
    max_attempts: int = Field(
        3, ge=1, le=100, description="Attempts per run before it fails, unless it names its own."
    )
    max_gpus_per_node: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="The most GPUs any node of this cluster has: a run asking for more per "
        "node is a 422 at submit, since no worker could ever take it. Unset: any number is "
        "accepted, and a run no live worker can serve waits (its waiting_reason says why).",
    )
    max_gpu_memory_bytes: int = Field(
        LARGEST_GPU_MEMORY_BYTES,
        ge=1 << 30,
        le=1 << 50,
        description="The most memory one GPU of this cluster has. A CUDA run is refused at "
        "submit when its estimate exceeds what the live GPU workers report, and, while none "
        "is live (nor a GPU on this node), when it exceeds this: no worker that could join "
        "would hold it. Default: the largest GPU sold (288 GiB, NVIDIA B300 and AMD MI355X).",
    )
    trackers: Annotated[list[Tracker], NoDecode] = Field(
        default_factory=list,
        description="Trackers a train run is mirrored to when its spec names none "
        "(comma-separated: tensorboard, mlflow, wandb).",
    )
    mlflow_uri: str | None = Field(
        None,
        description="The MLflow tracking server runs with the 'mlflow' tracker are mirrored to "
        "(http or https; user:password@ in it for basic authentication).",
    )
    mlflow_timeout_seconds: float = Field(
        10.0, gt=0, le=300, description="The most one request to the MLflow server may take."
    )
    wandb_project: str | None = Field(
        None,
        description="The Weights & Biases project runs with the 'wandb' tracker are mirrored "
        "to; unset, the tracker is off and wandb is not imported. The API key is W&B's own "
        "(WANDB_API_KEY or ~/.netrc), never a setting.",
    )
    wandb_entity: str | None = Field(
        None,
        description="The W&B entity (user or team) of the project; unset: the key's own. With "
        "it set the dashboard links each run to its W&B page.",
    )
    wandb_mode: Literal["online", "offline"] = Field(
        "online",
        description="online: sent to the W&B server; offline: written under the data dir's "
        "wandb/ only, for `wandb sync` later.",
    )
    wandb_base_url: str | None = Field(
        None,
        description="The W&B server (http or https) of a self-hosted deployment; unset: W&B's "
        "own default (WANDB_BASE_URL, else https://api.wandb.ai).",
    )
    wandb_timeout_seconds: float = Field(
        30.0,
        gt=0,
        le=600,
        description="The most the W&B client may take to open a run, or to finish one.",
    )
    sink_poll_seconds: float = Field(
        1.0, gt=0, le=60, description="How often the metrics sinks read the event log."
    )
    sink_retry_max_seconds: float = Field(
        60.0,
        gt=0,
        le=3600,
        description="Longest wait between a sink's attempts while its tracker is down; the "
        "first wait is 1 s, doubling after.",
    )
    max_body_bytes: int = Field(1 << 20, ge=1024, description="Largest request body accepted.")
    store_concurrency: int = Field(
        16,
        ge=1,
        le=1024,
        description="Requests to the checkpoint and export stores, and submits (which may read "
        "them), served at once (each holds a thread of the pool of 40); one more waits for a "
        "slot.",
    )
    store_wait_seconds: float = Field(
        10.0,
        gt=0,
        le=600,
        description="How long a store request waits for a slot before a 503 with Retry-After.",
    )
    max_event_streams: int = Field(
        256, ge=1, le=100_000, description="Event streams open at once, in all; beyond, 503."
    )
    max_event_streams_per_token: int = Field(
        32,
        ge=1,
        le=100_000,
        description="Event streams one API token may hold open (without tokens, all requests "
        "share one count); beyond, 429.",
    )
    event_stream_keepalive_seconds: float = Field(
        15.0,
        ge=0.1,
        le=300,
        description="Quiet time after which an event stream sends a keepalive comment: below "
        "a proxy's idle timeout, and how soon a closed stream gives back its slot.",
    )
    webhook_allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Hosts webhooks may send to (comma-separated): names, '*.example.com', IP "
        "addresses or networks (10.0.0.0/8). Default: any address but link-local, multicast, "
        "unspecified, reserved and cloud metadata ones.",
    )
    webhook_timeout_seconds: float = Field(
        5.0, gt=0, le=300, description="The most one webhook delivery attempt may take."
    )
    webhook_max_attempts: int = Field(
        10, ge=1, le=100, description="Attempts per webhook delivery before it is given up."
    )
    webhook_retry_seconds: float = Field(
        10.0, gt=0, le=86400, description="Wait before a delivery's first retry; doubles after."
    )
    webhook_retry_max_seconds: float = Field(
        3600.0, gt=0, le=86400, description="Longest wait between a delivery's attempts."
    )
    webhook_concurrency: int = Field(
        4, ge=1, le=64, description="Webhook deliveries sent at once to one webhook."
    )
    webhook_poll_seconds: float = Field(
        0.5, gt=0, le=60, description="How often the webhook dispatcher reads the event log."
    )

    @field_validator("slurm_time_limit")
    @classmethod
    def _slurm_time(cls, v: str | None) -> str | None:
        if v:
            time_limit_seconds(v)  # a bad value stops the service at start, naming it
        return v or None

    @property
    def slurm_defaults(self) -> SlurmDefaults:
        return SlurmDefaults(
            self.slurm_partition, self.slurm_account, self.slurm_qos, self.slurm_time_limit
        )

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _split_hosts(cls, v: object) -> object:
        if isinstance(v, str):
            return [h.strip().lower() for h in v.split(",") if h.strip()]
        return v

    @field_validator("webhook_allowed_hosts", mode="before")
    @classmethod
    def _split_webhook_hosts(cls, v: object) -> object:
        if isinstance(v, str):
            v = [h.strip().lower() for h in v.split(",") if h.strip()]
        if isinstance(v, list):
            HostPolicy.parse(v)  # a bad entry stops the service at start, naming it
        return v

    @property
    def webhook_policy(self) -> HostPolicy:
        return HostPolicy.parse(self.webhook_allowed_hosts)

    @property
    def host_allow_list(self) -> list[str]:
        """The Host names served. On loopback the default keeps a web page the user visits
        from driving the API through DNS rebinding (its requests name the attacker's host)."""
        if self.allowed_hosts:
            return self.allowed_hosts
        return list(LOOPBACK_NAMES) if is_loopback(self.host) else ["*"]

    @field_validator("trackers", mode="before")
    @classmethod
    def _split_trackers(cls, v: object) -> object:
        if isinstance(v, str):
            return [t.strip().lower() for t in v.split(",") if t.strip()]
        return v

    @field_validator("mlflow_uri")
    @classmethod
    def _http_uri(cls, v: str | None) -> str | None:
        # The service speaks MLflow's REST API (service/sinks/mlflow.py): a file: or
        # databricks: URI would need the mlflow package in the API process.
        v = v.strip() if v else None
        if v and urlsplit(v).scheme not in ("http", "https"):
            raise ValueError(f"TRAINCTL_MLFLOW_URI must be an http or https URL, got {v!r}")
        return v or None

    @field_validator("wandb_base_url")
    @classmethod
    def _http_base_url(cls, v: str | None) -> str | None:
        v = v.strip().rstrip("/") if v else None
        if v and urlsplit(v).scheme not in ("http", "https"):
            raise ValueError(f"TRAINCTL_WANDB_BASE_URL must be an http or https URL, got {v!r}")
        return v or None

    @field_validator("wandb_project", "wandb_entity")
    @classmethod
    def _blank_is_unset(cls, v: str | None) -> str | None:
        return (v.strip() or None) if v else None

    @model_validator(mode="after")
    def _workers_of_the_backend(self) -> Settings:
        if self.backend != "local" and self.workers:
            raise ValueError(
                f"TRAINCTL_WORKERS={self.workers} with TRAINCTL_BACKEND={self.backend}: workers "
                "start inside the scheduler's jobs there, none on this node; unset it"
            )
        return self

    @model_validator(mode="after")
    def _trackers_configured(self) -> Settings:
        if len(set(self.trackers)) != len(self.trackers):
            raise ValueError(f"TRAINCTL_TRACKERS names a tracker twice: {self.trackers}")
        if "mlflow" in self.trackers and self.mlflow_uri is None:
            raise ValueError(f"TRAINCTL_TRACKERS names mlflow, but {MLFLOW_SETTING} is not set")
        if "wandb" in self.trackers and self.wandb_project is None:
            raise ValueError(f"TRAINCTL_TRACKERS names wandb, but {WANDB_SETTING} is not set")
        return self

    @field_validator("data_roots", mode="before")
    @classmethod
    def _split_roots(cls, v: object) -> object:
        if isinstance(v, str):
            return [p for p in v.split(":") if p]
        return v

    @field_validator("api_token", mode="before")
    @classmethod
    def _strip_token(cls, v: object) -> object:
        # HTTP drops whitespace around a header's value, so no client could ever send a token
        # that has it: such a token would turn every request away. Blank means none at all.
        if isinstance(v, SecretStr):
            v = v.get_secret_value()
        if isinstance(v, str):
            return v.strip() or None
        return v

    @property
    def redirect_seconds(self) -> int | None:
        """How long a download's presigned URL lives (service.files); None: downloads stream."""
        return self.download_url_seconds if self.downloads == "redirect" else None

    @property
    def datasets_dir(self) -> Path:
        return self.layout.datasets

    @property
    def tensorboard_dir(self) -> Path:
        return self.layout.tensorboard

    @property
    def wandb_dir(self) -> Path:
        return self.layout.wandb

    @property
    def log_dir(self) -> Path:
        return self.layout.logs


@lru_cache
def get_settings() -> Settings:
    return Settings()
