"""``python -m benchmarks [--quick] [--only NAME ...]``: run the benchmark areas, print, record."""

from __future__ import annotations

import argparse
import importlib
import sys

from benchmarks import AREAS
from benchmarks._harness import append_results, machine_description


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, fewer repeats (a smoke run)")
    parser.add_argument("--only", nargs="+", choices=sorted(AREAS), help="run only these areas")
    parser.add_argument("--no-record", action="store_true", help="do not append to benchmarks/RESULTS.md")
    args = parser.parse_args(argv)
    print(machine_description(), flush=True)
    reports = []
    for name in args.only or AREAS:
        module = importlib.import_module(AREAS[name])
        print(f"\n== {name} ==", flush=True)
        report = module.run(quick=args.quick)
        print(report.to_markdown(), flush=True)
        reports.append(report)
    if not args.no_record:
        append_results(reports, quick=args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
