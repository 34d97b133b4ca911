"""`python -m bench [--quick] [--only NAME ...]`: run the measurements, print every figure and
each ratio against its target. `--quick` is a smoke run of minutes; the figures of
docs/performance.md come from the full run (`make bench`)."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import traceback

import torch

from bench.common import Figure

MODULES = [
    "service_overhead",
    "model_step",
    "time_to_quality",
    "checkpoint_io",
    "s3_checkpoint",
    "sharded_checkpoint",
    "data_loader",
    "api_load",
    "event_streams",
    "tokenize",
    "bits_per_byte",
    "generate",
    "claims",
    "hf_train",
    "hf_vs_gpt",
    "sharded_muon",
    "fsdp_vs_ddp",
    "evals_throughput",
    "drain",
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="smoke sizes: about two minutes")
    p.add_argument("--only", nargs="+", choices=MODULES, help="run only these measurements")
    p.add_argument("--json", metavar="PATH", help="also write the figures to this JSON file")
    args = p.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, quick={args.quick}")
    figures: list[Figure] = []
    failed = []
    for name in args.only or MODULES:
        started = time.perf_counter()
        print(f"\n== {name}", flush=True)
        try:
            module = importlib.import_module(f"bench.{name}")
            found = module.run(quick=args.quick)
        except Exception:
            traceback.print_exc()
            failed.append(name)
            continue
        for f in found:
            print(f.line(), flush=True)
        print(f"({name}: {time.perf_counter() - started:.0f} s)")
        figures.extend(found)
    print("\n== targets")
    for f in figures:
        if f.target is not None:
            print(f.line())
    if args.json:
        with open(args.json, "w") as out:
            json.dump([{**vars(f), "met": f.met} for f in figures], out, indent=2)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
