"""``python -m benchmarks [--quick] [--only NAME ...] [--no-record] [--report]``: run the benchmark areas,
print their tables, record them in ``benchmarks/history/`` and re-render ``benchmarks/RESULTS.md``."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from benchmarks import AREAS
from benchmarks._harness import append_results, load_note, machine_description
from benchmarks.report import write_results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, fewer repeats (a smoke run)")
    parser.add_argument("--only", nargs="+", choices=sorted(AREAS), help="run only these areas")
    parser.add_argument(
        "--no-record", action="store_true", help="record nothing (no history, RESULTS.md unchanged)"
    )
    parser.add_argument(
        "--report", action="store_true", help="run nothing: only re-render RESULTS.md from the history"
    )
    args = parser.parse_args(argv)
    if args.report:
        if args.quick or args.only or args.no_record:
            parser.error("--report runs nothing: it takes no other option")
        print(write_results())
        return 0
    print(machine_description(), flush=True)
    names, reports = list(args.only or AREAS), []
    for name in names:
        module = importlib.import_module(AREAS[name])
        print(f"\n== {name} ==", flush=True)
        start = os.getloadavg()
        report = module.run(quick=args.quick)
        report.notes.append(load_note(start, os.getloadavg()))
        print(report.to_markdown(), flush=True)
        reports.append(report)
    if not args.no_record:
        for path in append_results(reports, quick=args.quick, areas=names):
            print(f"recorded in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
