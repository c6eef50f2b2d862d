"""``make_sketch``: one entry point from a kind name to an operator."""

from __future__ import annotations

import inspect

from rsketch._validation import SKETCH_KIND_NAMES, check_operand, check_sketch_kind
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


def _keyword_options(func) -> set[str]:
    params = inspect.signature(func).parameters
    return {name for name, prm in params.items() if prm.kind is inspect.Parameter.KEYWORD_ONLY} - {"seed"}


def _check_options(func, options, kind):
    allowed = _keyword_options(func)
    unknown = set(options) - allowed - {"seed"}
    if unknown:
        raise TypeError(
            f"unknown option(s) {sorted(unknown)} for sketch kind {kind!r}; allowed: {sorted(allowed)}"
        )


def sketch_options(kind) -> tuple[str, ...]:
    """The family options :func:`make_sketch` accepts for ``kind`` (besides ``seed`` and ``A``).

    Examples
    --------
    >>> sketch_options("sparse_sign")
    ('dtype', 'nnz_per_column')
    >>> sketch_options("leverage")
    ('dtype', 'method', 'scores', 'uniform_mix')
    """
    check_sketch_kind(kind, "kind")
    cls = SKETCH_KINDS[kind]
    allowed = _keyword_options(cls.__init__)
    if kind == "leverage":
        allowed |= _keyword_options(cls.from_matrix)
    return tuple(sorted(allowed))


def check_sketch_options(kind, options, where: str = "make_sketch", taken=()) -> None:
    """Raise ``TypeError`` naming the unknown ones when ``options`` are not all options of ``kind``;
    ``taken``: options the caller's own arguments of the same names take (not offered as allowed).

    Examples
    --------
    >>> check_sketch_options("leverage", {"uniform_mx": 0.5}, "bounds")
    Traceback (most recent call last):
    ...
    TypeError: bounds: unknown option(s) ['uniform_mx'] for sketch kind 'leverage'; allowed: ['dtype', ...]
    """
    allowed = [name for name in sketch_options(kind) if name not in taken]
    unknown = set(options) - set(allowed)
    if unknown:
        raise TypeError(
            f"{where}: unknown option(s) {sorted(unknown)} for sketch kind {kind!r}; allowed: {list(allowed)}"
        )


def _check_kind_specific(kind, A, options) -> None:
    """Refuse ``A`` (and leverage's ``method``) where make_sketch would ignore it, as unknown options are.

    An ignored ``A`` hides a mistake: the sketch the caller gets does not depend on the matrix they passed.
    """
    with_scores = kind == "leverage" and "scores" in options
    if A is not None and kind != "leverage":
        raise TypeError(
            f"make_sketch: A is used only by kind='leverage' without scores (to compute them); got "
            f"kind={kind!r}: drop A, or pass kind='leverage'"
        )
    if A is not None and with_scores:
        raise TypeError(
            "make_sketch: A is used only by kind='leverage' without scores (to compute them); pass either "
            "scores=... or A, not both"
        )
    if with_scores and "method" in options:
        raise TypeError(
            "make_sketch: method is used only by kind='leverage' without scores (it picks how the scores "
            "are computed from A); drop method, or pass A instead of scores"
        )


def make_sketch(kind, input_dim, sketch_size, *, seed=None, A=None, **options):
    """Build a sketch operator by name.

    Parameters
    ----------
    kind : {"gaussian", "srht", "srdct", "countsketch", "sparse_sign", "leverage", "uniform"}
        The family (see ``docs/operators.md`` for when to choose which).
    input_dim, sketch_size : int
        ``S`` has shape ``(sketch_size, input_dim)``.
    seed : None, int, SeedSequence, Generator or RandomState
        Philox key source.
    A : array or sparse matrix, optional
        Only for ``"leverage"`` without ``scores``: compute leverage scores from ``A``
        (``method="exact"`` or ``"approx"`` may be passed in ``options``). ``TypeError`` for
        another kind, or next to ``scores``.
    **options
        Family options: ``dtype``; ``nnz_per_column`` (sparse_sign);
        ``scores``, ``uniform_mix``, ``method`` (leverage, ``method`` only with ``A``); ``replace``
        (uniform). An option of another family raises ``TypeError``.

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
    if kind == "leverage" and "scores" in options and options["scores"] is None:
        del options["scores"]  # scores=None is no scores (it met "scores must hold real numbers")
    _check_kind_specific(kind, A, options)
    if kind == "leverage" and "scores" not in options:
        if A is None:
            raise ValueError("kind='leverage' needs either scores=... or the matrix A to compute them from")
        _check_options(cls.from_matrix, options, kind)
        A, _ = check_operand(A, input_dim, "A", rows_label="make_sketch's input_dim")
        return cls.from_matrix(A, sketch_size, seed=seed, **options)
    _check_options(cls.__init__, options, kind)
    return cls(input_dim, sketch_size, seed=seed, **options)
