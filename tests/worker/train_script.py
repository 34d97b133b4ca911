"""Runs a train plan in its own process (the tests kill, resume and compare such runs).

usage: python -m tests.worker.train_script PLAN_JSON CHECKPOINT_ROOT [STOP_AFTER_STEP]
Prints one JSON line per train step: {"step": N, "loss": L}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.stores import posix_store
from trainctl.store.plans import TrainPlan
from trainctl.worker.train import train


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
        on_metrics=on_metrics,
        should_stop=lambda: stop_after is not None and state["step"] >= stop_after,
    )


if __name__ == "__main__":
    main()
