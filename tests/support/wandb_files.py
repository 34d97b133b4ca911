"""What an offline W&B run wrote, read back with wandb's own reader (`wandb leet inspect
--json`: one JSON record per line of the run's `.wandb` transaction log)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WANDB = Path(sys.executable).with_name("wandb")


@dataclass
class WandbFile:
    """The records of one `.wandb` file, by kind."""

    path: Path
    runs: list[dict[str, Any]] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    exits: list[dict[str, Any]] = field(default_factory=list)


def wandb_files(data_dir: Path, wandb_id: str) -> list[WandbFile]:
    """Every `.wandb` file of W&B run `wandb_id` in the data dir's wandb/ (one per time a
    service opened it), oldest first. Two opens in one second share the time: W&B adds `-1`,
    `-2`, ... to the later folders' names."""
    paths = sorted(
        (data_dir / "wandb").glob(f"offline-run-*-{wandb_id}*/run-{wandb_id}.wandb"),
        key=lambda p: (p.parent.name.split("-")[2], len(p.parent.name), p.parent.name),
    )
    return [read_wandb_file(p) for p in paths]


def read_wandb_file(path: Path) -> WandbFile:
    done = subprocess.run(
        [str(WANDB), "leet", "inspect", "--json", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    read = WandbFile(path)
    for line in done.stdout.splitlines():
        record = json.loads(line)
        kind = record["type"]
        if kind == "run":
            read.runs.append(record["run"])
        elif kind == "history":
            read.history.append(record["history"]["item"])
        elif kind == "artifact":
            read.artifacts.append(record["artifact"])
        elif kind == "exit":
            read.exits.append(record["exit"])
    return read


def table_rows(files: list[WandbFile], key: str) -> list[list[Any]]:
    """The rows of every table the files' runs logged under `key`, as the client wrote them
    beside the `.wandb` file (files/media/table/<key>_*.table.json)."""
    return [
        row
        for f in files
        for table in sorted((f.path.parent / "files" / "media" / "table").glob(f"{key}_*.json"))
        for row in json.loads(table.read_text())["data"]
    ]


def history_rows(files: list[WandbFile]) -> dict[tuple[str, int], Any]:
    """(name, W&B step) -> value over the files' history rows; W&B's own fields left out. A
    table is a row's `<key>._type` ("table-file") and its size, `<key>.nrows`."""
    return {
        (name, row["_step"]): value
        for f in files
        for row in f.history
        for name, value in row.items()
        if not name.startswith("_")
    }
