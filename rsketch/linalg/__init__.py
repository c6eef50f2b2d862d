"""Sketched least squares (:func:`lstsq`: sketch-and-solve, sketch-and-precondition, IHS) and randomized
low-rank approximation (:func:`range_finder`, :func:`svd`, :func:`eigh`, :func:`nystrom`,
:func:`qr_pivoted`, :func:`interpolative`), and Nyström-preconditioned CG for regularised systems
(:func:`nystrom_pcg`)."""

import rsketch.linalg._results as _results
from rsketch.linalg._backward_error import backward_error
from rsketch.linalg._common import default_sketch_size
from rsketch.linalg._cqrrpt import InterpolativeResult, QRPivotedResult, interpolative, qr_pivoted
from rsketch.linalg._gram import GramOperator
from rsketch.linalg._lowrank import (
    EighResult,
    NystromResult,
    RangeFinderResult,
    SVDResult,
    eigh,
    nystrom,
    range_finder,
    svd,
)
from rsketch.linalg._lstsq import lstsq
from rsketch.linalg._nystrom_pcg import NystromPCGResult, nystrom_pcg, nystrom_preconditioner
from rsketch.linalg._results import LstsqResult, SolverLog

__all__ = [
    "ConvergenceWarning",
    "EighResult",
    "GramOperator",
    "InterpolativeResult",
    "LstsqResult",
    "NystromPCGResult",
    "NystromResult",
    "QRPivotedResult",
    "RangeFinderResult",
    "SVDResult",
    "SolverLog",
    "backward_error",
    "default_sketch_size",
    "eigh",
    "interpolative",
    "lstsq",
    "nystrom",
    "nystrom_pcg",
    "nystrom_preconditioner",
    "qr_pivoted",
    "range_finder",
    "svd",
]


def __getattr__(name):
    if name == "ConvergenceWarning":  # made on first use: it imports scikit-learn (_results)
        return _results.ConvergenceWarning
    raise AttributeError(f"module 'rsketch.linalg' has no attribute {name!r}")
