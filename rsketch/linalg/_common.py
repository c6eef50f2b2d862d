"""What every solver shares: the checked problem, the sketch it uses, and ``S @ X`` itself.

Data flows one way: :mod:`rsketch.linalg._lstsq` (the entry point) calls the solvers
(:mod:`._precondition`, :mod:`._ihs`), and all of them take their inputs from here.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg.blas
import scipy.sparse as sp

from rsketch._backend import array_namespace, is_non_numpy_array, to_host
from rsketch._validation import LSTSQ_METHODS, as_matrix, check_finite, check_int, check_operand, check_option
from rsketch.dask._design import DaskDesign, validate_dask_problem
from rsketch.dask._leverage import leverage_sampling
from rsketch.dask._sketch import is_dask_array
from rsketch.linalg._array_design import ArrayDesign, leverage_scores, validate_array_problem
from rsketch.linalg._design import Design
from rsketch.operators import SKETCH_KINDS, LeverageSampling, SketchOperator, make_sketch
from rsketch.operators.base import canonical_csr

# Default sketch size, as a multiple of p (capped at n; never below 2 p).
SKETCH_FACTOR = {"sketch_and_solve": 20, "precondition": 40, "ihs": 10}
# Nonzeros per column of the sparse sign sketch lstsq builds for preconditioning (the operator's
# own default, 8, is kept for sketch-and-solve, whose answer is the sketch's estimate).
PRECONDITION_NNZ = 2


def default_sketch_size(method: str, n: int, p: int) -> int:
    """The documented default ``sketch_size`` for ``method``: ``min(n, c p)``, at least ``2 p``.

    ``c = 40`` for ``"precondition"``, ``20`` for ``"sketch_and_solve"``, ``10`` for ``"ihs"``. For
    preconditioning, ``r = 40 p`` gives a CG contraction of about ``sqrt(p / r) = 0.16`` per pass
    over ``X``, and was the fastest overall of ``20, 40, 80 p`` (fewer iterations against a larger
    sketch and factorisation; docs/solvers.md). For sketch-and-solve the expected
    squared-residual ratio is about ``1 + p / (r - p) = 1.05``. IHS draws a new sketch each
    iteration, so it uses a smaller one.

    Examples
    --------
    >>> default_sketch_size("precondition", 100_000, 50)
    2000
    >>> default_sketch_size("ihs", 300, 50)
    300
    """
    check_option(method, "method", LSTSQ_METHODS)
    return int(max(2 * p, min(n, SKETCH_FACTOR[method] * p)))


def validate_problem(X, y):
    """Check ``X`` (dense or sparse, ``n >= p``) and ``y`` (``(n,)`` or ``(n, k)``); both finite.

    Returns float64 ``X`` (dense arrays C-contiguous where they were, sparse as CSR), ``Y`` as a
    C-contiguous ``(n, k)`` float64 array, and whether ``y`` was a vector. A Dask ``X`` or ``y`` is
    checked by :func:`rsketch.dask._design.validate_dask_problem` (``X`` stays lazy).
    """
    if is_dask_array(X) or is_dask_array(y):
        return validate_dask_problem(X, y)
    if is_non_numpy_array(X) or is_non_numpy_array(y):  # CuPy (or another array-API library)
        return validate_array_problem(X, y)
    X = as_matrix(X)
    n = X.shape[0]
    X, _ = check_operand(X, n, "X", check_finite_values=False)
    if sp.issparse(X):
        X = X.tocsr().astype(np.float64, copy=False)
    elif X.dtype != np.float64:
        X = X.astype(np.float64, order="K")
    n, p = X.shape
    if n < p:
        raise ValueError(
            f"X must have at least as many rows as columns (n >= p) for an overdetermined "
            f"least-squares problem; got shape {X.shape}"
        )
    if not hasattr(y, "shape"):
        try:
            y = np.asarray(y)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"y must be an array of real numbers: {exc}") from exc
    if sp.issparse(y):
        y = y.toarray()
    if y.ndim not in (1, 2) or y.shape[0] != n:
        raise ValueError(f"y must have shape ({n},) or ({n}, k) to match X of shape {X.shape}; got {y.shape}")
    Y, is_vector = check_operand(y, n, "y")
    Y = np.ascontiguousarray(Y, dtype=np.float64)
    return X, Y, is_vector


def resolve_sketch(sketch, n, p, sketch_size, method, seed, X):
    """The operator to use: a kind name built here, or a given operator checked against ``X``."""
    if isinstance(sketch, SketchOperator):
        if sketch.input_dim != n:
            raise ValueError(f"sketch has input_dim={sketch.input_dim} but X has {n} rows")
        if sketch_size is not None and check_int(sketch_size, "sketch_size", minimum=1) != sketch.sketch_size:
            raise ValueError(
                f"sketch_size={sketch_size} contradicts the given operator's sketch_size={sketch.sketch_size}"
            )
        r = sketch.sketch_size
        S = sketch
    elif isinstance(sketch, str):
        if sketch not in SKETCH_KINDS:
            raise ValueError(
                f"sketch must be one of {sorted(SKETCH_KINDS)} or a SketchOperator, got {sketch!r}"
            )
        r = (
            default_sketch_size(method, n, p)
            if sketch_size is None
            else check_int(sketch_size, "sketch_size")
        )
        S = None
    else:
        raise TypeError(
            f"sketch must be a kind name ({sorted(SKETCH_KINDS)}) or a SketchOperator, "
            f"got {type(sketch).__name__}"
        )
    if r < 1:
        raise ValueError(f"sketch_size must be >= 1, got {r}")
    if method in ("precondition", "ihs") and r < p:
        raise ValueError(
            f"sketch_size must be >= p = {p} for method={method!r} (S X must have full column rank to "
            f"precondition); got sketch_size={r}"
        )
    if S is None:
        S = build_sketch(sketch, n, r, seed, X, method)
    return S, r


def build_sketch(kind, n, r, seed, X, method="sketch_and_solve"):
    """``make_sketch(kind, n, r, seed=seed)``; leverage scores are computed exactly from ``X``.

    For ``method="precondition"`` a sparse sign sketch gets ``PRECONDITION_NNZ = 2`` nonzeros per
    column: the sketch only has to make ``X M`` well conditioned, which ``r = 40 p`` rows do
    with two nonzeros as well as with eight (18 iterations either way at ``n = 500,000,
    p = 100``), and each nonzero costs a scattered add per entry of ``X`` (0.06 s against 0.15 s).
    """
    if kind == "leverage":
        if is_dask_array(X):  # approximate scores, in two passes over the chunks
            try:
                return leverage_sampling(X, r, seed=seed)
            except ValueError:  # its chunk checks name their operand A: as apply_sketch, X's own
                check_finite(X, "X")
                raise
        if is_non_numpy_array(X):  # exact scores from the SVD on X's device
            return LeverageSampling.from_scores(leverage_scores(X), r, seed=seed)
        return make_sketch(kind, n, r, seed=seed, A=X)
    if kind == "sparse_sign" and method == "precondition":
        return make_sketch(kind, n, r, seed=seed, nnz_per_column=min(PRECONDITION_NNZ, r))
    return make_sketch(kind, n, r, seed=seed)


def apply_sketch(S, X, name="X"):
    """``S @ X`` (computed, for Dask ``X``; on the device for CuPy ``X``); a NaN/inf found by the operator
    is reported against ``name``."""
    try:
        SX = S @ X
        return SX.compute() if is_dask_array(SX) else SX
    except ValueError:
        check_finite(X, name)
        raise


def design_for(X):
    """The products the iterations use: ``Design``; ``DaskDesign`` for a Dask ``X``, ``ArrayDesign`` for
    an ``X`` of another array library (CuPy)."""
    if is_dask_array(X):
        return DaskDesign(X)
    return ArrayDesign(X) if is_non_numpy_array(X) else Design(X)


def product_norms(design):
    """``V -> ||X V||`` per column, through ``design``'s products (:func:`design_for`): how the
    solvers confirm the sketch's rank against ``X`` itself (``_precondition.confirmed_rank``)."""
    return lambda V: column_norms(design.matmul(V))


def frobenius_norm(A) -> float:
    """``||A||_F`` of a dense or SciPy sparse NumPy array by BLAS ``nrm2``, which scales as it sums:
    no overflow or underflow of the squares, and no temporary for a contiguous ``A``.

    Examples
    --------
    >>> frobenius_norm(np.array([[3.0, 0.0], [4.0, 0.0]]))
    5.0
    >>> bool(np.isclose(frobenius_norm(np.array([3e200, 4e200])), 5e200, rtol=1e-15))  # no overflow
    True
    """
    if sp.issparse(A) and not (A.format in ("csr", "csc") and A.has_canonical_format):
        A = canonical_csr(A)  # entries stored twice add up, their squares do not: 1 and 2 gave sqrt(5)
    x = np.ravel(A.data if sp.issparse(A) else A)  # a view where A is contiguous
    if x.size == 0:
        return 0.0
    return float(scipy.linalg.blas.get_blas_funcs("nrm2", (x,))(x))


def column_norms(A) -> np.ndarray:
    """Euclidean norm of each column of a 2-D array, a host array for any input library (the solvers
    scale their data into range first; columns of finite entries whose squares overflow, or
    underflow, are scaled here, where the error estimate of the low-rank functions meets them).

    Examples
    --------
    >>> column_norms(np.array([[3.0, 0.0], [4.0, 2.0]])).tolist()
    [5.0, 2.0]
    >>> column_norms(np.array([[3e-200], [4e-200]])).tolist()  # squares of 1e-400 are 0
    [5e-200]
    >>> column_norms(np.zeros((0, 2))).tolist()
    [0.0, 0.0]
    """
    if is_non_numpy_array(A):
        xp = array_namespace(A)
        with np.errstate(over="ignore", under="ignore"):  # the squares' range is handled below
            norms = np.sqrt(to_host(xp.sum(A * A, axis=0)))
        if not _suspect(norms).any():
            return norms
        A = to_host(A)  # the rare overflow or underflow (or a zero column): on the host
    norms = np.sqrt(np.einsum("ij,ij->j", A, A))
    redo = _suspect(norms)
    if not redo.any() or A.shape[0] == 0:  # no rows: every norm is 0
        return norms
    # finite entries whose squares overflow (from about 1e154) or underflow (below about 1e-154: a
    # 300 x 40 matrix of 2**-600 gave norms 0): those columns by their largest entry (0: a zero column)
    block = A[:, redo]
    if not np.isfinite(block).all():  # NaN or inf in A itself: its norms say so as they are
        return norms
    scale = np.abs(block).max(axis=0)
    scale = np.where(scale > 0, scale, 1.0)
    block /= scale
    norms[redo] = scale * np.sqrt(np.einsum("ij,ij->j", block, block))
    return norms


#: Below this a column's norm may have lost digits to squares that underflow (sqrt(tiny) / eps).
_SMALL_NORM = {t: float(np.sqrt(np.finfo(t).tiny) / np.finfo(t).eps) for t in (np.float32, np.float64)}


def _suspect(norms) -> np.ndarray:
    """The norms that may be wrong: not finite (squares that overflow), or below :data:`_SMALL_NORM`
    (squares that underflow, down to 0 for a nonzero column)."""
    return ~(np.isfinite(norms) & (norms >= _SMALL_NORM.get(norms.dtype.type, 0.0)))
