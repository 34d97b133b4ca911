"""Runs a train plan in its own process (the tests kill, resume and compare such runs);
`run_script` starts it and reads what it printed.

usage: python -m tests.support.train_script PLAN_JSON CHECKPOINT_ROOT [STOP_AFTER_STEP]
Prints one JSON line per train step: {"step": N, "loss": L}.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.stores import posix_store
from trainctl.store.kinds.train import TrainPlan
from trainctl.worker.training.hooks import TrainerHooks
from trainctl.worker.training.loop import train

REPO = Path(__file__).resolve().parents[2]


def main() -> None:
    plan = TrainPlan.model_validate_json(sys.argv[1])
    root = Path(sys.argv[2])
    stop_after = int(sys.argv[3]) if len(sys.argv) > 3 else None
    state = {"step": 0}

    def on_metrics(m: dict) -> None:
        if m["kind"] == "train":
            state["step"] = m["step"]
            print(json.dumps({"step": m["step"], "loss": m["loss"]}), flush=True)

    train(
        plan,
        posix_store(root),
        hooks=TrainerHooks(
            on_metrics=on_metrics,
            should_stop=lambda: stop_after is not None and state["step"] >= stop_after,
        ),
    )


def run_script(s: TrainPlan, root: Path, stop_after: int | None = None) -> list[dict[str, Any]]:
    args = [sys.executable, "-m", "tests.support.train_script", s.model_dump_json(), str(root)]
    if stop_after is not None:
        args.append(str(stop_after))
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    proc = subprocess.run(args, capture_output=True, text=True, cwd=REPO, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines()]


if __name__ == "__main__":
    main()
