"""Sketch operators: one module per family, all subclasses of :class:`SketchOperator`."""

from rsketch.operators.base import AdjointSketch, SketchOperator
from rsketch.operators.factory import SKETCH_KINDS, make_sketch
from rsketch.operators.gaussian import GaussianSketch
from rsketch.operators.sampling import LeverageSampling, UniformSampling
from rsketch.operators.sparse import CountSketch, SparseSign
from rsketch.operators.srht import SRDCT, SRHT

__all__ = [
    "AdjointSketch",
    "CountSketch",
    "GaussianSketch",
    "LeverageSampling",
    "SKETCH_KINDS",
    "SRDCT",
    "SRHT",
    "SketchOperator",
    "SparseSign",
    "UniformSampling",
    "make_sketch",
]
