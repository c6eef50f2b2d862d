"""Benchmarks: every figure is a ratio against a peer measured in the same run.

Each area is one module with a ``run(quick: bool) -> Report`` function, registered in
``AREAS``; ``python -m benchmarks [--quick] [--only NAME]`` runs them and appends the tables,
with date, CPU model, thread count and BLAS, to ``benchmarks/RESULTS.md``.
"""

# name -> module path. Modules are imported lazily so one area's missing extra does not stop the rest.
AREAS = {
    "efficiency": "benchmarks.efficiency",
    "operators": "benchmarks.operators",
    "solvers": "benchmarks.solvers",
    "decoding": "benchmarks.decoding_engine",
    "speculative": "benchmarks.speculative",
    "serving": "benchmarks.serving",
}
