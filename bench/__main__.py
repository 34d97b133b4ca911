"""`python -m bench [--quick] [--only NAME ...] [--summary]`: run the measurements, print every
figure and each ratio against its target. `--quick` is a smoke run of minutes; the figures of
docs/performance.md come from the full run (`make bench`), which records the figures of the
summary rows it measured (bench/results.json) and rewrites the summary table from the records
(`bench.summary`). `--summary` rewrites the table alone, measuring nothing."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import traceback
from datetime import date

from bench import summary
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
    "slurm",
    "hangs",
    "loss_health",
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="smoke sizes: about two minutes")
    p.add_argument("--only", nargs="+", choices=MODULES, help="run only these measurements")
    p.add_argument("--json", metavar="PATH", help="also write the figures to this JSON file")
    p.add_argument(
        "--summary",
        action="store_true",
        help="rewrite docs/performance.md's summary table from bench/results.json; measure nothing",
    )
    args = p.parse_args(argv)
    if args.summary:
        summary.write_doc(summary.load())
        print(f"{summary.DOC.relative_to(summary.REPO)}: summary table written from the records")
        return 0
    import torch

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
    record_summary(figures, args.quick)
    if failed:
        print(f"\nfailed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def record_summary(figures: list[Figure], quick: bool) -> None:
    """A full run's figures into the summary's records, and the table rewritten from them."""
    if quick:
        print("\n(--quick: the summary's records are left as they are)")
        return
    records = summary.load()
    updated = summary.record(records, figures, date.today().isoformat(), summary.this_machine())
    if updated:
        summary.save(records)
        summary.write_doc(records)
    print(f"\nsummary rows recorded: {', '.join(updated) or 'none'}")


if __name__ == "__main__":
    sys.exit(main())
