"""Sketch-and-precondition: a preconditioner from the sketch, a sketch-and-solve warm start, and a
one-pass-per-iteration preconditioned conjugate-gradient finish on the normal equations.

The preconditioner comes from the SVD ``S X = U diag(s) V.T`` (``r x p``, cheap): ``M = V_k diag(1/s_k)``
keeps the ``k`` singular values above ``max(r, p) * eps * s_1``. When ``S`` is a subspace embedding
of ``range(X)`` with distortion ``eps_S``, the singular values of ``X M`` lie in
``[1/(1 + eps_S), 1/(1 - eps_S)]``; for Gaussian-like sketches ``eps_S ~ sqrt(p / r)``, so
``kappa(X M) ~ (1 + sqrt(p/r)) / (1 - sqrt(p/r))`` and conjugate gradients on
``M.T X.T X M z = M.T X.T y`` contract the error ``||X (x - x_opt)||`` by about ``sqrt(p / r)`` per
iteration (Rokhlin & Tygert 2008; Avron, Maymounkov & Toledo, Blendenpik, 2010; Meng, Saunders &
Mahoney, LSRN, 2014).

Why this finish. Each iteration needs ``X.T X v``, which the fused kernel computes in one streaming
pass over ``X`` (LSQR's two BLAS products read ``X`` twice; a BLAS-3 Cholesky-QR pass costs
``3 n p^2`` flops, more than the passes it saves; ``docs/solvers.md`` has the measurements).
The warm start from sketch-and-solve starts the error at ``~ sqrt(p/r) ||r_opt||`` instead of
``||y||``, and every round ends with the true gradient recomputed from ``X`` (residual
replacement), which keeps the
recurrences honest; a round that does not meet the test starts again from the current iterate
(iterative refinement with a CG inner solver; Epperly, Meier & Nakatsukasa 2024 show
warm-started sketch-and-precondition is forward stable, and refinement is what restores backward
stability).

Rank-deficient ``X``: ``M`` spans the row space of ``S X``, which equals that of ``X`` when ``S``
embeds ``range(X)``, so the warm start and every update stay in the row space and the answer is the
minimum-norm solution.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import scipy.linalg

from rsketch._validation import one_blas_thread
from rsketch.linalg._results import ConvergenceWarning

# Relative singular-value cutoff: max(r, p) * eps, as numpy.linalg.matrix_rank.
_EPS = np.finfo(np.float64).eps


def sketched_factor(SX):
    """Preconditioner and warm-start basis from the SVD of ``S X``.

    Parameters
    ----------
    SX : ndarray of shape (r, p)

    Returns
    -------
    M : ndarray of shape (p, k)
        ``V_k / s_k``: right preconditioner (``X @ M`` has orthonormal-like columns).
    W : ndarray of shape (r, k)
        ``U_k``: the sketch-and-solve solution is ``M @ (W.T @ (S y))``.
    s : ndarray of shape (min(r, p),)
        All singular values of ``S X``.
    rank : int

    Examples
    --------
    >>> import numpy as np
    >>> M, W, s, rank = sketched_factor(np.diag([3.0, 2.0, 0.0]))
    >>> rank, M.shape
    (2, (3, 2))
    """
    # Small dense factorisations run on one BLAS thread: threaded LAPACK on an r x p matrix costs
    # more in synchronisation than it saves (docs/solvers.md). QR first, then the SVD of the p x p
    # factor R (cheaper than the SVD of S X itself).
    with one_blas_thread():
        if SX.shape[0] > SX.shape[1]:
            Q, R = scipy.linalg.qr(SX, mode="economic", check_finite=False)
            Ur, s, Vt = scipy.linalg.svd(R, check_finite=False, lapack_driver="gesdd")
            U = Q @ Ur
        else:
            U, s, Vt = scipy.linalg.svd(SX, full_matrices=False, check_finite=False, lapack_driver="gesdd")
    if s.size == 0 or s[0] == 0.0:
        rank = 0
    else:
        rank = int(np.count_nonzero(s > s[0] * max(SX.shape) * _EPS))
    M = Vt[:rank].T / s[:rank]
    return M, U[:, :rank], s, rank


def rounding_floor(s, rank, coef, ynorm, rnorm, p):
    """What rounding alone can leave of the two stopping measures, per column.

    ``fl(X.T (y - X coef))`` is off by about ``eps ||X|| (||y|| + ||X|| ||coef||)``, which ``M.T``
    scales by ``1 / s_min`` (gradient floor, relative to ``||y||``); a backward-stable direct solver's
    forward error is ``eps (kappa + kappa^2 ||r|| / (||X|| ||coef||))`` (step floor, relative to
    ``||coef||``). Both carry a ``sqrt(p)`` margin. Used only to judge a run that stopped
    improving, never to stop early.
    """
    if rank == 0:
        z = np.zeros_like(ynorm)
        return z, z
    kappa = s[0] / s[rank - 1]
    cn = np.sqrt(np.einsum("ij,ij->j", coef, coef))
    cn = np.where(cn > 0, cn, 1.0)
    grad = np.sqrt(p) * _EPS * kappa * (4.0 + s[0] * cn / np.where(ynorm > 0, ynorm, 1.0))
    step = np.sqrt(p) * _EPS * kappa * (4.0 + kappa * rnorm / (s[0] * cn))
    return grad, step


def _measures(M, s, coef, scale):
    """Relative preconditioned gradient ``||s|| / ||y||`` and relative step ``||M s|| / ||coef||``."""
    gnorm = np.sqrt(np.einsum("ij,ij->j", s, s)) / scale
    step = M @ s
    cn = np.sqrt(np.einsum("ij,ij->j", coef, coef))
    snorm = np.sqrt(np.einsum("ij,ij->j", step, step)) / np.where(cn > 0, cn, 1.0)
    return gnorm, snorm


def pcg_finish(design, Y, coef, M, s_values, rank, *, tol, max_iter, log):
    """Preconditioned CG on the normal equations from ``coef``, in rounds with residual replacement.

    Each round recomputes the true gradient ``g = X.T (y - X coef)`` from ``X`` (one pass, summed in
    double-double so that its rounding does not limit the answer), then runs CG on
    ``M.T X.T X M d = M.T g`` (one fused pass per iteration) until the recurrence's measures are
    below ``tol / 4``, and adds ``M d``. Two measures, per column: the preconditioned gradient
    ``||M.T g|| / ||y||`` (``~ ||X (coef - coef_opt)|| / ||y||``: the residual's accuracy) and the
    step ``||M M.T g|| / ||coef||`` (``~ ||coef - coef_opt|| / ||coef||``: the forward error).
    Rounds repeat while a true measure exceeds ``tol`` and still falls tenfold per round.

    Parameters
    ----------
    design : rsketch.linalg._design.Design
    Y : ndarray of shape (n, k)
    coef : ndarray of shape (p, k)
        Warm start (not modified).
    M : ndarray of shape (p, rank)
        Right preconditioner.
    s_values : ndarray
        Singular values of ``S X`` (to judge a stall against the rounding floor).
    rank : int
    tol : float
        Target for both measures.
    max_iter : int
        Most CG iterations in all (each one pass over ``X``); the replacement passes are extra.
    log : SolverLog
        Receives the history of the larger measure.

    Returns
    -------
    coef, iterations, converged, residual_norms
        ``converged`` is True when every column met ``tol``, or stopped improving with both
        measures below :func:`rounding_floor` (working accuracy: more iterations cannot help).
    """
    k = Y.shape[1]
    p = coef.shape[0]
    ynorm = np.sqrt(np.einsum("ij,ij->j", Y, Y))
    scale = np.where(ynorm > 0, ynorm, 1.0)
    coef = coef.copy()
    iterations = 0
    best = np.full(k, np.inf)
    kappa = s_values[0] / s_values[rank - 1] if rank else 1.0
    stalled = np.zeros(k, dtype=bool)
    rounds = 0
    while True:
        # True gradient X.T r: one pass. The first one only starts round 1, whose result the next
        # true gradient checks, so it need not be summed carefully.
        g, rn2 = design.residual_gradient(Y, coef, accurate=rounds > 0)
        s = M.T @ g  # (rank, k)
        gnorm, snorm = _measures(M, s, coef, scale)
        worst = np.maximum(gnorm, snorm)
        log.gradient_norms.append(float(worst.max()) if k else 0.0)
        active = worst > tol
        # A column whose round gained less than tenfold has met rounding: it stays frozen. Only
        # measures from careful gradients are compared (the first, at the warm start, is not one).
        if rounds >= 2:
            stalled |= active & (worst > 0.1 * best)
        running = active & ~stalled
        if not running.any() or iterations >= max_iter:
            gfloor, sfloor = rounding_floor(s_values, rank, coef, ynorm, np.sqrt(rn2), p)
            at_floor = (gnorm <= np.maximum(gfloor, tol)) & (snorm <= np.maximum(sfloor, tol))
            converged = bool((~active | (stalled & at_floor)).all())
            return coef, iterations, converged, np.sqrt(rn2)
        first = rounds == 0
        if rounds > 0:
            best = np.minimum(best, worst)
        rounds += 1
        active = running
        # Applying X M in floating point is exact only to about eps * kappa relative, so a round
        # cannot gain more than that factor on the true measures: stop the inner CG there and let
        # the next round (a fresh true gradient) take the rest.
        # After the first round the true measures are near their rounding floor, so a round aims
        # for at most four more digits.
        gain = _EPS * kappa if first else max(_EPS * kappa, 1e-4)
        inner_target = np.maximum(0.25 * tol, gain * worst)
        # Inner CG on M.T X.T X M d = s (columns that already meet the test stay frozen).
        s = s * active
        d = np.zeros_like(s)
        pdir = s.copy()
        gamma = np.einsum("ij,ij->j", s, s)
        while iterations < max_iter:
            q, pq = design.gram(M @ pdir)  # X.T X (M p) and ||X M p||^2: one pass
            q = M.T @ q
            iterations += 1
            live = (pq > 0) & (gamma > 0)
            alpha = np.where(live, gamma / np.where(live, pq, 1.0), 0.0)
            d += alpha * pdir
            s -= alpha * q
            gamma_new = np.einsum("ij,ij->j", s, s)
            gn, sn = _measures(M, s, coef, scale)
            log.gradient_norms.append(float(np.maximum(gn, sn).max()))
            if (np.maximum(gn, sn) <= inner_target).all():
                break
            beta = np.where(gamma > 0, gamma_new / np.where(gamma > 0, gamma, 1.0), 0.0)
            pdir = s + beta * pdir
            gamma = gamma_new
        coef += M @ d


def predicted_rate(p: int, r: int) -> float:
    """``sqrt(p / r)``: the per-iteration contraction CG attains with a Gaussian-like sketch.

    Examples
    --------
    >>> predicted_rate(100, 400)
    0.5
    """
    return math.sqrt(p / r)


def default_max_iter(p: int, r: int) -> int:
    """Enough iterations for a ``1e-16`` reduction at the predicted rate, doubled, plus 10.

    Examples
    --------
    >>> default_max_iter(100, 2000)
    60
    """
    rate = min(predicted_rate(p, r), 0.95)
    return int(2 * math.ceil(math.log(1e-16) / math.log(rate)) + 10)


def warn_not_converged(method, iterations, gnorm, tol):
    """Issue the :class:`ConvergenceWarning` of a run that stopped with ``converged=False``."""
    warnings.warn(
        f"lstsq(method={method!r}) stopped after {iterations} iterations with error measure "
        f"{gnorm:.3g} > tol={tol:.3g} (and above the rounding floor); the result has converged=False. "
        "Raise max_iter or sketch_size, or loosen tol.",
        ConvergenceWarning,
        stacklevel=3,
    )
