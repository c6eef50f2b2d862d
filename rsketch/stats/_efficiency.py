"""Statistical and worst-case efficiency of the sketch-and-solve least-squares estimator.

Raskutti & Mahoney (JMLR 2016) compare the sketched estimator
``beta_S = argmin ||S y - S X beta||`` with full-data OLS in three ways, for one sketch ``S``:

- worst-case (algorithmic) error ``C_WC(S) = ||y - X beta_S||^2 / ||y - X beta_OLS||^2`` for a given ``y``;
- prediction efficiency ``C_PE(S) = E_eps ||X (beta_S - beta_0)||^2 / E_eps ||X (beta_OLS - beta_0)||^2``;
- residual efficiency ``C_RE(S) = E_eps ||y - X beta_S||^2 / E_eps ||y - X beta_OLS||^2``,

under ``y = X beta_0 + eps`` with ``E eps = 0``, ``Cov eps = sigma^2 I_n``; expectations are over the noise
for a fixed sketch. :func:`efficiency` estimates their distribution over sketch draws.

The closed form (derived here, see ``docs/efficiency.md``): with ``X = U Sigma V^T`` (``U`` n x p
orthonormal) and ``M = (U^T S^T S U)^{-1} U^T S^T S``, ``X beta_S = U M y`` and ``M U = I``, hence
``X (beta_S - beta_0) = U M eps`` and ``y - X beta_S = (I - U M) eps``, so

    C_PE(S) = ||M||_F^2 / p,        C_RE(S) = 1 + p (C_PE(S) - 1) / (n - p).

Per draw we never form an n x n matrix: with the thin SVD ``S U = Q diag(s) W^T``,
``||M||_F^2 = sum_k ||(S^T Q)[:, k]||^2 / s_k^2``, which costs one ``S @ U`` and one ``S.T @ Q``.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field

import numpy as np
import scipy.linalg
import scipy.sparse as sp
from scipy.special import ndtr, ndtri

from rsketch._backend import array_namespace, check_same_library, is_non_numpy_array, like, to_host
from rsketch._exact_scaling import max_abs, shift_down, unit_exponents
from rsketch._progress import progress_bar
from rsketch._validation import (
    EFFICIENCY_METHODS,
    check_allocation,
    check_bool,
    check_finite,
    check_int,
    check_option,
    check_real_vector,
    check_sketch_kind,
    check_sparse_structure,
    plain_ndarray,
    seed_sequence,
)
from rsketch.linalg._array_design import checked_float64
from rsketch.operators import make_sketch
from rsketch.operators.factory import check_sketch_options

MEASURES = ("pe", "re", "wc")

# Bootstrap resamples for the interval on each mean (BCa): enough for a stable 2.5 % quantile.
_N_BOOT = 4000
# Memory each draw holds whatever n and p: its two seeds (SeedSequence objects, about 400 bytes each),
# its row of results and, at the end, its column of each BCa bootstrap (an int64 index and a float64
# value for each of the _N_BOOT resamples). Checked before any seed is spawned (n_sketches=10**12
# otherwise ran for hours towards a bare MemoryError).
_PER_DRAW_BYTES = 2 * 400 + 8 * 8 + 16 * _N_BOOT
# Dense Gaussian sketches are generated once per draw and kept (S @ U and S.T @ Q then reuse them)
# when they fit in this many bytes; otherwise they are generated twice (once per product).
_GAUSSIAN_CACHE_BYTES = 512 * 2**20
# The per-draw SVD of the small r x p matrix runs with the process's BLAS threads: limiting them would
# change them for every other thread of the process too (docs/efficiency.md, docs/operators.md "Threads").
# Closed-form draws therefore run in phases over a block of draws: every sketch product (numba's
# threads), then every SVD (BLAS's threads), then every adjoint. Alternating the two thread pools
# draw by draw made each run beside the other's spin-waiting threads (100 countsketch draws at
# n = 20,000, p = 50, r = 1,000: 1.17 s; in phases over all 100, 0.63 s; blocks of 16, 0.76 s).
# A block holds S @ [U, y] and Q of each draw, 8 r (2 p + 1) bytes a draw, up to this many bytes.
_PHASE_BYTES = 64 * 2**20


def _small_svd(A):
    return np.linalg.svd(A, full_matrices=False)


@dataclass(frozen=True)
class EfficiencyResult:
    """Per-draw efficiencies of one sketch family at one sketch size, with their summaries.

    Attributes
    ----------
    sketch : str
        The sketch kind.
    n, p, sketch_size : int
        Rows and columns of ``X`` and the sketch size ``r``.
    method : {"closed_form", "simulate"}
        How the expectation over the noise was taken.
    pe_draws, re_draws : ndarray of shape (n_sketches,)
        ``C_PE(S_i)`` and ``C_RE(S_i)`` for each draw; NaN where the draw was rank-deficient.
    wc_draws : ndarray of shape (n_sketches,) or None
        ``C_WC(S_i)`` for the given ``y`` (None when no ``y`` was given).
    rank_deficient : ndarray of bool, shape (n_sketches,)
        Draws where ``S X`` has rank below ``p`` (``r < p``, or sampling that missed directions): the sketched
        problem has a whole affine set of solutions there, over which each measure is unbounded: a failure
        of the sketch. The summaries count such a draw as ``+inf``.
    pe, re, wc : float
        Means over all draws (``wc`` is None without ``y``): ``+inf`` where any draw was rank-deficient
        (the expectation over sketches is then infinite), and for a Gaussian sketch with
        ``r <= p + 1``, where every draw has full rank but the mean of the inverse Wishart matrix
        ``((S U).T S U)^-1`` is infinite (the sample mean grew with ``n_sketches``: 88, 218, 1340 for
        100, 1,000, 10,000 draws at ``p = 2``, ``r = 3``); :meth:`mean_given_full_rank` gives the mean
        over the full-rank draws. Sampling with replacement (``p >= 2``) can always fail (all ``r``
        picks in one row); where no drawn sketch failed, the mean estimates ``E[C | rank S X = p]``.
    pe_median, re_median, wc_median : float
        Medians over all draws, rank-deficient ones counted as ``+inf`` (``+inf`` when half or more are).
    pe_ci, re_ci, wc_ci : tuple of float
        95 % bias-corrected and accelerated (BCa) bootstrap intervals for each mean, valid for the
        right-skewed distributions these ratios have; ``(inf, inf)`` where the mean is ``+inf``. For
        a Gaussian sketch with ``r = p + 2`` or ``p + 3`` the mean is finite but the variance is not
        (the inverse Wishart's second moment needs ``r > p + 3``): the interval is not reliable
        there (at ``p = 3``, ``r = 5``: ``[123, 209]`` around a true 198).
    seed : object
        The seed the draws were spawned from.

    Examples
    --------
    >>> import numpy as np, rsketch
    >>> X = np.random.default_rng(0).standard_normal((500, 5))
    >>> res = rsketch.efficiency(X, sketch="gaussian", sketch_size=100, n_sketches=8, seed=0)
    >>> res.pe_draws.shape, bool(res.pe_ci[0] <= res.pe <= res.pe_ci[1])
    ((8,), True)
    """

    sketch: str
    n: int
    p: int
    sketch_size: int
    method: str
    pe_draws: np.ndarray
    re_draws: np.ndarray
    wc_draws: np.ndarray | None
    rank_deficient: np.ndarray
    pe: float
    re: float
    wc: float | None
    pe_median: float
    re_median: float
    wc_median: float | None
    pe_ci: tuple[float, float]
    re_ci: tuple[float, float]
    wc_ci: tuple[float, float] | None
    seed: object = None
    options: dict = field(default_factory=dict)

    @property
    def n_sketches(self) -> int:
        """Number of sketch draws (full-rank or not)."""
        return int(self.pe_draws.shape[0])

    @property
    def n_rank_deficient(self) -> int:
        """Number of rank-deficient draws (failures of the sketch: ``+inf`` in every summary)."""
        return int(self.rank_deficient.sum())

    def draws(self, measure: str) -> np.ndarray:
        """The full-rank draws of ``measure`` (``"pe"``, ``"re"`` or ``"wc"``)."""
        check_option(measure, "measure", set(MEASURES))
        values = getattr(self, f"{measure}_draws")
        if values is None:
            raise ValueError("measure='wc' needs y: this result was computed without y")
        return values[~self.rank_deficient]

    def quantile(self, measure: str, q: float) -> float:
        """Empirical ``q``-quantile of ``measure`` over all draws, a rank-deficient draw counted as ``+inf``.

        It is ``+inf`` once ``q`` reaches into the rank-deficient draws (linear interpolation between the
        sorted draws, as ``numpy.quantile``, with them last): a ``(1 - delta)``-quantile set against a
        bound that holds with probability ``1 - delta`` must count a sketch that failed as a failure.
        Over the full-rank draws alone (``numpy.quantile(res.draws(measure), q)``) it would be a quantile
        of the draws that succeeded, below the one a bound is about.

        Examples
        --------
        >>> import numpy as np, rsketch
        >>> X = np.random.default_rng(0).standard_normal((200, 3))
        >>> res = rsketch.efficiency(X, sketch="gaussian", sketch_size=40, n_sketches=20, seed=0)
        >>> res.quantile("pe", 0.9) >= res.pe_median
        True
        """
        if isinstance(q, bool) or not isinstance(q, numbers.Real):
            raise TypeError(f"q must be a number in [0, 1], got {type(q).__name__} {q!r}")
        q = float(q)
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q must lie in [0, 1], got {q}")
        self.draws(measure)  # checks measure
        return _quantile_with_failures(getattr(self, f"{measure}_draws"), self.rank_deficient, q)

    def mean_given_full_rank(self, measure: str) -> float:
        """Mean of ``measure`` over the full-rank draws only (NaN if there are none).

        The conditional mean ``E[C | S X of rank p]``: what ``pe``, ``re`` and ``wc`` were before they
        counted rank-deficient draws. Read it with :attr:`n_rank_deficient`, never as the mean over
        sketches.
        """
        values = self.draws(measure)
        return float(values.mean()) if values.size else math.nan

    def __str__(self) -> str:
        lines = [
            f"EfficiencyResult({self.sketch}, n={self.n}, p={self.p}, r={self.sketch_size}, "
            f"method={self.method}, "
            f"{self.n_sketches} draws, {self.n_rank_deficient} rank-deficient)"
        ]
        for m in MEASURES:
            mean = getattr(self, m)
            if mean is None:
                continue
            lo, hi = getattr(self, f"{m}_ci")
            med = getattr(self, f"{m}_median")
            line = f"  {m.upper()}: mean {mean:.4g} (95% CI {lo:.4g} .. {hi:.4g}), median {med:.4g}"
            if self.n_rank_deficient:
                line += f"; mean over the full-rank draws {self.mean_given_full_rank(m):.4g}"
            lines.append(line)
        if _mean_is_infinite(self.sketch, self.sketch_size, self.p):
            lines.append(f"  (a Gaussian sketch's expectations are infinite for r <= p + 1 = {self.p + 1})")
        return "\n".join(lines)


# --------------------------------------------------------------------------------------------- inputs
def _check_design(X) -> np.ndarray:
    if is_non_numpy_array(X):  # CuPy: checked, and kept, on its device
        if X.ndim != 2:
            raise ValueError(f"X must be 2-D (n x p), got shape {X.shape}")
        n, p = X.shape
        if p < 1 or n <= p:
            raise ValueError(
                f"X must have more rows than columns and at least one column, got shape {X.shape}"
            )
        return checked_float64(X, "X")
    if not sp.issparse(X):
        if isinstance(X, np.ma.MaskedArray):  # its hidden values had been read as data
            X = plain_ndarray(X, "X")
        try:
            X = np.asarray(X)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"X must be a 2-D array of real numbers: {exc}") from exc
    if X.dtype.kind not in "iuf":
        raise TypeError(f"X must hold real numbers, got dtype {X.dtype}")
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D (n x p), got shape {X.shape}")
    n, p = X.shape
    if p < 1 or n <= p:
        raise ValueError(f"X must have more rows than columns and at least one column, got shape {X.shape}")
    if sp.issparse(X):  # dense from here (the shape checked first: a wide sparse X had been densified)
        check_allocation(
            8 * n * p, f"efficiency's dense copy of the sparse X ({n:,} x {p:,})", "use a smaller X"
        )
        check_sparse_structure(X, "X")
        X = X.toarray()
    X = X.astype(np.float64, copy=False)
    check_finite(X, "X")  # no n x p mask (np.isfinite's had been a third copy)
    return X


def _check_response(X, y, n):
    """``y`` for a device ``X``: of ``X``'s library (else a ``TypeError``), of shape ``(n,)``, finite."""
    check_same_library(X=X, y=y)
    if not is_non_numpy_array(y) or array_namespace(y) is not array_namespace(X):
        raise TypeError(f"y must be an array of X's library, on X's device; got {type(y).__name__}")
    if tuple(y.shape) != (n,):
        raise ValueError(f"y must have shape ({n},), got {tuple(y.shape)}")
    return checked_float64(y, "y")


def _check_positive(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a positive number, got {type(value).__name__} {value!r}")
    value = float(value)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be positive and finite, got {value}")
    return value


def _equilibrated(X):
    """``X`` with each column multiplied by the power of two that brings its largest entry into ``[1/2, 1)``.

    Exact (only exponents change; a zero column stays zero), and it leaves ``range(X)``, on which every
    measure depends, as it was. The rank check and ``U`` then do not depend on the columns' scales: from
    the SVD of ``X * logspace(-150, 150, p)`` the rank check read rank 1, and a normwise backward-stable
    SVD loses the small columns' directions besides. The largest entry, not the norm: a column's norm
    under- or overflows (entries near 1e-170 or 1e170), its largest entry never does.
    """
    exponents = unit_exponents(max_abs(X, axis=0))
    return shift_down(X, exponents) if exponents.any() else X  # exact, in X's library


def orthonormal_basis(X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Thin SVD ``X = U diag(s) Vt`` of an ``X`` that :func:`_equilibrated` gave (``efficiency`` does it
    once, for this and the draws); raises ``ValueError`` if ``X`` does not have full column rank.

    ``U`` is an orthonormal basis of ``range(X)``, which is all the efficiencies depend on; scaling a
    column of ``X`` changes neither ``U``'s range nor, equilibrated, the rank found (its singular values
    above ``s[0] max(n, p) eps``, NumPy's ``matrix_rank`` rule). For an ``X`` of another library (CuPy)
    ``U`` is computed and kept there; ``s`` and ``Vt`` are host arrays.
    """
    if is_non_numpy_array(X):  # on the device (cuSOLVER for CuPy); U stays there
        U, s, Vt = array_namespace(X).linalg.svd(X, full_matrices=False)
        s, Vt = to_host(s), to_host(Vt)
    else:
        U, s, Vt = scipy.linalg.svd(X, full_matrices=False, check_finite=False)
        # row-major: the sparse kernels stream rows (10x faster than column-major)
        U = np.ascontiguousarray(U)
    tol = s[0] * max(X.shape) * np.finfo(np.float64).eps if s.size and s[0] > 0 else 0.0
    if s.size == 0 or s[-1] <= tol:
        rank = int(np.sum(s > tol))
        raise ValueError(
            f"X must have full column rank (the efficiencies compare with a unique OLS fit); "
            f"got rank {rank} < p = {X.shape[1]} (each column scaled to a largest entry near 1)"
        )
    return U, s, Vt


# --------------------------------------------------------------------------------------------- intervals
def bca_interval(values, *, level: float = 0.95, n_boot: int = _N_BOOT, rng=None) -> tuple[float, float]:
    """Bias-corrected and accelerated bootstrap interval for the mean of ``values``.

    BCa (Efron 1987) corrects the percentile interval for the bias and skewness of the bootstrap
    distribution, which matters here: efficiencies are ratios bounded below by 1 with long right tails.
    Returns ``(nan, nan)`` for fewer than two values and ``(v, v)`` when all values equal ``v``.

    Examples
    --------
    >>> import numpy as np
    >>> from rsketch.stats._efficiency import bca_interval
    >>> x = np.random.default_rng(0).exponential(size=200)
    >>> lo, hi = bca_interval(x, rng=0)
    >>> bool(lo < x.mean() < hi)
    True
    """
    x = np.asarray(values, dtype=np.float64)
    k = x.size
    if k < 2:
        return (math.nan, math.nan)
    theta = float(x.mean())
    if np.all(x == x[0]):
        return (theta, theta)
    rng = np.random.default_rng(rng)
    boot = x[rng.integers(0, k, size=(n_boot, k))].mean(axis=1)
    frac = (np.count_nonzero(boot < theta) + 0.5 * np.count_nonzero(boot == theta)) / n_boot
    frac = min(max(frac, 1.0 / n_boot), 1.0 - 1.0 / n_boot)
    z0 = float(ndtri(frac))
    jack = (x.sum() - x) / (k - 1)
    d = jack.mean() - jack
    denom = 6.0 * float(np.sum(d**2)) ** 1.5
    a = float(np.sum(d**3)) / denom if denom > 0 else 0.0
    alpha = (1.0 - level) / 2.0
    qs = []
    for z in (ndtri(alpha), ndtri(1.0 - alpha)):
        qs.append(float(ndtr(z0 + (z0 + z) / (1.0 - a * (z0 + z)))))
    lo, hi = np.quantile(boot, qs)
    return (float(lo), float(hi))


def _quantile_with_failures(values: np.ndarray, failed: np.ndarray, q: float) -> float:
    """``numpy.quantile`` of ``values`` with the ``failed`` entries counted as ``+inf``.

    ``numpy.quantile`` itself gives NaN between a finite value and ``inf`` (its interpolation forms
    ``inf - inf`` or ``0 * inf``): the failures sit last in sorted order, so the quantile is ``+inf``
    once its position reaches them, and otherwise that of the same positions among the finite draws.
    Without failures it is ``numpy.quantile`` itself, bit for bit.
    """
    if not failed.any():
        return float(np.quantile(values, q))
    k, ok = values.size, int(np.count_nonzero(~failed))
    h = (k - 1) * q  # numpy's position for its default ("linear") method
    if ok == 0 or h > ok - 1:
        return math.inf
    # Positions 0 .. ok - 1 are the finite draws: fill the failures with the largest of them (never used
    # at these positions) so that numpy interpolates between the same two draws it would use.
    good = values[~failed]
    filled = np.concatenate([good, np.full(k - ok, good.max())])
    return float(np.quantile(filled, q))


def _summaries(
    values: np.ndarray, mask: np.ndarray, rng, infinite_mean: bool = False
) -> tuple[float, float, tuple[float, float]]:
    """Mean, median and BCa interval over all draws, the rank-deficient ones (``mask``) as ``+inf``.

    A rank-deficient draw has no unique sketched fit; every measure is infinite there (the worst over
    the fits). One in the sample shows that failures have positive probability, so the mean over
    sketches, and every interval for it, is ``+inf``; the median is ``+inf`` from half the draws on.
    ``infinite_mean``: the expectation is known to be infinite (:func:`_mean_is_infinite`).
    """
    if mask.any() or infinite_mean:
        return math.inf, _quantile_with_failures(values, mask, 0.5), (math.inf, math.inf)
    return float(values.mean()), float(np.median(values)), bca_interval(values, rng=rng)


# --------------------------------------------------------------------------------------------- per draw
def _is_rank_deficient(s: np.ndarray, shape: tuple[int, int], p: int) -> bool:
    if s.size < p or s[0] <= 0:
        return True
    return bool(s[p - 1] <= s[0] * max(shape) * np.finfo(np.float64).eps)


class _DenseColumns:
    """A Gaussian sketch materialised once, so both products reuse it.

    ``buffers`` (one dict per ``efficiency`` call) keeps the ``n x r`` array across draws: the
    sketch is written in place (``GaussianSketch.fill_transposed``), never reallocated.
    """

    def __init__(self, S, buffers):
        shape = (S.input_dim, S.sketch_size)
        if buffers.get("dense_t") is None or buffers["dense_t"].shape != shape:
            buffers["dense_t"] = np.empty(shape)
        self.dense_t = S.fill_transposed(buffers["dense_t"])  # S.T, row-major

    def __matmul__(self, A):
        return self.dense_t.T @ A

    def adjoint(self, Z):
        return self.dense_t @ Z


class _Operator:
    def __init__(self, S):
        self.S = S

    def __matmul__(self, A):
        return self.S @ A

    def adjoint(self, Z):
        return self.S.T @ Z


def _materialised(S) -> bool:
    """Whether a draw writes ``S`` out as a dense ``n x r`` array (:class:`_DenseColumns`)."""
    return S.kind == "gaussian" and 8 * S.input_dim * S.sketch_size <= _GAUSSIAN_CACHE_BYTES


def _apply_wrapper(S, buffers):
    return _DenseColumns(S, buffers) if _materialised(S) else _Operator(S)


def _phase_block(r: int, p: int) -> int:
    """Closed-form draws run in phases over blocks of this many draws (``_PHASE_BYTES``)."""
    return max(1, _PHASE_BYTES // (8 * r * (2 * p + 1)))


def _closed_form_draws(sketches, U, y_parts, buffers):
    """(pe, wc or nan, rank_deficient) for each sketch, by the closed form.

    In three phases over the sketches (``_PHASE_BYTES``): the products ``S [U, y]``, their SVDs,
    then the adjoints ``S^T Q``; each draw's numbers are those of the draw alone. A materialised
    Gaussian sketch (one ``n x r`` buffer, reused) goes through the phases one draw at a time.
    """
    device = is_non_numpy_array(U)  # CuPy: both products on the device, the r x p SVD on the host
    if not device and len(sketches) > 1 and _materialised(sketches[0]):  # one buffer: one at a time
        return [row for S in sketches for row in _closed_form_draws([S], U, y_parts, buffers)]
    p = U.shape[1]
    ops = [_Operator(S) if device else _apply_wrapper(S, buffers) for S in sketches]
    B = _basis_with_response(U, y_parts, buffers)
    products = [to_host(op @ B) for op in ops]
    svds = [_small_svd(SB[:, :p]) for SB in products]
    return [
        _closed_form_finish(op, SB, svd, U, y_parts) for op, SB, svd in zip(ops, products, svds, strict=True)
    ]


def _closed_form_finish(op, SB, svd, U, y_parts):
    """A draw's (pe, wc or nan, rank_deficient) from its product ``SB`` and the SVD of ``SB[:, :p]``."""
    p = U.shape[1]
    Q, s, Wt = svd
    if _is_rank_deficient(s, (SB.shape[0], p), p):
        return math.nan, math.nan, True
    T = op.adjoint(like(np.ascontiguousarray(Q), U))  # n x p: S^T Q
    if is_non_numpy_array(U):
        xp = array_namespace(T)
        pe = float(to_host(xp.sum(T * T, axis=0)) @ (1.0 / s**2)) / p
    else:
        pe = float(np.einsum("ij,ij->j", T, T) @ (1.0 / s**2)) / p
    wc = math.nan
    if y_parts is not None:
        _, Uty, rss = y_parts
        coef = Wt.T @ ((Q.T @ SB[:, p]) / s)  # the sketched fit in U coordinates
        wc = 1.0 + float(np.sum((Uty - coef) ** 2)) / rss
    return pe, wc, False


def _basis_with_response(U, y_parts, buffers):
    """``[U, y]`` (or ``U``), built once per call and kept in ``buffers`` (an ``n x (p + 1)`` copy)."""
    if y_parts is None:
        return U
    if buffers.get("basis_y") is None:
        if is_non_numpy_array(U):
            xp = array_namespace(U)
            buffers["basis_y"] = xp.concat([U, xp.reshape(y_parts[0], (-1, 1))], axis=1)
        else:
            buffers["basis_y"] = np.ascontiguousarray(np.column_stack([U, y_parts[0]]))
    return buffers["basis_y"]


def _lstsq(Q, s, Wt, B):
    """Least-squares solution (host) from a thin SVD ``A = Q diag(s) Wt`` of a full-column-rank ``A``;
    ``Q`` and ``B`` may be arrays of another library (``X``'s basis on a device), ``s`` and ``Wt`` host."""
    return Wt.T @ (to_host(Q.T @ B) / s[:, None])


def _simulate_draw(S, X, svd_x, y, mean, sigma, n_noise, noise_seed):
    """(pe, re, wc or nan, rank_deficient) for one sketch, by solving least squares on noise draws.

    ``X`` is the equilibrated design (``svd_x`` its SVD) and ``mean`` the caller's ``X @ beta``: the
    fits are projections onto ``range(X)``, which the equilibration keeps. For an ``X`` of another
    library (CuPy) the noise is drawn on the host (the same numbers on every device) and moved there
    once; the ``n``-sized work runs in ``X``'s library, the SVD of ``S X`` on the host.
    """
    n, p = X.shape
    rng = np.random.default_rng(noise_seed)
    xp = array_namespace(X)
    Y = mean[:, None] + like(sigma * rng.standard_normal((n, n_noise)), X)
    if y is not None:
        Y = xp.concat([Y, y[:, None]], axis=1)
    B = xp.concat([X, Y], axis=1)
    SB = to_host(S @ (B if is_non_numpy_array(B) else np.ascontiguousarray(B)))
    SX, SY = SB[:, :p], SB[:, p:]
    Q, s, Wt = _small_svd(SX)
    if _is_rank_deficient(s, SX.shape, p):
        return math.nan, math.nan, math.nan, True
    fit_s = X @ like(_lstsq(Q, s, Wt, SY), X)  # the sketched fits, one per response
    fit_o = X @ like(_lstsq(*svd_x, Y), X)  # the OLS fits on the same responses

    def ratio(a, b):  # sum of squares of a over that of b
        return float(xp.sum(a**2)) / float(xp.sum(b**2))

    pe = ratio(mean[:, None] - fit_s[:, :n_noise], mean[:, None] - fit_o[:, :n_noise])
    res_s, res_o = Y - fit_s, Y - fit_o
    re = ratio(res_s[:, :n_noise], res_o[:, :n_noise])
    wc = ratio(res_s[:, n_noise], res_o[:, n_noise]) if y is not None else math.nan
    return pe, re, wc, False


# --------------------------------------------------------------------------------------------- public
def efficiency(
    X,
    *,
    sketch,
    sketch_size,
    y=None,
    n_sketches=100,
    seed=None,
    method="closed_form",
    sigma=1.0,
    beta=None,
    n_noise=200,
    progress=False,
    executor=None,
    **sketch_options,
) -> EfficiencyResult:
    """Worst-case error, prediction efficiency and residual efficiency of sketch-and-solve least squares.

    For each of ``n_sketches`` independent sketches ``S_i`` of the family ``sketch``, computes
    ``C_PE(S_i)`` and ``C_RE(S_i)`` (and ``C_WC(S_i)`` when ``y`` is given) as defined by Raskutti & Mahoney
    (JMLR 2016), then summarises them over the draws.

    Parameters
    ----------
    X : array of shape (n, p)
        The design, of full column rank with ``n > p`` (sparse input is densified, after its shape
        and the copy's memory are checked: the SVD needs it).
        The measures depend on ``range(X)`` only, and so does the rank check: the columns are scaled by
        powers of two (exactly) to a largest entry near 1 first, so ``X * logspace(-150, 150, p)`` gives
        the measures of ``X``.
        A CuPy array (or one of another array-API library) stays on its device: its SVD and both
        products of every draw run there, the ``r x p`` SVDs on the host (``docs/gpu.md``); then ``y``
        must be on the same device and ``executor`` None (``"simulate"`` draws its noise on the host).
    sketch : {"gaussian", "srht", "srdct", "countsketch", "sparse_sign", "leverage", "uniform"}
        The sketch family; a fresh sketch is drawn for every draw. Draw ``i`` is the operator seeded with
        ``numpy.random.SeedSequence(seed).spawn(n_sketches)[i]``.
    sketch_size : int
        ``r``, the number of rows of each sketch (``>= 1``; ``r < p`` is allowed and every draw is then
        reported rank-deficient).
    y : array of shape (n,), optional
        A response for the worst-case error ``C_WC = ||y - X beta_S||^2 / ||y - X beta_OLS||^2``; it must
        not lie in the column space of ``X``.
    n_sketches : int, default 100
        Number of sketch draws.
    seed : None, int or numpy.random.SeedSequence
        Root of the draws' seeds (and of the noise and the bootstrap); the same seed gives the same result.
    method : {"closed_form", "simulate"}, default "closed_form"
        ``"closed_form"`` takes the expectation over the noise exactly (``C_PE = ||M||_F^2 / p``,
        ``C_RE = 1 + p (C_PE - 1) / (n - p)``); ``"simulate"`` draws ``n_noise`` responses
        ``X beta + sigma * eps`` per sketch, solves least squares on ``(S X, S y)`` and on ``(X, y)``, and
        takes ratios of the empirical mean squared errors. It exists to validate the closed form.
    sigma : float, default 1.0
        Noise standard deviation for ``"simulate"`` (the efficiencies do not depend on it).
    beta : array of shape (p,), optional
        True coefficients for ``"simulate"`` (default zeros; the efficiencies do not depend on it).
    n_noise : int, default 200
        Noise draws per sketch for ``"simulate"``.
    progress : bool, default False
        Show a tqdm progress bar over the draws.
    executor : None, concurrent.futures.Executor or dask.distributed.Client, optional
        Spread the draws over it, in contiguous blocks (four per worker). Every draw keeps its own
        seeds, so the result is bitwise the serial one whatever the number of workers (the workers
        run the same BLAS build with the same thread count as the caller; see ``docs/dask.md``).
        A ``Client`` receives ``X``'s basis once (``scatter``); another executor pickles it with
        each block. A draw lost with its worker is recomputed by Dask; an error in a draw is raised.
    **sketch_options
        Passed to :func:`rsketch.make_sketch` (``nnz_per_column``, ``replace``, ``uniform_mix``,
        ``scores``, ...). For ``"leverage"`` without ``scores`` the exact leverage scores of
        ``X`` are computed once and reused by every draw.

    Returns
    -------
    EfficiencyResult
        Per-draw values, means, medians, 95 % BCa intervals and the rank-deficient draws. A
        rank-deficient draw is a failure of the sketch: the means, intervals, medians and quantiles count
        it as ``+inf`` (``mean_given_full_rank`` leaves it out).

    Notes
    -----
    Cost per draw: one ``S @ [U, y]`` and one ``S.T @ Q`` (``n x p``), plus an SVD of the ``r x p`` matrix
    ``S U``; no ``n x n`` matrix is formed. Gaussian sketches are materialised once per draw (``8 r n`` bytes,
    up to 512 MiB) so that the two products share one generation of ``S``.

    See Also
    --------
    rsketch.bounds : the theoretical upper and lower bounds to compare these with.

    References
    ----------
    G. Raskutti and M. W. Mahoney, "A statistical perspective on randomized sketching for ordinary
    least-squares", JMLR 17 (2016); arXiv:1406.5986.

    Examples
    --------
    >>> import numpy as np, rsketch
    >>> X = np.random.default_rng(0).standard_normal((2000, 10))
    >>> res = rsketch.efficiency(X, sketch="srht", sketch_size=200, n_sketches=20, seed=0)
    >>> 5 < res.pe < 20 and 1 < res.re < 1.2  # PE ~ n/r, RE ~ 1 + p/r
    True
    >>> res.n_rank_deficient
    0
    """
    X = _check_design(X)
    n, p = X.shape
    r = _check_arguments(sketch, sketch_size, n_sketches, method, n, sketch_options)
    device = is_non_numpy_array(X)
    if device and executor is not None:
        raise ValueError(
            "executor is for NumPy input: a device X runs its draws on its device, one after another; "
            "pass executor=None"
        )
    sigma = _check_positive(sigma, "sigma")
    n_noise = check_int(n_noise, "n_noise", minimum=2)
    progress = check_bool(progress, "progress")  # a string "no" had shown the bar
    beta = np.zeros(p) if beta is None else check_real_vector(beta, p, "beta")
    if method == "simulate":
        _check_noise_scale(X, beta, sigma, n_noise)
    if y is not None:
        y = _check_response(X, y, n) if device else check_real_vector(y, n, "y")
        y = _unit_scaled(y)
    root = seed_sequence(seed)

    # Per draw: [U, y] and S^T Q (closed form), or the noise, fits and residuals (simulate), each n x width.
    width = 3 * (p + 1) if method == "closed_form" else 5 * (n_noise + 1) + p
    check_allocation(
        8 * n * (width + 3 * p),  # X, its equilibrated copy and U besides the per-draw arrays
        f"efficiency with n={n}, p={p}" + (f", n_noise={n_noise}" if method == "simulate" else ""),
        "use a smaller n_noise or a sample of the rows of X"
        if method == "simulate"
        else "use fewer rows of X",
    )
    # The measures depend on range(X) only: the draws use X with its columns scaled by powers of two
    # (exact), so neither the rank check nor U depends on the columns' scales; the simulated responses'
    # mean X beta is the caller's.
    mean = X @ like(beta, X) if method == "simulate" else None
    X = _equilibrated(X)
    svd_x = orthonormal_basis(X)
    options = dict(sketch_options)
    if sketch == "leverage" and "scores" not in options:
        U = svd_x[0]
        options["scores"] = (
            to_host(array_namespace(U).sum(U * U, axis=1)) if device else np.einsum("ij,ij->i", U, U)
        )
    y_parts = _wc_parts(y, svd_x[0])

    draw = _Draws(sketch, r, options, method, svd_x, y_parts, X, y, mean, sigma, n_noise)
    seeds = root.spawn(n_sketches)
    noise_seeds = root.spawn(n_sketches)  # the next children: independent of the sketch seeds
    bar = progress_bar(n_sketches, enabled=progress, desc=f"efficiency[{sketch}, r={r}]", leave=False)
    try:
        draws = _run_draws(draw, seeds, noise_seeds, executor, bar)  # columns: PE, RE, WC, rank-deficient
    finally:
        bar.close()
    if method == "simulate":
        _check_simulated_draws(draws, sigma)
    shown = {k: v for k, v in sketch_options.items() if k != "scores"}
    return _summarise(
        draws,
        y is not None,
        root.spawn(1)[0],
        sketch=sketch,
        n=n,
        p=p,
        sketch_size=r,
        method=method,
        seed=seed,
        options=shown,
    )


@dataclass(frozen=True)
class _Draws:
    """What a draw needs besides its seeds: picklable, so executors can run blocks of draws."""

    sketch: str
    r: int
    options: dict
    method: str
    svd_x: tuple
    y_parts: tuple | None
    X: np.ndarray  # equilibrated (_equilibrated)
    y: np.ndarray | None
    mean: np.ndarray | None  # X @ beta of the caller's X (method="simulate")
    sigma: float
    n_noise: int

    def __call__(self, seeds, noise_seeds, buffers=None) -> np.ndarray:
        """Rows ``(PE, RE, WC, rank-deficient)`` of the draws with these seeds, in order."""
        buffers = {} if buffers is None else buffers  # work arrays reused across draws
        n, p = self.X.shape
        out = np.full((len(seeds), 4), math.nan)
        if self.method == "closed_form":
            step = _phase_block(self.r, p)
            for a in range(0, len(seeds), step):
                sketches = [
                    make_sketch(self.sketch, n, self.r, seed=seed, **self.options)
                    for seed in seeds[a : a + step]
                ]
                rows = _closed_form_draws(sketches, self.svd_x[0], self.y_parts, buffers)
                for i, (pe, wc, bad) in enumerate(rows, start=a):
                    out[i] = pe, (math.nan if bad else 1.0 + p * (pe - 1.0) / (n - p)), wc, bad
            return out
        for i, (seed, noise_seed) in enumerate(zip(seeds, noise_seeds, strict=True)):
            S = make_sketch(self.sketch, n, self.r, seed=seed, **self.options)
            out[i] = _simulate_draw(
                S, self.X, self.svd_x, self.y, self.mean, self.sigma, self.n_noise, noise_seed
            )
        return out

    def block(self) -> int:
        """Draws a serial run hands to :meth:`__call__` at once (closed form: a block of phases)."""
        return _phase_block(self.r, self.X.shape[1]) if self.method == "closed_form" else 1


def _executor_workers(executor) -> int:
    if hasattr(executor, "scheduler_info"):  # a dask.distributed.Client
        return max(1, len(executor.scheduler_info().get("workers", {})))
    return max(1, int(getattr(executor, "_max_workers", 4) or 4))


def _run_draws(draw, seeds, noise_seeds, executor, bar) -> np.ndarray:
    """The draws' rows, serially or in blocks on ``executor``; the same numbers either way."""
    m = len(seeds)
    if executor is None:
        buffers, out, step = {}, np.empty((m, 4)), draw.block()
        for a in range(0, m, step):
            out[a : a + step] = draw(seeds[a : a + step], noise_seeds[a : a + step], buffers)
            bar.update(len(seeds[a : a + step]))
        return out
    if not callable(getattr(executor, "submit", None)):
        raise TypeError(
            "executor must be None, a concurrent.futures.Executor or a dask.distributed.Client, got "
            f"{type(executor).__name__}"
        )
    if hasattr(executor, "scatter"):  # a Client: ship X's basis and the options to every worker once
        draw = executor.scatter(draw, broadcast=True)
    n_blocks = min(m, 4 * _executor_workers(executor))
    bounds = [(b * m // n_blocks, (b + 1) * m // n_blocks) for b in range(n_blocks)]
    futures = [executor.submit(_draw_block, draw, seeds[a:b], noise_seeds[a:b]) for a, b in bounds]
    out = np.empty((m, 4))
    for (a, b), future in zip(bounds, futures, strict=True):
        out[a:b] = future.result()
        bar.update(b - a)
    return out


def _draw_block(draw, seeds, noise_seeds):
    # Arrays unpickled from a message may start at any byte (Dask's out-of-band buffers); NumPy then
    # multiplies them without BLAS, in another order. Fresh copies are allocated as the caller's were.
    fresh = {
        f.name: _fresh_arrays(getattr(draw, f.name)) for f in dataclasses.fields(draw) if f.name != "options"
    }
    return dataclasses.replace(draw, **fresh)(seeds, noise_seeds)


def _fresh_arrays(value):
    if isinstance(value, np.ndarray):
        return value.copy(order="K")
    if isinstance(value, tuple):
        return tuple(_fresh_arrays(v) for v in value)
    return value


def _check_noise_scale(X, beta, sigma, n_noise) -> None:
    """``sigma`` (with ``X @ beta``) must keep every simulated sum of squares finite, normal and accurate.

    The largest sum, over ``n (n_noise + 1)`` squares of ``|X beta| + 7 sigma``, must stay below
    ``1e300``; the smallest squares, of size ``sigma**2 p / n``, above ``1e-290`` (no underflow) and,
    relative to ``X beta``, above rounding (``sigma sqrt(p / n) >= 1e-8 max|X beta|``).
    """
    n, p = X.shape
    with np.errstate(over="ignore", invalid="ignore"):
        xp = array_namespace(X)
        scale = float(to_host(xp.max(xp.abs(X @ like(beta, X)))))
    if not math.isfinite(scale):
        raise ValueError("beta is too large: X @ beta overflows")
    spread = math.sqrt(p / n)
    low = max(1e-145 / spread, 1e-8 * scale / spread)
    high = 1e150 / (7.0 * math.sqrt(n * (n_noise + 1.0))) - scale / 7.0
    if not low <= high:  # no sigma will do: X @ beta is too large (the range read [7.9e293, -1.6e300])
        raise ValueError(
            f"beta is too large for method='simulate': max|X @ beta| = {scale:.3g}, whose squared errors "
            "would overflow at any sigma. The efficiencies do not depend on beta: beta=None is safe"
        )
    if not low <= sigma <= high:
        raise ValueError(
            f"sigma must lie in [{low:.3g}, {high:.3g}] for method='simulate' with this X, beta and "
            f"n_noise={n_noise} (the squared errors would overflow, underflow or drown in rounding); got "
            f"{sigma:.3g}. The efficiencies do not depend on sigma or beta: sigma=1 and beta=None are safe"
        )


def _check_simulated_draws(draws, sigma) -> None:
    """Raise if a full-rank simulated draw came out non-finite (never return NaN efficiencies silently)."""
    full_rank = draws[:, 3] == 0
    bad = full_rank & ~np.isfinite(draws[:, :2]).all(axis=1)
    if bad.any():
        raise FloatingPointError(
            f"{int(bad.sum())} of {len(draws)} simulated draws gave non-finite efficiencies at "
            f"sigma={sigma:.3g}: the noise overflowed or underflowed; use sigma nearer 1"
        )


def _check_arguments(sketch, sketch_size, n_sketches, method, n, sketch_options) -> int:
    """Check the family and its options, its size for ``n`` rows, the draw count, the method; return r."""
    check_sketch_kind(sketch, "sketch")
    # efficiency's own method (closed form or simulation) takes the name of leverage's scores method
    check_sketch_options(sketch, sketch_options, "efficiency", taken=("method",))
    r = check_int(sketch_size, "sketch_size", minimum=1)
    n_sketches = check_int(n_sketches, "n_sketches", minimum=1)
    check_allocation(
        _PER_DRAW_BYTES * n_sketches,
        f"efficiency with n_sketches={n_sketches}",
        "use fewer n_sketches (a few hundred already give tight intervals)",
    )
    check_option(method, "method", EFFICIENCY_METHODS)
    if sketch in ("srht", "srdct") and r > n:
        raise ValueError(f"sketch_size must be <= n = {n} for sketch={sketch!r} (it selects rows), got {r}")
    if sketch == "uniform" and not sketch_options.get("replace", True) and r > n:
        raise ValueError(f"sketch_size must be <= n = {n} for uniform sampling without replacement, got {r}")
    return r


def _unit_scaled(y):
    """``y`` times the power of two (exact) that brings ``max |y|`` into ``[1/2, 1)``.

    C_WC does not depend on the scale of ``y``, but its sums of squares do: at ``|y| ~ 1e155`` they
    overflow, at ``1e-160`` they lose digits to subnormals, and either way ``y`` looked like it lay in
    the column space of ``X``. A zero ``y`` is returned as it is (``_wc_parts`` rejects it).

    Examples
    --------
    >>> import numpy as np
    >>> from rsketch.stats._efficiency import _unit_scaled
    >>> _unit_scaled(np.array([3.0, -1e-300, 0.0])).tolist()
    [0.75, -2.5e-301, 0.0]
    >>> _unit_scaled(np.array([5e-324])).tolist()  # the smallest subnormal, 2**-1074: exactly 1/2
    [0.5]
    """
    xp = array_namespace(y)
    top = float(to_host(xp.max(xp.abs(y))))
    if top == 0.0:
        return y
    shift = -math.frexp(top)[1]  # in [-1024, 1074]: 2.0**shift alone may overflow, so in two halves
    half = shift // 2
    return (y * 2.0**half) * 2.0 ** (shift - half)


def _wc_parts(y, U):
    """``(y, U.T y, ||y - U U.T y||^2)`` for the worst-case measure, or None without ``y``."""
    if y is None:
        return None
    Uty = U.T @ y
    rss = float(array_namespace(U).sum((y - U @ Uty) ** 2))
    Uty = to_host(Uty)
    if rss <= (np.finfo(np.float64).eps * U.shape[0]) ** 2 * float(y @ y) or rss == 0.0:
        raise ValueError("y lies in the column space of X: its OLS residual is zero, C_WC is undefined")
    return y, Uty, rss


def _mean_is_infinite(sketch: str, r: int, p: int) -> bool:
    """Whether every mean is infinite whatever the draws show: a Gaussian ``S`` with ``r <= p + 1``.

    ``S U`` (``U`` an orthonormal basis of ``range(X)``) is then an ``r x p`` Gaussian matrix, and
    ``E[((S U).T S U)^-1]``, the inverse Wishart's mean, is finite only for ``r > p + 1``
    (``I / (r - p - 1)``): ``E[C_PE] = 1 + (n - p) / (r - p - 1)`` and ``E[C_WC] = 1 + p / (r - p - 1)``
    (docs/efficiency.md), and ``C_RE`` follows ``C_PE``. Each draw is finite, and a sample mean
    with an interval only sampled the heavy tail. The discrete sketches (sampling, SRHT, CountSketch)
    take finitely many values: their means are finite unless a rank-deficient draw can occur."""
    return sketch == "gaussian" and r <= p + 1


def _summarise(draws, with_wc, boot_seed, **fields) -> EfficiencyResult:
    """Means, medians and BCa intervals of the per-draw measures (rank-deficient draws as ``+inf``)."""
    pe, re, wc = draws[:, 0].copy(), draws[:, 1].copy(), draws[:, 2].copy() if with_wc else None
    deficient = draws[:, 3] != 0
    infinite = _mean_is_infinite(fields["sketch"], fields["sketch_size"], fields["p"])
    rngs = boot_seed.spawn(3)
    pe_mean, pe_med, pe_ci = _summaries(pe, deficient, rngs[0], infinite)
    re_mean, re_med, re_ci = _summaries(re, deficient, rngs[1], infinite)
    wc_mean = wc_med = wc_ci = None
    if with_wc:
        wc_mean, wc_med, wc_ci = _summaries(wc, deficient, rngs[2], infinite)
    return EfficiencyResult(
        pe_draws=pe,
        re_draws=re,
        wc_draws=wc,
        rank_deficient=deficient,
        pe=pe_mean,
        re=re_mean,
        wc=wc_mean,
        pe_median=pe_med,
        re_median=re_med,
        wc_median=wc_med,
        pe_ci=pe_ci,
        re_ci=re_ci,
        wc_ci=wc_ci,
        **fields,
    )
