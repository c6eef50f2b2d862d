"""Benchmark reports, their history (JSON lines) and the rendered ``benchmarks/RESULTS.md``.

Every recorded run adds one JSON object per table row, stated target and note to
``benchmarks/history/<area>.jsonl``; nothing is ever removed from those files. ``RESULTS.md`` is rendered
from them: the targets of the latest run of every area at the top, then each area's latest tables. Both
``python -m benchmarks`` (after a run) and ``python -m benchmarks --report`` (alone) re-render it.

A history record carries ``stamp`` (UTC, the run's name), ``area``, ``quick``, ``table`` (the table's
title), ``kind`` (``"row"``, ``"target"`` or ``"note"``) with its payload (``row``: the row's columns;
``target``, ``measured``, ``met``; ``note``), ``source`` (``"run"``, or ``"log"`` for the runs recovered
from the old append-only RESULTS.md, whose figures are the 4 significant digits it printed) and
``machine`` (see :func:`machine_line`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import AREAS

HERE = Path(__file__).parent
RESULTS = HERE / "RESULTS.md"
HISTORY = HERE / "history"
LOAD_MISSING = "; load average not recorded"

# Title prefix -> area, for reports recorded without an area name (benchmarks/parity_llamacpp.py) and
# for the tables of the old log.
AREA_TITLES = {
    "efficiency()": "efficiency",
    "Sketch operators": "operators",
    "Dense least squares": "solvers",
    "Sparse least squares": "solvers",
    "Sketch-and-solve": "solvers",
    "Low-rank approximation": "lowrank",
    "Decoding engine": "decoding",
    "Speculative decoding": "speculative",
    "Continuous batching": "serving",
    "Parity with llama.cpp": "parity",
}


@dataclass
class Target:
    """A stated target: what it asks, what we measured, and whether it is met."""

    description: str
    measured: str
    met: bool


@dataclass
class Report:
    """One benchmark area's table (a list of rows with the same keys) and its targets."""

    title: str
    rows: list[dict] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_markdown(self) -> str:
        out = [f"### {self.title}", ""]
        if self.rows:
            keys = list(self.rows[0])
            out.append("| " + " | ".join(keys) + " |")
            out.append("|" + "---|" * len(keys))
            for row in self.rows:
                out.append("| " + " | ".join(_fmt(row.get(k, "")) for k in keys) + " |")
            out.append("")
        for t in self.targets:
            out.append(f"- {'MET' if t.met else 'NOT MET'}: {t.description} (measured: {t.measured})")
        if self.targets:
            out.append("")
        out.extend(f"- {n}" for n in self.notes)
        if self.notes:
            out.append("")
        return "\n".join(out)


def _fmt(v) -> str:
    if isinstance(v, float):
        if v == 0 or 1e-3 <= abs(v) < 1e5:
            return f"{v:.4g}"
        return f"{v:.3e}"
    return str(v)


@dataclass
class Run:
    """The recorded tables of one area in one run, as read back from the history."""

    area: str
    stamp: str
    quick: bool
    machine: dict
    tables: list[Report]


def area_of(title: str) -> str:
    """The benchmark area a report's title belongs to (see ``AREA_TITLES``).

    >>> area_of("Sketch operators: S @ A, n=500,000, k=100, r=2,000, float64")
    'operators'
    """
    for prefix, area in AREA_TITLES.items():
        if title.startswith(prefix):
            return area
    raise ValueError(f"no benchmark area for the report {title!r}: pass its area by name")


def machine_line(machine: dict) -> str:
    """One line describing the machine of a run, from its history record's ``machine``.

    Keys: ``cpu``, ``simd`` (the vector extensions the CPU reports, or None if not recorded),
    ``logical_cpus``, ``blas``, ``python``, ``numpy``, ``scipy`` and ``load_avg`` (1-minute load average
    when the run was recorded, or None). Runs recovered from the old log have no ``simd`` or ``load_avg``.

    >>> print(machine_line({"cpu": "AMD EPYC", "simd": ["avx2", "fma"], "logical_cpus": 2,
    ...                     "blas": "openblas 0.3.30 (2 threads)", "python": "3.11.7", "numpy": "2.4.6",
    ...                     "scipy": "1.17.1", "load_avg": 1.5}))  # doctest: +ELLIPSIS
    CPU: AMD EPYC (avx2 fma); logical CPUs: 2; BLAS: openblas 0.3.30 (2 threads); ...; load average 1.50
    """
    simd = " (" + " ".join(machine["simd"]) + ")" if machine.get("simd") else ""
    line = (
        f"CPU: {machine['cpu']}{simd}; logical CPUs: {machine['logical_cpus']}; BLAS: {machine['blas']}; "
        f"Python {machine['python']}, NumPy {machine['numpy']}, SciPy {machine['scipy']}"
    )
    if machine.get("load_avg") is not None:
        line += f"; load average {machine['load_avg']:.2f}"
    return line


def history_records(
    report: Report, *, area: str, stamp: str, quick: bool, machine: dict, source: str = "run"
) -> list[dict]:
    """The history records of one area's report: one per table row, stated target and note.

    A report with further tables in ``report.parts`` (benchmarks/solvers.py) gives the records of each.

    >>> rep = Report("Demo", rows=[{"case": "a", "time_s": 0.5}], targets=[Target("fast", "0.5 s", True)])
    >>> [r["kind"] for r in history_records(rep, area="demo", stamp="2026-12-03 09:01:00 UTC",
    ...                                     quick=True, machine={})]
    ['row', 'target']
    """
    out = []
    for table in [report, *getattr(report, "parts", [])]:
        head = {"stamp": stamp, "area": area, "quick": quick, "table": table.title}
        tail = {"source": source, "machine": machine}
        out += [{**head, "kind": "row", "row": dict(row), **tail} for row in table.rows]
        out += [
            {
                **head,
                "kind": "target",
                "target": t.description,
                "measured": t.measured,
                "met": bool(t.met),
                **tail,
            }
            for t in table.targets
        ]
        out += [{**head, "kind": "note", "note": note, **tail} for note in table.notes]
    return out


def _plain(value):
    """JSON for the NumPy scalars a row may hold (``np.float64`` is a float already)."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"a benchmark row holds {type(value).__name__} {value!r}, not a number or a string")


def append_history(records: list[dict], history: Path | None = None) -> list[Path]:
    """Append records to ``history/<area>.jsonl``, one JSON object a line; returns the files written.

    >>> import tempfile
    >>> rec = {"stamp": "2026-12-03 09:01:00 UTC", "area": "demo", "kind": "note", "note": "hello"}
    >>> with tempfile.TemporaryDirectory() as d:
    ...     [p.name for p in append_history([rec], Path(d))], read_history(Path(d))[0]["note"]
    (['demo.jsonl'], 'hello')
    """
    history = HISTORY if history is None else history
    history.mkdir(parents=True, exist_ok=True)
    by_area: dict[str, list[str]] = {}
    for rec in records:
        by_area.setdefault(rec["area"], []).append(json.dumps(rec, ensure_ascii=False, default=_plain))
    paths = []
    for area, lines in by_area.items():
        path = history / f"{area}.jsonl"
        with path.open("a", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        paths.append(path)
    return paths


def read_history(history: Path | None = None) -> list[dict]:
    """Every record of every ``history/*.jsonl`` file, in file order (areas by name).

    >>> isinstance(read_history(), list)
    True
    """
    history = HISTORY if history is None else history
    records = []
    for path in sorted(history.glob("*.jsonl")):
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{i}: not a JSON object ({exc})") from None
    return records


def runs(records: list[dict]) -> list[Run]:
    """The records grouped into runs: one per area, stamp and quick flag, oldest first.

    Stamps sort as times ("2026-12-03 09:01 UTC" of the old log before "2026-12-03 09:01:30 UTC").

    >>> recs = [{"stamp": s, "area": "demo", "quick": False, "table": "T", "kind": "note", "note": s,
    ...          "machine": {}} for s in ("2026-12-03 10:00:00 UTC", "2026-12-03 09:00:00 UTC")]
    >>> [r.stamp for r in runs(recs)]
    ['2026-12-03 09:00:00 UTC', '2026-12-03 10:00:00 UTC']
    """
    grouped: dict[tuple, Run] = {}
    for rec in records:
        key = (rec["area"], rec["stamp"], bool(rec.get("quick", False)))
        run = grouped.setdefault(key, Run(key[0], key[1], key[2], rec.get("machine", {}), []))
        if not run.tables or run.tables[-1].title != rec["table"]:
            run.tables.append(Report(rec["table"]))
        table = run.tables[-1]
        if rec["kind"] == "row":
            table.rows.append(rec["row"])
        elif rec["kind"] == "target":
            table.targets.append(Target(rec["target"], rec["measured"], rec["met"]))
        elif rec["kind"] == "note":
            table.notes.append(rec["note"])
        else:
            raise ValueError(f"history record of unknown kind {rec['kind']!r}: {rec}")
    return sorted(grouped.values(), key=lambda r: r.stamp)


def latest_runs(records: list[dict]) -> dict[str, Run]:
    """The latest run of every area, areas in ``benchmarks.AREAS`` order (then any others by name).

    A ``--quick`` run (a smoke run at small sizes) stands for an area only while it has no full run.

    >>> recs = [{"stamp": s, "area": "demo", "quick": q, "table": "T", "kind": "note", "note": s,
    ...          "machine": {}} for s, q in (("2026-12-03 09:00 UTC", False), ("2026-12-03 10:00 UTC", True))]
    >>> latest_runs(recs)["demo"].stamp
    '2026-12-03 09:00 UTC'
    """
    latest: dict[str, Run] = {}
    for run in runs(records):  # oldest first: a later run replaces an earlier one of its kind
        if run.area not in latest or latest[run.area].quick or not run.quick:
            latest[run.area] = run
    order = [a for a in AREAS if a in latest] + sorted(set(latest) - set(AREAS))
    return {a: latest[a] for a in order}


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|")


def render(records: list[dict]) -> str:
    """``RESULTS.md`` from history records: every target of each area's latest run, then its tables.

    >>> rep = Report("Demo", rows=[{"case": "a", "time_s": 0.5}], targets=[Target("fast", "0.5 s", False)])
    >>> md = render(history_records(rep, area="demo", stamp="2026-12-03 09:01:00 UTC", quick=False,
    ...                             machine={"cpu": "x", "logical_cpus": 2, "blas": "b", "python": "3",
    ...                                      "numpy": "2", "scipy": "1"}))
    >>> "| demo | fast | 0.5 s | **missed** | 2026-12-03 09:01:00 UTC |" in md, "| a | 0.5 |" in md
    (True, True)
    """
    all_runs = runs(records)
    latest = latest_runs(records)
    out = [
        "# Benchmark results",
        "",
        "Generated from the run history in [`benchmarks/history/`](history/) by `python -m benchmarks "
        "--report` (and after every recorded `python -m benchmarks` run): do not edit by hand. Each area "
        "shows its latest run; every run, with its machine, stays in the area's history file "
        "(one JSON object per table row, stated target and note).",
        "",
        "## Targets",
        "",
        "The stated targets of each area's latest run.",
        "",
        "| area | target | measured | status | run |",
        "|---|---|---|---|---|",
    ]
    for area, run in latest.items():
        targets = [t for table in run.tables for t in table.targets]
        for t in targets:
            status = "met" if t.met else "**missed**"
            out.append(f"| {area} | {_cell(t.description)} | {_cell(t.measured)} | {status} | {run.stamp} |")
        if not targets:
            out.append(f"| {area} | (no stated target) |  |  | {run.stamp} |")
    for area, run in latest.items():
        n_runs = sum(r.area == area for r in all_runs)
        link = f"history/{area}.jsonl"
        out += [
            "",
            f"## {area}",
            "",
            f"Run of {run.stamp}{' (--quick)' if run.quick else ''}; {n_runs} run(s) in [{link}]({link}).",
            "",
            machine_line(run.machine) + ("" if run.machine.get("load_avg") is not None else LOAD_MISSING),
            "",
        ]
        out.append("\n".join(table.to_markdown() for table in run.tables).rstrip("\n"))
    return "\n".join(out) + "\n"


def write_results(history: Path | None = None, results: Path | None = None) -> Path:
    """Render ``results`` (``benchmarks/RESULTS.md``) from the history files; returns its path.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     write_results(Path(d), Path(d) / "RESULTS.md").read_text().startswith("# Benchmark results")
    True
    """
    results = RESULTS if results is None else results
    results.write_text(render(read_history(history)), encoding="utf-8")
    return results


def record_run(
    reports: list[tuple[str, Report]],
    *,
    quick: bool,
    machine: dict,
    stamp: str,
    history: Path | None = None,
    results: Path | None = None,
) -> list[Path]:
    """Append one run's reports (``(area, report)`` pairs) to the history and re-render ``results``.

    Returns the history files written.

    >>> import tempfile
    >>> rep = Report("Demo table", rows=[{"case": "a", "time_s": 0.5}])
    >>> machine = {"cpu": "x", "logical_cpus": 2, "blas": "b", "python": "3", "numpy": "2", "scipy": "1"}
    >>> with tempfile.TemporaryDirectory() as d:
    ...     paths = record_run([("demo", rep)], quick=True, machine=machine, stamp="2026-12-03 09:01:00 UTC",
    ...                        history=Path(d), results=Path(d) / "RESULTS.md")
    ...     [p.name for p in paths], "| a | 0.5 |" in (Path(d) / "RESULTS.md").read_text()
    (['demo.jsonl'], True)
    """
    records = []
    for area, report in reports:
        records += history_records(report, area=area, stamp=stamp, quick=quick, machine=machine)
    paths = append_history(records, history)
    write_results(history, results)
    return paths
