"""Sketch-and-precondition with iterative refinement: a preconditioner from the sketch, a
sketch-and-solve warm start, and refinement steps whose corrections come from conjugate gradients on
the preconditioned normal equations, each ending in a backward-error estimate from the sketch.

The preconditioner comes from the SVD ``S X = U diag(s) V.T`` (``r x p``, cheap): ``M = V_k diag(1/s_k)``
keeps the ``k`` singular values above ``max(r, p) * eps * s_1``. When ``S`` is a subspace embedding
of ``range(X)`` with distortion ``eps_S``, the singular values of ``X M`` lie in
``[1/(1 + eps_S), 1/(1 - eps_S)]``; for Gaussian-like sketches ``eps_S ~ sqrt(p / r)``, so
conjugate gradients on ``M.T X.T X M d = M.T X.T r`` contract the error by about ``sqrt(p / r)`` per
iteration (Rokhlin & Tygert 2008; Avron, Maymounkov & Toledo, Blendenpik, 2010; Meng, Saunders &
Mahoney, LSRN, 2014), each iteration one fused pass over ``X``.

Refinement (SPIR: Epperly, Meier & Nakatsukasa 2024). Step ``i`` computes ``r_i = y - X x_i`` and
``g_i = X.T r_i`` from ``X`` itself, solves ``M.T X.T X M d = M.T g_i`` by CG to the accuracy that
rounding allows (about ``kappa u`` relative), and sets ``x_{i+1} = x_i + M d``. Their meta-stability
theorem: when each inner solve is accurate to ``O(kappa u)`` relative, two steps from a
sketch-and-solve start give a backward stable solution. Rather than always taking two, each step
ends with the Karlson-Walden estimate of the backward error, computed from the sketch's SVD in
``O(p^2)`` per column once ``g_i`` is known (:func:`backward_error_estimate`); the run stops when it
is at the stable level (``tol``, default ``10 u ||X||_F``) and reports ``converged=False`` with the
estimate when a step no longer halves it. ``docs/solvers.md`` derives why this is stable and shows
the measurements.

Rank-deficient ``X``: ``M`` spans the row space of ``S X``, which equals that of ``X`` when ``S``
embeds ``range(X)``, so the warm start and every update stay in the row space and the answer is the
minimum-norm solution.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import scipy.linalg

import rsketch.linalg._results as _results
from rsketch._backend import array_namespace, is_non_numpy_array, to_host
from rsketch.linalg._common import column_norms

_EPS = np.finfo(np.float64).eps
# The unit roundoff of float64.
_U = _EPS / 2
# Singular values of S X at most RANK_CUTOFF * u * s_1 count as zero (see sketched_factor).
RANK_CUTOFF = 8.0
#: Singular values of ``S X`` at most ``SUSPECT sqrt(n) u s_1`` may be the rounding of forming ``S X``:
#: each entry sums up to ``n`` products, so a zero singular value of ``X`` shows in ``S X`` above the
#: ``2 u s_1`` that :data:`RANK_CUTOFF` allows for. Measured, for an ``X`` of rank ``p - 1`` (``p = 6``,
#: 6 seeds, the default sketch sizes), as multiples of ``sqrt(n) u s_1``: Gaussian 0.17 and 0.06 at
#: ``n = 2,000`` and ``20,000``, sparse sign 0.06 to 0.01 (``n = 2,000`` to ``200,000``), SRHT 0.035 to
#: 0.004, CountSketch 0.026 to 0.005; a probe's ``8.2 u s_1`` at ``n = 400,000`` (0.013) and IHS's
#: ``22-30 u s_1`` there (0.047). Twice the largest. Their directions are re-checked against ``X``
#: itself (:func:`confirmed_rank`), and a kept one sends ``X`` to the direct solve where it can
#: (:func:`near_singular`).
SUSPECT = 0.35


@dataclass(frozen=True)
class SketchedFactor:
    """The SVD ``S X = U diag(s) V.T`` as the solvers use it.

    Attributes
    ----------
    M : ndarray of shape (p, rank)
        ``V_k / s_k``: right preconditioner (``X @ M`` has orthonormal-like columns).
    s : ndarray of shape (min(r, p),)
        All singular values of ``S X``.
    rank : int
        How many of them lie above :data:`RANK_CUTOFF` ``* u * s_1``.
    Vt : ndarray of shape (min(r, p), p)
        All right singular vectors (rows), for the backward-error estimate.
    presolve : ndarray of shape (p, k) or None
        The sketch-and-solve solution ``argmin ||S X c - S y||`` (minimum norm) for the ``S y``
        given to :func:`sketched_factor`, or None.
    missed : bool
        Whether the sketch mapped a direction that ``X`` does not map to (near) zero to (near) zero:
        ``S`` is no subspace embedding of ``range(X)`` (found by :func:`confirmed_rank`).

    Examples
    --------
    >>> import numpy as np
    >>> f = sketched_factor(np.diag([4.0, 2.0]))
    >>> f.kappa, f.frobenius == float(np.sqrt(20.0)), f.rank
    (2.0, True, 2)
    """

    M: np.ndarray
    s: np.ndarray
    rank: int
    Vt: np.ndarray
    presolve: np.ndarray | None = None
    missed: bool = False

    @property
    def kappa(self) -> float:
        """``s_1 / s_k``: the condition number of ``X`` as the sketch sees it (within ``1 +- eps_S``)."""
        return float(self.s[0] / self.s[self.rank - 1]) if self.rank else 1.0

    @property
    def frobenius(self) -> float:
        """``||S X||_F``, whose square is an unbiased estimate of ``||X||_F^2`` (``E[S.T S] = I``)."""
        return float(np.sqrt(np.sum(self.s**2)))


def _sketch_rank(s) -> int:
    """The singular values of ``S X`` above :data:`RANK_CUTOFF` ``u s_1`` (none of a zero ``S X``)."""
    return int(np.count_nonzero(s > s[0] * RANK_CUTOFF * _U)) if s.size and s[0] > 0 else 0


def _band(s, n: int) -> float:
    """``SUSPECT sqrt(n) u s_1``: below it a singular value of ``S X`` may be its rounding's."""
    return float(s[0]) * SUSPECT * math.sqrt(n) * _U if s.size else 0.0


def confirmed_rank(s, Vt, x_norms, n: int, check_dropped: bool = False) -> tuple[int, bool]:
    """The rank of ``X`` from the SVD ``S X = U diag(s) V.T`` and ``X``'s own products; whether the
    sketch missed a direction of ``range(X)``.

    ``S X`` is formed with sums of up to ``n`` products, whose rounding lifts a zero singular value
    of ``X`` to up to ``sqrt(n) u s_1`` (:data:`SUSPECT`), above :data:`RANK_CUTOFF` ``u s_1``: a rank-1
    ``X`` of 400,000 rows kept its second direction (``8.2 u s_1``), and the solvers returned
    coefficients ``1e17`` times the minimum-norm ones with ``converged=True`` (found by probing,
    2026-12-06). ``X v`` sums only ``p`` products, so directions ``v`` whose singular value lies
    below ``SUSPECT sqrt(n) u s_1`` are judged by ``||X v||`` (``x_norms(V)``, one product with ``X``,
    made only where a kept direction lies there) against ``max(RANK_CUTOFF, sqrt(p)) u s_1``. A
    kept direction that fails ends the rank. With ``check_dropped`` (sketch-and-solve, whose answer
    rests on the sketch alone) the dropped directions, and those outside ``S X``'s row space when it
    has fewer rows than ``X`` has columns, are checked too: one that ``X`` maps to ten times the
    bound shows a sketch that is no embedding of ``range(X)`` (``missed``).

    Examples
    --------
    >>> import numpy as np
    >>> X = np.outer(np.arange(1.0, 5.0), [1.0, 2.0])  # rank 1
    >>> s, Vt = np.array([5.5, 1e-15]), np.array([[0.447, 0.894], [0.894, -0.447]])
    >>> confirmed_rank(s, Vt, lambda V: np.linalg.norm(X @ V, axis=0), n=10**6)
    (1, False)
    """
    p = Vt.shape[1]
    rank = _sketch_rank(s)
    first = int(np.count_nonzero(s[:rank] > _band(s, n)))  # the kept directions in the band come last
    last = Vt.shape[0] if check_dropped else rank
    outside = check_dropped and Vt.shape[0] < p  # S X has fewer rows than X has columns
    if first == last and not outside:
        return rank, False
    V = Vt[first:last].T
    if outside:
        V = np.hstack([V, scipy.linalg.null_space(Vt)])
    norms = np.asarray(x_norms(V), dtype=np.float64)
    bound = (float(s[0]) if s.size else 0.0) * max(RANK_CUTOFF, math.sqrt(p)) * _U
    kept = first  # the kept suspects count up to the first that X maps to rounding
    while kept < rank and norms[kept - first] > bound:
        kept += 1
    return kept, bool(np.any(norms[rank - first :] > 10 * bound))


def near_singular(factor, n: int) -> bool:
    """Whether ``S X`` kept a singular value where its own rounding could have put a zero of ``X``
    (at most :data:`SUSPECT` ``sqrt(n) u s_1``): the sketch cannot settle ``X``'s rank there, and a
    direction ``X`` maps to rounding would give coefficients of ``1e13`` to ``1e17`` (the solution of
    another problem). :func:`confirmed_rank`'s products cannot settle it either: the sketch's ``v``
    is off by up to the same angle, and ``||X v||`` showed ``13-16 u s_1`` for a zero of ``X``.

    Examples
    --------
    >>> import numpy as np
    >>> near_singular(sketched_factor(np.diag([1.0, 1e-15])), n=10**6), near_singular(
    ...     sketched_factor(np.diag([1.0, 1e-6])), n=10**6)
    (True, False)
    """
    return bool(factor.rank) and bool(factor.s[factor.rank - 1] <= _band(factor.s, n))


def sketched_factor(SX, SY=None, x_norms=None, n=None, check_dropped=False):
    """Preconditioner, singular values and the sketch-and-solve solution from ``S X`` (and ``S y``).

    Parameters
    ----------
    SX : ndarray of shape (r, p)
        Or an array of another library (CuPy): its QR runs there, the ``p x p`` rest on the host.
    SY : ndarray of shape (r, k), optional
        The sketched right-hand sides, for :attr:`SketchedFactor.presolve` (of ``SX``'s library).
    x_norms : callable, optional
        ``V -> ||X V||`` per column, and ``n``, ``X``'s rows: the rank is then confirmed against
        ``X`` (:func:`confirmed_rank`, with ``check_dropped``); without them, the singular values
        of ``S X`` alone decide.

    Returns
    -------
    SketchedFactor

    Notes
    -----
    ``S X = Q R`` (LAPACK's Householder QR), then the SVD ``R = U_r diag(s) V.T`` of the ``p x p``
    triangle; ``Q.T S y`` gives the sketch-and-solve solution without forming ``U = Q U_r``. They run
    on OpenBLAS's threads as the process has them set: rsketch never changes that setting (on a busy
    two-core machine threaded LAPACK on a small matrix can be slow; ``docs/solvers.md``). The rank
    keeps the singular values above ``8 u s_1`` (``u = eps / 2``). A computed SVD of
    a rank-deficient ``S X`` shows its zero singular values as about ``2 u s_1`` (measured for ``r``
    from 500 to 20,000), so they are dropped and the answer is the minimum-norm one; and dropping a
    singular value below ``8 u s_1`` is itself a perturbation of ``X`` of at most ``8 u ||X||``, so
    the truncated answer is still backward stable. NumPy's ``matrix_rank`` cutoff,
    ``max(r, p) eps s_1``, would drop genuine singular values of a matrix with condition number
    ``1e14`` and cost a backward error of ``1e-14``.

    Examples
    --------
    >>> import numpy as np
    >>> f = sketched_factor(np.diag([3.0, 2.0, 0.0]), np.ones((3, 1)))
    >>> f.rank, f.M.shape, f.presolve.ravel().tolist()
    (2, (3, 2), [0.3333333333333333, 0.5, 0.0])
    """
    if is_non_numpy_array(SX):  # on a device: the QR there (cuSOLVER), the p x p rest on the host
        xp = array_namespace(SX)
        if SX.shape[0] > SX.shape[1]:
            Q, R = xp.linalg.qr(SX)
            SX, SY = R, None if SY is None else xp.matrix_transpose(Q) @ SY
        return sketched_factor(to_host(SX), None if SY is None else to_host(SY), x_norms, n, check_dropped)
    if SX.shape[0] > SX.shape[1]:
        Q, R = scipy.linalg.qr(SX, mode="economic", check_finite=False)
        U, s, Vt = scipy.linalg.svd(R, check_finite=False, lapack_driver="gesdd")
        qty = None if SY is None else Q.T @ SY
    else:  # r <= p: the SVD of the small S X itself
        U, s, Vt = scipy.linalg.svd(SX, full_matrices=False, check_finite=False, lapack_driver="gesdd")
        qty = SY
    missed = False
    if x_norms is not None:
        rank, missed = confirmed_rank(s, Vt, x_norms, n, check_dropped)
    else:
        rank = _sketch_rank(s)
    M = Vt[:rank].T / s[:rank]
    presolve = None if qty is None else M @ (U[:, :rank].T @ qty)
    return SketchedFactor(M, s, rank, Vt, presolve, missed)


def backward_error_estimate(factor, g, rnorm, coef):
    """Karlson-Walden backward error of ``coef``, estimated from the sketch, per column.

    The Karlson-Walden estimate is ``||(X.T X + t^2 I)^(-1/2) X.T r|| / ||coef||`` with
    ``t = ||r|| / ||coef||``; it is within a factor ``sqrt(2)`` of the smallest ``||dX||_F`` for
    which ``coef`` solves the problem with ``X + dX`` (Gu 1998). With ``X.T X`` replaced by
    ``(S X).T (S X) = V diag(s^2) V.T`` it costs ``O(p^2)`` once ``g = X.T r`` is known, and a
    subspace embedding with distortion ``eps_S`` keeps it within ``(1 +- eps_S)`` of the true one.
    ``coef = 0`` gives the limit ``||g|| / ||r||``.

    Parameters
    ----------
    factor : SketchedFactor
    g : ndarray of shape (p, k)
        ``X.T (y - X coef)``.
    rnorm : ndarray of shape (k,)
        ``||y - X coef||``.
    coef : ndarray of shape (p, k)

    Returns
    -------
    ndarray of shape (k,)
        In units of ``X`` (divide by ``||X||_F`` for the relative backward error).

    Examples
    --------
    >>> import numpy as np
    >>> X = np.vstack([np.eye(2), np.zeros((2, 2))]); y = np.array([[1.0], [2.0], [3.0], [0.0]])
    >>> f = sketched_factor(X)  # an "embedding" with no distortion
    >>> coef = np.array([[1.0], [2.0]])  # the solution: X.T r = 0
    >>> float(backward_error_estimate(f, X.T @ (y - X @ coef), np.array([3.0]), coef)[0])
    0.0
    """
    cn = column_norms(coef)
    # Every direction of the sketch's SVD, the ones the rank rule dropped included: a solution
    # that ignores a small singular value leaves its component of g, weighted by 1 / sqrt(s^2 + t^2).
    z = factor.Vt @ g
    s2 = factor.s**2
    out = np.zeros(coef.shape[1])
    for j in range(coef.shape[1]):
        if cn[j] > 0 and rnorm[j] > 0:
            w = z[:, j] / np.sqrt(s2 + (rnorm[j] / cn[j]) ** 2)
            out[j] = math.sqrt(float(w @ w)) / cn[j]
        elif cn[j] > 0:  # a zero residual: every direction with s > 0 counts by 1 / s
            live = factor.s > 0
            w = z[live, j] / factor.s[live]
            out[j] = math.sqrt(float(w @ w)) / cn[j]
        elif rnorm[j] > 0:
            out[j] = math.sqrt(float(g[:, j] @ g[:, j])) / rnorm[j]
    return out


# Refinement steps at most; the gain a step must bring to earn another; the fraction of tol that
# steps aim for.
MAX_STEPS = 6
STEP_GAIN = 0.5
AIM = 0.25
POLISH = 1e-4


def refine(design, Y, coef, factor, *, tol, max_iter, log, inner="cg"):
    """Iterative refinement from ``coef``: corrections until the backward error is at ``tol``.

    Step ``i`` recomputes ``g = X.T (y - X coef)`` from ``X`` (one pass; summed in double-double
    after the first step, so that the estimate that judges the step is not limited by the
    gradient's own rounding), estimates the backward error (:func:`backward_error_estimate`), and,
    for the columns above ``tol * ||X||_F``, adds ``M d`` with ``d`` solving
    ``M.T X.T X M d = M.T g``: by CG (``inner="cg"``, one fused pass per iteration, run to the
    accuracy rounding allows), or (``inner="gram"``) by a Cholesky solve with ``M.T G M``, where
    ``G = X.T X`` was computed once (:func:`whitened_gram`). The Gram solve is exact up to the
    rounding of ``G``, about ``u kappa^2`` relative, so each step contracts the error by that much;
    a step that fails to halve the estimate switches the remaining steps to CG.

    Parameters
    ----------
    design : rsketch.linalg._design.Design
    Y : ndarray of shape (n, k)
    coef : ndarray of shape (p, k)
        Warm start (not modified).
    factor : SketchedFactor
    tol : float
        Target relative backward error (estimate over ``||S X||_F``, which estimates ``||X||_F``).
    max_iter : int
        Most CG iterations in all (each one pass over ``X``), Gram solves counting one each; the
        gradient passes are extra.
    log : SolverLog
        Receives the relative backward-error estimates and the CG measures.
    inner : {"cg", "gram"}
        How the corrections are solved (``"gram"`` computes ``X.T X`` first; :func:`choose_inner`).

    Returns
    -------
    coef, iterations, converged, residual_norms, backward_errors
        ``converged`` is True when every column's estimate is at most ``tol``.
    """
    coef = coef.copy()
    k = Y.shape[1]
    frob = factor.frobenius
    target = tol * frob
    aim = AIM * target  # steps continue below tol while they pay, so that a result is not at the line
    iterations = 0
    prev_fe = np.full(k, np.inf)
    best = {"est": np.full(k, np.inf), "coef": coef.copy(), "rnorm": np.zeros(k)}
    strikes = np.zeros(k, dtype=int)  # steps in a row that did not halve the best estimate
    at_floor = np.ones(k, dtype=bool)  # whether the last inner solve stopped at its rounding floor
    kappa_u = max(factor.kappa, 1.0) * _U
    s_min = factor.s[factor.rank - 1] if factor.rank else 0.0
    ynorm = column_norms(Y)
    rnorm = ynorm
    chol = whitened_gram(design, factor.M, Y, coef) if inner == "gram" else None
    log.inner = "cg" if chol is None else "gram"
    first = design.first_gradient(Y, coef) if chol is not None else None
    for step in range(MAX_STEPS + 1):
        if step == 0 and first is not None:
            g, rn2 = first
        else:
            g, rn2 = design.residual_gradient(
                Y, coef, accuracy=_accuracy(step, rnorm, ynorm, design.shape[0])
            )
        rnorm = np.sqrt(rn2)
        c = factor.M.T @ g
        cn = column_norms(coef)
        todo = np.ones(k, dtype=bool)
        if step > 0:
            est = backward_error_estimate(factor, g, rnorm, coef)
            log.backward_errors.append(float(est.max() / frob) if frob > 0 else 0.0)
            # Near cond(X) = 1/u a step can make the estimate worse: keep the best iterate, and allow
            # a column two steps in a row without halving it before giving up.
            if chol is not None and ((est > aim) & (est > GRAM_GAIN * best["est"])).any():
                # A Gram step gains u kappa^2 p <= 1e-3 or better; one that does not was stalled by
                # the Gram's rounding: CG from here on.
                chol, log.inner = None, "gram+cg"
            strikes = np.where(est < STEP_GAIN * best["est"], 0, strikes + 1)
            better = est < best["est"]
            best["est"] = np.where(better, est, best["est"])
            best["coef"][:, better] = coef[:, better]
            best["rnorm"] = np.where(better, rnorm, best["rnorm"])
            # The forward error's estimate: coef - coef_opt = (X.T X)^+ g, about M M.T g.
            fe = column_norms(factor.M @ c) / np.where(cn > 0, cn, 1.0)
            # A backward-stable solver's forward error is about kappa u (Householder QR's measured
            # 0.8-8 kappa u on the stability family); polishing below a tenth of that buys nothing.
            need_be, need_fe = best["est"] > aim, fe > max(2 * _U, 0.1 * kappa_u)
            # A step that stopped at the rounding floor leaves a correction for the next (SPIR's
            # second step); otherwise a column goes on while a measure it has not met still falls.
            go = (at_floor & (step < 2)) | (need_be & (strikes < 2)) | (need_fe & (fe < STEP_GAIN * prev_fe))
            if not go.any() or step == MAX_STEPS or iterations >= max_iter:
                est = best["est"]
                converged = bool((est <= target).all())
                return best["coef"], iterations, converged, best["rnorm"], est / frob if frob else est
            todo, prev_fe = go, fe
        c = c * todo  # finished columns stay as they are
        # From the third step on, a step only polishes the forward error left by the previous one
        # (the backward error is done by then): four digits of it are enough.
        floor = max(0.1 * kappa_u, POLISH if step >= 2 else 0.0) * column_norms(c)
        # Solve until the correction's remaining error, at most ||rho|| / s_min, is a tenth of u ||coef||,
        # or to where rounding stops the inner solve anyway (about kappa u relative to ||c||).
        enough = 0.1 * _U * s_min * cn
        at_floor = floor >= enough
        if chol is not None:
            if iterations >= max_iter:
                d, used = np.zeros_like(c), 0
            else:  # exact up to the Gram's rounding, which the next step corrects if it must:
                # the estimate after it judges it, with no floor of CG's to work past.
                d, used, at_floor = scipy.linalg.cho_solve(chol, c), 1, np.zeros(k, dtype=bool)
                log.gradient_norms.append(float(column_norms(c).max()))
        else:
            d, used = _cg(design, factor.M, c, np.maximum(floor, enough), max_iter - iterations, log)
        iterations += used
        coef += factor.M @ d
    raise AssertionError("unreachable")  # pragma: no cover


# The Gram path: at most this many columns (X.T X costs n p^2 flops, about p / 8 passes over X on the
# machines measured, against about 20 CG passes), and a predicted rounding u kappa^2 p of M.T G M at
# most GRAM_ROUNDING, so that each correction gains at least three digits.
GRAM_MAX_P = 128
GRAM_ROUNDING = 1e-3
GRAM_GAIN = 1e-2


def choose_inner(design, factor):
    """``"gram"`` where a Gram solve beats CG and its rounding leaves room to refine, else ``"cg"``.

    Examples
    --------
    >>> import numpy as np
    >>> from rsketch.linalg._design import Design
    >>> X = np.random.default_rng(0).standard_normal((200, 5))
    >>> choose_inner(Design(X), sketched_factor(X))
    'gram'
    >>> choose_inner(Design(X), sketched_factor(X @ np.diag([1, 1, 1, 1, 1e-9])))
    'cg'
    """
    p = design.shape[1]
    if design.sparse or p > GRAM_MAX_P or factor.rank == 0:
        return "cg"
    return "gram" if _U * factor.kappa**2 * p <= GRAM_ROUNDING else "cg"


def whitened_gram(design, M, Y=None, coef=None):
    """The Cholesky factor of ``M.T (X.T X) M`` (for ``scipy.linalg.cho_solve``), or None.

    ``X.T X`` is one pass of ``n p^2`` flops (:meth:`Design.gram_matrix`, which also sums the first
    gradient at ``coef`` in that pass when given ``Y`` and ``coef``); its rounding, about
    ``u ||X||^2``, is ``u kappa^2`` relative to the whitened system, which stays positive
    definite while that is below one. None when Cholesky finds it is not (then CG is used).
    """
    W = M.T @ (design.gram_matrix(Y, coef) @ M)
    try:
        return scipy.linalg.cho_factor((W + W.T) / 2, lower=False, check_finite=False)
    except np.linalg.LinAlgError:
        return None


def _accuracy(step, rnorm, ynorm, n):
    """How carefully step ``step`` computes its gradient, from the residual the last step left.

    The first gradient only starts step 1, which the next one checks: plain sums. After that the
    gradient judges the step, so it is summed in double-double; the residual itself is computed
    error-free (Dot2) when it is small, ``||r|| < 32 ||y|| / sqrt(n)``. Above that, a plain residual's
    rounding (about ``u ||y|| / sqrt(n)`` per row, unrelated to ``range(X)``) moves the backward-error
    estimate by less than ``u / 32`` of ``||X||_F``.
    """
    if step == 0:
        return "fast"
    small = rnorm * math.sqrt(n) < 32.0 * ynorm
    return "exact" if small.any() else "compensated"


def _cg(design, M, c, target, budget, log):
    """CG on ``M.T X.T X M d = c`` per column until ``||c - M.T X.T X M d|| <= target``."""
    s = c.copy()
    d = np.zeros_like(c)
    pdir = s.copy()
    gamma = np.einsum("ij,ij->j", s, s)
    used = 0
    while used < budget and (np.sqrt(gamma) > target).any():
        live = np.sqrt(gamma) > target
        q, pq = design.gram(M @ (pdir * live))  # X.T X (M p) and ||X M p||^2: one pass
        q = M.T @ q
        used += 1
        ok = live & (pq > 0)
        alpha = np.where(ok, gamma / np.where(ok, pq, 1.0), 0.0)
        d += alpha * pdir
        s -= alpha * q
        gamma_new = np.einsum("ij,ij->j", s, s)
        log.gradient_norms.append(float(np.sqrt(gamma_new).max()))
        beta = np.where(ok, gamma_new / np.where(ok, gamma, 1.0), 0.0)
        pdir = s + beta * pdir
        gamma = np.where(ok, gamma_new, 0.0)
    return d, used


def predicted_rate(p: int, r: int) -> float:
    """``sqrt(p / r)``: the per-iteration contraction CG attains with a Gaussian-like sketch.

    Examples
    --------
    >>> predicted_rate(100, 400)
    0.5
    """
    return math.sqrt(p / r)


def default_max_iter(p: int, r: int) -> int:
    """Three times the iterations of a ``1e-16`` reduction at the predicted rate, plus 10.

    One refinement step from a sketch-and-solve start needs at most one such reduction; ill-
    conditioned problems take two or three shorter steps (each reduces by about ``kappa u``).

    Examples
    --------
    >>> default_max_iter(100, 4000)
    70
    """
    rate = min(predicted_rate(p, r), 0.95)
    return int(3 * math.ceil(math.log(1e-16) / math.log(rate)) + 10)


def warn_not_converged(method, iterations, measure, tol, what="error measure"):
    """Issue the :class:`ConvergenceWarning` of a run that stopped with ``converged=False``."""
    warnings.warn(
        f"lstsq(method={method!r}) stopped after {iterations} iterations with {what} {measure:.3g} > "
        f"tol={tol:.3g}; the result has converged=False. Raise max_iter or sketch_size, or loosen tol; "
        "a backward error that will not fall means X is too ill-conditioned for float64 (cond(X) near "
        "1/eps).",
        _results.ConvergenceWarning,
        stacklevel=3,
    )
