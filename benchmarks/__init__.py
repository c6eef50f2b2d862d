"""Benchmarks: every figure is a ratio against a peer measured in the same run.

Each area is one module with a ``run(quick: bool) -> Report`` function, registered in
``AREAS``; ``python -m benchmarks [--quick] [--only NAME]`` runs them and records the tables, with
date, CPU model, thread count, BLAS and load, in ``benchmarks/history/<area>.jsonl`` (one JSON object
per row, target and note; ``benchmarks/report.py``), then re-renders ``benchmarks/RESULTS.md``: the
targets and tables of each area's latest run. ``python -m benchmarks --report`` only re-renders it.
"""

# name -> module path. Modules are imported lazily so one area's missing extra does not stop the rest.
AREAS = {
    "efficiency": "benchmarks.efficiency",
    "operators": "benchmarks.operators",
    "solvers": "benchmarks.solvers",
    "lowrank": "benchmarks.lowrank",
    "dask": "benchmarks.dask_cluster",
    "decoding": "benchmarks.decoding_engine",
    "decoding-busy": "benchmarks.decoding_busy",
    "speculative": "benchmarks.speculative",
    "serving": "benchmarks.serving",
}
