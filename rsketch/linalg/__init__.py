"""Sketched least squares: :func:`lstsq` (sketch-and-solve, sketch-and-precondition, IHS)."""

from rsketch.linalg._backward_error import backward_error
from rsketch.linalg._common import default_sketch_size
from rsketch.linalg._lstsq import lstsq
from rsketch.linalg._results import ConvergenceWarning, LstsqResult, SolverLog

__all__ = [
    "ConvergenceWarning",
    "LstsqResult",
    "SolverLog",
    "backward_error",
    "default_sketch_size",
    "lstsq",
]
