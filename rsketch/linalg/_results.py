"""The result object of the least-squares solvers (SciPy-style, named fields) and its timing log."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np


def __getattr__(name):
    # ConvergenceWarning subclasses scikit-learn's, and importing scikit-learn takes a second and sets
    # the environment variables KMP_DUPLICATE_LIB_OK and KMP_INIT_AT_FORK: it is made when first asked
    # for (a solver's warning, an estimator, or a caller's reference), so that `import rsketch` alone
    # changes nothing (docs/operators.md, "Threads")
    if name == "ConvergenceWarning":
        return _convergence_warning()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _convergence_warning() -> type:
    import sklearn.exceptions

    class ConvergenceWarning(sklearn.exceptions.ConvergenceWarning):
        """An iterative method stopped before meeting its ``tol``: a solver at ``max_iter``
        (``converged=False``), or the adaptive range finder at its largest basis (``rank`` columns).

        A subclass of scikit-learn's (itself a ``UserWarning``), so that its filters,
        ``ignore_warnings(category=...)`` and ``pytest.warns`` with scikit-learn's class catch it too.

        Examples
        --------
        >>> import warnings, rsketch, sklearn.exceptions
        >>> issubclass(rsketch.ConvergenceWarning, sklearn.exceptions.ConvergenceWarning)
        True
        """

    ConvergenceWarning.__module__, ConvergenceWarning.__qualname__ = "rsketch", "ConvergenceWarning"
    return ConvergenceWarning


@dataclass
class SolverLog:
    """Where a solver spent its time, in seconds, and how its error went down (as PARLA logs).

    Attributes
    ----------
    sketch : float
        Drawing the sketch and computing ``S @ X`` and ``S @ y`` (all sketches, for IHS).
    factor : float
        The small factorisation (SVD of ``S @ X``) that gives the preconditioner.
    presolve : float
        The sketch-and-solve warm start.
    iterate : float
        The iterations (and the final residual).
    total : float
        Wall time of the whole call, validation included.
    gradient_norms : list of float
        Per iteration, the largest over columns of the iteration's error measure: for
        ``"precondition"`` the CG residual ``||M.T X.T X M d - M.T g||`` of the current refinement
        step (with Gram solves, ``||M.T g||`` of the step), for ``"ihs"`` the relative
        preconditioned gradient ``||M.T X.T (y - X coef)|| / ||y||``.
    backward_errors : list of float
        ``"precondition"``: after each refinement step, the largest over columns of the
        Karlson-Walden backward-error estimate from the sketch, relative to ``||S X||_F``
        (which estimates ``||X||_F``).
    backward_error : float, ndarray of shape (k,) or None
        The estimate for the returned ``coef`` (per right-hand side); None for sketch-and-solve,
        which computes no gradient.
    finish : str
        The finishing iteration used (``"refine"``, ``"ihs"``, ``"none"``, or ``"direct"`` where
        ``X`` was solved by LAPACK, no sketch being smaller).
    inner : str
        ``"precondition"``: how the refinement's corrections were solved: ``"cg"`` (conjugate
        gradients, a pass over ``X`` per iteration), ``"gram"`` (a Cholesky solve with ``X.T X``,
        computed once), or ``"gram+cg"`` (Gram solves, then CG once they stopped paying); else ``""``.
    passes : int or None
        Dask ``X``: the passes over ``X``, each a map-reduce over its chunks (the leverage scores', the
        sketch's and its range check's, ``X.T X``, gradients, CG iterations, the residual; IHS: ``X``'s
        largest entry, then a gradient and a sketch per iteration); None otherwise.

    Examples
    --------
    >>> from rsketch.linalg._results import SolverLog
    >>> SolverLog(sketch=0.1, total=0.3).sketch
    0.1
    """

    sketch: float = 0.0
    factor: float = 0.0
    presolve: float = 0.0
    iterate: float = 0.0
    total: float = 0.0
    gradient_norms: list = field(default_factory=list)
    backward_errors: list = field(default_factory=list)
    backward_error: object = None
    finish: str = "none"
    inner: str = ""
    passes: int | None = None


@dataclass
class LstsqResult:
    """The result of :func:`rsketch.lstsq`.

    Attributes
    ----------
    coef : ndarray of shape (p,) or (p, k)
        The solution (the minimum-norm one when ``X`` is rank-deficient); the shape follows ``y``.
    residual_norm : float or ndarray of shape (k,)
        ``||y - X coef||`` (per column for a matrix ``y``), computed from ``X`` itself.
    iterations : int
        Iterations taken (0 for sketch-and-solve). Each costs one pass over ``X`` (and, for
        IHS, one new sketch).
    converged : bool
        Whether the stopping test was met (always True for sketch-and-solve, which is direct).
    method : str
        ``"sketch_and_solve"``, ``"precondition"`` or ``"ihs"``.
    sketch : SketchOperator or None
        The operator used (the first one for IHS); None where no sketch could be smaller than
        ``X`` (the default ``sketch_size`` reaches ``n``) and ``X`` was solved by LAPACK's
        ``gelsy`` (``iterations`` 0, ``log.finish`` ``"direct"``).
    rank : int
        Numerical rank of ``X`` as seen through the sketch (singular values of ``S X`` above
        ``max(r, p) * eps`` times the largest), or of ``X`` itself when solved directly.
    sketch_size : int
        ``r``, the number of rows of the sketch (``n`` when solved directly).
    log : SolverLog
        Timings (sketch, factorisation, presolve, iterations) and the gradient history.

    Examples
    --------
    >>> import numpy as np, rsketch
    >>> X = np.random.default_rng(0).standard_normal((2000, 5))
    >>> res = rsketch.lstsq(X, X @ np.arange(5.0), seed=0)
    >>> res.method, res.rank, res.converged
    ('precondition', 5, True)
    >>> np.allclose(res.coef, np.arange(5.0))
    True
    """

    coef: np.ndarray
    residual_norm: float | np.ndarray
    iterations: int
    converged: bool
    method: str
    sketch: object
    rank: int
    sketch_size: int
    log: SolverLog = field(default_factory=SolverLog)

    def __repr__(self) -> str:
        rn = self.residual_norm
        rn = f"{rn:.6g}" if np.ndim(rn) == 0 else np.array2string(np.asarray(rn), precision=6)
        sketch = "None" if self.sketch is None else f"{type(self.sketch).__name__}(r={self.sketch_size})"
        return (
            f"LstsqResult(method={self.method!r}, coef shape={np.shape(self.coef)}, residual_norm={rn}, "
            f"iterations={self.iterations}, converged={self.converged}, rank={self.rank}, "
            f"sketch={sketch}, "
            f"time={self.log.total:.3g}s)"
        )
