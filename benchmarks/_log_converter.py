"""One-off: the old append-only ``benchmarks/RESULTS.md`` log -> history records (``benchmarks.report``).

Until the history existed, ``python -m benchmarks`` appended each run to RESULTS.md as markdown:
``## Run of <stamp>[ (--quick)]``, the machine line, then each report's ``Report.to_markdown()``. This
module parses that log back into history records (``source: "log"``): a cell that reads as a number or
a boolean becomes one (the log kept 4 significant digits), the rest stay strings; the targets, and the
notes that follow them, are kept verbatim. It checks that every recovered run renders back to the very
text it came from. The log's last version is in git (``git log -- benchmarks/RESULTS.md``)::

    python -m benchmarks._log_converter OLD_RESULTS.md   # writes benchmarks/history/*.jsonl
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from benchmarks.report import HISTORY, Report, Target, append_history, area_of, history_records

RUN = re.compile(r"^## Run of (?P<stamp>\d{4}-\d\d-\d\d \d\d:\d\d(?::\d\d)? UTC)(?P<quick> \(--quick\))?$")
MACHINE = re.compile(
    r"^CPU: (?P<cpu>.*); logical CPUs: (?P<logical_cpus>\d+|None); BLAS: (?P<blas>.*); "
    r"Python (?P<python>\S+), NumPy (?P<numpy>\S+), SciPy (?P<scipy>\S+)$"
)
TARGET = re.compile(r"^- (?P<met>MET|NOT MET): (?P<description>.*?) \(measured: (?P<measured>.*)\)$")
NUMBER = re.compile(r"^-?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?$")


def parse_cell(text: str):
    """A table cell of the log as the value it printed: an int, a float, a bool or the string.

    >>> [parse_cell(c) for c in ("20", "1.581e+04", "True", "", "n=500,000 p=50", "nan")]
    [20, 15810.0, True, '', 'n=500,000 p=50', 'nan']
    """
    if NUMBER.match(text):
        return int(text) if text.lstrip("-").isdigit() else float(text)
    return {"True": True, "False": False}.get(text, text)


def _row_cells(line: str, where: str) -> list[str]:
    if not (line.startswith("| ") and line.endswith(" |")):
        raise ValueError(f"{where}: not a table line: {line!r}")
    return line[2:-2].split(" | ")


def parse_log(text: str) -> list[dict]:
    """The history records of every run in the old RESULTS.md log, oldest first.

    >>> rep = Report("Sketch operators: demo", rows=[{"case": "a", "time_s": 0.5}],
    ...              targets=[Target("fast", "0.5 s", True)], notes=["a note"])
    >>> log = "# Benchmark results\\n\\n## Run of 2026-12-03 09:01 UTC\\n\\n" + (
    ...     "CPU: x; logical CPUs: 2; BLAS: b; Python 3, NumPy 2, SciPy 1\\n\\n" + rep.to_markdown() + "\\n")
    >>> [(r["area"], r["kind"]) for r in parse_log(log)]
    [('operators', 'row'), ('operators', 'target'), ('operators', 'note')]
    """
    records = []
    for chunk in re.split(r"^(?=## Run of )", text, flags=re.M)[1:]:
        head, _, body = chunk.partition("\n")
        run = RUN.match(head)
        if not run:
            raise ValueError(f"unreadable run heading {head!r}")
        where = f"run of {run['stamp']}"
        lines = body.strip("\n").split("\n")
        machine_match = MACHINE.match(lines[0])
        if not machine_match:
            raise ValueError(f"{where}: unreadable machine line {lines[0]!r}")
        machine = machine_match.groupdict()
        machine["logical_cpus"] = None if machine["logical_cpus"] == "None" else int(machine["logical_cpus"])
        machine.update(simd=None, load_avg=None)  # not recorded then
        reports, keys = [], None
        for line in lines[1:]:
            if line.startswith("### "):
                reports.append(Report(line[4:]))
                keys = None
            elif not line:
                continue
            elif not reports:
                raise ValueError(f"{where}: text before the first table: {line!r}")
            elif set(line) <= set("|-") and keys is not None:
                continue  # the rule under the header
            elif line.startswith("|"):
                cells = _row_cells(line, where)
                if keys is None:
                    keys = cells
                elif len(cells) != len(keys):
                    raise ValueError(f"{where}: {len(cells)} cells under {len(keys)} columns: {line!r}")
                else:
                    reports[-1].rows.append({k: parse_cell(c) for k, c in zip(keys, cells, strict=True)})
            elif (target := TARGET.match(line)) and not reports[-1].notes:
                reports[-1].targets.append(
                    Target(target["description"], target["measured"], target["met"] == "MET")
                )
            elif line.startswith("- "):
                reports[-1].notes.append(line[2:])
            else:
                raise ValueError(f"{where}: unreadable line {line!r}")
        rendered = "\n".join(f"{r.to_markdown()}" for r in reports).strip("\n")
        original = "\n".join(lines[1:]).strip("\n")
        if rendered != original:
            raise ValueError(f"{where}: the recovered tables do not render back to the log's text")
        for report in reports:
            records += history_records(
                report,
                area=area_of(report.title),
                stamp=run["stamp"],
                quick=bool(run["quick"]),
                machine=machine,
                source="log",
            )
    return records


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__)
        return 2
    if any(HISTORY.glob("*.jsonl")):
        print(f"{HISTORY} already holds history; convert into an empty folder", file=sys.stderr)
        return 1
    records = parse_log(Path(argv[0]).read_text(encoding="utf-8"))
    for path in append_history(records):
        print(path)
    runs = {(r["area"], r["stamp"]) for r in records}
    print(f"{len(runs)} area runs, {sum(r['kind'] == 'row' for r in records)} rows, {len(records)} records")
    return 0


if __name__ == "__main__":
    sys.exit(main())
