"""``rsketch.lstsq``: one entry point for sketch-and-solve, sketch-and-precondition and IHS."""

from __future__ import annotations

import numbers
import time
import warnings

import numpy as np
import scipy.linalg
import scipy.sparse as sp

import rsketch.linalg._results as _results
from rsketch._backend import is_non_numpy_array, like, to_host
from rsketch._validation import (
    LSTSQ_INNER_SOLVERS,
    LSTSQ_METHODS,
    available_memory,
    check_allocation,
    check_finite,
    check_int,
    check_option,
    check_seed,
)
from rsketch.dask._leverage import SCORE_PASSES
from rsketch.dask._sketch import is_dask_array
from rsketch.linalg._common import (
    SKETCH_KINDS,
    column_norms,
    default_sketch_size,
    design_for,
    product_norms,
    resolve_sketch,
    validate_problem,
)
from rsketch.linalg._ihs import ihs
from rsketch.linalg._precondition import (
    GRAM_MAX_P,
    choose_inner,
    default_max_iter,
    near_singular,
    refine,
    sketched_factor,
    warn_not_converged,
)
from rsketch.linalg._results import LstsqResult, SolverLog
from rsketch.linalg._scaling import scale_columns, scale_design, sketch_design, unscale

# precondition: the stable level, a backward error of 10 u relative to ||X||_F (u = eps / 2).
DEFAULT_TOL = {"precondition": 10 * np.finfo(np.float64).eps / 2, "ihs": 1e-12}


def _check_tol(tol, method):
    if tol is None:
        return DEFAULT_TOL.get(method, 0.0)
    if isinstance(tol, bool) or not isinstance(tol, numbers.Real):
        raise TypeError(f"tol must be a real number, got {type(tol).__name__}")
    tol = float(tol)
    if not (0.0 < tol < 1.0):
        raise ValueError(f"tol must lie in (0, 1), got {tol!r}")
    return tol


def lstsq(
    X,
    y,
    *,
    sketch="sparse_sign",
    sketch_size=None,
    method="precondition",
    seed=None,
    tol=None,
    max_iter=None,
    inner_solver="auto",
):
    """Least squares ``min ||X coef - y||`` by sketching.

    Parameters
    ----------
    X : array_like or scipy.sparse matrix of shape (n, p), n >= p
        Dense (any layout; C-contiguous float64 is fastest: one pass per iteration) or sparse.
        Integer and float32 input is converted to float64. A CuPy array (or one of another
        array-API library) is solved on its device, ``y`` with it, and ``coef`` returned there
        (``docs/gpu.md``).
    y : array_like of shape (n,) or (n, k)
        One or ``k`` right-hand sides (solved together; each column has its own iteration).
    sketch : str or SketchOperator, default "sparse_sign"
        A kind for :func:`rsketch.make_sketch` (``"gaussian"``, ``"srht"``, ``"countsketch"``,
        ``"sparse_sign"``, ``"leverage"``, ``"uniform"``), or an operator of shape ``(r, n)``.
        ``"sparse_sign"`` (8 nonzeros per column; 2 when it only preconditions, see
        :func:`build_sketch`) is one cheap pass over ``X`` and embeds as well as a Gaussian at
        this size. ``"leverage"`` computes exact leverage scores (``O(n p^2)``).
    sketch_size : int, optional
        ``r``. Default :func:`default_sketch_size`: ``min(n, 40 p)`` for ``"precondition"``,
        ``min(n, 20 p)`` for ``"sketch_and_solve"``, ``min(n, 10 p)`` for ``"ihs"`` (at least
        ``2 p``). Must be ``>= p`` for ``"precondition"`` and ``"ihs"``.
    method : {"precondition", "sketch_and_solve", "ihs"}, default "precondition"
        ``"sketch_and_solve"``: ``argmin ||S (X coef - y)||``, the estimator Raskutti & Mahoney study
        (one sketch, no pass over ``X`` beyond it and the residual; accuracy ``1 + O(p/r)`` in the
        squared residual). ``"precondition"``: sketch-and-precondition with iterative refinement,
        backward stable like Householder QR (``docs/solvers.md`` derives why). ``"ihs"``: iterative
        Hessian sketch (Pilanci & Wainwright 2016), a fresh sketch each iteration.
    seed : None, int, SeedSequence, Generator or RandomState
        Randomness of the sketch(es); a fixed int gives the same sketch, and the same ``S X`` bit for
        bit under any thread count. The answer is bitwise reproducible for a fixed BLAS thread count:
        the QR and SVD of ``S X`` go through LAPACK, whose rounding follows OpenBLAS's threads
        (``docs/operators.md``, "Threads"). Not used where ``sketch`` is an operator: the operator's
        own seed fixed it, and IHS derives its later sketches from that operator's key.
    tol : float in (0, 1), optional
        ``"precondition"``: the target backward error, relative to ``||X||_F`` (the Karlson-Walden
        estimate from the sketch, per column); default ``10 u = 1.1e-15``, the stable level.
        ``"ihs"``: stop when ``||M.T X.T (y - X coef)|| <= tol ||y||`` per column (default ``1e-12``),
        and the backward-error estimate is at most ``10 sqrt(p) eps`` (or ``tol``, where a larger
        ``tol`` is given). Ignored by sketch-and-solve.
    max_iter : int, optional
        Most iterations (passes over ``X``). Default: three times the count the sketch size predicts
        for a ``1e-16`` reduction, plus 10 (precondition, 70 at ``r = 40 p``); 100 for IHS.
        A Gram solve (``inner_solver="gram"``) counts as one iteration.
    inner_solver : {"auto", "cg", "gram"}, default "auto"
        ``"precondition"``: how each refinement step solves for its correction. ``"cg"``: conjugate
        gradients on the preconditioned normal equations, one pass over ``X`` per iteration.
        ``"gram"``: ``X.T X`` computed once (``n p^2`` flops), then a Cholesky solve per step, exact
        up to the Gram's rounding (``u kappa^2``), which the next step corrects; where that rounding
        stalls a step, CG takes over. ``"auto"`` takes the Gram for dense ``X`` with ``p <= 128``
        and ``u kappa^2 p <= 1e-3`` (``kappa`` from the sketch), where it costs fewer passes'
        time than CG's twenty (``docs/solvers.md``). The accuracy contract is the same for all.

    Returns
    -------
    LstsqResult
        ``coef``, ``residual_norm``, ``iterations``, ``converged``, ``method``, ``sketch``, ``rank``,
        ``sketch_size`` and ``log`` (timings of sketch, factorisation, presolve, iterations; for
        ``"precondition"`` and ``"ihs"`` the backward-error estimate, ``log.backward_error``, and
        the inner solver used, ``log.inner``). ``converged`` is True for ``"precondition"`` only
        when that estimate is at most ``tol``, for ``"ihs"`` only when it is at most ``10 sqrt(p) eps``
        (or a larger ``tol`` given); an unconverged IHS run returns its last iterate, or an earlier
        one of clearly smaller residual norm where it diverged.

    Raises
    ------
    ValueError
        ``n < p``; NaN or inf in ``X`` or ``y``; mismatched shapes; ``sketch_size < p`` for
        ``"precondition"``/``"ihs"``; an unknown ``method`` or ``sketch``; ``tol`` outside (0, 1); a
        solution beyond float64's range (it would overflow, or underflow to subnormals).
    TypeError
        Non-numeric or complex input, a non-integer ``sketch_size`` or ``max_iter``.

    Warns
    -----
    ConvergenceWarning
        When an iterative method stops before meeting ``tol`` (for ``"precondition"`` the message gives
        the backward-error estimate), and for ``"sketch_and_solve"`` when the sketch maps a direction of
        ``range(X)`` to zero; then ``converged=False``.

    Notes
    -----
    Rank-deficient ``X`` gives the minimum-norm solution, and ``rank`` counts the singular values
    of ``S X`` above ``8 u`` times the largest (``u = eps / 2``): dropping smaller ones perturbs ``X``
    by at most ``8 u ||X||``, so the answer stays backward stable. Data of any finite scale is first
    scaled by powers of two into a safe range (exact), as LAPACK's drivers do. float32 input is
    solved in float64 and the answer is backward stable for the float32 data as given.

    References
    ----------
    Raskutti & Mahoney, JMLR 17 (2016). Rokhlin & Tygert, PNAS 2008. Avron, Maymounkov & Toledo,
    SISC 2010 (Blendenpik). Meng, Saunders & Mahoney, SISC 2014 (LSRN). Pilanci & Wainwright, JMLR
    2016 (IHS). Meier, Nakatsukasa, Townsend & Webb, SIMAX 2024 (stability of
    sketch-and-precondition). Epperly, Meier & Nakatsukasa, 2024 (SPIR: refinement makes it backward
    stable; the backward-error estimate from the sketch).

    Examples
    --------
    >>> import numpy as np, rsketch
    >>> rng = np.random.default_rng(0)
    >>> X = rng.standard_normal((5000, 20)); y = X @ np.ones(20) + 0.1 * rng.standard_normal(5000)
    >>> res = rsketch.lstsq(X, y, seed=1)
    >>> ref = np.linalg.lstsq(X, y, rcond=None)[0]
    >>> bool(np.allclose(res.coef, ref, rtol=1e-12, atol=1e-12)), res.converged
    (True, True)
    >>> sas = rsketch.lstsq(X, y, method="sketch_and_solve", seed=1)
    >>> 1.0 <= sas.residual_norm / res.residual_norm < 1.1
    True
    """
    t_start = time.perf_counter()
    X_in = X
    check_option(method, "method", LSTSQ_METHODS)
    check_option(inner_solver, "inner_solver", LSTSQ_INNER_SOLVERS)
    X, Y, is_vector = validate_problem(X, y)
    n, p = X.shape
    tol_given, tol = tol, _check_tol(tol, method)
    if max_iter is not None:
        max_iter = check_int(max_iter, "max_iter", minimum=1)
    check_seed(seed)  # checked here too: a direct solve draws no sketch
    direct = _solves_directly(sketch, sketch_size, method, n, p)
    if direct:  # X dense on the host, gelsy's copy and QR's Q: 2 n p values (3 for a sparse, Dask or
        # float32 X, converted to a float64 copy first)
        dense64 = (isinstance(X, np.ndarray) or is_non_numpy_array(X)) and str(X.dtype).endswith("float64")
        copies = 2 if dense64 else 3
        check_allocation(
            8 * n * p * copies,
            f"lstsq's direct solve of a {n} x {p} X (the default sketch would have n rows or more)",
            f"pass a sketch_size between 2 p = {2 * p} and n = {n} to sketch X instead"
            if 2 * p < n
            else "X is too large to solve directly here, and too wide to sketch (a sketch needs 2 p rows)",
        )
    S, r = (None, n) if direct else resolve_sketch(sketch, n, p, sketch_size, method, seed, X)
    log = SolverLog()
    if is_dask_array(X) and not direct:  # docs/dask.md: log.passes counts every pass over X
        # the approximate leverage scores' passes, where lstsq computed them (rsketch.dask.leverage_sampling)
        log.passes = SCORE_PASSES if isinstance(sketch, str) and sketch == "leverage" else 0
    if direct and is_dask_array(X):
        # No sketch is smaller than X, and S X would come to the client whole (r = n rows): X itself
        # does, in one pass over its chunks, and is solved as in memory (a square sketch gave
        # coef 0 with converged=True for a 2 x 1 column of ones).
        X, log.passes = np.asarray(X.compute()), 1
    elif direct and is_non_numpy_array(X):
        # The same for a device X (CuPy): its n x p copy on the host is the size of S X, and the
        # answer goes back to the device.
        X, Y = to_host(X), np.ascontiguousarray(to_host(Y))
    Y, y_shift = scale_columns(Y)
    if direct:
        X, x_shift = scale_design(X)
        coef, rank, rnorm, iterations, converged = _direct_solve(X, Y, log)
    elif method == "ihs":
        X, x_shift = scale_design(X)
        if log.passes is not None:  # Dask: X's largest entry; ihs adds its iterations' passes
            log.passes += 1
        # A tol given sets the backward error asked for too (at least the stable level ihs uses).
        coef, iterations, converged, rnorm, rank, shortfall = ihs(
            X,
            Y,
            S,
            tol=tol,
            max_iter=100 if max_iter is None else max_iter,
            log=log,
            backward_tol=None if tol_given is None else tol,
            settle=lambda X, factor: settle_directly(X, factor) and _direct_solve(X, Y, log),
        )
        if not converged:
            value, target, what = shortfall
            warn_not_converged(method, iterations, value, target, what=what)
    else:
        coef, rank, rnorm, iterations, converged, x_shift = _sketched_solve(
            X, Y, S, method, p=p, r=r, tol=tol, max_iter=max_iter, inner_solver=inner_solver, log=log
        )
    coef = unscale(coef, x_shift, y_shift)  # exact: powers of two
    rnorm = np.ldexp(rnorm, y_shift)
    log.total = time.perf_counter() - t_start
    if is_vector:
        coef, rnorm = coef[:, 0], float(rnorm[0])
        if log.backward_error is not None:
            log.backward_error = float(log.backward_error[0])
    return LstsqResult(
        coef=like(coef, X_in),  # on X's device
        residual_norm=rnorm,
        iterations=iterations,
        converged=bool(converged),
        method=method,
        sketch=S,
        rank=int(rank),
        sketch_size=int(r),
        log=log,
    )


def _sketched_solve(X, Y, S, method, *, p, r, tol, max_iter, inner_solver, log):
    """Sketch-and-solve or sketch-and-precondition of a scaled ``Y``: the sketch ``S X`` (``X``
    rescaled by a power of two where the sketch would leave the range), its factor and presolve,
    then, for ``"precondition"``, the refinement to ``tol``. Fills ``log``'s timings and passes;
    returns ``(coef, rank, residual norms, iterations, converged, X's shift)``."""
    t0 = time.perf_counter()
    design = design_for(X)
    # Where Gram solves may be taken and X's reads cost more than its arithmetic (Dask), the
    # sketch's pass also gives X.T X and X.T y.
    prefetch = method == "precondition" and inner_solver != "cg" and p <= GRAM_MAX_P
    prefetch = prefetch and hasattr(design, "sketch_with_normal_equations")
    first = (lambda S, X: design.sketch_with_normal_equations(S, Y)) if prefetch else None
    X, SX, x_shift, sketch_passes = sketch_design(S, X, first_pass=first)
    if x_shift:  # rescaled: products of the new X
        design = design_for(X)
    SY = S @ Y
    t1 = time.perf_counter()
    # the rank confirmed by X's own products where S X's rounding could hide a zero (one product)
    x_norms = product_norms(design)
    factor = sketched_factor(SX, SY, x_norms, X.shape[0], check_dropped=method == "sketch_and_solve")
    rank = factor.rank
    if settle_directly(X, factor):
        log.sketch = time.perf_counter() - t0
        return (*_direct_solve(X, Y, log), x_shift)
    t2 = time.perf_counter()
    coef = factor.presolve
    t3 = time.perf_counter()
    log.sketch, log.factor, log.presolve = t1 - t0, t2 - t1, t3 - t2
    if method == "sketch_and_solve":
        # a sketch that maps a direction of range(X) to zero solves another problem: a 2 x 1 column
        # of ones with sketch_size=2 gave coef 0 (rank 0, residual 1.41 for 0) and converged=True
        iterations, converged = 0, not factor.missed
        rnorm = _residual_norms(design, Y, coef)
        if factor.missed:
            warnings.warn(
                f"sketch_and_solve: the sketch (sketch_size={r}) maps a direction of range(X) to zero, so "
                "its solution is not X's (converged=False); use a larger sketch_size or another sketch",
                _results.ConvergenceWarning,
                stacklevel=3,
            )
    else:
        log.finish = "refine"
        if max_iter is None:
            max_iter = default_max_iter(p, r)
        inner = choose_inner(design, factor) if inner_solver == "auto" else inner_solver
        if inner == "gram" and design.sparse:
            raise ValueError("inner_solver='gram' needs a dense X; use 'cg' or 'auto' for sparse X")
        coef, iterations, converged, rnorm, log.backward_error = refine(
            design, Y, coef, factor, tol=tol, max_iter=max_iter, log=log, inner=inner
        )
        if not converged:
            worst = float(np.max(log.backward_error))
            warn_not_converged(method, iterations, worst, tol, what="backward error estimate")
    log.iterate = time.perf_counter() - t3
    if hasattr(design, "passes"):  # Dask: the scores', the sketch's (1 to 3) and the design's passes
        # the first pass, prefetched, is the design's too where it is still the design in use
        log.passes += sketch_passes - (1 if prefetch and not x_shift else 0) + design.passes
    return coef, rank, rnorm, iterations, converged, x_shift


def _solves_directly(sketch, sketch_size, method, n, p) -> bool:
    """Whether no sketch can be smaller than ``X``: the default ``sketch_size`` (a kind named, no
    size given) has at least ``n`` rows, for any ``X``: in memory (NumPy, dense or sparse), Dask or
    on a device (these two brought to the host, as ``S X`` of ``n`` rows would be anyway).
    Such a sketch only mixes the rows (and a square sparse sign of ``+-1`` entries can be singular
    on ``range(X)``: a 2 x 1 column of ones came out rank 0, with ``coef = 0``), so ``X`` is solved
    by LAPACK instead."""
    if not isinstance(sketch, str) or sketch_size is not None or sketch not in SKETCH_KINDS:
        return False
    return default_sketch_size(method, n, p) >= n


#: The direct solve's rank: ``gelsy`` keeps the leading pivoted columns whose triangle's condition
#: estimate stays below ``1 / (DIRECT_RANK_ULPS u)``, ``u = eps / 2`` (the sketched solvers drop the
#: singular values of ``S X`` below ``8 u`` times the largest: ``docs/solvers.md``).
DIRECT_RANK_ULPS = 8


def _direct_solve(X, Y, log):
    """LAPACK's ``gelsy`` (column-pivoted QR and a complete orthogonal factorization: backward stable
    as Householder QR, the minimum-norm solution where ``X`` is rank-deficient), then, where it finds
    ``X`` of full rank, Householder QR without pivoting, for the scaled ``X`` and ``Y``: ``(coef, rank,
    residual norms, iterations, converged)``. ``gelsd`` (SVD) left backward errors of ``4e-15`` where
    QR's were ``6e-17`` (``60 x 4``, ``kappa = 2e4``)."""
    t0 = time.perf_counter()
    check_finite(X, "X")  # the sketched paths find NaN/inf through the sketch's pass
    Xd = X.toarray() if sp.issparse(X) else X
    u = np.finfo(np.float64).eps / 2
    coef, _, rank, _ = scipy.linalg.lstsq(
        Xd, Y, cond=DIRECT_RANK_ULPS * u, lapack_driver="gelsy", check_finite=False
    )
    if rank == Xd.shape[1]:
        # Full rank: Householder QR without pivoting, as the accuracy contract's reference. gelsy's
        # solution was as backward stable, but its forward error 35-57x QR's at kappa = 1e7 with a
        # residual of norm 1 (n = 194 and 197, p = 10; test_random_problems_are_solved_stably).
        Q, R = scipy.linalg.qr(Xd, mode="economic", check_finite=False)
        coef = scipy.linalg.solve_triangular(R, Q.T @ Y, check_finite=False)
    log.factor, log.finish = time.perf_counter() - t0, "direct"
    return coef, int(rank), column_norms(Y - Xd @ coef), 0, True


#: A sketch that cannot settle ``X``'s rank (:func:`~rsketch.linalg._precondition.near_singular`)
#: hands an in-memory dense ``X`` of at most this many columns to the direct solve: its ``O(n p^2)``
#: is then below the refinement's, which runs to ``max_iter`` on such an ``X``.
NEAR_SINGULAR_DIRECT_P = 500


def settle_directly(X, factor) -> bool:
    """Whether ``X`` goes to :func:`_direct_solve` because its sketch cannot settle its rank: a rank-1
    ``X`` of 400,000 rows (``sigma_2 = 2.5 u sigma_1``) had coefficients ``1e13`` to ``1e17`` times the
    minimum-norm ones and ``converged=True`` from ``"precondition"`` and ``"ihs"`` (found by probing,
    2026-12-06). In memory and dense only, with room for the direct solve's two copies of ``X``;
    elsewhere the sketch's rank stands (``docs/solvers.md``)."""
    if not isinstance(X, np.ndarray) or X.shape[1] > NEAR_SINGULAR_DIRECT_P:
        return False
    if not near_singular(factor, X.shape[0]):
        return False
    room = available_memory()
    return room is None or 24 * X.size <= room


def _residual_norms(design, Y, coef):
    return column_norms(Y - design.matmul(coef))
