"""Run by tests/store/test_processes.py as a child started by `store.processes`: reports how
it, and a process it spawns (as a prepare run spawns its tokenizers), import numpy and
trainctl."""

from __future__ import annotations

import json
import multiprocessing
import sys


def report() -> dict[str, object]:
    import numpy

    import trainctl

    return {
        "isolated": bool(sys.flags.isolated),
        "numpy": numpy.__file__,
        "trainctl": trainctl.__file__,
    }


if __name__ == "__main__":
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        spawned = pool.apply(report)
    print(json.dumps({"started": report(), "spawned": spawned}))
