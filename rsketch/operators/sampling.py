"""Row-sampling sketches: uniform and leverage-score sampling, rescaled so E[S.T S] = I."""

from __future__ import annotations

import math

import numpy as np
import scipy.linalg
import scipy.sparse as sp

from rsketch._backend import to_host
from rsketch._exact_scaling import arithmetic_dtype, scale_design
from rsketch._random import (
    STREAM_SAMPLE,
    STREAM_SELECT,
    bounded_exact,
    check_key,
    derive_key,
    key_from_seed,
    random_words,
    sample_without_replacement,
    uniform53_from_words,
)
from rsketch._validation import check_allocation, check_operand, check_option, check_real, check_real_vector
from rsketch.kernels import cpu
from rsketch.operators.base import SketchOperator, read_only_view
from rsketch.operators.gaussian import GaussianSketch
from rsketch.operators.srht import SRHT

# Share of uniform probability mixed into leverage-score sampling so every row has p_i > 0.
DEFAULT_UNIFORM_MIX = 0.1


class _RowSampling(SketchOperator):
    """Common machinery: row ``i`` of ``S`` is ``scale_i * e_{idx_i}``; subclasses choose idx and scale."""

    _nonfinite_propagates = False  # unsampled rows never reach the output: scan the input

    def indices(self) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def scales(self) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def _columns_from(self, idx, scale, start, stop, xp):
        j = xp.arange(start, stop, dtype=xp.int64)[None, :]
        hit = xp.asarray(idx)[:, None] == j
        return xp.where(hit, xp.asarray(scale)[:, None], 0.0)

    def _fast_columns(self, start, stop):
        return self._columns_from(self.indices(), self.scales(), start, stop, np)

    def _check_index_memory(self):
        r = self.sketch_size
        check_allocation(
            48 * r, f"the {r} sampled rows of a {type(self).__name__}", "use a smaller sketch_size"
        )

    def _apply_bytes(self, k: int, itemsize: int) -> int:
        return itemsize * self.sketch_size * k + 48 * self.sketch_size

    def _adjoint_bytes(self, k: int, itemsize: int) -> int:
        return itemsize * (self.input_dim + self.sketch_size) * k + 48 * self.sketch_size

    def _columns_bytes(self) -> int:
        return 48 * self.sketch_size

    def _apply_numpy(self, A):
        out = A[self.indices()]  # a gather: the one r x k allocation
        out *= self.scales().astype(A.dtype)[:, None]
        return out

    def _apply_sparse(self, A):
        out = A.tocsr()[self.indices()].toarray()
        out *= self.scales().astype(A.dtype)[:, None]
        return out

    def _adjoint_numpy(self, Z):
        out = np.zeros((self.input_dim, Z.shape[1]), dtype=Z.dtype)
        np.add.at(out, self.indices(), Z * self.scales().astype(Z.dtype)[:, None])
        return out


class UniformSampling(_RowSampling):
    """Uniform row sampling: ``r`` rows of ``A``, each scaled by ``sqrt(n / r)``.

    With ``replace=True`` (default) sample ``i`` is an exactly uniform row drawn from the
    counters ``(i, ., STREAM_SAMPLE)`` (:func:`rsketch._random.bounded_exact`); with
    ``replace=False`` the rows are a uniformly random ``r``-subset of ``[0, n)`` drawn by Floyd's
    algorithm (:func:`rsketch._random.sample_without_replacement`), in ascending order (then
    ``r = n`` gives ``S.T S = I`` exactly). Either way ``E[S.T S] = I``, and the indices cost
    ``O(r)`` time and memory whatever ``n`` is. Cost ``O(r k)`` (a gather); it ignores ``A`` and
    fails on coherent matrices (a few rows carrying most of the leverage), which leverage
    sampling fixes.

    Parameters
    ----------
    input_dim, sketch_size, seed, dtype
        See :class:`rsketch.SketchOperator`.
    replace : bool, default True
        Sample with replacement (i.i.d. rows) or without.

    Examples
    --------
    >>> import numpy as np, rsketch
    >>> S = rsketch.UniformSampling(100, 100, seed=0, replace=False)
    >>> np.allclose(S.to_dense().T @ S.to_dense(), np.eye(100))
    True
    """

    kind = "uniform"

    def __init__(self, input_dim, sketch_size, *, seed=None, dtype=np.float64, replace=True):
        if not isinstance(replace, (bool, np.bool_)):
            raise TypeError(f"replace must be a bool, got {type(replace).__name__}")
        self.replace = bool(replace)
        self._allows_oversize = self.replace
        super().__init__(input_dim, sketch_size, seed=seed, dtype=dtype)
        self._idx = None

    def _options(self):
        return {"replace": self.replace}

    def indices(self, xp=None) -> np.ndarray:
        """The sampled row of ``A`` for each row of ``S``."""
        if xp is not None:  # the portable path: checked as the cached one (2**40 rows met numpy's error)
            self._check_index_memory()
            return self._indices(xp)
        if self._idx is None:
            self._check_index_memory()
            self._idx = self._indices(None)
        return read_only_view(self._idx)

    def _indices(self, xp):
        n, r = self.input_dim, self.sketch_size
        if self.replace:
            if xp is None:
                return cpu.uniform_indices(self.key[0], self.key[1], r, n, STREAM_SAMPLE)
            return bounded_exact(xp, self.key, xp.arange(r, dtype=xp.int64), n, STREAM_SAMPLE)
        if xp is None:
            return cpu.floyd_sample(self.key[0], self.key[1], n, r, STREAM_SELECT)
        return sample_without_replacement(xp, self.key, n, r, STREAM_SELECT)

    def scales(self) -> np.ndarray:
        """Row scales ``sqrt(n / r)``."""
        r = self.sketch_size
        check_allocation(8 * r, f"the {r} row scales", "use a smaller sketch_size")
        return np.full(r, math.sqrt(self.input_dim / r))

    def _reference_columns(self, start, stop, xp):
        return self._columns_from(self._indices(xp), self.scales(), start, stop, xp)


def check_uniform_mix(uniform_mix) -> float:
    """The share of uniform probability in leverage sampling: a real number in ``[0, 1)``.

    Examples
    --------
    >>> check_uniform_mix(0.25)
    0.25
    >>> check_uniform_mix(1.0)
    Traceback (most recent call last):
    ...
    ValueError: uniform_mix must lie in [0, 1) (the share of uniform probability), got 1.0
    """
    mix = check_real(uniform_mix, "uniform_mix")
    if not (0.0 <= mix < 1.0):
        raise ValueError(
            f"uniform_mix must lie in [0, 1) (the share of uniform probability), got {uniform_mix!r}"
        )
    return mix


def _check_scores(scores, input_dim):
    s = check_real_vector(scores, input_dim, "scores")
    if (s < 0).any():
        raise ValueError("scores must be non-negative (leverage scores lie in [0, 1])")
    if s.max() <= 0:  # not the sum, which can overflow for finite scores
        raise ValueError("scores are all zero; at least one row must have positive leverage")
    return s


#: Below this sum the scores are rescaled by their largest: ``(1 - mix) * s`` of subnormal
#: scores lost their digits (scores ``[5e-324, 0, 0]`` gave probabilities summing to 1.1).
_SMALLEST_SUM = 2.0**-960


def _scores_and_sum(s):
    """``(s, sum(s))`` for finite non-negative ``s``, rescaled by ``max(s)`` only if the sum overflows
    or is near the subnormal range.

    Only proportions matter; scores of ordinary size are returned as they are, so the
    probabilities keep their exact rounding.

    Examples
    --------
    >>> _scores_and_sum(np.array([1e308, 1e308, 0.0]))
    (array([1., 1., 0.]), np.float64(2.0))
    >>> _scores_and_sum(np.array([5e-324, 0.0]))
    (array([1., 0.]), np.float64(1.0))
    """
    with np.errstate(over="ignore"):
        total = s.sum()
    if not math.isfinite(total) or total < _SMALLEST_SUM:
        s = s / s.max()
        total = s.sum()
    return s, total


class LeverageSampling(_RowSampling):
    """Leverage-score sampling with replacement, rows rescaled by ``1 / sqrt(r p_i)``.

    Row ``i`` of ``A`` is drawn with probability
    ``p_i = (1 - alpha) * l_i / sum(l) + alpha / n`` (``alpha = uniform_mix``, default 0.1): the
    uniform share keeps every ``p_i > 0`` (so ``E[S.T S] = I`` holds exactly and estimates stay
    finite) at the price of at most a factor ``1 / (1 - alpha)`` in the sample size the leverage
    theory asks for (the "shrinkage leverage" of Ma, Mahoney & Yu 2015). Sample ``i`` inverts the
    CDF at the 53-bit uniform of counter ``(i, 0, STREAM_SAMPLE)``.

    Parameters
    ----------
    input_dim, sketch_size, seed, dtype
        See :class:`rsketch.SketchOperator`.
    scores : array of shape (input_dim,)
        Non-negative importance scores (leverage scores, exact or approximate); only their
        proportions matter.
    uniform_mix : float in [0, 1), default 0.1
        ``alpha`` above.

    See Also
    --------
    LeverageSampling.from_matrix : compute the scores from ``A`` (exactly or approximately).

    Examples
    --------
    >>> import numpy as np, rsketch
    >>> A = np.random.default_rng(0).standard_normal((500, 5))
    >>> S = rsketch.LeverageSampling.from_matrix(A, 100, seed=0)
    >>> (S @ A).shape
    (100, 5)
    """

    kind = "leverage"

    def __init__(
        self, input_dim, sketch_size, *, scores, seed=None, dtype=np.float64, uniform_mix=DEFAULT_UNIFORM_MIX
    ):
        super().__init__(input_dim, sketch_size, seed=seed, dtype=dtype)
        self.scores = _check_scores(scores, self.input_dim)
        self.uniform_mix = mix = check_uniform_mix(uniform_mix)
        s, total = _scores_and_sum(self.scores)
        self._probabilities = (1 - mix) * s / total + mix / self.input_dim
        self._cdf = np.cumsum(self.probabilities)
        self._idx = None

    def _options(self):
        return {"uniform_mix": self.uniform_mix}

    @property
    def probabilities(self) -> np.ndarray:
        """The sampling probabilities ``p_i`` (read-only: they define the sketch)."""
        return read_only_view(self._probabilities)

    def indices(self, xp=None) -> np.ndarray:
        """The sampled row of ``A`` for each row of ``S``."""
        if xp is not None:
            self._check_index_memory()
            w = random_words(xp, self.key, xp.arange(self.sketch_size, dtype=xp.int64), 0, STREAM_SAMPLE)
            return self._invert(to_host(w[0]), to_host(w[1]))  # O(r) words; np.asarray refuses CuPy's
        if self._idx is None:
            self._check_index_memory()
            w = cpu.philox_words(self.key[0], self.key[1], 0, self.sketch_size, 1, STREAM_SAMPLE)[:, 0, :]
            self._idx = self._invert(w[:, 0], w[:, 1])
        return read_only_view(self._idx)

    def _invert(self, w_lo, w_hi):
        u = uniform53_from_words(np, w_lo, w_hi)
        idx = np.searchsorted(self._cdf, u * self._cdf[-1], side="right")
        return np.minimum(idx, self.input_dim - 1).astype(np.int64)

    def scales(self) -> np.ndarray:
        """Row scales ``1 / sqrt(r p_{idx_i})``."""
        return 1.0 / np.sqrt(self.sketch_size * self.probabilities[self.indices()])

    def _reference_columns(self, start, stop, xp):
        idx = self.indices(xp)
        scale = 1.0 / np.sqrt(self.sketch_size * self.probabilities[idx])
        return self._columns_from(idx, scale, start, stop, xp)

    @classmethod
    def from_matrix(
        cls, A, sketch_size, *, method="exact", seed=None, dtype=np.float64, uniform_mix=DEFAULT_UNIFORM_MIX
    ):
        """Leverage sampling with scores computed from ``A``.

        Parameters
        ----------
        A : array or sparse matrix of shape (n, p)
        sketch_size : int
        method : {"exact", "approx"}
            ``"exact"``: squared row norms of the left singular vectors of ``A`` (thin SVD,
            rank-revealing; ``O(n p**2)``). ``"approx"``: the fast approximation of Drineas,
            Magdon-Ismail, Mahoney & Woodruff (JMLR 2012): ``R`` from the QR of an SRHT sketch
            ``Pi1 A`` with ``r1 = min(n, 4p + 64)`` rows, then squared row norms of
            ``A R^{-1} Pi2`` for a Gaussian ``Pi2`` with ``r2 = max(32, ceil(4 ln n))`` columns;
            ``O(n p log n + n p r2)``, within a constant factor of the exact scores with high
            probability. Its sketches are seeded from keys derived from ``seed``.
        seed, dtype, uniform_mix
            As for the constructor.

        Examples
        --------
        >>> import numpy as np, rsketch
        >>> A = np.random.default_rng(1).standard_normal((2000, 10))
        >>> S = rsketch.LeverageSampling.from_matrix(A, 200, method="approx", seed=0)
        >>> S.scores.shape
        (2000,)
        """
        check_option(method, "method", {"exact", "approx"})
        A2, _ = check_operand(A, None, "A")
        A2, _ = scale_design(A2)  # scores do not change with A's scale: the SVD of 1e307 overflowed
        key = key_from_seed(seed)
        scores = exact_leverage(A2) if method == "exact" else approximate_leverage(A2, key)
        return cls._keyed(scores, sketch_size, key, seed, dtype, uniform_mix)

    @classmethod
    def from_scores(
        cls, scores, sketch_size, *, seed=None, dtype=np.float64, uniform_mix=DEFAULT_UNIFORM_MIX
    ):
        """The operator :meth:`from_matrix` builds, given the scores it would compute (computed elsewhere:
        on a GPU, or from chunks): the same seed gives the same sampled rows.

        Examples
        --------
        >>> import numpy as np, rsketch
        >>> A = np.random.default_rng(1).standard_normal((500, 4))
        >>> S = rsketch.LeverageSampling.from_scores(exact_leverage(A), 50, seed=3)
        >>> bool((S.indices() == rsketch.LeverageSampling.from_matrix(A, 50, seed=3).indices()).all())
        True
        """
        return cls._keyed(scores, sketch_size, key_from_seed(seed), seed, dtype, uniform_mix)

    @classmethod
    def _keyed(cls, scores, sketch_size, key, seed, dtype, uniform_mix):
        """The operator with Philox key ``key``, the one ``key_from_seed(seed)`` gave the caller: the
        constructor's for the same ``seed``, so ``from_matrix``, ``from_scores`` and the constructor
        sample the same rows from the same scores. The key is drawn once by the caller (scores and
        sampling share it): a Generator (or None) seed must not be drawn from twice."""
        scores = np.asarray(scores, dtype=np.float64)
        op = cls(scores.shape[0], sketch_size, scores=scores, seed=0, dtype=dtype, uniform_mix=uniform_mix)
        op.seed, op.key = seed, key
        return op


def _zero_matrix_error() -> ValueError:
    return ValueError(
        "A is zero (rank 0): its leverage scores are undefined; pass scores=... or use uniform sampling"
    )


def exact_leverage(A) -> np.ndarray:
    """Leverage scores of ``A``: squared row norms of an orthonormal basis of its range.

    Examples
    --------
    >>> exact_leverage(np.eye(3)[:, :2])
    array([1., 1., 0.])
    """
    n, p = A.shape
    q = min(n, p)
    check_allocation(
        8 * (2 * n * p + n * q + n),
        f"exact leverage scores of a {n} x {p} A (a thin SVD)",
        "use method='approx'",
    )
    dense = A.toarray() if sp.issparse(A) else np.asarray(A, dtype=np.float64)
    U, s, _ = scipy.linalg.svd(dense, full_matrices=False, check_finite=False)
    # float64's rule even for float32 A: its SVD runs in float64 on the data as given (float32's, with
    # max(n, p) eps at n = 100,000, dropped a column of 1e-3 the scale of the others)
    rank = leverage_rank(s, dense.shape)
    return np.einsum("ij,ij->i", U[:, :rank], U[:, :rank])


def leverage_rank(s, shape, dtype=np.float64) -> int:
    """The columns of ``U`` that carry leverage: the singular values ``s`` of a matrix of ``shape``
    above ``max(shape) eps s_1`` (NumPy's ``matrix_rank`` rule), ``eps`` that of the arithmetic that
    computed ``s`` (``dtype``: float32's for the approximate scores' float32 sketch of float32 data,
    float64's otherwise); ``ValueError`` for a zero matrix.

    With float64's ``eps`` for a float32 sketch, the rounding of a rank-5 float32 matrix counted as 5
    more directions, and the approximate scores, whose ``R^-1`` then scaled that rounding up by ``1e7``,
    summed to 19.8.

    Examples
    --------
    >>> leverage_rank(np.array([2.0, 1.0, 1e-20]), (10, 3))
    2
    >>> s = np.array([2.0, 1.0, 1e-7])
    >>> leverage_rank(s, (10, 3)), leverage_rank(s, (10, 3), np.float32)
    (3, 2)
    """
    eps = np.finfo(arithmetic_dtype(dtype)).eps
    rank = int(np.sum(s > s[0] * max(shape) * eps)) if s.size and s[0] > 0 else 0
    if rank == 0:
        raise _zero_matrix_error()
    return rank


def approximate_leverage(A, key) -> np.ndarray:
    """Drineas, Magdon-Ismail, Mahoney & Woodruff (2012) approximate leverage scores.

    Examples
    --------
    >>> A = np.random.default_rng(0).standard_normal((1000, 4))
    >>> bool(abs(approximate_leverage(A, (1, 2)).sum() - 4) < 1)
    True
    """
    key = check_key(key)
    n, p = A.shape
    r1 = min(n, 4 * p + 64)
    r2 = max(32, math.ceil(4 * math.log(n)))
    check_allocation(
        8 * (n * r2 + n),
        f"approximate leverage scores of a {n} x {p} A (an {n} x {r2} projection)",
        "pass scores=...",
    )
    Pi1 = SRHT(n, r1, seed=np.random.SeedSequence(list(derive_key(key, 1))))
    SA = Pi1 @ A
    # Pseudo-inverse factor of Pi1 A by SVD: robust to rank deficiency (R^{-1} = V diag(1/s)).
    _, s, Vt = scipy.linalg.svd(SA, full_matrices=False, check_finite=False)
    rank = leverage_rank(s, SA.shape, A.dtype)
    Rinv = Vt[:rank].T / s[:rank]
    # N(0, 1/r2) entries, so E[||x Pi2||^2] = ||x||^2 (a JL projection of the rows of A R^-1).
    Pi2 = GaussianSketch(rank, r2, seed=np.random.SeedSequence(list(derive_key(key, 2)))).to_dense().T
    Omega = Rinv @ Pi2  # (p, r2)
    B = np.asarray(A @ Omega)
    return np.einsum("ij,ij->i", B, B)
