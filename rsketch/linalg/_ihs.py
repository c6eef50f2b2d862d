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

from rsketch.linalg._common import apply_sketch, column_norms, design_for, product_norms
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


def stable_level(p):
    """The relative backward error estimate a run must reach to count as converged by default."""
    return BACKWARD_STABLE * np.sqrt(p) * _EPS


#: An unconverged run returns an earlier iterate only where the last one's squared residual norm is
#: larger by more than this, relative: near a stall the norms differ by a few eps, at random (a
#: "best" chosen on that picked backward errors of 5e-10 over the last iterate's 1.4e-12).
CLEARLY_WORSE = np.sqrt(_EPS)


class _Best:
    """Per column, the iterate with the smallest residual norm seen, with its gradient and measure.

    A run that ends unconverged returns it where its last iterate is clearly worse: a diverging
    iteration (a sketch that is no embedding of ``range(X)``) left its last iterate at a relative
    error of ``1e44`` where ``coef = 0`` had 1. The residual norm comes with each iterate's gradient
    (from ``X`` itself), so the choice costs nothing; columns are independent iterations, each
    keeps its own.
    """

    def __init__(self, p, k):
        self.rn2 = np.full(k, np.inf)
        self.coef, self.g = np.zeros((p, k)), np.zeros((p, k))
        self.measure = np.zeros(k)

    def update(self, coef, g, rn2, measure):
        better = rn2 < self.rn2
        if better.any():
            self.rn2[better], self.measure[better] = rn2[better], measure[better]
            self.coef[:, better], self.g[:, better] = coef[:, better], g[:, better]

    def or_last(self, coef, g, rn2, measure):
        """``(coef, g, rn2, measure)``: per column the kept iterate where the last is clearly worse."""
        back = rn2 > self.rn2 * (1.0 + CLEARLY_WORSE)
        return (
            np.where(back, self.coef, coef),
            np.where(back, self.g, g),
            np.where(back, self.rn2, rn2),
            np.where(back, self.measure, measure),
        )


def ihs(X, Y, S0, *, tol, max_iter, log, backward_tol=None, settle=None):
    """Run IHS on validated ``X`` (float64, dense or CSR) and ``Y`` (``(n, k)``, C-contiguous).

    Parameters
    ----------
    X, Y
        As returned by :func:`rsketch.linalg._common.validate_problem`.
    S0 : SketchOperator
        The first sketch; later ones come from :func:`fresh_sketch`.
    tol : float
        Stop when, for every column, both ``||M_t.T g|| / ||y||`` and ``||M_t M_t.T g|| / ||coef||``
        are below ``tol`` (``g`` the gradient, ``M_t`` the current sketch's preconditioner) and the
        relative backward error estimate is at most ``backward_tol``.
    settle : callable, optional
        ``settle(X, factor)``: the first sketch's factor is handed to it, which returns False or the
        direct solve's ``(coef, rank, residual norms, iterations, converged)`` where the sketch cannot
        settle ``X``'s rank (:func:`rsketch.linalg._lstsq.settle_directly`).
    max_iter : int
    log : SolverLog
    backward_tol : float, optional
        Default (and at least) :func:`stable_level`, ``10 sqrt(p) eps``: the measures alone, relative
        to ``||y||`` and ``||coef||``, stopped runs at backward errors of ``1e-13`` (plain Gaussian
        ``X`` and columns scaled ``1e+-150`` alike), while a run that stalls has had to reach this
        level to count as converged.

    Returns
    -------
    coef, iterations, converged, residual_norms, rank, shortfall
        ``shortfall`` is None for a converged run, else ``(value, target, what)`` for its warning;
        an unconverged run returns, per column, its iterate of smallest residual norm where the
        last one's is clearly larger (:data:`CLEARLY_WORSE`).
    """
    design = design_for(X)
    x_norms = product_norms(design)
    # Dask: log.passes (the passes lstsq made, or None in memory) grows by each iteration's two
    counted = hasattr(design, "passes")
    passes_before = log.passes or 0
    n, p = X.shape
    k = Y.shape[1]
    level = stable_level(p) if backward_tol is None else max(backward_tol, stable_level(p))
    ynorm = column_norms(Y)
    scale = np.where(ynorm > 0, ynorm, 1.0)
    coef = np.zeros((p, k))
    log.finish = "ihs"
    best, since_best = np.inf, 0
    kept = _Best(p, k)
    rank0 = None
    t = 0
    while True:
        t0 = time.perf_counter()
        g, rn2 = design.residual_gradient(Y, coef, accuracy="compensated")
        t1 = time.perf_counter()
        S = fresh_sketch(S0, t)
        SX = apply_sketch(S, X)
        if counted:  # the gradients' passes (the design counts them) and t + 1 sketches
            log.passes = passes_before + design.passes + t + 1
        t2 = time.perf_counter()
        # the first sketch's rank confirmed by X's products (settle hands a near-singular X to the
        # direct solve); the later sketches' ranks stand
        factor = sketched_factor(SX, None, x_norms if t == 0 else None, X.shape[0])
        M, s_values, rank = factor.M, factor.s, factor.rank
        if rank0 is not None and rank > rank0:  # X's rank, confirmed on the first sketch, holds for all:
            M, rank = M[:, :rank0], rank0  # a later sketch's rounding had kept a zero of X (coef 5e12)
        t3 = time.perf_counter()
        log.sketch += t2 - t1
        log.factor += t3 - t2
        log.iterate += t1 - t0
        if rank0 is None:
            rank0 = rank
            # A rank-deficient X: every step is kept in the first sketch's row space, X's to
            # rounding. Each later sketch's kept directions span a different near-null part, and
            # steps gathered there: at kappa 1e20, coef 1e10 times the minimum-norm one, "converged".
            row_space = factor.Vt[:rank0].T if rank0 < p else None
            settled = settle(X, factor) if settle is not None else False
            if settled:
                coef, rank, rnorm, iterations, converged = settled
                return coef, iterations, converged, rnorm, rank, None
        s = M.T @ g
        gnorm, snorm = _measures(M, s, coef, scale)
        measures = np.maximum(gnorm, snorm)
        kept.update(coef, g, rn2, measures)
        worst = float(measures.max()) if k else 0.0
        log.gradient_norms.append(worst)
        if worst <= tol:
            # The measures met: converged once the backward error is at the level too (an O(p^2)
            # estimate from this sketch's SVD); otherwise go on, for the stall rule below to judge.
            log.backward_error = _relative_backward_error(factor, g, rn2, coef)
            if np.all(np.asarray(log.backward_error) <= level):
                return coef, t, True, np.sqrt(rn2), rank0, None
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
            stable = np.all(np.asarray(log.backward_error) <= level)
            at_floor = (
                since_best >= _PATIENCE
                and bool(stable)
                and bool(((gnorm <= np.maximum(gfloor, tol)) & (snorm <= np.maximum(sfloor, tol))).all())
            )
            if at_floor:
                return coef, t, True, np.sqrt(rn2), rank0, None
            coef, g, rn2, measures = kept.or_last(coef, g, rn2, measures)
            log.backward_error = _relative_backward_error(factor, g, rn2, coef)
            measure = float(measures.max()) if k else 0.0
            if measure <= tol:  # the measures were met; the backward error was not
                shortfall = (float(np.max(log.backward_error)), level, "backward error estimate")
            else:
                shortfall = (measure, tol, "error measure")
            return coef, t, False, np.sqrt(rn2), rank0, shortfall
        step = M @ s
        coef = coef + (step if row_space is None else row_space @ (row_space.T @ step))
        log.iterate += time.perf_counter() - t3
        t += 1
