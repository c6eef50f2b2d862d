"""Conjugate gradients for ``(A + mu I) x = b`` with the randomized Nyström preconditioner.

Frangella, Tropp & Udell (2023): from a rank-``l`` Nyström approximation
``A_nys = U diag(lambda) U.T`` (:func:`rsketch.linalg.nystrom`),

    P^-1 = (lambda_l + mu) U (diag(lambda) + mu I)^-1 U.T + (I - U U.T),

which costs ``O(n l)`` per application. Their Theorem 5.1: when ``l >= 2 ceil(1.5 d_eff(mu)) + 1``,
with ``d_eff(mu) = tr(A (A + mu I)^-1)`` the effective dimension, the preconditioned matrix has
``E[kappa] < 28``, so PCG reaches a relative error ``eps`` in ``O(log(1/eps))`` iterations whatever
the conditioning of ``A + mu I``. The rank is chosen adaptively (their section 5.4): the sketch
doubles, keeping its columns, until ``lambda_l <= target_ratio * mu``, the sign that ``l`` has
passed ``d_eff(mu)``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import scipy.linalg
import scipy.sparse as sp
from scipy.sparse.linalg import LinearOperator

import rsketch.linalg._results as _results
from rsketch._backend import is_non_numpy_array
from rsketch._exact_scaling import max_abs, shift_down, unit_exponent, unit_exponents
from rsketch._validation import (
    check_allocation,
    check_int,
    check_operand,
    check_real,
    check_seed,
    seed_sequence,
)
from rsketch.linalg._gram import GramOperator, sketch_matrix
from rsketch.linalg._lowrank import (
    NystromResult,
    _check_matrix,
    _cholqr_limit,
    _overflow,
    _psd_core,
    check_symmetric,
    check_test_matrix_kind,
    nystrom,
)
from rsketch.linalg._scaling import unscale
from rsketch.operators import SketchOperator, make_sketch


@dataclass(frozen=True)
class NystromPCGResult:
    """The solution of ``(A + mu I) x = b`` by Nyström-preconditioned CG.

    Attributes
    ----------
    x : ndarray of shape (n,) or (n, k)
    iterations : int
        CG iterations (the most over the columns of ``b``).
    residual_norms : ndarray of shape (k,)
        ``||b - (A + mu I) x|| / ||b||`` per column, computed from ``x`` (one product; CG's
        recurrence, which stops the iterations, drifts from it in low precision).
    converged : bool
        Every residual is at most ``tol``, or at most the rounding floor below which it cannot be
        computed, ``10 u (||A + mu I|| ||x|| + ||b||) / ||b||`` (``||A||`` from the Nyström
        approximation's largest eigenvalue): a float32 solve does not claim ``tol=1e-12``.
    preconditioner : NystromResult
        The Nyström approximation the preconditioner is built from (its rank is ``U.shape[1]``).
        With the adaptive rank, an eigenvalue within rounding of the stabilising shift
        (``sigma^2 <= 2 nu``) is zero and its column of ``U`` is zero: it has no direction to give,
        and the preconditioner acts as the identity there, as the formula does for a zero
        eigenvalue.
    matvecs : int
        Products of ``A`` with a vector (the Nyström sketch's columns and the final residual's
        included).

    Examples
    --------
    >>> import numpy as np
    >>> A = np.diag(np.logspace(0, -8, 200))
    >>> res = nystrom_pcg(A, np.ones(200), 1e-6, seed=0)
    >>> res.converged, bool(np.allclose(res.x, 1 / (np.diag(A) + 1e-6), rtol=1e-8))
    (True, True)
    """

    x: np.ndarray
    iterations: int
    residual_norms: np.ndarray
    converged: bool
    preconditioner: NystromResult
    matvecs: int


def _check_mu(mu) -> float:
    """``mu`` as a float, finite and > 0 (the regularisation that makes ``A + mu I``, and ``P``,
    definite); errors name it."""
    mu = check_real(mu, "mu")
    if not (math.isfinite(mu) and mu > 0):
        raise ValueError(
            f"mu must be a finite number > 0 (the regularisation makes A + mu I definite), got {mu}"
        )
    return mu


def nystrom_preconditioner(approx: NystromResult, mu: float) -> LinearOperator:
    """``P^-1`` of Frangella, Tropp & Udell (2023) as a symmetric positive definite LinearOperator.

    ``P^-1 v = (lambda_l + mu) U (diag(lambda) + mu I)^-1 U.T v + v - U U.T v``.

    Parameters
    ----------
    approx : NystromResult
    mu : float > 0

    Returns
    -------
    LinearOperator of shape (n, n)

    Examples
    --------
    >>> import numpy as np
    >>> from rsketch.linalg import nystrom
    >>> A = np.diag([100.0, 10.0, 1.0, 0.0])
    >>> P_inv = nystrom_preconditioner(nystrom(A, 3, oversample=0, seed=0), 1.0)
    >>> np.round(P_inv @ (A + np.eye(4)) @ np.ones(4), 10).tolist()  # eigenvalues lambda_l + mu = 2, and 1
    [2.0, 2.0, 2.0, 1.0]
    """
    if not isinstance(approx, NystromResult):
        raise TypeError(f"approx must be a NystromResult (from nystrom), got {type(approx).__name__}")
    mu = _check_mu(mu)  # a string had been taken; 0 gave a singular "preconditioner"
    U, lam = approx.U, approx.eigenvalues
    scale = (lam[-1] + mu) / (lam + mu) - 1.0  # P^-1 = I + U diag(scale) U.T

    def apply(v):
        coef = U.T @ v
        return v + U @ (scale[:, None] * coef if coef.ndim == 2 else scale * coef)

    n = U.shape[0]
    return LinearOperator((n, n), matvec=apply, rmatvec=apply, matmat=apply, rmatmat=apply, dtype=U.dtype)


#: The adaptive sketch's first round where ``initial_rank`` is not given (at most ``max_rank``).
DEFAULT_INITIAL_RANK = 50


def nystrom_pcg(
    A,
    b,
    mu,
    *,
    rank=None,
    initial_rank=None,
    max_rank=1000,
    target_ratio=10.0,
    oversample=10,
    sketch="gaussian",
    tol=1e-12,
    max_iter=None,
    callback=None,
    seed=None,
):
    """Solve ``(A + mu I) x = b`` for a positive semi-definite ``A`` by Nyström-preconditioned CG.

    Parameters
    ----------
    A : ndarray, sparse matrix or LinearOperator of shape (n, n), symmetric positive semi-definite
        Only products ``A @ V`` are used (for ridge regression, ``A = X.T X`` as an operator; a
        :class:`rsketch.linalg.GramOperator` makes each product one pass over ``X``, and with
        ``sketch="sparse_sign"`` the sketch's first product costs ``O(s n p)``, not a GEMM).
    b : ndarray of shape (n,) or (n, k)
    mu : float > 0
    rank : int, optional
        The Nyström rank (``rank + oversample`` columns, :func:`rsketch.linalg.nystrom`). Default:
        adaptive, ``initial_rank`` columns doubling (the old ones kept) until
        ``lambda_l <= target_ratio * mu`` or ``max_rank`` columns.
    initial_rank : int, optional
        Default ``min(50, max_rank)``.
        The adaptive sketch's first round. Each round costs a product with ``A``: where that has a
        cost of its own beyond the columns (a pass over a large ``X``), fewer, larger rounds pay.
    max_rank : int, default 1000
        The adaptive sketch's most columns (at most ``n``); at least ``initial_rank`` where that is
        given.
    target_ratio : float, default 10
        With ``lambda_l <= target_ratio mu`` the preconditioned condition number is about
        ``1 + target_ratio`` plus the approximation error over ``mu`` (Frangella et al., Prop. 5.3).
    oversample : int, default 10
        With ``rank`` only.
    sketch : str, default "gaussian"
        The Nyström test matrix (see :func:`rsketch.linalg.nystrom`); ``"uniform"`` with ``rank``
        only (the adaptive rounds would sample a column twice).
    tol : float, default 1e-12
        Stop when ``||r|| <= tol ||b||`` (per column).
    max_iter : int, optional
        Default ``n``. A ConvergenceWarning is issued when reached.
    callback : callable, optional
        ``callback(x)`` after every iteration (for ``b`` of one column).
    seed : None, int, SeedSequence, Generator or RandomState

    Returns
    -------
    NystromPCGResult

    Raises
    ------
    ValueError
        Where ``x`` is beyond or below the float range of ``A``'s dtype (it is computed scaled, and
        scaled back exactly), or ``mu`` is below that range relative to ``||A||``.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> X = rng.standard_normal((300, 500)) * np.exp(-np.arange(500) / 30)
    >>> A, y = X.T @ X, rng.standard_normal(500)
    >>> res = nystrom_pcg(A, y, 1e-4, seed=0)
    >>> bool(np.allclose(res.x, np.linalg.solve(A + 1e-4 * np.eye(500), y), rtol=1e-8)), res.iterations < 60
    (True, True)
    """
    A, dtype = _check_matrix(A)
    n = A.shape[0]
    if A.shape != (n, n):
        raise ValueError(f"A must be square, got shape {A.shape}")
    check_symmetric(A)
    mu = _check_mu(mu)
    if sp.issparse(b) or is_non_numpy_array(b):
        raise TypeError(f"b must be a dense NumPy array of shape ({n},) or ({n}, k), got {type(b).__name__}")
    # as every operand: complex a TypeError, bool and integers float64, float16 float32, longdouble
    # float64 (it had come back as a float128 x; bool was refused, complex a ValueError)
    b, b_is_vector = check_operand(b, n, "b")
    tol = check_real(tol, "tol")
    if not 0 < tol < 1:
        raise ValueError(f"tol must lie in (0, 1), got {tol}")
    max_iter = n if max_iter is None else check_int(max_iter, "max_iter", minimum=1)
    target_ratio = check_real(target_ratio, "target_ratio")
    if not (target_ratio > 0 and math.isfinite(target_ratio)):
        raise ValueError(f"target_ratio must be a finite number > 0, got {target_ratio}")
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable or None, got {type(callback).__name__}")
    if rank is None and isinstance(sketch, SketchOperator):
        raise TypeError(
            "sketch must be a kind name for the adaptive rank (its rounds draw test blocks of their "
            "own sizes); give rank= to use a SketchOperator"
        )
    if not isinstance(sketch, SketchOperator):
        check_test_matrix_kind(sketch)
    if rank is None and sketch == "uniform":  # each round drew anew: a column twice, every time
        raise ValueError(
            "sketch='uniform' with the adaptive rank samples each round's columns anew, and a column "
            "sampled twice leaves the sketch singular: give rank= (one sample without replacement) or "
            "use sketch='sparse_sign' or 'gaussian'"
        )
    max_rank = check_int(max_rank, "max_rank", minimum=1)
    if initial_rank is None:  # a max_rank below the default first round is no contradiction
        initial_rank = min(DEFAULT_INITIAL_RANK, max_rank)
    initial_rank = check_int(initial_rank, "initial_rank", minimum=1)
    if initial_rank > max_rank:  # both as given (both are cut to n below, which is no contradiction)
        raise ValueError(f"initial_rank ({initial_rank}) must not exceed max_rank ({max_rank})")
    max_rank = min(max_rank, n)
    # checked with the adaptive rank too, which does not use it: an option is valid or not
    oversample = check_int(oversample, "oversample", minimum=0)
    check_seed(seed)
    seeds = seed_sequence(seed)
    matvecs = 0
    if rank is not None:
        rank = check_int(rank, "rank", minimum=1, maximum=n)
        approx = nystrom(A, rank, sketch=sketch, oversample=oversample, seed=seeds.spawn(1)[0])
        matvecs += approx.U.shape[1]
    else:
        approx, used = _adaptive_nystrom(
            A, n, dtype, sketch, seeds, initial_rank, max_rank, target_ratio * mu
        )
        matvecs += used
    # CG runs on (A + mu I) / 2**e, 2**e ~ max(||A||, mu) (||A||: the approximation's largest eigenvalue)
    # and each column of b over a power of two to a largest entry in [1/2, 1); x comes back exactly
    # scaled. Its scalars and norms then neither underflow nor overflow: b of 1e-300 came back as
    # x = 0, "converged"; b of 1e-150, or A of 1e-300, met a division by zero; b of 1e160 gave x = 0.
    top = float(approx.eigenvalues.max(initial=0.0))
    e = unit_exponent(max(top, mu) if top < math.inf else mu)  # ||A + mu I|| ~ 2**e: nothing overflows
    A_e, mu_e = _Scaled(A, e), math.ldexp(mu, -e)
    if mu_e < np.finfo(dtype).tiny:  # CG then met A alone, singular, and returned NaN "converged"
        raise ValueError(
            f"mu = {mu:g} is below the float range relative to ||A|| ~ 2**{e} ({dtype}): A + mu I is "
            "singular to working precision; give a larger mu"
        )
    approx_e = NystromResult(approx.U, np.ldexp(approx.eigenvalues, -e), _ldexp(approx.shift, -e))
    P_inv = nystrom_preconditioner(approx_e, mu_e)
    B = b.astype(np.result_type(dtype, b.dtype), copy=False)
    shift = unit_exponents(max_abs(B, axis=0))
    B = shift_down(B, shift)
    X = np.zeros_like(B)
    its, norms = 0, np.zeros(B.shape[1])
    for j in range(B.shape[1]):
        X[:, j], it, norms[j] = _pcg(A_e, mu_e, B[:, j], P_inv, tol, max_iter, callback, int(shift[j]) - e)
        its, matvecs = max(its, it), matvecs + it
    true, floor = _true_residuals(A_e, mu_e, B, X, approx_e)
    if not np.isfinite(X).all():
        raise FloatingPointError(
            "nystrom_pcg's iterate is not finite (A's products or the preconditioner broke down): "
            "check A, or give a larger mu"
        )
    # exact powers of two; out of the float range a ValueError (an x of 1e310 had come back as inf,
    # one of 1e-601 as 0, both "converged")
    X = unscale(X, e, shift, what="the solution x", fix="rescale A, b or mu")
    matvecs += B.shape[1]
    converged = bool(np.all(true <= np.maximum(tol, floor)))
    if not converged:
        stopped = f"stopped at max_iter={max_iter}" if np.any(norms > tol) else "met tol by its recurrence"
        warnings.warn(
            f"nystrom_pcg {stopped}, with the residual of x at {true.max():.3g} of ||b||, above tol={tol:g} "
            f"and the rounding floor of {A.dtype} ({floor.max():.3g})",
            _results.ConvergenceWarning,
            stacklevel=2,
        )
    x = X[:, 0] if b_is_vector else X
    return NystromPCGResult(x, its, true, converged, approx, matvecs)


class _Scaled:
    """``A / 2**e`` for products (``A @ V``, then an exact scale by a power of two)."""

    def __init__(self, A, e: int):
        self.A, self.e = A, e

    def __matmul__(self, V):
        AV = np.asarray(self.A @ V)
        if AV.size != V.size or AV.dtype.kind != "f":
            raise ValueError(_product_error(AV, V))
        return np.ldexp(AV, -self.e).astype(AV.dtype, copy=False)


def _product_error(AV, V) -> str:
    return (
        f"A returned A @ V of shape {AV.shape} and dtype {AV.dtype} for V of shape {V.shape}: expected "
        "a real float array of V's shape"
    )


#: The residual of a solution ``x`` cannot be computed below about ``u (||A + mu I|| ||x|| + ||b||)``;
#: ``converged`` counts a residual within this many times that as converged where ``tol`` is below it.
ROUNDING_FLOOR = 10.0


def _true_residuals(A, mu, B, X, approx):
    """``||b - (A + mu I) x|| / ||b||`` per column, from ``x`` (one product: CG's recurrence drifts from
    it, in float32 to ``2e-6`` where it said ``7e-13``), and the rounding floor of each, with the
    Nyström approximation's largest eigenvalue for ``||A||``."""
    R = B - np.asarray(A @ X).reshape(B.shape) - mu * X
    bnorm = np.linalg.norm(B, axis=0)
    safe = np.where(bnorm > 0, bnorm, 1.0)
    norm_a = float(approx.eigenvalues.max(initial=0.0)) + mu
    eps = np.finfo(B.dtype).eps
    floor = ROUNDING_FLOOR * eps * (norm_a * np.linalg.norm(X, axis=0) + bnorm) / safe
    return np.linalg.norm(R, axis=0) / safe, floor


#: The adaptive sketch uses its test blocks as drawn (not orthonormalised) when it can take at most
#: ``n / DRAWN_MAX_FRACTION`` columns: a random ``n x l`` block is then well conditioned (a
#: Gaussian one's condition number is about ``3``), and the approximation depends on its range only.
#: A squarer block is not: at ``l = n = 400`` the drawn sparse sign left eigenvalues accurate to
#: ``1e-7`` of the largest where orthonormal columns gave ``3e-10``, and CG needed 7 iterations for 3.
DRAWN_MAX_FRACTION = 4
#: ... and while every column of ``Omega`` is at least ``DRAWN_MIN_DISTANCE`` of its norm away from
#: the span of the columns before it (the diagonal of the Cholesky factor of ``Omega.T Omega``, its
#: columns scaled to norm one; about ``sqrt(1 - l/n)`` for a random block): one with an empty column (a
#: CountSketch's bucket that no row hashed to) or a repeated one is orthonormalised instead. A
#: condition number's 1-norm estimate will not do: at ``p = 10,000`` and 1,600 columns it was 132
#: where ``cond(Omega)`` was 3.7 and every column stood at least 0.91 of its norm apart.
DRAWN_MIN_DISTANCE = 0.01


def _adaptive_nystrom(A, n, dtype, sketch, seeds, start, max_rank, threshold):
    """Nyström approximation whose sketch doubles until ``lambda_l <= threshold`` or ``max_rank``.

    Each round keeps the columns it has (``Y = A Omega`` filled from the left in a buffer of
    ``max_rank`` columns) and adds as many: ``A`` is applied to the new test block as drawn (for
    a :class:`~rsketch.linalg.GramOperator` and a sparse sign sketch, in ``O(s n p)`` before the
    one GEMM), ``A`` is applied to ``l`` columns in all (not ``2 l``).

    - With ``max_rank <= n / DRAWN_MAX_FRACTION``, while no column of ``Omega`` is within
      ``DRAWN_MIN_DISTANCE`` of the span of those before it, the blocks are used as drawn (else the
      rounds start again, orthonormalised): a sparse sign's blocks stay sparse, so ``Omega.T Y``
      and ``Omega.T Omega`` cost ``O(s n l)``, and ``Omega`` is never a dense ``n x l`` array.
      Orthonormalising each block against the ones before (with its dense copy and the products'
      update) cost 2.0 s of the 9.0 s of a 1,600-column sketch at ``p = 10,000``, and a full
      eigendecomposition each round 0.9 s (docs/lowrank.md).
    - Otherwise ``G = Omega C + Q R`` (``Omega``'s part projected out, then QR) gives orthonormal
      columns ``Q`` and their products ``A Q = (A G - Y C) R^-1`` (then ``Omega.T Omega = I``).

    Between rounds only ``l x l`` matrices are factored, the shifted form of Tropp et al. (2017):
    ``Y_nu = Y + nu Omega``, ``C = chol(Omega.T Y_nu)``, ``B = Y_nu C^-1``, whose
    ``B.T B = C^-T (Y_nu.T Y_nu) C^-1`` comes from ``Y.T Y``, ``Omega.T Y`` and ``Omega.T Omega``
    (each grown by a block column a round). A round's stopping test takes the smallest eigenvalue
    only; the last round's eigenvectors give ``B``'s left singular vectors as ``B V Sigma^-1``,
    one ``n x l`` GEMM, where the SVD of ``B`` cost several (5 s against 0.8 s at ``10,000 x 2,000``).
    Returns ``(NystromResult, columns)``.
    """
    children = seeds.spawn(64)
    if max_rank <= n // DRAWN_MAX_FRACTION:
        result = _nystrom_rounds(A, n, dtype, sketch, children, start, max_rank, threshold, drawn=True)
        if result is not None:
            return result
    return _nystrom_rounds(A, n, dtype, sketch, children, start, max_rank, threshold, drawn=False)


#: The working precision of the adaptive rounds' ``Y`` and ``l x l`` core, for float32 and float64 ``A``.
#: The core squares ``Y`` (``B.T B = C^-T Y_nu.T Y_nu C^-1``) and ``U = B V Sigma^-1`` scales its error
#: by ``sigma_1 / sigma_i``: in float32, ``U`` came out 27 away from orthonormal and the preconditioner
#: indefinite (CG stopped at ``max_iter`` with a residual of 0.075, or worse than ``x = 0``). ``A``'s
#: products stay in its precision (the shift ``nu`` accounts for their rounding).
ROUNDS_DTYPE = np.float64


def _check_round_memory(n: int, width: int) -> None:
    """Before a round fills ``width`` columns: ``Y``, ``Omega`` and ``U`` (``n x width`` each, at most) and
    the ``width x width`` cores. Checked a round at a time, as the buffers' pages are used (one check
    of ``max_rank`` columns up front refused calls that stop far below it); ``n = 10**7`` had met
    numpy's "Unable to allocate 74.5 GiB"."""
    check_allocation(
        8 * (3 * n * width + 3 * width**2),
        f"nystrom_pcg's adaptive Nystrom sketch of {width} columns of a {n} x {n} matrix",
        "pass nystrom_pcg a smaller max_rank or initial_rank (for SketchedRidge: a larger alpha)",
    )


def _nystrom_rounds(A, n, dtype, sketch, children, start, max_rank, threshold, *, drawn):
    """The rounds of :func:`_adaptive_nystrom`; None where the drawn blocks are ill-conditioned."""
    Omega = None if drawn else np.empty((n, max_rank), dtype, order="F")
    Y = np.empty((n, max_rank), ROUNDS_DTYPE, order="F")
    YtY = np.empty((max_rank, max_rank), ROUNDS_DTYPE)
    cross = np.empty((max_rank, max_rank), ROUNDS_DTYPE)  # Omega.T Y = Omega.T A Omega, symmetric
    omega_gram = np.eye(max_rank, dtype=ROUNDS_DTYPE)  # Omega.T Omega
    blocks = []  # drawn: (first column, the block as an (l_i, n) matrix, sparse for a sparse sign)
    l, width = 0, min(start, max_rank)
    applies_sketch = isinstance(A, GramOperator)  # S applied by A itself (a sparse sign from its pattern)
    e = None  # the rounds work on A / 2**e, e from the first products (below)
    for child in children:
        _check_round_memory(n, width)
        S = make_sketch(sketch, n, width - l, seed=child, dtype=dtype)
        new = slice(l, width)
        if drawn:  # the block as a matrix; a dense A multiplies its transpose (S generated once)
            block = sketch_matrix(S, dtype)
            G = None if applies_sketch else np.asfortranarray(_dense(block).T)  # as _test_block lays it out
        else:
            G = _test_block(S, dtype)
        AG = A.sketch(S) if applies_sketch else np.asarray(A @ G)
        if AG.shape != (n, width - l) or AG.dtype.kind != "f":
            raise ValueError(_product_error(AG, G if G is not None else np.empty((n, width - l))))
        if e is None:  # Y's squares must neither underflow nor overflow: A of 1e-170 gave a zero
            # approximation (CG took 251 iterations for 3), 1e155 an error
            e = unit_exponent(float(max_abs(AG)))
        if e:
            AG = np.ldexp(AG, -e)
        if drawn:
            blocks.append((l, block))
            Y[:, new] = AG
            for first, M in blocks:
                rows = slice(first, first + M.shape[0])
                cross[rows, new] = M @ Y[:, new]
                omega_gram[rows, new] = _dense(M @ block.T)
            omega_gram[new, :l] = omega_gram[:l, new].T
            if not _well_conditioned(omega_gram[:width, :width]):
                return None
        else:
            Q, C, R = _orthonormalize_against(G, Omega[:, :l])
            if not np.abs(np.diag(R)).min() > n * np.finfo(dtype).eps * np.abs(np.diag(R)).max():
                raise ValueError(
                    f"the {sketch!r} test matrix has linearly dependent columns (a sampling sketch "
                    "draws a column twice, a CountSketch can leave one empty): use sketch='sparse_sign' "
                    "or 'gaussian'"
                )
            Omega[:, new] = Q
            Y[:, new] = (AG - Y[:, :l] @ C) @ np.linalg.inv(R)  # NumPy's BLAS for n-sized work (_orth)
            cross[:width, new] = Omega[:, :width].T @ Y[:, new]
        YtY[:width, new] = Y[:, :width].T @ Y[:, new]
        cross[new, :l] = cross[:l, new].T
        YtY[new, :l] = YtY[:l, new].T
        l = width
        # Tropp et al.'s shift sqrt(n) u ||Y||, with ||Y||_F for ||Y||_2 (an upper bound, no SVD)
        nu = math.sqrt(n) * np.finfo(dtype).eps * math.sqrt(max(float(np.trace(YtY[:l, :l])), 0.0))
        if not math.isfinite(nu):
            raise _overflow()
        if nu == 0:  # A Omega = 0: for a PSD A the approximation is zero (the preconditioner, I)
            return NystromResult(np.zeros((n, l), dtype), np.zeros(l, dtype), 0.0), l
        core = (cross[:l, :l] + cross[:l, :l].T) / 2
        C_nu, nu = _psd_core(core, omega_gram[:l, :l], nu, n, "nystrom_pcg", e, eps=np.finfo(dtype).eps)
        gram = YtY[:l, :l] + nu * (cross[:l, :l] + cross[:l, :l].T) + nu**2 * omega_gram[:l, :l]
        half = scipy.linalg.solve_triangular(C_nu, gram, trans="T", check_finite=False)  # C^-T (Y_nu.T Y_nu)
        BtB = scipy.linalg.solve_triangular(C_nu, half.T, trans="T", check_finite=False)
        lowest = scipy.linalg.eigh(BtB, subset_by_index=[0, 0], eigvals_only=True, check_finite=False)[0]
        if width >= max_rank or lowest - nu <= _ldexp(threshold, -e):  # inf: mu dominates A
            break
        width = min(2 * width, max_rank)
    sigma2, V = np.linalg.eigh(BtB)
    sigma2, V = sigma2[::-1], V[:, ::-1]
    resolved, lam = _unshifted(sigma2, nu, dtype)
    W = scipy.linalg.solve_triangular(C_nu, V, check_finite=False)  # C^-1 V
    W *= np.where(resolved, 1.0 / np.sqrt(np.where(resolved, sigma2, 1.0)), 0.0)
    Y_nu = Y[:, :l]  # in place: Y is not needed again (a temporary of n x l cost 0.15 s)
    if drawn:
        for first, M in blocks:
            _add_transpose(Y_nu[:, first : first + M.shape[0]], nu, M)
    else:
        Y_nu += nu * Omega[:, :l]
    U = (Y_nu @ W).astype(dtype, copy=False)  # B V Sigma^-1, a zero column where lambda is zero
    if not _orthonormal(U[:, : int(resolved.sum())]):
        U, lam = _factor_through_qr(Y_nu, C_nu, nu, dtype)
    return NystromResult(U, np.ldexp(lam, e).astype(dtype, copy=False), _ldexp(nu, e)), l


#: How far from orthonormal the fast factor ``U`` may be (``max |U.T U - I|``) before it is computed again
#: through a QR: the preconditioner's eigenvalues move by about as much.
ORTHONORMAL_TOL = 1e-3


def _orthonormal(U) -> bool:
    """Whether ``U``'s columns are orthonormal to :data:`ORTHONORMAL_TOL` (``n l^2`` multiply-adds, 0.1-0.2 s
    at ``10,000 x 1,600``, about 1% of a ridge fit's time there)."""
    with np.errstate(over="ignore", invalid="ignore"):
        G = U.T @ U
    G[np.diag_indices_from(G)] -= 1
    return bool(np.abs(G).max() <= ORTHONORMAL_TOL) if G.size else True


def _factor_through_qr(Y_nu, C_nu, nu, dtype):
    """Tropp et al.'s factor itself: the SVD of ``B = Y_nu C^-1`` through a Householder QR of ``B``, where the
    fast factor squares ``B`` (``B.T B`` from ``Y.T Y``) and, on a spectrum spanning more than the square
    root of the rounding, loses its small directions: ``U`` came out 7 away from orthonormal and the
    preconditioner indefinite (an eigenvalue of -6.99; CG ended at 88 times ``||b||``). ``(U, lambda)``."""
    B = scipy.linalg.solve_triangular(C_nu, Y_nu.T, trans="T", check_finite=False).T  # Y_nu C^-1
    Q, R = scipy.linalg.qr(B, mode="economic", check_finite=False)
    V, sigma, _ = scipy.linalg.svd(R, check_finite=False)
    resolved, lam = _unshifted(sigma**2, nu, dtype)
    return ((Q @ V) * resolved).astype(dtype, copy=False), lam


def _unshifted(sigma2, nu, dtype):
    """``(resolved, lambda)`` from the squared singular values of ``B`` (``Y_nu``'s, shifted by ``nu``):
    ``lambda = sigma^2 - nu``, and zero where ``sigma^2 <= 2 nu``, within rounding of the shift."""
    resolved = sigma2 > 2 * nu
    return resolved, np.where(resolved, sigma2 - nu, 0.0).astype(dtype, copy=False)


def _ldexp(x: float, e: int) -> float:
    """``x * 2**e``, ``inf`` or 0 past the float range (``math.ldexp`` raises OverflowError)."""
    with np.errstate(over="ignore", under="ignore"):
        return float(np.ldexp(x, e))


def _test_block(S, dtype):
    """``S.T`` as a Fortran-ordered ``n x l`` array: the operator's own dense form (for a sparse
    sign, the one :meth:`~rsketch.linalg.GramOperator.sketch` applies from its pattern), with no
    copy beyond it where the dtype matches (``S.to_dense()`` is C-ordered, so its transpose is
    Fortran-ordered already)."""
    return np.asarray(S.to_dense().T, dtype=dtype, order="F")


def _orthonormalize_against(G, Omega):
    """``G = Omega C + Q R`` for orthonormal ``Omega``: ``(Q, C, R)``, ``Q`` orthonormal and
    orthogonal to ``Omega``, ``R`` upper triangular.

    ``Omega``'s part is projected out, and again where a column lost more than half its norm
    (Kahan's "twice is enough", Giraud et al. 2005; a random block against a basis of far fewer
    columns than rows loses little, so one pass is the rule). Cholesky QR makes ``Q``, a second
    round where ``R``'s condition number leaves ``Q`` orthonormal to worse than ``1e-12``
    (``u cond^2``), Householder QR where ``G`` is too ill-conditioned for it.
    """
    C = Omega.T @ G
    norms = np.linalg.norm(G, axis=0)
    G = G - Omega @ C
    if Omega.shape[1] and (np.linalg.norm(G, axis=0) < norms / 2).any():
        step = Omega.T @ G
        G -= Omega @ step
        C += step
    R = np.eye(G.shape[1], dtype=G.dtype)
    Q = G
    for _ in range(2):
        try:
            L = np.linalg.cholesky(Q.T @ Q)
        except np.linalg.LinAlgError:
            break
        cond = np.linalg.cond(L)
        if not cond <= _cholqr_limit(G.dtype):  # _orth's rule
            break
        Q = Q @ np.linalg.inv(L).T  # Q R1^-1 with R1 = L.T, as _orth does it
        R = L.T @ R
        if cond <= math.sqrt(1e-12 / np.finfo(G.dtype).eps):
            return np.asfortranarray(Q), C, R
    else:
        return np.asfortranarray(Q), C, R
    Q, R = scipy.linalg.qr(G, mode="economic", check_finite=False)
    return np.asfortranarray(Q), C, R


def _well_conditioned(omega_gram):
    """Whether every column of ``Omega`` stands ``DRAWN_MIN_DISTANCE`` of its norm away from the span
    of the ones before it: the diagonal of the Cholesky factor of ``Omega.T Omega`` with unit
    diagonal (``O(l^3 / 3)``, 0.06 s at 1,600 columns)."""
    scale = np.sqrt(np.diag(omega_gram))
    if not (scale > 0).all():
        return False  # an empty column
    try:
        L = np.linalg.cholesky(omega_gram / np.outer(scale, scale))
    except np.linalg.LinAlgError:
        return False
    return bool(np.diag(L).min() >= DRAWN_MIN_DISTANCE)


def _dense(M):
    return M.toarray() if sp.issparse(M) else M


def _add_transpose(out, scale, M):
    """``out += scale * M.T`` for a dense or SciPy sparse ``M`` (its nonzeros only)."""
    if not sp.issparse(M):
        out += scale * M.T
        return
    T = M.tocoo()
    np.add.at(out, (T.col, T.row), scale * T.data)


def _pcg(A, mu, b, P_inv, tol, max_iter, callback, shift=0):
    """Preconditioned CG (Hestenes-Stiefel) from ``x = 0``: ``(x, iterations, ||r|| / ||b||)``.
    ``b`` is the right-hand side over ``2**shift``; ``callback`` sees ``x`` times that."""
    bnorm = float(np.linalg.norm(b))
    x = np.zeros_like(b)
    if bnorm == 0:
        return x, 0, 0.0
    r = b.copy()
    z = P_inv @ r
    d = z.copy()
    rz = float(r @ z)
    rnorm = bnorm
    it = 0
    while rnorm > tol * bnorm and it < max_iter:
        Ad = np.asarray(A @ d).ravel() + mu * d
        curvature = float(d @ Ad)
        if not (curvature > 0 and rz > 0):  # breakdown: d or r exactly 0 (a tol below what the rounding
            break  # reaches had met a ZeroDivisionError), or an operator that is not positive definite
        alpha = rz / curvature
        x += alpha * d
        r -= alpha * Ad
        z = P_inv @ r
        rz, rz_old = float(r @ z), rz
        d = z + (rz / rz_old) * d
        rnorm = float(np.linalg.norm(r))
        it += 1
        if callback is not None:
            callback(np.ldexp(x, shift).astype(x.dtype, copy=False))
    return x, it, rnorm / bnorm
