"""Column-pivoted QR of tall matrices by CQRRPT, and the interpolative decomposition built on it.

CQRRPT (Melnichenko, Balabanov, Murray, Demmel, Mahoney & Luszczek, 2023/2025): the pivots and the
numerical rank come from LAPACK's QRCP of a small sketch ``S A`` (``d x n``, ``d ~ 2 n``); the
sketch's triangle preconditions ``A``, and one Cholesky QR of the well-conditioned
``A_k R_sk^-1`` finishes the factorization. Three BLAS-3 passes over ``A`` (sketch, Gram,
triangular solves) against LAPACK ``geqp3``'s BLAS-2 column pivoting over all of ``A``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg
import scipy.linalg.blas
import scipy.sparse as sp
from scipy.sparse.linalg import LinearOperator

import rsketch.linalg._lowrank_array as array_lowrank
from rsketch._backend import is_non_numpy_array
from rsketch._exact_scaling import scale_design
from rsketch._validation import check_finite, check_int, check_operand, check_real, check_seed
from rsketch.dask import _lowrank as dask_lowrank
from rsketch.dask._sketch import is_dask_array
from rsketch.linalg._common import column_norms
from rsketch.linalg._lowrank import check_test_matrix_kind
from rsketch.operators import SketchOperator, make_sketch


@dataclass(frozen=True)
class QRPivotedResult:
    """``A[:, perm] ~ Q @ R`` with ``Q`` orthonormal and ``R`` upper trapezoidal.

    Attributes
    ----------
    Q : ndarray of shape (m, rank)
    R : ndarray of shape (rank, n)
    perm : ndarray of shape (n,)
        Column permutation (``A[:, perm]``), as ``scipy.linalg.qr(..., pivoting=True)`` returns it.
    rank : int
        The numerical rank detected on the sketch (columns whose pivot in ``S A`` exceeds
        ``tol`` times the first), or on ``A`` itself where ``qr_pivoted`` factors it directly.

    Examples
    --------
    >>> import numpy as np
    >>> A = np.random.default_rng(0).standard_normal((500, 4))
    >>> res = qr_pivoted(A, seed=0)
    >>> bool(np.allclose(A[:, res.perm], res.Q @ res.R)), res.rank
    (True, 4)
    """

    Q: np.ndarray
    R: np.ndarray
    perm: np.ndarray
    rank: int


@dataclass(frozen=True)
class InterpolativeResult:
    """Column interpolative decomposition ``A[:, idx[rank:]] ~ A[:, idx[:rank]] @ proj``.

    The convention of :func:`scipy.linalg.interpolative.interp_decomp`; :meth:`skeleton` and
    :meth:`interpolation_matrix` give ``A ~ skeleton @ interpolation_matrix``.

    Attributes
    ----------
    idx : ndarray of shape (n,), int64
    proj : ndarray of shape (rank, n - rank)
    rank : int

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> A = rng.standard_normal((400, 3)) @ rng.standard_normal((3, 6))
    >>> res = interpolative(A, 3, seed=0)
    >>> bool(np.allclose(res.skeleton(A) @ res.interpolation_matrix(), A))
    True
    """

    idx: np.ndarray
    proj: np.ndarray
    rank: int

    def skeleton(self, A):
        """The chosen columns ``A[:, idx[:rank]]``."""
        return A[:, self.idx[: self.rank]]

    def interpolation_matrix(self):
        """``P`` of shape ``(rank, n)`` with ``A ~ skeleton(A) @ P``."""
        P = np.hstack([np.eye(self.rank, dtype=self.proj.dtype), self.proj])
        return P[:, np.argsort(self.idx)]


# Both triangular solves, A_k R_sk^-1 and A_pre R_pre^-1, go through an explicit inverse of the
# triangle where its row-equilibrated form R_hat = diag(R)^-1 R has a condition number at most this.
# X = R_hat^-1 is computed as the transpose of R_hat.T's solves on the identity, each column
# backward stable (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., chapter 8), so
# |X R_hat - I| <= c_n u |X| |R_hat|, and A_k X diag(R)^-1 R = A_k + E with ||E|| = O(u cond(R_hat)
# ||A_k||): the row scaling drops out. QRCP grades R_sk's rows: on the benchmark's A cond(R_sk) is
# 1e6 while cond(R_hat) is 1.5; rotated spectra (cond(R_hat) 50-100, measured) keep trsm.
INVERSE_MAX_COND = 10.0


def _solve_right_upper(R, Qt):
    """``Qt <- R^-T Qt`` in place (that is ``A <- A R^-1`` for ``A = Qt.T``), ``R`` upper triangular.

    trmm with the inverse took half trsm's time on a 100 x 1,000,000 ``Qt`` (0.20 s against
    0.37 s), so it is used where :data:`INVERSE_MAX_COND` allows.
    """
    trsm, trmm = scipy.linalg.blas.get_blas_funcs(("trsm", "trmm"), (Qt,))
    scale = np.diag(R).copy()
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        R_hat = R / scale[:, None]
    if not np.isfinite(R_hat).all() or np.linalg.cond(R_hat) > INVERSE_MAX_COND:  # (subnormal R: inf)
        return trsm(1.0, np.asfortranarray(R), Qt, side=0, lower=0, trans_a=1, overwrite_b=1)
    eye = np.eye(R.shape[0], dtype=R.dtype)
    R_hat_inv = scipy.linalg.solve_triangular(R_hat, eye, trans="T", check_finite=False).T
    with np.errstate(over="ignore"):  # a subnormal diagonal: inf, and the caller falls back to geqp3
        R_inv = R_hat_inv / scale[None, :]  # R^-1 = R_hat^-1 diag(R)^-1
    return trmm(1.0, np.asfortranarray(R_inv), Qt, side=0, lower=0, trans_a=1, overwrite_b=1)


def _check_tall(A, caller="CQRRPT", wide_hint="use scipy.linalg.qr"):
    if is_dask_array(A):
        A, _ = dask_lowrank.check_tall_dask(A)
        if A.shape[0] < A.shape[1]:
            raise ValueError(f"A must be tall (m >= n) for CQRRPT, got shape {A.shape}")
        return A
    if is_non_numpy_array(A):
        array_lowrank.refuse(A)
    if sp.issparse(A) or isinstance(A, LinearOperator):
        raise TypeError(
            f"A must be a dense array for {caller} (it forms Q, an m x rank dense array), got "
            f"{type(A).__name__}; for a sparse matrix or an operator, use svd or range_finder"
        )
    # float32 kept, integers to float64; NaN/inf are found from the sketch and the Gram (both see
    # every entry of A that reaches Q), which saves a full pass over A
    A, is_vector = check_operand(A, None, "A", check_finite_values=False)
    if is_vector:
        raise ValueError(f"A must be 2-D, got a vector of shape {A.shape[:1]}")
    m, n = A.shape
    if m < n:
        raise ValueError(f"A must be tall (m >= n) for {caller}, got shape {A.shape}; {wide_hint}")
    return A


def _sketch_rows(A, sketch, sketch_size):
    """The sketch's row count ``d``, validated: ``sketch_size``, else the operator's, else ``min(m, 2 n)``."""
    m, n = A.shape
    if isinstance(sketch, SketchOperator) and sketch_size is None:
        if sketch.shape[0] < n:  # its rows, not a sketch_size the caller never gave
            raise ValueError(
                f"sketch must have at least n = {n} rows (S A must keep A's rank), got {sketch.shape}"
            )
        sketch_size = sketch.shape[0]
    d = sketch_size if sketch_size is not None else min(m, 2 * n)
    d = check_int(d, "sketch_size", minimum=n)
    if isinstance(sketch, SketchOperator) and sketch.shape != (d, m):
        raise ValueError(f"sketch must have shape {(d, m)}, got {sketch.shape}")
    return d


def _sketch(A, sketch, d, seed):
    m, n = A.shape
    if isinstance(sketch, SketchOperator):
        if sketch.kind in ("uniform", "leverage") and not is_dask_array(A):
            check_finite(A, "A")  # a sampling sketch reads some rows only: it cannot vouch for the rest
        SA = sketch @ A
    else:
        SA = make_sketch(sketch, m, d, seed=seed, dtype=A.dtype) @ A
    return np.asarray(SA.compute()) if is_dask_array(SA) else SA


#: A column that the sketch's rank leaves out must lie within this many times the rank tolerance
#: (``tol`` times the first pivot) of the basis ``Q`` (:func:`_rest_in_range`). A sketch that embeds
#: ``range(A)`` with distortion ``eps`` maps a residual ``r`` to ``||S r|| >= (1 - eps) ||r||``, and
#: QRCP bounds ``||S r||`` by the next pivot: 10 leaves room for ``eps`` up to 0.9.
RANK_CHECK_FACTOR = 10.0


def _rank_of(R, tol):
    """Pivots of an upper-triangular ``R`` above ``tol`` times the first (0 for a zero ``R``)."""
    diag = np.abs(np.diag(R))
    return int(np.count_nonzero(diag > tol * diag[0])) if diag.size and diag[0] > 0 else 0


def _householder(A, tol):
    """LAPACK's QRCP (``geqp3``) of ``A`` itself, truncated at its numerical rank: where a sketch
    could not be smaller than ``A``, and where the sketch failed to reveal ``A``'s rank."""
    check_finite(A, "A")
    Q, R, perm = scipy.linalg.qr(A, mode="economic", pivoting=True, check_finite=False)
    if not np.isfinite(R).all():
        raise ValueError(f"A's column norms exceed the {A.dtype} range (R is not finite): scale A")
    tol = max(A.shape) * np.finfo(A.dtype).eps if tol is None else tol
    rank = _rank_of(R, tol)
    return QRPivotedResult(np.ascontiguousarray(Q[:, :rank]), R[:rank], perm, rank)


def _rest_in_range(A, Q, perm, rank, bound):
    """Whether every column of ``A`` the rank left out, ``A[:, perm[rank:]]``, lies within ``bound``
    of ``range(Q)``: the check that the sketch saw all of ``range(A)``. A sketch that maps part of it
    to nothing (a square sparse sign of ``+-1`` entries can be singular; a CountSketch folds rows
    together) reports a lower rank, and ``R`` would then misrepresent those columns. ``O(m n (n -
    rank))``, run only when the rank is below ``n``."""
    rest = np.take(A, perm[rank:], axis=1)
    if rank:
        rest -= Q @ (Q.T @ rest)
    # Scaled where the squares leave the range: at 2**-600 they underflowed to 0, a column outside
    # range(Q) passed, and A P - Q R was 7.9e-3 of A (the same A at scale 1 fails, as it must).
    norms = column_norms(rest)
    return bool(np.all(norms <= bound))  # False for NaN


def qr_pivoted(A, *, tol=None, sketch="sparse_sign", sketch_size=None, seed=None):
    """Column-pivoted QR of a tall ``A`` by CQRRPT: ``A[:, perm] = Q R``, rank-revealing.

    Parameters
    ----------
    A : array_like of shape (m, n), m >= n
        Dense, float32 or float64 (kept).
    tol : float, optional
        Relative rank tolerance on the sketch's pivots: column ``j`` of the pivoted order counts
        while ``|R_sk[j, j]| > tol |R_sk[0, 0]|``. Default ``max(m, n) eps``, the rule of
        ``numpy.linalg.matrix_rank`` for ``A`` (and of the ``geqp3`` path): the problem's, not the
        sketch's, so the rank does not depend on ``sketch_size``.
    sketch : str or SketchOperator, default "sparse_sign"
        The sketch ``S`` (``d x m``); any kind of :func:`rsketch.make_sketch` but ``"leverage"``
        (its scores would come from ``A``: give a leverage-sampling operator instead).
    sketch_size : int, optional
        ``d >= n``; default ``min(m, 2 n)``.
    seed : None, int, SeedSequence, Generator or RandomState

    Returns
    -------
    QRPivotedResult

    Notes
    -----
    1. ``S A = Q_sk R_sk P.T`` by LAPACK's ``geqp3`` (``d x n``: small). The rank ``k`` counts the
       pivots above ``tol``.
    2. ``A_pre = A[:, perm[:k]] R_sk[:k, :k]^-1``: with ``S`` a subspace embedding of
       ``range(A)`` the singular values of ``A_pre`` lie within ``1 +- eps_S`` of one, so:
    3. Cholesky QR of it in one round: ``A_pre.T A_pre = R_pre.T R_pre``, ``Q = A_pre R_pre^-1``,
       orthonormal to ``O(u)`` (the Gram's condition number is ``O(1)``), and
       ``R = R_pre R_sk[:k, :]``.

    The pivots are those of QRCP on the sketch, which Melnichenko et al. show rank-revealing for
    ``A`` within the embedding's distortion, and ``R`` equals Householder QR's ``R`` of
    ``A[:, perm]`` up to the signs of its rows and rounding. ``Q`` costs one ``m x k`` array.

    Where no sketch is smaller than ``A`` (``d >= m``, the default for ``m < 2 n``; a sketch given
    as a kind), ``A`` itself is factored by ``geqp3``. A rank ``k < n`` is checked: the columns it
    leaves out must lie within ``10 tol |R_sk[0, 0]|`` of ``range(Q)``; where they do not (the
    sketch missed part of ``range(A)``), or where the Cholesky QR fails, ``A`` is factored by
    ``geqp3`` (for Dask input: a ``ValueError``). See docs/lowrank.md.

    Raises
    ------
    ValueError
        ``m < n``, NaN/inf, ``sketch_size < n``; for Dask input, a sketch that did not reveal the
        rank or precondition ``A``.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> A = rng.standard_normal((2000, 3)) @ rng.standard_normal((3, 8))  # rank 3
    >>> res = qr_pivoted(A, seed=0)
    >>> res.rank, res.Q.shape, res.R.shape
    (3, (2000, 3), (3, 8))
    >>> bool(np.linalg.norm(A[:, res.perm] - res.Q @ res.R) < 1e-13 * np.linalg.norm(A))
    True
    """
    A = _check_tall(A)
    m, n = A.shape
    check_seed(seed)
    if tol is not None:
        tol = check_real(tol, "tol")
        if not 0 <= tol < 1:
            raise ValueError(f"tol must lie in [0, 1), got {tol}")
    if not isinstance(sketch, SketchOperator):
        check_test_matrix_kind(sketch)  # leverage scores would come from A itself: pass an operator
    d = _sketch_rows(A, sketch, sketch_size)
    if d >= m and not isinstance(sketch, SketchOperator):  # no sketch is smaller than A itself
        return _householder_of(A, tol)
    SA = _sketch(A, sketch, d, seed)
    R_sk = None
    if np.isfinite(SA).all():
        _, R_sk, perm = scipy.linalg.qr(SA, mode="economic", pivoting=True, check_finite=False)
    # A finite A whose sketch, or the sketch's triangle, overflows (entries near 1e308). A finite sketch
    # of entries up to 1.4e308 (the operators rescale a product that overflowed) had pivots of inf,
    # which made the rank 0 and its check's bound inf: Q R = 0 was returned for a nonzero A.
    if R_sk is None or not np.isfinite(R_sk).all():
        if is_dask_array(A):
            dask_lowrank.refuse_nonfinite(A)
        return _householder(A, tol)  # NaN/inf refused there; LAPACK scales huge entries safely
    eps = np.finfo(A.dtype).eps
    # max(m, n) eps, as the geqp3 path and NumPy's matrix_rank: the rank is A's. With max(d, n) eps
    # (d the sketch's rows) singular values 1e-14 of a 2000 x 30 A counted at d = 60 and not at d = 200.
    rank_tol = max(m, n) * eps if tol is None else tol
    rank = _rank_of(R_sk, rank_tol)
    bound = RANK_CHECK_FACTOR * max(rank_tol, max(d, n) * eps) * abs(R_sk[0, 0])
    if is_dask_array(A):  # two more passes over the chunks: the Gram, then Q (lazy)
        return _dask_cqrrpt(A, SA, R_sk, perm, rank, bound)
    if rank == 0:
        Q = np.zeros((m, 0), A.dtype)
        if not _rest_in_range(A, Q, perm, 0, bound):
            return _householder(A, tol)
        return QRPivotedResult(Q, np.zeros((0, n), A.dtype), perm, 0)
    # A[:, perm[:k]] is copied once (it becomes Q); its transpose is Fortran-ordered, so the
    # triangular solves run in place as R^-T (A_k).T. np.take, not fancy indexing: for a C-ordered
    # 1,000,000 x 100 A, A[:, perm] took 2.6 s against np.take's 0.15 s.
    Qt = np.take(A, perm[:rank], axis=1).T
    Qt = _solve_right_upper(R_sk[:rank, :rank], Qt)
    # gemm, not syrk: OpenBLAS's syrk took 0.36 s for this 100 x 100 Gram of 1,000,000 rows, its gemm
    # 0.29 s for twice the multiply-adds; the Cholesky reads the upper triangle only
    (gemm,) = scipy.linalg.blas.get_blas_funcs(("gemm",), (Qt,))
    G = gemm(1.0, Qt, Qt, trans_b=1)
    if not np.isfinite(G).all():  # NaN/inf in a column of A[:, perm[:k]] reaches G
        check_finite(A, "A")
        return _householder(A, tol)  # a finite A whose products are not: subnormal or huge entries
    try:
        R_pre = scipy.linalg.cholesky(G, lower=False, check_finite=False)
    except np.linalg.LinAlgError:  # the sketch did not embed range(A): no preconditioner
        return _householder(A, tol)
    Qt = _solve_right_upper(R_pre, Qt)
    if rank < n and not _rest_in_range(A, Qt.T, perm, rank, bound):
        return _householder(A, tol)
    return QRPivotedResult(Qt.T, R_pre @ R_sk[:rank, :], perm, rank)


def _householder_of(A, tol):
    """:func:`_householder` for a NumPy or (small, as the caller checks) Dask ``A``; a Dask ``A``
    gets its ``Q`` back as a Dask array chunked as its rows."""
    if not is_dask_array(A):
        return _householder(A, tol)
    import dask.array as da

    res = _householder(np.asarray(A.compute()), tol)
    return QRPivotedResult(da.from_array(res.Q, chunks=(A.chunks[0], -1)), res.R, res.perm, res.rank)


def _dask_cqrrpt(A, SA, R_sk, perm, rank, bound):
    """The passes after the sketch for a Dask ``A``: the Gram and ``Q`` (lazy), then, where the
    rank is below ``n``, the check of :func:`_rest_in_range` (two more passes). A sketch that failed
    is an error here: ``A`` may not fit in memory for LAPACK's QRCP."""
    m, n = A.shape
    if rank == 0:  # Q a Dask array of no column, as for any other rank (it was NumPy's)
        import dask.array as da

        Q, R = da.zeros((m, 0), dtype=A.dtype, chunks=(A.chunks[0], 0)), np.zeros((0, n), A.dtype)
    else:
        Q, R_pre = dask_lowrank.cqrrpt(A[:, perm[:rank]], SA, rank, R_sk)
        # In A's precision, as in memory (a float32 R_pre times R_sk; R was float64 for float32 A): the
        # R_pre that Q = A_pre R_pre^-1 was formed with, so Q R is A P to that rounding.
        R = R_pre.astype(A.dtype, copy=False) @ R_sk[:rank, :]
    if rank < n and not dask_lowrank.rest_in_range(A, None if rank == 0 else Q, perm[rank:], bound):
        raise ValueError(
            f"the sketch did not reveal A's rank: it found {rank} of {n} columns, and the others do not "
            "lie in their span; use a larger sketch_size or a Gaussian sketch"
        )
    return QRPivotedResult(Q, R, perm, rank)


def interpolative(A, rank, *, sketch="sparse_sign", sketch_size=None, seed=None):
    """Column interpolative decomposition of rank ``rank`` from CQRRPT.

    The skeleton is the first ``rank`` pivots of :func:`qr_pivoted`; the interpolation
    coefficients are ``R11^-1 R12`` from its ``R`` (the least-squares fit of the other columns on
    the skeleton), as Voronin & Martinsson's ID from a pivoted QR.

    Parameters
    ----------
    A : array_like of shape (m, n), m >= n
    rank : int
        ``1 <= rank <= n``; at most the numerical rank CQRRPT detects.
    sketch, sketch_size, seed
        As for :func:`qr_pivoted`.

    Returns
    -------
    InterpolativeResult

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> A = rng.standard_normal((1000, 20)) * np.exp(-np.arange(20))
    >>> res = interpolative(A, 10, seed=0)
    >>> err = np.linalg.norm(A - res.skeleton(A) @ res.interpolation_matrix(), 2)
    >>> bool(err < 1e-3 * np.linalg.norm(A, 2))
    True
    """
    A = _check_tall(A, "interpolative", "for a wide A use scipy.linalg.interpolative.interp_decomp")
    rank = check_int(rank, "rank", minimum=1, maximum=A.shape[1])
    res = qr_pivoted(A, sketch=sketch, sketch_size=sketch_size, seed=seed)
    if rank > res.rank:
        raise ValueError(
            f"rank={rank} exceeds the numerical rank {res.rank} that qr_pivoted detected; the columns "
            "beyond it are numerically dependent"
        )
    # R11^-1 R12 is scale-free: an R out of the safe range scaled first by a power of two (exact), as
    # a subnormal R11's back substitution overflowed through 1 / diag and gave NaN
    R, _ = scale_design(res.R)
    proj = scipy.linalg.solve_triangular(R[:rank, :rank], R[:rank, rank:], lower=False, check_finite=False)
    # int64 as interp_decomp's: SciPy's id_to_svd refuses LAPACK's int32 pivots (a buffer dtype mismatch)
    return InterpolativeResult(res.perm.astype(np.int64), proj, rank)
