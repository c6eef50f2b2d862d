"""rsketch: randomized sketching for least squares, after Raskutti & Mahoney (JMLR 2016).

Public API, every name importable from here: the sketch operators and :func:`make_sketch`
(:mod:`rsketch.operators`), the least-squares solver :func:`lstsq` (:mod:`rsketch.linalg`), the
efficiency measures and bounds (:mod:`rsketch.stats`) and the scikit-learn estimators
(:mod:`rsketch.estimators`, loaded on first use).

Examples
--------
>>> import numpy as np, rsketch
>>> S = rsketch.make_sketch("sparse_sign", 10_000, 200, seed=0)
>>> S.shape
(200, 10000)
"""

from rsketch.linalg import (
    LstsqResult,
    eigh,
    interpolative,
    lstsq,
    nystrom,
    nystrom_pcg,
    qr_pivoted,
    range_finder,
    svd,
)
from rsketch.operators import (
    SKETCH_KINDS,
    SRDCT,
    SRHT,
    AdjointSketch,
    CountSketch,
    GaussianSketch,
    LeverageSampling,
    SketchOperator,
    SparseSign,
    UniformSampling,
    make_sketch,
)
from rsketch.stats import Bound, EfficiencyResult, SketchBounds, bounds, efficiency

__version__ = "0.1.0"

# The scikit-learn estimators load on first use: importing scikit-learn costs more than the rest of
# rsketch together, and operators and lstsq do not need it.
_LAZY = {
    "ConvergenceWarning": "rsketch.linalg",  # a subclass of scikit-learn's, made on first use
    "SketchedLinearRegression": "rsketch.estimators",
    "SketchedPCA": "rsketch.estimators",
    "SketchedRidge": "rsketch.estimators",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'rsketch' has no attribute {name!r}")


__all__ = [
    "AdjointSketch",
    "Bound",
    "ConvergenceWarning",
    "CountSketch",
    "EfficiencyResult",
    "GaussianSketch",
    "LeverageSampling",
    "LstsqResult",
    "SKETCH_KINDS",
    "SRDCT",
    "SRHT",
    "SketchBounds",
    "SketchOperator",
    "SketchedLinearRegression",
    "SketchedPCA",
    "SketchedRidge",
    "SparseSign",
    "UniformSampling",
    "bounds",
    "efficiency",
    "eigh",
    "interpolative",
    "lstsq",
    "make_sketch",
    "nystrom",
    "nystrom_pcg",
    "qr_pivoted",
    "range_finder",
    "svd",
]
