"""Sketched least squares: :func:`lstsq` (sketch-and-solve, sketch-and-precondition, IHS)."""

from rsketch.linalg.lstsq import METHODS, default_sketch_size, lstsq
from rsketch.linalg.results import ConvergenceWarning, LstsqResult, SolverLog

__all__ = ["METHODS", "ConvergenceWarning", "LstsqResult", "SolverLog", "default_sketch_size", "lstsq"]
