"""Iterative Hessian sketch (Pilanci & Wainwright, JMLR 2016): a fresh sketch every iteration.

Starting from ``coef = 0``, each iteration takes the Newton-like step
``coef += (X.T S_t.T S_t X)^+ X.T (y - X coef)`` with a new, independent sketch ``S_t``: the sketch
stands in for the Hessian ``X.T X`` only, while the gradient comes from the full data. That escapes
the ``sigma^2 p / r`` lower bound that holds for any estimator built from ``(S X, S y)`` alone, and the
error ``||X (coef - coef_opt)||`` contracts by a factor of order ``sqrt(p / r)`` per iteration, so
IHS reaches the least-squares solution itself. Each iteration costs one sketch of ``X`` and one pass
for the gradient; sketch-and-precondition (one sketch, then one pass per iteration) is cheaper when
the whole of ``X`` is at hand, IHS fits when sketches are cheap or come from a stream.
"""

from __future__ import annotations

import time

import numpy as np

from rsketch.linalg._common import apply_sketch, column_norms, design_for
from rsketch.linalg._precondition import backward_error_estimate, sketched_factor
from rsketch.operators import LeverageSampling

# Iterations without halving the gradient measure after which IHS is judged to have stalled.
_PATIENCE = 5
_EPS = np.finfo(np.float64).eps
#: A run that stalls at the rounding floor is converged only with a relative backward error estimate
#: of at most ``BACKWARD_STABLE sqrt(p) eps``: the answer is then as good as a backward-stable
#: solver's (sketch-and-precondition's own target is ``10 u``).
BACKWARD_STABLE = 10.0


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
    cn = column_norms(coef)
    cn = np.where(cn > 0, cn, 1.0)
    grad = np.sqrt(p) * _EPS * kappa * (4.0 + s[0] * cn / np.where(ynorm > 0, ynorm, 1.0))
    step = np.sqrt(p) * _EPS * kappa * (4.0 + kappa * rnorm / (s[0] * cn))
    return grad, step


def _measures(M, s, coef, scale):
    """Relative preconditioned gradient ``||s|| / ||y||`` and relative step ``||M s|| / ||coef||``."""
    gnorm = column_norms(s) / scale
    step = M @ s
    cn = column_norms(coef)
    snorm = column_norms(step) / np.where(cn > 0, cn, 1.0)
    return gnorm, snorm


def fresh_sketch(S0, t):
    """Iteration ``t``'s sketch: ``S0``'s family, size and options, a key derived from ``S0.key`` and ``t``.

    Examples
    --------
    >>> import rsketch
    >>> S0 = rsketch.make_sketch("sparse_sign", 100, 20, seed=0)
    >>> S1 = fresh_sketch(S0, 1)
    >>> type(S1) is type(S0), S1.key != S0.key, fresh_sketch(S0, 1).key == S1.key
    (True, True, True)
    """
    if t == 0:
        return S0
    seed = np.random.SeedSequence([S0.key[0], S0.key[1], t])
    if isinstance(S0, LeverageSampling):
        return LeverageSampling(
            S0.input_dim,
            S0.sketch_size,
            scores=S0.scores,
            uniform_mix=S0.uniform_mix,
            seed=seed,
            dtype=S0.dtype,
        )
    return type(S0)(S0.input_dim, S0.sketch_size, seed=seed, dtype=S0.dtype, **S0._options())


def _relative_backward_error(factor, g, rn2, coef):
    frob = factor.frobenius
    est = backward_error_estimate(factor, g, np.sqrt(rn2), coef)
    return est / frob if frob > 0 else est


def ihs(X, Y, S0, *, tol, max_iter, log):
    """Run IHS on validated ``X`` (float64, dense or CSR) and ``Y`` (``(n, k)``, C-contiguous).

    Parameters
    ----------
    X, Y
        As returned by :func:`rsketch.linalg._common.validate_problem`.
    S0 : SketchOperator
        The first sketch; later ones come from :func:`fresh_sketch`.
    tol : float
        Stop when, for every column, both ``||M_t.T g|| / ||y||`` and ``||M_t M_t.T g|| / ||coef||``
        are below ``tol`` (``g`` the gradient, ``M_t`` the current sketch's preconditioner).
    max_iter : int
    log : SolverLog

    Returns
    -------
    coef, iterations, converged, residual_norms, rank
    """
    design = design_for(X)
    n, p = X.shape
    k = Y.shape[1]
    ynorm = column_norms(Y)
    scale = np.where(ynorm > 0, ynorm, 1.0)
    coef = np.zeros((p, k))
    log.finish = "ihs"
    best, since_best = np.inf, 0
    rank0 = None
    t = 0
    while True:
        t0 = time.perf_counter()
        g, rn2 = design.residual_gradient(Y, coef, accuracy="compensated")
        t1 = time.perf_counter()
        S = fresh_sketch(S0, t)
        SX = apply_sketch(S, X)
        t2 = time.perf_counter()
        factor = sketched_factor(SX)
        M, s_values, rank = factor.M, factor.s, factor.rank
        t3 = time.perf_counter()
        log.sketch += t2 - t1
        log.factor += t3 - t2
        log.iterate += t1 - t0
        if rank0 is None:
            rank0 = rank
        s = M.T @ g
        gnorm, snorm = _measures(M, s, coef, scale)
        worst = float(np.maximum(gnorm, snorm).max()) if k else 0.0
        log.gradient_norms.append(worst)
        if worst <= tol:
            log.backward_error = _relative_backward_error(factor, g, rn2, coef)
            return coef, t, True, np.sqrt(rn2), rank0
        # Progress is judged on the gradient measure alone: it contracts by about sqrt(p/r) per
        # iteration, while the step measure wanders until the large directions have converged.
        gmax = float(gnorm.max()) if k else 0.0
        if gmax < 0.5 * best:
            best, since_best = gmax, 0
        else:
            since_best += 1
        if t >= max_iter or since_best >= _PATIENCE:
            gfloor, sfloor = rounding_floor(s_values, rank, coef, ynorm, np.sqrt(rn2), p)
            log.backward_error = _relative_backward_error(factor, g, rn2, coef)
            # A stall counts as converged only where the answer is backward stable: the step floor
            # grows as kappa^2 ||r||, and at kappa 1e10 nearly any iterate passed it (a backward
            # error of 1.2e-11 reported converged, where "precondition" reaches 8.8e-16).
            stable = np.all(np.asarray(log.backward_error) <= BACKWARD_STABLE * np.sqrt(p) * _EPS)
            at_floor = (
                since_best >= _PATIENCE
                and bool(stable)
                and bool(((gnorm <= np.maximum(gfloor, tol)) & (snorm <= np.maximum(sfloor, tol))).all())
            )
            return coef, t, at_floor, np.sqrt(rn2), rank0
        coef = coef + M @ s
        log.iterate += time.perf_counter() - t3
        t += 1
