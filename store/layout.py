"""The data dir's layout and the worker's timing defaults, read by the service and the worker
alike (docs/design/runs.md, "Runs" and docs/design/checkpoints.md, "Checkpoint store"): both sides
of the database and the folders must agree on them, so each is written once, here.

```
<data dir>/
  trainctl.db      the run database, when TRAINCTL_DATABASE_URL is unset (SQLite)
  checkpoints/     the checkpoint store: <experiment>/<tag>/
  datasets/        what prepare runs write: <name>/ (in a bucket: only their staging folders)
  exports/         what export runs write: <experiment>/<tag>/
  tensorboard/     the tensorboard tracker's files: <experiment>/<run id>/
  wandb/           the wandb tracker's client's files: offline-run-<time>-<W&B id>/ (offline)
  logs/            the local workers' logs
  cache/           files read from a bucket, when TRAINCTL_STORAGE_URL is set
```
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

LEASE_SECONDS = 30.0
"""A run's lease: a worker not heard from for this long has lost its run."""
HEARTBEAT_SECONDS = 5.0
"""How often a worker extends its lease and says it is alive."""
POLL_SECONDS = 0.5
"""How often an idle worker asks the queue for a run."""
CACHE_BYTES = 50 * 1024**3
"""The most a node's cache of files read from a bucket holds (TRAINCTL_CACHE_BYTES): past
it, the least recently used files go (store.checkpoints.s3_cache)."""
DRAIN_SECONDS = 30.0
"""How long a run has, from SIGTERM or a drain request, to save and hand back (worker.drain):
the warning GCP gives a preempted VM; AWS gives two minutes."""


@dataclass(frozen=True)
class DataLayout:
    """Where everything of one data dir lives."""

    root: Path
    storage_url: str | None = None
    """TRAINCTL_STORAGE_URL: ``s3://bucket/prefix`` keeps the checkpoints, exports and
    prepared datasets in that bucket (under ``<prefix>/checkpoints``, ``<prefix>/exports``
    and ``<prefix>/datasets``); None keeps them in the data dir (`checkpoints`, `exports`,
    `datasets`)."""
    cache_dir: Path | None = None
    """TRAINCTL_CACHE_DIR: where files read from a bucket are kept locally; None:
    ``<data dir>/cache``."""

    cache_bytes: int = CACHE_BYTES
    """TRAINCTL_CACHE_BYTES: the most that cache holds, for every store of the bucket and
    every worker that shares the cache dir together."""

    @property
    def cache(self) -> Path:
        return self.cache_dir if self.cache_dir is not None else self.root / "cache"

    @property
    def database_file(self) -> Path:
        return self.root / "trainctl.db"

    @property
    def sqlite_url(self) -> str:
        """The embedded default database: SQLite in the data dir, by absolute path (the
        workers may start in another folder)."""
        return f"sqlite:///{self.database_file.resolve()}"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def datasets(self) -> Path:
        """Where prepare runs write datasets; a run names one of them by its name."""
        return self.root / "datasets"

    @property
    def exports(self) -> Path:
        """Where export runs write: exports/<experiment>/<tag>, served under /exports."""
        return self.root / "exports"

    @property
    def tensorboard(self) -> Path:
        """Where the tensorboard tracker writes: tensorboard/<experiment>/<run id>."""
        return self.root / "tensorboard"

    @property
    def wandb(self) -> Path:
        """Where the wandb tracker's client keeps its files: wandb/offline-run-*-<id>/ (or
        run-*-<id>/ online), each run's `.wandb` transaction log in it."""
        return self.root / "wandb"

    @property
    def logs(self) -> Path:
        return self.root / "logs"
