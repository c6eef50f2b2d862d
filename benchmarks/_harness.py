"""Timing, memory and reporting helpers shared by every benchmark area."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import statistics
import time
import tracemalloc
from pathlib import Path

from benchmarks.report import RESULTS, Report, Target, area_of, machine_line, record_run

__all__ = [
    "RESULTS",
    "Report",
    "Target",
    "append_results",
    "machine_description",
    "machine_info",
    "median_time",
    "median_times_interleaved",
    "peak_memory",
]


def timed(fn):
    """``(fn(), wall seconds)`` of one call.

    >>> out, seconds = timed(lambda: 2 + 2)
    >>> out, seconds >= 0
    (4, True)
    """
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


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


SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx_vnni", "avx512f", "avx512bw", "avx512vl", "avx512_vnni")
SIMD_FLAGS += ("avx512_bf16", "amx_tile")  # avx_vnni: the int8 path of an AVX2 machine
SIMD_FLAGS += ("asimd", "sve", "sve2")  # Arm


def machine_info() -> dict:
    """The machine of a run, as its history records carry it (see ``benchmarks.report.machine_line``).

    CPU model, the vector extensions of ``SIMD_FLAGS`` it reports, logical CPUs, BLAS (threadpoolctl),
    library versions and the 1-minute load average now.

    >>> sorted(machine_info())
    ['blas', 'cpu', 'load_avg', 'logical_cpus', 'numpy', 'python', 'scipy', 'simd']
    """
    fields = {}  # the first CPU's lines of /proc/cpuinfo (Linux)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    cpu = fields.get("model name") or platform.processor() or "unknown CPU"
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    import numpy as np
    import scipy

    blas = "unknown"
    try:
        from threadpoolctl import threadpool_info

        infos = [i for i in threadpool_info() if i.get("user_api") == "blas"]
        blas = ", ".join(f"{i['internal_api']} {i['version']} ({i['num_threads']} threads)" for i in infos)
    except Exception:  # threadpoolctl is informative only
        pass
    try:
        load = round(os.getloadavg()[0], 2)
    except OSError:  # not on every platform
        load = None
    return {
        "cpu": cpu,
        "simd": [f for f in SIMD_FLAGS if f in flags],
        "logical_cpus": os.cpu_count(),
        "blas": blas,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "load_avg": load,
    }


def load_note(start, end) -> str:
    """The note of an area's load averages (1, 5 and 15 minutes) at its start and its end: the run's
    own figure, where the machine line has the load when the whole invocation was recorded.

    >>> note = load_note((0.5, 0.25, 0.1), (2.0, 1.0, 0.5))
    >>> "start 0.50, 0.25, 0.10; at its end 2.00, 1.00, 0.50" in note
    True
    """
    fmt = lambda load: ", ".join(f"{x:.2f}" for x in load)  # noqa: E731
    return (
        f"Load average (1, 5, 15 min) at this area's start {fmt(start)}; at its end {fmt(end)} "
        "(its own threads count: 2 threads busy read as about 2)."
    )


def machine_description() -> str:
    """CPU model and vector extensions, logical CPUs, BLAS, library versions and load, in one line.

    >>> machine_description().startswith("CPU: ")
    True
    """
    return machine_line(machine_info())


def run_stamp() -> str:
    """The name of a run: now, in UTC, to the second."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def append_results(
    reports: list[Report], *, quick: bool, areas: list[str] | None = None, stamp: str | None = None
) -> list[Path]:
    """Record a run: its reports go to ``benchmarks/history/<area>.jsonl``, then RESULTS.md is re-rendered.

    ``areas`` names each report's area (``benchmarks.AREAS``); by default it follows from the title
    (``benchmarks.report.area_of``). ``stamp`` names the run (default :func:`run_stamp`): reports of
    one area recorded in several calls with one stamp make one run. Returns the history files written.
    """
    areas = areas or [area_of(r.title) for r in reports]
    if len(areas) != len(reports):
        raise ValueError(f"{len(reports)} reports but {len(areas)} area names")
    stamp = stamp or run_stamp()
    return record_run(
        list(zip(areas, reports, strict=True)), quick=quick, machine=machine_info(), stamp=stamp
    )
