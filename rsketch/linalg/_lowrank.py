"""Randomized low-rank approximation: range finder, SVD, symmetric eigendecomposition, Nyström.

Halko, Martinsson & Tropp (2011, "HMT") with our operators as test matrices: the first product is
``A @ S.T`` for any sketch kind (sparse sign by default, one cheap pass), then subspace iteration
with a QR between passes, or a block Krylov space (Musco & Musco 2015). Inputs: dense arrays
(float32 stays float32), SciPy sparse matrices (never densified) and
``scipy.sparse.linalg.LinearOperator``. The extra memory is the basis and the small factors.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import scipy.linalg
import scipy.linalg.blas
import scipy.sparse as sp
import scipy.sparse.linalg
from scipy.sparse.linalg import LinearOperator

import rsketch.linalg._lowrank_array as array_lowrank
import rsketch.linalg._results as _results
from rsketch._backend import is_non_numpy_array, like, to_host
from rsketch._exact_scaling import max_abs, safe_shift, unit_exponent
from rsketch._validation import (
    check_allocation,
    check_bool,
    check_int,
    check_operand,
    check_option,
    check_real,
    check_seed,
    seed_sequence,
)
from rsketch.dask import _lowrank as dask_lowrank
from rsketch.dask._sketch import is_dask_array
from rsketch.kernels import cpu
from rsketch.linalg._common import column_norms, frobenius_norm
from rsketch.linalg._scatter_plan import planned_product, with_scatter_plan
from rsketch.operators import SKETCH_KINDS, SketchOperator, make_sketch

RANGE_METHODS = ("subspace", "block_krylov")
# Gaussian probes of the a-posteriori estimate: it holds with probability at least 1 - 10**-PROBES.
PROBES = 10


@dataclass(frozen=True)
class RangeFinderResult:
    """An orthonormal basis of an approximate range of ``A``.

    Attributes
    ----------
    Q : ndarray of shape (m, l)
        Orthonormal columns (``l`` = rank + oversample, or what the adaptive finder grew).
    error_estimate : float or None
        HMT's randomized estimate (section 4.3) of ``||A - Q Q.T A||_2``: an upper bound with
        probability at least ``1 - 10**-10``. None when ``error_probes=0``.
    passes : int
        Passes over ``A``: products of ``A`` or ``A.T`` with a block of vectors (in memory the
        estimate's probes share the first one; Dask input and the adaptive finder give them their own).
    method : str

    Examples
    --------
    >>> import numpy as np
    >>> A = np.outer(np.arange(1.0, 5.0), np.ones(3))
    >>> res = range_finder(A, 1, seed=0)
    >>> res.Q.shape, bool(res.error_estimate < 1e-12)
    ((4, 3), True)
    """

    Q: np.ndarray
    error_estimate: float | None
    passes: int
    method: str


@dataclass(frozen=True)
class SVDResult:
    """A rank-``k`` approximation ``A ~ U diag(s) Vt``.

    Attributes
    ----------
    U : ndarray of shape (m, k)
    s : ndarray of shape (k,)
        Descending.
    Vt : ndarray of shape (k, n)
    error_estimate : float or None
        Randomized estimate of ``||A - U diag(s) Vt||_2`` (upper bound with probability
        ``1 - 10**-10``); None with ``error_probes=0``.
    passes : int
        Passes over ``A`` in all.
    timings : dict
        Seconds spent in ``"range"``, ``"project"`` (``Q.T A`` and its SVD) and ``"estimate"``.

    Examples
    --------
    >>> import numpy as np
    >>> res = svd(np.diag([3.0, 2.0, 1.0]), 2, seed=0)
    >>> np.round(res.s, 12).tolist()
    [3.0, 2.0]
    """

    U: np.ndarray
    s: np.ndarray
    Vt: np.ndarray
    error_estimate: float | None
    passes: int
    timings: dict = field(default_factory=dict)


@dataclass(frozen=True)
class EighResult:
    """A rank-``k`` approximation ``A ~ V diag(w) V.T`` of a symmetric ``A``.

    Attributes
    ----------
    eigenvalues : ndarray of shape (k,)
        The ``k`` of largest magnitude, in descending order of magnitude.
    eigenvectors : ndarray of shape (n, k)
    error_estimate : float or None
        Randomized estimate of ``||A - V diag(w) V.T||_2``.
    passes : int

    Examples
    --------
    >>> import numpy as np
    >>> res = eigh(np.diag([1.0, -4.0, 2.0]), 2, seed=0)
    >>> np.round(res.eigenvalues, 12).tolist()
    [-4.0, 2.0]
    """

    eigenvalues: np.ndarray
    eigenvectors: np.ndarray
    error_estimate: float | None
    passes: int


@dataclass(frozen=True)
class NystromResult:
    """``A ~ U diag(eigenvalues) U.T`` for a positive semi-definite ``A`` (randomized Nyström).

    Attributes
    ----------
    U : ndarray of shape (n, l)
        Orthonormal columns.
    eigenvalues : ndarray of shape (l,)
        Non-negative, descending.
    shift : float
        The stabilising shift ``nu`` that was added and removed (Tropp et al. 2017).

    Examples
    --------
    >>> import numpy as np
    >>> res = nystrom(np.diag([5.0, 1.0, 0.0, 0.0]), 2, oversample=0, seed=0)
    >>> np.round(res.eigenvalues, 10).tolist()
    [5.0, 1.0]
    """

    U: np.ndarray
    eigenvalues: np.ndarray
    shift: float

    def matvec(self, x):
        """``U diag(eigenvalues) U.T x``."""
        scale = self.eigenvalues[:, None] if np.ndim(x) == 2 else self.eigenvalues
        return self.U @ (scale * (self.U.T @ x))


# ----------------------------------------------------------------------------------------- input
def _check_matrix(A, name="A", dask=False, device=False):
    """``A`` as a dense float32/float64 array, a CSR/CSC matrix or a LinearOperator; its dtype.
    With ``dask``, a tall Dask array too (kept lazy, one column chunk); with ``device``, an array of
    another library (CuPy), kept on its device."""
    if is_dask_array(A):
        if not dask:
            raise TypeError(f"{name} is a Dask array: only range_finder, svd and qr_pivoted take one")
        return dask_lowrank.check_tall_dask(A, name)
    if is_non_numpy_array(A):
        if not device:
            array_lowrank.refuse(A, name)
        return array_lowrank.check_matrix(A, name)
    if isinstance(A, LinearOperator):
        dt = np.dtype(A.dtype)
        if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise TypeError(f"{name} must be a real float32 or float64 LinearOperator, got dtype {dt}")
        if 0 in A.shape:
            raise ValueError(f"{name} is empty (shape {A.shape})")
        return A, dt
    A, is_vector = check_operand(A, None, name)  # dense or CSR/CSC; float32 kept; finite
    if is_vector:
        raise ValueError(f"{name} must be 2-D, got a vector of shape {A.shape[:1]}")
    return A, A.dtype


def _check_rank(rank, m, n, name="rank"):
    return check_int(rank, name, minimum=1, maximum=min(m, n))


def _check_sketch(sketch, input_dim, size):
    """``sketch`` as :func:`_draw` takes it: a kind name, or an operator of shape ``(size, input_dim)``."""
    if isinstance(sketch, SketchOperator):
        if sketch.shape != (size, input_dim):
            raise ValueError(f"sketch must have shape {(size, input_dim)}, got {sketch.shape}")
    else:
        check_test_matrix_kind(sketch)


def _draw(sketch, input_dim, size, seed, dtype):
    """A sketch operator of shape ``(size, input_dim)``: a kind name or a given operator."""
    _check_sketch(sketch, input_dim, size)
    if isinstance(sketch, SketchOperator):
        return sketch
    # uniform sampling without replacement where it can: a column sampled twice left A @ S.T short of
    # rank, the basis' missing directions came from rounding, and they differed with A's memory
    # layout (SketchedPCA's components 1.6e-3 apart between C- and Fortran-ordered X of 20 columns)
    options = {"replace": False} if sketch == "uniform" and size <= input_dim else {}
    return make_sketch(sketch, input_dim, size, seed=seed, dtype=dtype, **options)


def check_test_matrix_kind(sketch):
    """A kind name the low-rank methods draw test matrices of: any of :func:`rsketch.make_sketch`'s
    but leverage-score sampling (its scores come from the matrix being approximated)."""
    if not isinstance(sketch, str) or sketch not in SKETCH_KINDS or sketch == "leverage":
        kinds = sorted(k for k in SKETCH_KINDS if k != "leverage")
        raise ValueError(f"sketch must be one of {kinds} or a SketchOperator, got {sketch!r}")


def _times_sketch(A, S):
    """``A @ S.T`` with ``S`` (``l x n``) generated as a dense ``n x l`` block, the size of the basis,
    and ``A``'s own product: one GEMM for dense ``A`` (the operators' kernels are built for tall
    operands; here the operand has ``m >> l`` columns), ``O(nnz l)`` for sparse ``A``."""
    return np.asarray(_matmat(A, np.asarray(S.to_dense().T, dtype=S.dtype)))


def _rmatmat(A, Y, out=None):
    """``A.T @ Y``; for dense ``A`` computed as ``(Y.T @ A).T`` (OpenBLAS's GEMM in that form:
    0.16 s against 0.23 s at 200,000 x 500 times 60 columns, either order of ``Y``). With ``out``
    (``n x l``, C- or Fortran-ordered), written into it."""
    if sp.issparse(A) and A.format in ("csr", "csc"):
        return _sparse_product(A.T, Y, out)
    if isinstance(A, np.ndarray):
        if out is None:
            return (Y.T @ A).T
        if out.flags.f_contiguous:
            np.matmul(Y.T, A, out=out.T)  # through the C-ordered view out.T: no temporary
        else:
            np.matmul(A.T, Y, out=out)
        return out
    AtY = np.asarray(A.T @ Y) if not isinstance(A, LinearOperator) else _operator_product(A, Y, True)
    if out is None:
        return AtY
    out[...] = AtY
    return out


def _operator_product(A, Y, adjoint):
    """``A @ Y`` (``A.T @ Y`` with ``adjoint``) of a LinearOperator, checked: a product of another
    shape was broadcast into the basis (an ``(m, 1)`` result for ``(m, k)`` gave singular values
    22.0, 16.0, 10.8 for 23.1, 22.5, 22.0), and a missing ``rmatvec`` met SciPy's bare
    "'NoneType' object is not callable". Returned in ``A.dtype``."""
    rows = A.shape[1] if adjoint else A.shape[0]
    try:
        AY = np.asarray(A.rmatmat(Y) if adjoint else A.matmat(Y))
    except TypeError as err:
        if adjoint and "NoneType" in str(err):
            raise TypeError(
                "A is a LinearOperator without rmatvec/rmatmat (products with A.T), which this "
                "function needs: give LinearOperator(..., rmatvec=..., rmatmat=...)"
            ) from err
        raise
    if AY.shape != (rows, Y.shape[1]) or AY.dtype.kind != "f":
        what = "A.T @ Y" if adjoint else "A @ Y"
        raise ValueError(
            f"the LinearOperator A returned {what} of shape {AY.shape} and dtype {AY.dtype} for Y of shape "
            f"{Y.shape}: expected a real float array of shape {(rows, Y.shape[1])}"
        )
    # In the dtype A declares, the one the results promise: a float32 operator whose products came
    # back float64 gave float64 U and Vt beside float32 s. Always a copy: the basis is orthonormalised
    # in place, which overwrote arrays the operator had handed out (and met read-only ones).
    return np.array(AY, dtype=A.dtype)


# The scatter form's private (n, l) sums: as many as fit in this many bytes, at most 4 (a function
# of the shapes only, so the sums' order and the result do not depend on the thread count).
SCATTER_BYTES = 1 << 28


def _sparse_product(A, Y, out=None):
    """``A @ Y`` for CSR or CSC ``A`` on our threaded kernels (SciPy's run on one thread).

    CSR gathers: each output row sums its nonzeros' rows of ``Y`` (written straight into ``out``).
    CSC scatters: ``A.T`` is CSR, and each row of it adds its entries times one row of ``Y``, read
    in order, into one of a few private sums. Measured at 1,000,000 x 100,000 with 10^7 nonzeros
    and 30 columns, against SciPy's 0.60 s and 0.49 s: 0.19-0.25 s and 0.26 s. A CSC ``A`` that
    carries a scatter plan (:mod:`rsketch.linalg._scatter_plan`, for calls that make many
    products) scatters panel by panel instead.
    """
    m, k = A.shape[0], Y.shape[1]
    dtype = np.result_type(A.dtype, Y.dtype)
    Y = np.ascontiguousarray(Y, dtype=dtype)
    if A.format == "csr":
        out = np.empty((m, k), dtype=dtype) if out is None else out
        cpu.csr_times_dense(A.indptr, A.indices, A.data.astype(dtype, copy=False), Y, out)
        return out
    if (planned := planned_product(A, Y, out)) is not None:
        return planned
    At = A.T  # CSR, no copy
    chunks = int(max(1, min(4, SCATTER_BYTES // max(1, m * k * dtype.itemsize))))
    acc = np.zeros((chunks, m, k), dtype=dtype)
    cpu.csr_transpose_times_dense(At.indptr, At.indices, At.data.astype(dtype, copy=False), Y, acc)
    if out is None:
        return acc[0] if chunks == 1 else acc.sum(axis=0)
    np.sum(acc, axis=0, out=out)
    return out


def _matmat(A, Y, out=None):
    """``A @ Y``; with ``out`` (``m x l``, C- or Fortran-ordered), written into it."""
    if isinstance(A, np.ndarray) and out is not None:
        if out.flags.c_contiguous:
            return np.matmul(A, Y, out=out)
        np.matmul(Y.T, A.T, out=out.T)  # through the C-ordered view out.T: no temporary
        return out
    if sp.issparse(A) and A.format in ("csr", "csc"):
        return _sparse_product(A, Y, out)
    AY = np.asarray(A @ Y) if not isinstance(A, LinearOperator) else _operator_product(A, Y, False)
    if out is None:
        return AY
    out[...] = AY
    return out


# Cholesky QR is used while cond(Y) <= CHOLQR_MAX_COND: its loss of orthogonality after the first
# pass is about u cond(Y)^2, which the second pass removes (Yamamoto et al. 2015, CholeskyQR2).
CHOLQR_MAX_COND = 1e5


def _cholqr_limit(dtype) -> float:
    """The largest ``cond(R)`` at which a Cholesky QR round is used, for ``dtype``: ``CHOLQR_MAX_COND``
    in float64, ``1e2`` in float32 (Householder QR beyond)."""
    return CHOLQR_MAX_COND if dtype == np.float64 else 1e2


def _overflow(name="A"):
    """The error for products of a finite ``A`` that are not finite (or a LinearOperator's NaN)."""
    return ValueError(
        f"products with {name} are not finite: its entries are too large for their sums (or a "
        f"LinearOperator returned NaN/inf); scale {name}, for example by a power of two near 1 / max|{name}|"
    )


def _orth(Y, scratch=None, with_r=False):
    """Orthonormal basis of ``range(Y)``, in ``Y``'s precision, written into ``Y`` (a temporary)
    unless Householder's fallback returns a new array; with ``with_r``, ``(Q, R)`` with ``Y = Q R``
    (``R`` square, upper triangular but for the power-of-two rescale of an overflow).

    CholeskyQR2 (two rounds of ``Y.T Y = R.T R``, ``Y R^-1``: BLAS-3) when ``Y`` is well enough
    conditioned, else Householder QR (LAPACK, whose panels are BLAS-2 and about ten times slower
    on a tall ``Y``). The two rounds go from ``Y`` to ``scratch`` (of ``Y``'s shape and order) and
    back, as products with the explicit ``l x l`` inverse ``R^-1``, so no ``m x l`` array is
    allocated when ``scratch`` is given: a fresh one costs its page faults, which on the machines
    measured took longer than the products. Everything of size ``m`` goes through NumPy's BLAS:
    SciPy's wheels carry their own OpenBLAS, whose threads spin after a call and took a core
    from NumPy's (a product of NumPy's right after a ``trsm`` of SciPy's took twice as long).
    """
    limit = _cholqr_limit(Y.dtype)
    fortran = Y.flags.f_contiguous and not Y.flags.c_contiguous  # a block of a Fortran-ordered basis
    Y = Y if fortran else np.ascontiguousarray(Y)
    if scratch is None:
        scratch = np.empty_like(Y, order="F" if fortran else "C")
    source, target = Y, scratch
    R = np.eye(Y.shape[1], dtype=Y.dtype) if with_r else None  # Y = source @ R throughout
    for _ in range(2):
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is handled here
            G = source.T @ source
        if not np.isfinite(G).all():  # only the range matters: scaled by a power of two (exact)
            if not np.isfinite(source).all():
                raise _overflow()
            shift = safe_shift(float(np.abs(source).max()), source.dtype)
            source *= np.ldexp(1.0, -shift)
            if with_r:
                R *= np.ldexp(1.0, shift)
            G = source.T @ source
        try:
            L = np.linalg.cholesky(G)
        except np.linalg.LinAlgError:
            break
        if not np.linalg.cond(L) <= limit:  # the l x l triangle's SVD; also catches NaN
            break
        # Y R^-1 with R = L.T: the inverse of an l x l triangle, O(u cond(R)) accurate as trsm.
        np.matmul(source, np.linalg.inv(L).T, out=target)
        source, target = target, source
        if with_r:
            R = L.T @ R
    else:
        return (Y, R) if with_r else Y
    if not with_r:
        return scipy.linalg.qr(source, mode="economic", overwrite_a=True, check_finite=False)[0]
    Q, R_last = scipy.linalg.qr(source, mode="economic", overwrite_a=True, check_finite=False)
    return Q, R_last @ R


def _estimate(A, approx, rng, dtype):
    """HMT (4.3): ``10 sqrt(2/pi) max_i ||(A - A_k) w_i||`` over ``PROBES`` Gaussian ``w_i``.

    ``approx(W, AW)`` returns ``A_k @ W`` (given ``A @ W``, for a projection ``Q Q.T A W``).
    """
    probes = _Probes.draw(rng, A.shape[1], dtype)
    probes.AW = _matmat(A, probes.W)
    return probes.estimate(approx)


@dataclass
class _Probes:
    """The error estimate's Gaussian probes ``W`` and ``A @ W``.

    The range finder computes ``A @ W`` in its first product from ``A`` (a GEMM of ``l + 10``
    columns, where the estimate took a pass of its own). ``W`` is drawn apart from the sketch, so
    ``A_k`` does not depend on it and HMT's bound holds as for probes drawn afterwards.
    """

    W: np.ndarray
    AW: np.ndarray | None = None

    @classmethod
    def draw(cls, rng, n, dtype):
        return cls(rng.standard_normal((n, PROBES)).astype(dtype, copy=False))

    def estimate(self, approx):
        R = self.AW - approx(self.W, self.AW)  # in A's library (on its device for CuPy)
        norms = column_norms(R)  # scaled where the squares overflow
        if not np.isfinite(norms).all():
            raise _overflow()
        return float(10 * math.sqrt(2 / math.pi) * norms.max())


# ------------------------------------------------------------------------------------ range finder
def range_finder(
    A,
    rank,
    *,
    sketch="sparse_sign",
    oversample=10,
    passes=3,
    method="subspace",
    tol=None,
    block_size=None,
    error_probes=True,
    seed=None,
):
    """An orthonormal basis ``Q`` with ``A ~ Q Q.T A`` (Halko, Martinsson & Tropp 2011).

    Parameters
    ----------
    A : ndarray, sparse matrix or LinearOperator of shape (m, n)
        A CuPy array (or one of another array-API library): ``Q`` is computed and returned on its
        device (``tol`` is not available there).
    rank : int
        Target rank ``k`` (with ``tol``: the largest basis allowed).
    sketch : str or SketchOperator, default "sparse_sign"
        The test matrix of the first pass, ``A @ S.T`` (``S`` of shape ``(l, n)``); any kind of
        :func:`rsketch.make_sketch` but ``"leverage"``. ``"gaussian"`` gives HMT's analysis exactly.
        ``"uniform"`` samples ``l`` distinct columns (without replacement) where ``l <= n``.
    oversample : int, default 10
        ``l = rank + oversample`` columns.
    passes : int, default 3
        Products of ``A`` or ``A.T`` with a block: ``passes = 2 q + 1`` is ``q`` rounds of subspace
        iteration ``(A A.T)^q A S.T``; an even count starts from ``A.T`` (``(A A.T)^q`` applied to
        ``A @ (A.T @ S.T)``, with ``S`` of shape ``(l, m)``). Each pass is re-orthonormalised (QR),
        as RandLAPACK and scikit-learn do. At most :data:`MAX_PASSES` (1000).
    method : {"subspace", "block_krylov"}
        ``"block_krylov"``: the whole Krylov space ``[A S.T, (A A.T) A S.T, ...]`` (blocks of
        ``l`` columns, orthonormalised together; Musco & Musco 2015), ``l (q + 1)`` columns.
    tol : float, optional
        Adaptive: grow the basis by ``block_size`` columns at a time (each block with the same
        ``passes`` of subspace iteration; ``method`` is not used) until the error estimate is at
        most ``tol`` (absolute, spectral norm), the basis holds ``A``'s range to rounding, or the
        basis has ``rank`` columns; in the last case, with the estimate above ``tol``, a
        :class:`~rsketch.ConvergenceWarning` gives it, as it does where the test blocks keep finding
        no new direction while the probes see more of ``A``'s range. Each step draws a new block, so
        ``sketch`` must then be a kind name, not an operator.
    block_size : int, optional
        With ``tol``, the adaptive step (10 by default). Without it, block Krylov's block
        (``rank + oversample`` by default), as :func:`svd`'s; subspace iteration's block is always
        ``rank + oversample``, and a ``block_size`` given for it is a ``ValueError``.
    error_probes : bool, default True
        Compute ``error_estimate`` from 10 Gaussian vectors, multiplied by ``A`` in the first
        product from ``A`` (no pass of their own; one more pass for Dask input and with ``tol``).
    seed : None, int, SeedSequence, Generator or RandomState

    Returns
    -------
    RangeFinderResult

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> A = rng.standard_normal((300, 8)) @ rng.standard_normal((8, 200))  # rank 8
    >>> res = range_finder(A, 8, oversample=2, seed=1)
    >>> bool(np.linalg.norm(A - res.Q @ (res.Q.T @ A)) < 1e-10 * np.linalg.norm(A))
    True
    """
    A, dtype = _check_matrix(A, dask=True, device=True)
    rank = _check_rank(rank, *A.shape)
    check_option(method, "method", RANGE_METHODS)
    block_size = _check_block_size(block_size, method, tol)
    oversample = check_int(oversample, "oversample", minimum=0)
    krylov_width = _krylov_width(A, block_size, tol, rank, oversample)
    adaptive_step = _adaptive_step(block_size, tol)
    found, _ = _find_range(
        A, dtype, rank, sketch, oversample, passes, method, tol, adaptive_step, error_probes, seed,
        krylov_width=krylov_width,
    )  # fmt: skip
    return found


#: The adaptive range finder's default step: columns added per block.
ADAPTIVE_STEP = 10


def _check_block_size(block_size, method, tol):
    """``block_size`` checked: block Krylov's block without ``tol``, the adaptive step with it; given
    for subspace iteration without ``tol``, where nothing would use it, a ``ValueError``."""
    if block_size is None:
        return None
    block_size = check_int(block_size, "block_size", minimum=1)
    if method == "subspace" and tol is None:
        raise ValueError(
            "block_size sets block Krylov's block (or, with tol, the adaptive step); subspace "
            "iteration's block is rank + oversample: leave block_size out or use method='block_krylov'"
        )
    return block_size


def _krylov_width(A, block_size, tol, rank, oversample):
    """Block Krylov's block where ``block_size`` gives it (no ``tol``), else None; a block below
    ``rank + oversample`` is for in-memory input only."""
    if block_size is None or tol is not None:
        return None
    m, n = A.shape
    if (is_dask_array(A) or is_non_numpy_array(A)) and block_size < min(rank + oversample, m, n):
        raise ValueError(  # their block Krylov stops at a spent space with the blocks it has
            f"block_size={block_size} below rank + oversample is available for in-memory input; "
            "for Dask or device input give block_size >= rank + oversample, or leave it out"
        )
    return block_size


def _adaptive_step(block_size, tol):
    """The adaptive range finder's columns per block: ``block_size`` where it goes with ``tol``
    (without ``tol`` it is block Krylov's block, :func:`_krylov_width`), else :data:`ADAPTIVE_STEP`."""
    return ADAPTIVE_STEP if block_size is None or tol is None else block_size


#: The most passes over ``A`` any low-rank function takes. Subspace iteration's error falls as
#: ``(sigma_{k+1} / sigma_k)^(2 q)`` and block Krylov's faster; a few dozen passes reach rounding on the
#: slow decays measured (docs/lowrank.md). ``passes=2**62 + 1`` had run on until killed.
MAX_PASSES = 1000


def check_passes(passes) -> int:
    """``passes`` as an int in ``[1, MAX_PASSES]``; errors name it.

    Examples
    --------
    >>> check_passes(3)
    3
    """
    return check_int(passes, "passes", minimum=1, maximum=MAX_PASSES)


def _check_basis_memory(m, n, rank, width, passes, method, tol, dtype, kept=None):
    """``MemoryError`` before the range finder allocates a basis beyond the memory (a large
    LinearOperator met NumPy's bare "Unable to allocate"). With ``kept`` (:func:`svd`), also the
    ``n``-long ``B.T``, a copy of it where it is factored, block Krylov's two product buffers, and
    its products kept beside the basis: ``"m"`` for sparse ``A`` (``A A.T Q_j``), ``"n"`` for dense
    (``A.T Q_j``, then ``B.T`` itself)."""
    blocks = 1 if method == "subspace" else min((passes - 1) // 2, min(m, n) // width - 1) + 1
    # the basis, a scratch block, and as much again for what the last steps hold beside them (svd's U,
    # a Householder QR's copy of the space; the adaptive finder's old and new Q): measured (tracemalloc,
    # 100,000 x 3,000 sparse, rank 300) 3.2 blocks for subspace, 5.3 for block Krylov, 2 ranks for tol,
    # where basis and scratch alone (2, 3 and 1) let an accepted call need all the memory
    columns = 2 * rank + width if tol is not None else width * (2 * blocks + 2)
    beside = width + PROBES + (2 * max(width * blocks, rank) + 2 * width if kept else 0)
    columns += width * blocks if kept == "m" else 0
    check_allocation(
        (m * columns + n * beside) * np.dtype(dtype).itemsize,
        f"the range finder's basis of {m:,} x {columns:,} and blocks of {n:,} x {beside:,}",
        "use a smaller rank (or oversample and passes)",
    )


def _find_range(
    A,
    dtype,
    rank,
    sketch,
    oversample,
    passes,
    method,
    tol,
    block_size,
    error_probes,
    seed,
    keep=None,
    probes=None,
    krylov_width=None,
    finishes_svd=False,
):
    """:func:`range_finder` of an ``A`` that :func:`_check_matrix` accepted (each check of a dense
    ``A`` reads it once); ``keep`` (a list) receives ``A.T Q_j`` of every block Krylov block but the
    last, computed on the way (:func:`svd` then needs one pass of ``l`` columns for ``Q.T A``): a
    :class:`_Kept` in memory, ``Q_j.T A`` blocks for Dask and device input; ``probes`` (a
    :class:`_Probes`) gets ``A @ W`` from the first product (in memory only); ``krylov_width``
    (checked by the caller) is block Krylov's block in place of ``rank + oversample``;
    ``finishes_svd`` counts :func:`svd`'s scatters after the range finder in the decision on a
    scatter plan. Returns the :class:`RangeFinderResult` and the operand the basis came from: a
    sparse ``A`` given a scatter plan, for the caller's own products, or ``A`` itself."""
    m, n = A.shape
    rank = _check_rank(rank, m, n)
    oversample = check_int(oversample, "oversample", minimum=0)
    passes = check_passes(passes)
    check_option(method, "method", RANGE_METHODS)
    check_seed(seed)
    error_probes = check_bool(error_probes, "error_probes")
    # an option is valid or not, whether tol (the adaptive finder that uses it) is given or not
    block_size = check_int(block_size, "block_size", minimum=1)
    if method == "block_krylov" and passes % 2 == 0 and tol is None:  # with tol, each block is subspace
        raise ValueError(f"method='block_krylov' needs an odd number of passes (2 q + 1), got {passes}")
    seeds = seed_sequence(seed).spawn(2)
    width = min(rank + oversample, m, n)
    if method == "block_krylov" and tol is None:
        width = width if krylov_width is None else min(krylov_width, m, n)
        fits = min(m, n) // width - 1  # blocks past the first that fit in min(m, n)
        if fits == 0 and passes > 1:  # none: its power rounds were dropped (a rank-60 svd of
            method = "subspace"  # 2,000 x 100 made 2 products and reported 6); subspace does them
            width = min(rank + oversample, m, n)
        else:
            asked, passes = passes, 2 * min((passes - 1) // 2, fits) + 1  # the passes it makes, as reported
            _check_krylov_space(width, passes, asked, rank, min(rank + oversample, m, n))
    _check_basis_memory(m, n, rank, width, passes, method, tol, dtype)
    if tol is not None:
        if is_dask_array(A) or is_non_numpy_array(A):
            raise ValueError(
                "tol (the adaptive range finder) is not available for Dask or device input; give rank"
            )
        tol = check_real(tol, "tol")
        if not (tol > 0 and math.isfinite(tol)):
            raise ValueError(f"tol must be a finite number > 0, got {tol}")
        if isinstance(sketch, SketchOperator):  # one operator would be every block, the last too
            raise ValueError(
                "tol draws a new test block for each step (of block_size columns, the last one "
                "narrower): give sketch as a kind name, not an operator"
            )
        _check_sketch(sketch, n if passes % 2 else m, min(block_size, rank))  # before the plan
        # rounds not known ahead: A @ W for the probes, then one block's scatters times as many
        # blocks as may come, then svd's
        blocks = -(-rank // block_size)
        scattered = _scatters(A, 1) + _scatters(A, passes) * blocks
        scattered += _svd_finish_scatters(A, None) if finishes_svd else 0
        A = with_scatter_plan(A, block_size, scattered, dtype)
        return _adaptive(A, rank, tol, block_size, passes, sketch, seeds, dtype), A
    if is_dask_array(A):
        return _dask_range(A, width, passes, method, sketch, seeds, dtype, error_probes, keep), A
    if error_probes:
        probes = _Probes.draw(np.random.default_rng(seeds[1]), n, dtype)
    if is_non_numpy_array(A):
        return _array_range(A, width, passes, method, sketch, seeds[0], dtype, keep, probes, error_probes), A
    needed = min(rank + oversample, m, n)
    _check_sketch(sketch, n if passes % 2 else m, width)  # before the plan
    scattered = _scatters(A, passes) + (_svd_finish_scatters(A, method) if finishes_svd else 0)
    A = with_scatter_plan(A, width, scattered, dtype)
    Q, passes = _basis(A, width, passes, method, sketch, seeds[0], dtype, keep, probes, needed)
    est = probes.estimate(lambda W, AW: Q @ (Q.T @ AW)) if error_probes else None
    return RangeFinderResult(Q, est, passes, method), A


def _svd_finish_scatters(A, method):
    """The scatters :func:`svd` makes after the range finder: block Krylov's last block (``A.T``,
    then ``A``: one scatter) and ``B = Q.T A`` (``A.T @ Q``: a scatter for CSR ``A``)."""
    if not sp.issparse(A):
        return 0
    return (method == "block_krylov") + (A.format == "csr")


def _scatters(A, passes):
    """How many of ``passes`` products of a sparse ``A`` are scatters (``A @ Y`` of a CSC ``A``,
    ``A.T @ Y`` of a CSR one): the products alternate, and an odd count starts and ends with ``A``."""
    return (passes + 1) // 2 if sp.issparse(A) and A.format == "csc" else passes // 2


def _check_krylov_space(width, passes, asked, rank, needed):
    """``ValueError`` where blocks of ``width`` columns in ``passes`` span fewer than ``needed``
    (``rank + oversample``) columns: the rank asked for could not be returned. Where ``min(m, n)``
    cut the ``asked`` passes down, the space need only hold ``rank``."""
    space = width * ((passes - 1) // 2 + 1)
    capped = passes < asked
    if space >= needed or (capped and space >= rank):
        return
    if capped:
        raise ValueError(
            f"block_size={width} spans at most {space} columns within min(m, n) (whole blocks), fewer "
            f"than rank = {rank}: give a larger block_size"
        )
    least = 2 * (-(-needed // width) - 1) + 1
    raise ValueError(
        f"block_size={width} with passes={passes} spans {space} columns, fewer than "
        f"rank + oversample = {needed}: give passes >= {least} or a larger block_size"
    )


def _dask_range(A, width, passes, method, sketch, seeds, dtype, error_probes, keep):
    """The range finder on a tall Dask ``A`` (:mod:`rsketch.dask._lowrank`): the same sketch, the
    passes as map-reduces over the row chunks, ``Q`` a persisted Dask array."""
    m, n = A.shape
    if passes % 2:
        first = _first_test_block(sketch, n, width, seeds[0], dtype).astype(A.dtype, copy=False)
    else:
        first = _draw(sketch, m, width, seeds[0], dtype)
    Q, kept = dask_lowrank.basis(A, first, passes, method)
    if keep is not None:
        keep.extend(kept)
    est = None
    if error_probes:
        W = np.random.default_rng(seeds[1]).standard_normal((n, PROBES)).astype(dtype, copy=False)
        est = 10 * math.sqrt(2 / math.pi) * dask_lowrank.estimate_error(A, lambda W: Q @ (Q.T @ (A @ W)), W)
    return RangeFinderResult(Q, est, passes + (1 if error_probes else 0), method)


def _array_range(A, width, passes, method, sketch, seed, dtype, keep, probes, error_probes):
    """The range finder on an ``A`` of another library (:mod:`._lowrank_array`): the test block of
    :func:`_basis`, the passes and QRs on ``A``'s device, ``Q`` there too."""
    m, n = A.shape
    if passes % 2:
        Z = _first_test_block(sketch, n, width, seed, dtype)
    else:  # orth(A.T S.T) on the device, brought back as the n x l test block
        S_t = _first_test_block(sketch, m, width, seed, dtype)
        Z = to_host(array_lowrank.basis(_transpose(A), S_t, 0, "subspace")[0])
    rounds = (passes - 1) // 2
    if method == "block_krylov":
        rounds = min(rounds, min(m, n) // width - 1)  # the space cannot outgrow min(m, n)
    W = None if probes is None else probes.W
    Q, probes_AW, made = array_lowrank.basis(A, Z, rounds, method, keep, W)
    if probes is not None:
        probes.AW = probes_AW
    est = probes.estimate(lambda W, AW: Q @ (Q.T @ AW)) if error_probes else None
    # the passes made: block Krylov stops where A's range is spent (it had reported the passes asked)
    return RangeFinderResult(Q, est, passes - 2 * (rounds - made), method)


def _first_test_block(sketch, size, width, seed, dtype):
    """The first pass's test block ``S.T`` (``size x width``, dense), or the identity where ``width >= size``:
    a square test matrix spans every direction only where it is nonsingular, and a square sparse sign,
    CountSketch or sampling one often is not (``svd(A, 3, passes=1)`` of a 100 x 3 ``A`` lost a singular
    value in 6 of 10 seeds); ``I`` gives ``A``'s range exactly, whatever the seed."""
    if width >= size:
        return np.eye(size, dtype=dtype)
    return np.asarray(_draw(sketch, size, width, seed, dtype).to_dense().T, dtype=dtype)


def _basis(A, width, passes, method, sketch, seed, dtype, keep=None, probes=None, needed=0):
    """The range finder's basis (Fortran-ordered; ``l (q + 1)`` columns for block Krylov) and the
    passes it made (fewer than ``passes`` where block Krylov found ``A``'s range spent).

    One buffer holds ``A @ probes.W`` (when given) and then the basis' blocks, each a contiguous
    ``m x l`` slice, so the first product from ``A`` writes both in one GEMM and no ``m x l`` array
    is allocated per step (their page faults cost more than the products on the machines measured).
    """
    m, n = A.shape
    if passes % 2:
        Z = _first_test_block(sketch, n, width, seed, dtype)
    elif width >= m:  # A.T's range exactly (_first_test_block)
        Z = _orth(_rmatmat(A, np.eye(m, dtype=dtype)))
    else:
        Z = _orth(_times_sketch(_transpose(A), _draw(sketch, m, width, seed, dtype)))
    rounds = (passes - 1) // 2
    if method == "block_krylov":
        rounds = min(rounds, min(m, n) // width - 1)  # the space cannot outgrow min(m, n)
    p = 0 if probes is None else probes.W.shape[1]
    blocks = rounds + 1 if method == "block_krylov" else 1
    buffer = np.empty((m, p + width * blocks), dtype=dtype, order="F")
    _matmat(A, Z if p == 0 else np.hstack([probes.W, Z]), out=buffer[:, : p + width])
    if probes is not None:
        probes.AW = buffer[:, :p]
    K, scratch = buffer[:, p:], np.empty((m, width), dtype=dtype, order="F")
    if method == "block_krylov":
        Q, made = _block_krylov(A, K, width, scratch, keep, needed)
        return Q, passes - 2 * (rounds - made)
    Q = _orth(K, scratch)
    for _ in range(rounds):
        Z = _orth(_rmatmat(A, Q))
        Q = _orth(_matmat(A, Z, out=Q), scratch)  # the last block's memory is free now
    return Q, passes


@dataclass(frozen=True)
class _Kept:
    """What block Krylov leaves for :func:`svd`. Dense ``A``: ``Bt`` holds ``A.T Q_j`` of every
    block but the last in its first ``done`` columns. Sparse ``A``: ``gram``, ``Q.T A A.T Q``."""

    Bt: np.ndarray | None = None
    done: int = 0
    gram: np.ndarray | None = None


def _block_krylov(A, K, width, scratch, keep, needed=0):
    """Block Krylov in the Fortran-ordered basis ``K`` (its first block ``A S.T``; each block a
    contiguous ``m x l`` slice) with one scratch block. ``keep`` (a list) receives a :class:`_Kept`
    unless the space had to be re-orthonormalised: for a dense ``A``, the products ``A.T Q_j``,
    written where :func:`svd` reads them; for a sparse ``A``, whose basis :func:`svd` puts on the
    short side, the Gram ``Q.T A A.T Q`` from the ``m``-long ``A A.T Q_j`` (each the block before
    its orthogonalisation, times ``R``), so nothing ``n`` long is kept. The ``n x l`` products are
    orthonormalised in two buffers allocated once: a fresh array costs its page faults (1.2-1.6 s a
    gigabyte on the machines measured) on every round. A space that ``A``'s range no longer feeds
    stops there, but with at least ``needed`` columns (blocks narrower than that go on into
    rounding noise, orthonormal directions as a wide block's last one would be). Returns the basis
    and the rounds it made (two products each)."""
    n = A.shape[1]
    gram = keep is not None and sp.issparse(A)
    order = _product_order(A)
    kept = None
    if keep is not None:
        rows, kept_order = (K.shape[0], "F") if gram else (n, order)
        kept = np.empty((rows, K.shape[1]), dtype=K.dtype, order=kept_order)
    P, P_scratch = (np.empty((n, width), dtype=K.dtype, order=order) for _ in range(2))
    _orth_into(K[:, :width], scratch)
    noise = False  # a block found A's range spent
    for j in range(1, K.shape[1] // width):
        previous, behind = K[:, (j - 1) * width : j * width], slice((j - 1) * width, j * width)
        block, done = K[:, j * width : (j + 1) * width], K[:, : j * width]
        if kept is None or gram:
            _rmatmat(A, previous, out=P)  # A.T Q_{j-1}, (n, l)
        else:
            P[...] = _rmatmat(A, previous, out=kept[:, behind])
        Z, R = _orth(P, P_scratch, with_r=True)
        _matmat(A, Z, out=block)
        if gram:
            with np.errstate(over="ignore", invalid="ignore"):  # an overflow: _sparse_finish refuses G
                np.matmul(block, R, out=kept[:, behind])  # A A.T Q_{j-1} = (A Z) R
        for _ in range(2):  # CGS2 against the space so far: the blocks need no final QR
            np.matmul((done.T @ block).T, done.T, out=scratch.T)
            block -= scratch
        _orth_into(block, scratch)
        spent = np.abs(done.T @ block).max() > array_lowrank.KRYLOV_ORTH_TOL[K.dtype]  # noise: A's rank
        if spent and (j + 1) * width >= needed:
            return _reorthonormalize(K[:, : (j + 1) * width]), j
        noise |= spent
    if noise:  # spent before `needed` columns, which the space could not reach (its blocks are capped at
        # min(m, n)): the noise blocks after it are not orthogonal to the rest (||Q.T Q - I|| was 6.6)
        return _reorthonormalize(K), K.shape[1] // width - 1
    if keep is not None and gram:
        last = slice(K.shape[1] - width, None)
        _rmatmat(A, K[:, last], out=P)
        _matmat(A, P, out=kept[:, last])  # two more passes
        with np.errstate(over="ignore", invalid="ignore"):
            G = K.T @ kept
            keep.append(_Kept(gram=(G + G.T) / 2))
    elif keep is not None:
        keep.append(_Kept(Bt=kept, done=K.shape[1] - width))
    return K, K.shape[1] // width - 1


def _product_order(A):
    """The order of ``A.T @ Y``'s buffers: Fortran for a dense ``A`` (GEMM writes ``Y.T @ A`` into
    the C-ordered transpose), C for the sparse kernels, which write rows and read the next factor
    by rows (a Fortran ``n x l`` block written by rows, and its C copy for the next product, had
    cost 2.9 s of 12 at 1,000,000 x 100,000 with 31 blocks of 5)."""
    return "F" if isinstance(A, np.ndarray) else "C"


def _reorthonormalize(K):
    """Householder QR of the whole space (the products kept on the way no longer apply)."""
    return scipy.linalg.qr(K, mode="economic", check_finite=False)[0]


def _orth_into(block, scratch=None):
    Q = _orth(block, scratch)
    if Q is not block:  # Householder's fallback returned a new array
        block[...] = Q


def _transpose(A):
    return A.T if not isinstance(A, LinearOperator) else A.adjoint()


def _deflate(Y, Q):
    """``(I - Q Q.T) Y``, projected twice (twice is enough, Giraud et al. 2005)."""
    for _ in range(2):
        Y = Y - Q @ (Q.T @ Y)
    return Y


def _deflated_block(A, Q, width, passes, sketch, seed, dtype):
    """``A Z`` for ``Z`` from subspace iteration on the deflated ``(I - Q Q.T) A``, with ``passes``
    products as :func:`_basis` counts them; the last product as it is (not projected).

    The deflation matters from the second pass on: a power round of ``A`` itself turns every block
    back to the leading singular directions, which ``Q`` holds already, and the new directions come
    out at ``(sigma_j / sigma_1)^2`` of their size, below rounding (HMT section 4.4; Martinsson &
    Voronin 2016 iterate on ``A - Q B`` likewise).
    """
    m, n = A.shape
    if passes % 2:
        Z = np.asarray(_draw(sketch, n, width, seed, dtype).to_dense().T, dtype=dtype)
    else:  # A.T (I - Q Q.T) S.T, with S.T dense: the deflation needs it
        St = np.asarray(_draw(sketch, m, width, seed, dtype).to_dense().T, dtype=dtype)
        Z = _orth(_rmatmat(A, _deflate(St, Q)))
    Y = _matmat(A, Z)
    for _ in range((passes - 1) // 2):
        Z = _orth(_rmatmat(A, _orth(_deflate(Y, Q))))
        Y = _matmat(A, Z)
    return Y


def _new_directions(Y, Q, scale):
    """An orthonormal basis of the part of ``range(Y)`` outside ``range(Q)``, orthogonal to ``Q``;
    None where nothing is left but rounding. ``Y`` is a block of products ``A Z`` (``Z`` of unit
    columns or a drawn test block), and ``scale`` estimates ``||A||_F`` (probes), which the products'
    rounding is measured against.

    Deflated, the block is factored by QRCP, and the directions whose pivot is at rounding level
    (``max(m, k + l) u scale``) are dropped: noise, not range. The others are projected once more,
    since the projection's rounding, ``O(u)`` of the block, is ``O(u / nu)`` of a direction of size
    ``nu``. Without this, once ``range(A)`` was in ``Q``, each block added noise and cost
    orthogonality: ``||Q.T Q - I|| = 33`` at ``tol=1e-14``, ``block_size=1``, with an estimate of
    ``5e-13`` where the error was ``1.7e3``.
    """
    W, R, _ = scipy.linalg.qr(_deflate(Y, Q), mode="economic", pivoting=True, check_finite=False)
    noise = max(Y.shape[0], Q.shape[1] + Y.shape[1]) * np.finfo(Y.dtype).eps * scale
    found = int(np.count_nonzero(np.abs(np.diag(R)) > noise))
    if found == 0:
        return None
    W = W[:, :found]
    return _orth(W - Q @ (Q.T @ W))


#: Blocks the adaptive range finder draws again where one adds no direction while its probes' estimate
#: stands above :data:`ADAPTIVE_RETRY_ABOVE` times its rounding level (past them: "A's range is in Q").
ADAPTIVE_RETRIES = 8
ADAPTIVE_RETRY_ABOVE = 1e3


def _adaptive(A, max_rank, tol, block_size, passes, sketch, seeds, dtype):
    """HMT's blocked adaptive range finder: new blocks until the probe estimate is below ``tol``."""
    m, n = A.shape
    rng = np.random.default_rng(seeds[1])
    W = rng.standard_normal((n, PROBES)).astype(dtype, copy=False)
    R = _matmat(A, W)  # (I - Q Q.T) A W, kept up to date as Q grows
    used = 1
    Q = np.zeros((m, 0), dtype=dtype)
    scale = 10 * math.sqrt(2 / math.pi)
    # E ||A w||^2 = ||A||_F^2; column_norms, whose squares neither overflow nor underflow (A of
    # 2**-600 gave a basis of no column and an estimate of 0, A of 1e160 an estimate of inf)
    with np.errstate(over="ignore"):
        norm_estimate = float(column_norms(R).max())
    if not math.isfinite(norm_estimate):  # no new direction would beat inf: no column, and no warning
        raise _overflow()
    est = scale * norm_estimate
    blocks = max(1, -(-max_rank // block_size))
    children = seeds[0].spawn(blocks + ADAPTIVE_RETRIES)
    at_rounding, stalled, retries = False, False, 0
    rounding = scale * max(m, n) * np.finfo(dtype).eps * norm_estimate  # the estimate at rounding level
    for child in children:
        if est <= tol or Q.shape[1] >= max_rank:
            break
        b = min(block_size, max_rank - Q.shape[1])
        Y = _deflated_block(A, Q, b, passes, sketch, child, dtype)
        used += passes
        Y = _new_directions(Y, Q, norm_estimate)
        if Y is None and est > ADAPTIVE_RETRY_ABOVE * rounding and retries < ADAPTIVE_RETRIES:
            # the probes see range outside Q: the block was degenerate (random +-1 columns of a few
            # entries can be dependent on the ones before: at block_size 1, 30 of 100 seeds had
            # stopped at 9 of 10 columns, the error 13.9, with no warning), so draw another
            retries += 1
            continue
        if Y is None:  # A's range is in Q to rounding (another block would add only noise), or the
            # draws keep missing what the probes see: after 8 retries, a uniform test matrix of 2
            # columns still missed 3 of 5 nonzero columns of A (error 11, estimate 266, no warning)
            at_rounding = est <= ADAPTIVE_RETRY_ABOVE * rounding
            stalled = not at_rounding
            break
        Q = np.hstack([Q, Y])
        R = R - Y @ (Y.T @ R)
        est = scale * float(column_norms(R).max())
    else:  # the draws ran out with blocks that found fewer directions than they had columns
        stalled = Q.shape[1] < max_rank and est > tol
    # A basis that holds A's range to rounding is the best this precision gives, whatever the
    # estimate (an upper bound, 8x the largest probe's residual, it can sit above a tol that the
    # error itself meets): found so (no new direction), a basis of all min(m, n) columns, or an
    # estimate at the probes' rounding. One cut short by rank is not.
    at_rounding = at_rounding or Q.shape[1] >= min(m, n) or est <= rounding
    if stalled and est > tol:
        warnings.warn(
            f"the adaptive range finder stopped at {Q.shape[1]} of rank={max_rank} columns with its "
            f"error estimate at {est:.3g} (tol={tol:g}): its {sketch!r} test blocks found no new "
            "direction (or fewer than their columns) while the probes still saw A's range outside "
            "the basis, so they miss part of it: use sketch='gaussian' or 'sparse_sign'",
            _results.ConvergenceWarning,
            stacklevel=4,  # the caller of range_finder or svd
        )
    elif est > tol and not at_rounding:
        warnings.warn(
            f"the adaptive range finder stopped at rank={max_rank} columns: raise rank (error estimate "
            f"{est:.3g}, tol={tol:g})",
            _results.ConvergenceWarning,
            stacklevel=4,  # the caller of range_finder or svd
        )
    return RangeFinderResult(Q, est, used, "adaptive")


# ------------------------------------------------------------------------------------- SVD, eigh
def svd(
    A,
    rank,
    *,
    sketch="sparse_sign",
    oversample=10,
    passes=5,
    method="block_krylov",
    tol=None,
    block_size=None,
    error_probes=True,
    flip_sign=True,
    seed=None,
):
    """Randomized truncated SVD ``A ~ U diag(s) Vt`` of rank ``rank`` (HMT, section 5.1).

    The range finder (:func:`range_finder`, same parameters) gives ``Q``; then ``B = Q.T A``
    (one pass), the SVD of the small ``B``, ``U = Q U_B``. A sparse ``A`` is decomposed on its
    short side (as ``A.T`` where it has more rows than columns), and ``B`` through its Gram
    ``B B.T`` where the Gram's rounding is a millionth of the error or less, else exactly
    (``docs/lowrank.md``); block Krylov then reports ``passes=5`` as 8 passes (6 for dense ``A``).
    With ``flip_sign`` the signs follow scikit-learn's ``svd_flip`` (``u_based_decision``), so
    results compare with ``randomized_svd``.

    Parameters
    ----------
    A : ndarray, sparse matrix or LinearOperator of shape (m, n)
        A CuPy array (or one of another array-API library) is decomposed on its device, and ``U``,
        ``s`` and ``Vt`` are returned there (``docs/gpu.md``).
    rank : int
    sketch, oversample, tol, seed
        As for :func:`range_finder`.
    passes : int, default 5
    method : {"block_krylov", "subspace"}, default "block_krylov"
        As for :func:`range_finder`. The defaults (a block Krylov space of three blocks) gave a
        smaller Frobenius error than scikit-learn's ``randomized_svd`` defaults (four power
        iterations) on fast and slow spectral decays, in less time (``docs/lowrank.md``).
    block_size : int, optional
        Block Krylov's block, ``rank + oversample`` by default; with ``tol``, the adaptive range
        finder's step (10 by default, as :func:`range_finder`'s). Its ``block_size (passes + 1) / 2``
        columns must be at least ``rank + oversample``. On a flat spectrum, small blocks and more
        passes reach a given accuracy in fewer products (Meyer, Musco & Musco 2024; measured in
        ``docs/lowrank.md``); but a block narrower than the multiplicity of a leading singular
        value reaches the rest of its vectors only through rounding errors (in exact arithmetic,
        never), so such a spectrum needs more passes.
    error_probes : bool, default True
        Estimate ``||A - U diag(s) Vt||_2`` from 10 Gaussian vectors carried in the range finder's
        first product (one more pass for Dask input and with ``tol``).
    flip_sign : bool, default True

    Returns
    -------
    SVDResult

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> A = (rng.standard_normal((500, 60)) * np.exp(-np.arange(60) / 5)) @ rng.standard_normal((60, 80))
    >>> res = svd(A, 10, seed=0)
    >>> s = np.linalg.svd(A, compute_uv=False)
    >>> bool(np.allclose(res.s, s[:10], rtol=1e-6)), bool(res.error_estimate >= s[10])
    (True, True)
    """
    t0 = time.perf_counter()
    A, dtype = _check_matrix(A, dask=True, device=True)
    m, n = A.shape
    rank = _check_rank(rank, m, n)
    check_option(method, "method", RANGE_METHODS)
    block_size = _check_block_size(block_size, method, tol)
    oversample = check_int(oversample, "oversample", minimum=0)
    error_probes = check_bool(error_probes, "error_probes")
    flip_sign = check_bool(flip_sign, "flip_sign")
    krylov_width = _krylov_width(A, block_size, tol, rank, oversample)
    args = (rank, sketch, oversample, passes, method, tol, error_probes, flip_sign, seed, dtype, t0)
    if is_dask_array(A) or is_non_numpy_array(A):
        svd_on = _dask_svd if is_dask_array(A) else _array_svd
        return svd_on(A, *args, krylov_width)
    check_seed(seed)
    # The range of A.T where A is sparse and taller than wide: the basis, its QRs and the products
    # kept for B are n rows long, not m (a dense A's GEMMs dwarf them either way; an operator's
    # errors would name the wrong product; a sketch operator given fixes the side by its shape).
    transposed = m > n and sp.issparse(A) and isinstance(sketch, str)
    M = _transpose(A) if transposed else A
    rows, cols = M.shape
    width = min(krylov_width or rank + oversample, rows, cols)
    kept = "m" if sp.issparse(M) else "n"
    _check_basis_memory(rows, cols, rank, width, check_passes(passes), method, tol, dtype, kept=kept)
    keep, probes = [], None
    if error_probes:
        probes = _Probes.draw(np.random.default_rng(seed_sequence(seed).spawn(3)[2]), cols, dtype)
    adaptive_step = _adaptive_step(block_size, tol)
    # M comes back with the range finder's scatter plan, where it made one, for the finish's products
    found, M = _find_range(
        M, dtype, rank, sketch, oversample, passes, method, tol, adaptive_step, False, seed, keep, probes,
        krylov_width, finishes_svd=True,
    )  # fmt: skip
    t1 = time.perf_counter()
    if sp.issparse(M):
        U, s, Vt, finish_passes = _sparse_svd_finish(M, found.Q, rank, keep, transposed)
    else:
        U, s, Vt, finish_passes = _dense_svd_finish(M, found.Q, rank, keep, dtype)
    if flip_sign:
        U, Vt = _flip_signs(U, Vt)
    t2 = time.perf_counter()
    est, estimate_passes = None, 0
    if error_probes:
        est, estimate_passes = _svd_error_estimate(M, probes, U, s, Vt, transposed)
    t3 = time.perf_counter()
    passes_used = found.passes + finish_passes + estimate_passes
    timings = {"range": t1 - t0, "project": t2 - t1, "estimate": t3 - t2}
    return SVDResult(U, s.astype(dtype, copy=False), Vt, est, passes_used, timings)


def _dense_svd_finish(M, Q, rank, keep, dtype):
    """``(U, s, Vt, passes)`` of a dense or operator ``M ~ Q Q.T M`` at rank ``rank``: the SVD of
    ``B = Q.T M`` from ``B.T = M.T Q`` (``n x l``), which block Krylov computed on the way for all
    its blocks but the last (``keep``); one pass for the rest."""
    if keep:
        Bt, done = keep[0].Bt, keep[0].done
    else:
        Bt, done = np.empty((M.shape[1], Q.shape[1]), dtype, order=_product_order(M)), 0
    _rmatmat(M, Q[:, done:], out=Bt[:, done:])
    Ub, s, Vt = _wide_svd(Bt.T)
    k = min(rank, s.size)
    return Q @ Ub[:, :k], s[:k], Vt[:k], 1


def _sparse_svd_finish(M, Q, rank, keep, transposed):
    """``(U, s, Vt, passes)`` of a sparse ``A`` (``M``, or ``M = A.T`` where ``transposed``) from
    :func:`_sparse_finish`, through block Krylov's Gram where it kept one (its last block
    ``M M.T Q_q`` is then two passes)."""
    gram = keep[0].gram if keep else None
    U_M, s, Vt_M, passes = _sparse_finish(M, Q, rank, gram)
    passes += 0 if gram is None else 2
    U, Vt = (Vt_M.T, U_M.T) if transposed else (U_M, Vt_M)
    return U, s, np.ascontiguousarray(Vt), passes


def _svd_error_estimate(M, probes, U, s, Vt, transposed):
    """``(estimate, passes)``: ``||A - U diag(s) Vt||_2`` from the probes ``W`` and ``M W``, which the
    range finder's first product carried, or one more pass where it did not (the adaptive range
    finder's first products are its blocks')."""
    extra_pass = probes.AW is None
    if extra_pass:
        probes.AW = _matmat(M, probes.W)
    if transposed:  # M = A.T ~ Vt.T diag(s) U.T
        return probes.estimate(lambda W, AW: Vt.T @ (s[:, None] * (U.T @ W))), int(extra_pass)
    return probes.estimate(lambda W, AW: U @ (s[:, None] * (Vt @ W))), int(extra_pass)


# The Gram finish of _sparse_finish is taken where its rounding is at most this fraction of the
# squared error of the projection it serves.
GRAM_FINISH_MARGIN = 1e6


def _sparse_finish(M, Q, k, gram=None):
    """``(U_M, s, Vt_M, passes)`` of ``M ~ Q Q.T M`` at rank ``k``, in BLAS-3 and passes over ``M``.

    ``M`` is sparse with its long side ``n``: ``B.T = M.T Q`` (``n x l``) would be tall, and
    LAPACK's tall SVD or Householder QR run BLAS-2 panels (8.6 s and 7.5 s at 1,000,000 x 90,
    against 0.3 s for the Gram), and keeping it costs its page faults (1.3 s at 1,000,000 x 155).
    The Gram ``G = B B.T`` (block Krylov's, or ``B.T``'s when not given) has eigenvectors ``E``;
    ``M.T Q E_k`` (one pass of ``k`` columns; condition number ``sqrt(lambda_1 / lambda_k)``) is
    factored exactly (CholeskyQR2 and the SVD of its triangle), so ``s`` and ``Vt_M`` are ``M``'s
    on that subspace to rounding. The Gram's rounding, at most ``(l + n) u lambda_1`` in norm with
    ``eigh``'s, lowers the energy ``||B.T E_k||_F^2`` it captures by at most ``2 k`` times that;
    the squared error of the projection is at least ``lambda_{k+1}``, so the Gram is used where
    that loss is below ``lambda_{k+1} / GRAM_FINISH_MARGIN``, and ``B.T`` is factored itself
    elsewhere (exactly low-rank ``M``, steep spectra, float32).

    Examples
    --------
    >>> import scipy.sparse as sp
    >>> M = sp.random(40, 3000, density=0.05, format="csr", random_state=0)
    >>> Q = np.linalg.qr(M @ np.random.default_rng(0).standard_normal((3000, 12)))[0]
    >>> U, s, Vt, passes = _sparse_finish(M, Q, 4)
    >>> B = Q.T @ M
    >>> bool(np.allclose(s, np.linalg.svd(B.toarray() if sp.issparse(B) else B, compute_uv=False)[:4]))
    True
    """
    l = Q.shape[1]
    if l == 0:  # an adaptive basis of no column (A = 0, or tol above ||A||): nothing to factor
        return Q, np.zeros(0, Q.dtype), np.zeros((0, M.shape[1]), Q.dtype), 0
    k = min(k, l)
    Bt, passes = None, 0
    if gram is None:
        Bt, passes = _rmatmat(M, Q), 1
        with np.errstate(over="ignore", invalid="ignore", under="ignore"):
            gram = Bt.T @ Bt
    Ek = _gram_subspace(gram, k, M.shape[1])
    if Ek is None:  # B.T itself, exactly
        Y = Bt if Bt is not None else _rmatmat(M, Q)
    else:  # M.T Q E_k, k columns
        Y = Bt @ Ek if Bt is not None else _rmatmat(M, Q @ Ek)
    W, R = _orth(Y, with_r=True)  # Y is a temporary
    Ur, s, Vrt = np.linalg.svd(R)
    V = Vrt[:k].T if Ek is None else Ek @ Vrt.T
    return Q @ V, s[:k], (W @ Ur[:, :k]).T, passes + (Bt is None)


def _gram_subspace(gram, k, n):
    """The Gram's ``k`` leading eigenvectors ``E_k`` (C-ordered), or None where :func:`_sparse_finish`
    may not take them: ``G`` not finite (its entries, squares of ``A``'s scale, had overflowed at
    ``||A|| ~ 1e154``), ``lambda_{k+1}`` not a normal number with all its digits (at ``A`` scaled by
    ``2^-530`` the Gram was subnormal and ``s`` came out ``1e-5`` off), or the Gram's rounding above
    ``lambda_{k+1} / GRAM_FINISH_MARGIN``. One ``eigh`` serves the test and the vectors.

    Examples
    --------
    >>> np.abs(_gram_subspace(np.diag([4.0, 2.0, 1.0]), 2, 100)).tolist()
    [[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]]
    >>> _gram_subspace(np.diag([4.0, 2.0, 0.0]), 2, 100) is None  # lambda_3 = 0: the exact finish
    True
    """
    l = gram.shape[0]
    if k >= l or not np.isfinite(gram).all():
        return None
    lam, E = np.linalg.eigh(gram)
    lam, E = lam[::-1], E[:, ::-1]
    finfo = np.finfo(gram.dtype)
    loss = 2 * k * (l + n) * finfo.eps * lam[0]
    if lam[k] >= finfo.tiny / finfo.eps and loss * GRAM_FINISH_MARGIN <= lam[k]:
        return np.ascontiguousarray(E[:, :k])
    return None


def _wide_svd(B):
    """The thin SVD ``(Ub, s, Vt)`` of a wide ``B`` (``l x n``, ``l <= n``) through that of ``B.T``.

    ``B.T`` of a C-ordered ``B`` is a Fortran-ordered tall matrix: LAPACK reduces it by a QR over
    contiguous columns, where ``B`` itself takes an LQ over long strided rows (measured, 90 x 100,000:
    0.45 s against 1.32 s, the same singular values to 1e-15).
    """
    # NumPy's LAPACK (gesdd, as SciPy's), not SciPy's: see _orth on the two OpenBLAS libraries.
    W, s, Zt = np.linalg.svd(B.T, full_matrices=False)
    return Zt.T, s, W.T


def _flip_signs(U, Vt):
    """scikit-learn's ``svd_flip(U, Vt)`` (``u_based_decision``), in place, without ``|U|``'s temporary.

    Each column of ``U`` is made positive at its entry of largest magnitude (the first one on a tie,
    as ``argmax`` takes it; a zero column gets sign 0, as there), and ``Vt``'s row with it. The
    column maxima and minima are row-wise reductions over a C-ordered ``U``: for a 200,000 x 50
    ``U`` they took 0.02 s where ``svd_flip`` took 0.37 s.

    Examples
    --------
    >>> U, Vt = np.array([[1.0, -3.0], [-2.0, 1.0]]), np.array([[1.0, 2.0], [3.0, 4.0]])
    >>> U, Vt = _flip_signs(U, Vt)
    >>> U.tolist(), Vt.tolist()
    ([[-1.0, 3.0], [2.0, -1.0]], [[-1.0, -2.0], [-3.0, -4.0]])
    """
    hi, lo = U.max(axis=0), U.min(axis=0)
    signs = np.where(hi > -lo, 1.0, -1.0)
    tie = hi == -lo  # +a and -a both present: the first in row order decides
    if tie.any():
        cols = np.flatnonzero(tie)
        sub = U[:, cols]
        signs[cols] = np.sign(sub[np.argmax(np.abs(sub), axis=0), np.arange(cols.size)])
    U *= signs.astype(U.dtype, copy=False)
    Vt *= signs.astype(Vt.dtype, copy=False)[:, None]
    return U, Vt


def _dask_svd(
    A, rank, sketch, oversample, passes, method, tol, error_probes, flip_sign, seed, dtype, t0, krylov_width
):
    """:func:`svd` of a tall Dask ``A``: ``U`` a Dask array (persisted), ``s`` and ``Vt`` in memory."""
    keep = []  # tol: refused by _find_range (the adaptive range finder is not available for Dask)
    found, _ = _find_range(
        A, dtype, rank, sketch, oversample, passes, method, tol, ADAPTIVE_STEP, False, seed, keep, None,
        krylov_width,
    )  # fmt: skip
    t1 = time.perf_counter()
    B = dask_lowrank.project(A, found.Q, keep)
    Ub, s, Vt = _wide_svd(B)
    k = min(rank, s.size)
    U = (found.Q @ Ub[:, :k].astype(dtype, copy=False)).persist()
    s, Vt = s[:k], Vt[:k]
    if flip_sign:
        U, Vt = dask_lowrank.flip_signs(U, Vt)
        U = U.persist()
    t2 = time.perf_counter()
    est = None
    if error_probes:
        rng = np.random.default_rng(seed_sequence(seed).spawn(3)[2])
        W = rng.standard_normal((A.shape[1], PROBES)).astype(dtype, copy=False)
        est = (
            10
            * math.sqrt(2 / math.pi)
            * dask_lowrank.estimate_error(A, lambda W: U @ (s[:, None] * (Vt @ W)), W)
        )
    t3 = time.perf_counter()
    timings = {"range": t1 - t0, "project": t2 - t1, "estimate": t3 - t2}
    passes_used = found.passes + 1 + (1 if error_probes else 0)
    return SVDResult(U, s.astype(dtype, copy=False), Vt, est, passes_used, timings)


def _array_svd(
    A, rank, sketch, oversample, passes, method, tol, error_probes, flip_sign, seed, dtype, t0, krylov_width
):
    """:func:`svd` of an ``A`` of another library: the steps of the in-memory path with the same
    sketch and probes; ``U``, ``s`` and ``Vt`` returned on ``A``'s device."""
    keep, probes = [], None
    if error_probes:
        probes = _Probes.draw(np.random.default_rng(seed_sequence(seed).spawn(3)[2]), A.shape[1], dtype)
    found, _ = _find_range(  # refuses tol for device input
        A, dtype, rank, sketch, oversample, passes, method, tol, ADAPTIVE_STEP, False, seed, keep, probes,
        krylov_width,
    )  # fmt: skip
    t1 = time.perf_counter()
    Ub, s, Vt = _wide_svd(array_lowrank.project(A, found.Q, keep))
    k = min(rank, s.size)
    U = found.Q @ like(np.ascontiguousarray(Ub[:, :k], dtype=dtype), A)
    s, Vt = s[:k].astype(dtype, copy=False), Vt[:k].astype(dtype, copy=False)
    if flip_sign:
        U, Vt = array_lowrank.flip_signs(U, Vt)
    t2 = time.perf_counter()
    est = None
    if error_probes:
        est = probes.estimate(lambda W, AW: U @ like(s[:, None] * (Vt @ W), A))
    t3 = time.perf_counter()
    timings = {"range": t1 - t0, "project": t2 - t1, "estimate": t3 - t2}
    return SVDResult(U, like(s, A), like(np.ascontiguousarray(Vt), A), est, found.passes + 1, timings)


def eigh(A, rank, *, sketch="sparse_sign", oversample=10, passes=3, error_probes=True, seed=None):
    """Randomized eigendecomposition of a symmetric ``A``: the ``rank`` eigenpairs of largest magnitude.

    ``Q`` from :func:`range_finder`, then the eigendecomposition of ``Q.T A Q`` (HMT 5.3, the
    direct method; one more pass).

    Parameters
    ----------
    A : ndarray, sparse matrix or LinearOperator of shape (n, n), symmetric
        Symmetry is checked for dense and sparse input (``||A - A.T||_F <= 1e-10 ||A||_F``), and
        for a LinearOperator through its projection ``Q.T A Q`` (:func:`check_projected_symmetric`).
    rank : int
    sketch, oversample, passes, seed
        As for :func:`range_finder`.
    error_probes : bool, default True

    Returns
    -------
    EighResult

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> V = np.linalg.qr(rng.standard_normal((200, 5)))[0]
    >>> A = V @ np.diag([9.0, -7.0, 5.0, 3.0, 1.0]) @ V.T
    >>> np.round(eigh(A, 3, seed=0).eigenvalues, 10).tolist()
    [9.0, -7.0, 5.0]
    """
    A, dtype = _check_matrix(A)
    m, n = A.shape
    if m != n:
        raise ValueError(f"A must be square for eigh, got shape {A.shape}")
    check_symmetric(A)
    rank = _check_rank(rank, m, n)
    error_probes = check_bool(error_probes, "error_probes")
    if isinstance(A, LinearOperator):  # symmetric: A.T products are A's (a matvec alone is enough)
        A = LinearOperator(A.shape, matvec=A.matvec, rmatvec=A.matvec, matmat=A.matmat, rmatmat=A.matmat,
                           dtype=A.dtype)  # fmt: skip
    found, _ = _find_range(
        A, dtype, rank, sketch, oversample, passes, "subspace", None, ADAPTIVE_STEP, False, seed
    )
    Q = found.Q
    T = Q.T @ _matmat(A, Q)
    check_projected_symmetric(T)
    w, Z = scipy.linalg.eigh((T + T.T) / 2, check_finite=False)
    order = np.argsort(-np.abs(w), kind="stable")[: min(rank, w.size)]
    w, V = w[order], Q @ Z[:, order]
    est = None
    if error_probes:
        rng = np.random.default_rng(seed_sequence(seed).spawn(3)[2])
        est = _estimate(A, lambda W, AW: V @ (w[:, None] * (V.T @ W)), rng, dtype)
    return EighResult(w, V, est, found.passes + 1 + (1 if error_probes else 0))


# ------------------------------------------------------------------------------------------ Nyström
#: Rows of a dense ``A`` per block of :func:`check_symmetric`'s sums (8 MB at ``n = 10,000``): the
#: check allocates no ``n x n`` ``A - A.T``.
SYMMETRY_BLOCK_BYTES = 8 << 20


def check_symmetric(A, name="A"):
    """``ValueError`` unless ``||A - A.T||_F <= max(1e-10, 100 u) ||A||_F`` for a dense or sparse
    square ``A`` (a LinearOperator is checked later, through its projection:
    :func:`check_projected_symmetric`): the methods for symmetric matrices read only products
    ``A V`` and would return a wrong answer for any other. The bound leaves room for a product's
    rounding (a float32 ``X.T @ X`` from GEMM is symmetric to ``O(u)``, not exactly)."""
    if isinstance(A, LinearOperator):
        return
    if sp.issparse(A):  # frobenius_norm sums duplicates in a copy (SciPy's norm did it in A itself)
        asym, size = frobenius_norm(A - A.T), frobenius_norm(A)
    else:
        n = A.shape[0]
        rows = max(1, SYMMETRY_BLOCK_BYTES // max(1, n * A.itemsize))
        asym = size = 0.0
        for a in range(0, n, rows):  # BLAS nrm2 (scaled, no overflow) per block, combined by hypot
            block = A[a : a + rows]
            asym = math.hypot(asym, frobenius_norm(block - A[:, a : a + rows].T))
            size = math.hypot(size, frobenius_norm(block))
    if asym > max(1e-10, 100 * np.finfo(A.dtype).eps) * size:
        raise ValueError(
            f"{name} must be symmetric: ||{name} - {name}.T||_F / ||{name}||_F = {asym / size:.3g}"
        )


#: A LinearOperator's projection ``V.T A V`` farther than this from symmetric (relative, Frobenius) is
#: refused (:func:`check_projected_symmetric`).
PROJECTED_ASYMMETRY = 1e-2


def check_projected_symmetric(T, name="A"):
    """``ValueError`` unless the projection ``T = V.T A V`` (``V`` orthonormal) of a LinearOperator
    is symmetric to :data:`PROJECTED_ASYMMETRY`: ``||T - T.T||_F <= 1e-2 ||T||_F``.

    The check of an operator, which :func:`check_symmetric` cannot read: ``eigh`` and ``nystrom``
    form ``T`` anyway and used to symmetrise it unseen, so an upper-triangular operator of ones
    (every eigenvalue 1) gave eigenvalues ``[96.1, 0.5, 0.5]`` with no error (its ``T`` was 1.10 away
    from symmetric). An operator is symmetric only to its own accuracy: a shift-invert matvec by CG
    at ``rtol=1e-6`` gave ``1.5e-7``, a float64 operator computing in float32 ``3.7e-7``; such an
    operator is taken as its symmetric part, which is within its error of it.

    Examples
    --------
    >>> import numpy as np
    >>> check_projected_symmetric(np.array([[2.0, 1.0], [1.0 + 1e-6, 3.0]]))
    >>> check_projected_symmetric(np.array([[2.0, 1.0], [0.0, 3.0]]))
    Traceback (most recent call last):
    ...
    ValueError: A must be symmetric: ... ||T - T.T||_F / ||T||_F = 0.378 (at most 0.01 is taken ...
    """
    asym, size = frobenius_norm(T - T.T), frobenius_norm(T)
    if asym > PROJECTED_ASYMMETRY * size:
        raise ValueError(
            f"{name} must be symmetric: its projection V.T {name} V onto the sketch's basis has "
            f"||T - T.T||_F / ||T||_F = {asym / size:.3g} (at most {PROJECTED_ASYMMETRY:g} is taken as an "
            "operator's own inexactness); check its matvec, or use svd for a non-symmetric matrix"
        )


#: A negative eigenvalue of ``Omega.T A Omega`` (relative to ``Omega.T Omega``) is rounding, not
#: indefiniteness, down to ``-PSD_ROUNDING n u`` times the largest: the products' rounding is of order
#: ``n u ||A||``, and Tropp et al.'s shift ``sqrt(n) u ||Y||`` can fall short of it (a float32 rank-one
#: ``X.T X`` of 40 columns had ``-5e-7`` of the largest, 4 ``u``, and was refused as indefinite).
PSD_ROUNDING = 10.0


def _precision_name(eps) -> str:
    """The float dtype whose rounding unit is ``eps`` (the products' precision, which the rounds of
    ``nystrom_pcg`` may carry in a wider dtype)."""
    names = (t.__name__ for t in (np.float16, np.float32, np.float64) if np.finfo(t).eps == eps)
    return next(names, f"u = {eps:.2g}")


def _psd_core(cross, omega_gram, nu, n, caller, exponent=0, eps=None):
    """``(C, nu)``: the upper Cholesky factor ``C`` of ``cross + nu omega_gram`` (``cross = Omega.T A
    Omega``, symmetric; ``omega_gram = Omega.T Omega``), the stable Nyström method's core, and the
    shift used. Where the Cholesky fails on eigenvalues within rounding of zero (see
    :data:`PSD_ROUNDING`), the shift grows past them (any shift is exact in exact arithmetic; it only
    hides eigenvalues below it, rounding here); where one is below that, ``A`` is not PSD: a
    ``ValueError`` with the eigenvalue (in ``A``'s units where ``cross`` is of ``A / 2**exponent``).
    ``eps``: the rounding unit of the products in ``cross`` (default: ``cross``'s dtype's)."""
    for _ in range(2):
        try:
            return scipy.linalg.cholesky(cross + nu * omega_gram, lower=False, check_finite=False), nu
        except np.linalg.LinAlgError:
            w = scipy.linalg.eigvalsh(cross, omega_gram, check_finite=False)
        eps = np.finfo(cross.dtype).eps if eps is None else eps
        if not w[0] >= -PSD_ROUNDING * n * eps * max(w[-1], 0.0):
            break
        nu = max(2 * nu, nu + 2 * abs(w[0]) + n * eps * max(w[-1], 0.0))
    low, high = math.ldexp(w[0], exponent), math.ldexp(w[-1], exponent)
    raise ValueError(
        f"A is not positive semi-definite: Omega.T A Omega has the eigenvalue {low:.3g} relative to "
        f"Omega.T Omega (largest {high:.3g}), beyond {_precision_name(eps)} rounding "
        f"({PSD_ROUNDING:g} n u of the largest); {caller} needs a PSD matrix"
        + (" (use eigh for an indefinite one)" if caller == "nystrom" else "")
        + ". A sketch sees A's spectrum in its range only, so another seed may miss such an eigenvalue; "
        "a PSD matrix rounded in lower precision (a float32 kernel) is PSD to that precision: pass it "
        "in it, or add a shift"
    )


def nystrom(A, rank, *, sketch="gaussian", oversample=10, seed=None):
    """Randomized Nyström approximation of a positive semi-definite ``A`` (numerically stable form).

    Tropp, Yurtsever, Udell & Cevher (2017), Algorithm 3: ``Y = A Omega`` for an orthonormalised
    test matrix ``Omega`` (``n x l``, from ``sketch``), a shift ``nu = sqrt(n) eps(||Y||)`` added
    (``Y_nu = Y + nu Omega``), ``C = chol(Omega.T Y_nu)``, the SVD of ``B = Y_nu C^-1`` gives
    ``U`` and ``Sigma``, and ``Lambda = max(0, Sigma^2 - nu)``. One pass over ``A``.

    Parameters
    ----------
    A : ndarray, sparse matrix or LinearOperator of shape (n, n), symmetric positive semi-definite
        Symmetry checked as for :func:`eigh` (an operator through ``Omega.T A Omega``).
    rank : int
        ``l = rank + oversample`` columns are kept (the approximation has rank at most ``l``).
    sketch : str or SketchOperator, default "gaussian"
    oversample : int, default 10
    seed : None, int, SeedSequence, Generator or RandomState

    Returns
    -------
    NystromResult

    Raises
    ------
    ValueError
        ``A`` is not positive semi-definite: ``Omega.T A Omega`` has a negative eigenvalue beyond
        rounding (the message gives it).

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> G = rng.standard_normal((300, 6)); A = G @ G.T  # PSD, rank 6
    >>> res = nystrom(A, 6, oversample=2, seed=0)
    >>> bool(np.linalg.norm(A - res.matvec(np.eye(300))) < 1e-9 * np.linalg.norm(A))
    True
    """
    A, dtype = _check_matrix(A)
    m, n = A.shape
    if m != n:
        raise ValueError(f"A must be square for nystrom, got shape {A.shape}")
    check_symmetric(A)
    rank = _check_rank(rank, m, n)
    oversample = check_int(oversample, "oversample", minimum=0)
    check_seed(seed)
    width = min(rank + oversample, n)
    # the dense test block, Omega, Y and B (then U): checked here, where the error names the choices
    # the caller made (the sketch's own check named "columns 0:n of a GaussianSketch")
    check_allocation(
        5 * n * width * np.dtype(dtype).itemsize,
        f"nystrom's {n:,} x {width:,} blocks (the test matrix, its product with A and the factors)",
        "use a smaller rank (or oversample)",
    )
    S = _draw(sketch, n, width, seed_sequence(seed).spawn(1)[0], dtype)
    Omega = _orth(np.array(S.to_dense().T, dtype=dtype))
    Y = _matmat(A, Omega)
    if not np.isfinite(Y).all():
        raise _overflow()
    if not Y.any():  # A Omega = 0: the approximation is zero (for a PSD A, A = 0 on range(Omega))
        return NystromResult(Omega, np.zeros(width, dtype), 0.0)
    # The method is homogeneous in A: Y of the scaled 2^-e A (exact), with |Y| up to one, keeps the
    # core's products in range whatever A's scale (entries near 1e308 overflowed in Omega.T Y).
    e = unit_exponent(float(max_abs(Y)))  # 0 for a non-finite Y: refused where its squares are summed
    Y = np.ldexp(Y, -e)
    eps = np.finfo(dtype).eps
    nu = math.sqrt(n) * eps * float(np.linalg.norm(Y, 2))
    cross = Omega.T @ Y
    check_projected_symmetric(cross)
    cross = (cross + cross.T) / 2
    C, nu = _psd_core(cross, np.eye(width, dtype=dtype), nu, n, "nystrom", e)  # an error in A's units
    Y_nu = Y + nu * Omega
    B = scipy.linalg.solve_triangular(C, Y_nu.T, trans="T", lower=False, check_finite=False).T
    U, sigma, _ = scipy.linalg.svd(B, full_matrices=False, check_finite=False)
    lam = np.maximum(sigma**2 - nu, 0.0)
    with np.errstate(over="ignore"):
        scaled = np.ldexp(lam, e).astype(dtype, copy=False)
    if not np.isfinite(scaled).all():
        raise ValueError(
            f"A's largest eigenvalue, about {lam.max():.3g} * 2^{e}, exceeds the {dtype.name} range: scale A"
        )
    return NystromResult(U, scaled, math.ldexp(nu, e))
