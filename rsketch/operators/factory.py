"""``make_sketch``: one entry point from a kind name to an operator."""

from __future__ import annotations

import inspect

from rsketch._validation import SKETCH_KIND_NAMES, check_sketch_kind
from rsketch.operators.gaussian import GaussianSketch
from rsketch.operators.sampling import LeverageSampling, UniformSampling
from rsketch.operators.sparse import CountSketch, SparseSign
from rsketch.operators.srht import SRDCT, SRHT

SKETCH_KINDS = {
    "gaussian": GaussianSketch,
    "srht": SRHT,
    "srdct": SRDCT,
    "countsketch": CountSketch,
    "sparse_sign": SparseSign,
    "leverage": LeverageSampling,
    "uniform": UniformSampling,
}
assert tuple(SKETCH_KINDS) == SKETCH_KIND_NAMES, "rsketch._validation.SKETCH_KIND_NAMES lists the kinds"


def _check_options(func, options, kind):
    params = inspect.signature(func).parameters
    allowed = {name for name, prm in params.items() if prm.kind is inspect.Parameter.KEYWORD_ONLY}
    unknown = set(options) - allowed
    if unknown:
        allowed = sorted(allowed - {"seed"})
        raise TypeError(f"unknown option(s) {sorted(unknown)} for sketch kind {kind!r}; allowed: {allowed}")


def make_sketch(kind, input_dim, sketch_size, *, seed=None, A=None, **options):
    """Build a sketch operator by name.

    Parameters
    ----------
    kind : {"gaussian", "srht", "srdct", "countsketch", "sparse_sign", "leverage", "uniform"}
        The family (see ``docs/operators.md`` for when to choose which).
    input_dim, sketch_size : int
        ``S`` has shape ``(sketch_size, input_dim)``.
    seed : None, int, SeedSequence or Generator
        Philox key source.
    A : array or sparse matrix, optional
        Only for ``"leverage"`` without ``scores``: compute leverage scores from ``A``
        (``method="exact"`` or ``"approx"`` may be passed in ``options``).
    **options
        Family options: ``dtype``; ``nnz_per_column`` (sparse_sign);
        ``scores``, ``uniform_mix``, ``method`` (leverage); ``replace`` (uniform).

    Returns
    -------
    SketchOperator

    Examples
    --------
    >>> import rsketch
    >>> rsketch.make_sketch("srht", 1000, 64, seed=0)
    SRHT(input_dim=1000, sketch_size=64, key=(...), dtype=float64)
    """
    check_sketch_kind(kind, "kind")
    cls = SKETCH_KINDS[kind]
    if kind == "leverage" and "scores" not in options:
        if A is None:
            raise ValueError("kind='leverage' needs either scores=... or the matrix A to compute them from")
        _check_options(cls.from_matrix, options, kind)
        if A.shape[0] != input_dim:
            raise ValueError(f"A must have input_dim={input_dim} rows, got shape {A.shape}")
        return cls.from_matrix(A, sketch_size, seed=seed, **options)
    _check_options(cls.__init__, options, kind)
    return cls(input_dim, sketch_size, seed=seed, **options)
