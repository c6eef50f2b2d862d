"""Timing, memory and reporting helpers shared by every benchmark area."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import statistics
import time
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")


def median_time(fn, *, repeats: int = 5, warmup: int = 1) -> float:
    """Median wall time of ``fn()`` in seconds over ``repeats`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def median_times_interleaved(fns: dict, *, repeats: int = 9, warmup: int = 1, settle: float = 0.3) -> dict:
    """Median wall times of several callables measured in alternation (A B A B ...).

    On a shared machine the speed drifts over seconds; alternating the contenders gives each
    the same conditions, so their ratio is far steadier than from back-to-back blocks. A pause
    of ``settle`` seconds precedes each timing: OpenBLAS's idle threads spin for about 0.1 s
    after a call, and would otherwise steal a core from whichever contender runs next.
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            time.sleep(settle)
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def peak_memory(fn) -> int:
    """Peak bytes allocated through Python/NumPy allocators while ``fn()`` runs (tracemalloc)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak


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


def machine_description() -> str:
    """CPU model, logical CPUs, threads allowed, BLAS (threadpoolctl) and library versions."""
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import numpy as np
    import scipy

    blas = "unknown"
    try:
        from threadpoolctl import threadpool_info

        infos = [i for i in threadpool_info() if i.get("user_api") == "blas"]
        blas = ", ".join(f"{i['internal_api']} {i['version']} ({i['num_threads']} threads)" for i in infos)
    except Exception:  # threadpoolctl is informative only
        pass
    return (
        f"CPU: {cpu}; logical CPUs: {os.cpu_count()}; BLAS: {blas}; "
        f"Python {platform.python_version()}, NumPy {np.__version__}, SciPy {scipy.__version__}"
    )


def append_results(reports: list[Report], *, quick: bool) -> None:
    """Append the reports, headed by date and machine, to ``benchmarks/RESULTS.md``."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    head = f"## Run of {stamp}{' (--quick)' if quick else ''}\n\n{machine_description()}\n\n"
    body = "\n".join(r.to_markdown() for r in reports)
    if not RESULTS.exists():
        RESULTS.write_text("# Benchmark results\n\nAppended by `python -m benchmarks`; newest last.\n\n")
    with RESULTS.open("a") as f:
        f.write(head + body + "\n")
