"""scikit-learn estimators: ordinary least squares and ridge by sketching (:func:`rsketch.lstsq`), and PCA by
randomized SVD (:func:`rsketch.svd`)."""

from __future__ import annotations

import math
import numbers

import array_api_compat
import numpy as np
import scipy.linalg
import scipy.sparse as sp
import sklearn
from array_api_compat import device
from scipy.sparse.linalg import LinearOperator
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, RegressorMixin, TransformerMixin
from sklearn.utils.extmath import svd_flip
from sklearn.utils.sparsefuncs import mean_variance_axis
from sklearn.utils.validation import _check_sample_weight, check_array, check_is_fitted
from sklearn.utils.validation import validate_data as _sklearn_validate_data

from rsketch._backend import is_non_numpy_array, like, numpy_namespace, to_host
from rsketch._exact_scaling import scale_design, shift_down, unit_exponent
from rsketch._validation import (
    LSTSQ_METHODS,
    check_allocation,
    check_int,
    check_option,
    check_seed,
    check_sketch_kind,
    check_sparse_structure,
)
from rsketch.dask import check_dask_operand, is_dask_array, validate_dask_problem
from rsketch.linalg import GramOperator, default_sketch_size, lstsq, nystrom_pcg, svd
from rsketch.linalg._common import column_norms, frobenius_norm
from rsketch.linalg._lowrank import RANGE_METHODS, check_passes
from rsketch.operators import SketchOperator
from rsketch.operators.base import canonical_csr


def _validated(estimator, X, *args, **kwargs):
    """scikit-learn's ``validate_data``, after a sparse ``X``'s index arrays are checked
    (:func:`rsketch._validation.check_sparse_structure`: SciPy's products and conversions, and
    scikit-learn's variances, read out of bounds where an index was changed in place; a fit had
    crashed the process)."""
    if sp.issparse(X):
        check_sparse_structure(X, "X")
    return _sklearn_validate_data(estimator, X, *args, **kwargs)


# A ridge design this wide gets Nyström-preconditioned CG on the normal equations (issue 21): the
# augmented sketch-and-precondition would factor a sketch of at least p x p (O(p^3)) and sketch the
# p identity rows; the Nyström preconditioner costs O(n p l) with l ~ the effective dimension.
NYSTROM_MIN_FEATURES = 2000
# Nyström columns at most: at 10,000 x 10,000 (d_eff = 3,133) the sketch stops at 1,600 columns and
# CG takes 90 iterations, against 187 at a cap of 1,000 (the fit 13.5 s against 13.8 s from rounds
# of 50; docs/lowrank.md). Past about 1,600 the GEMM of a round costs more than the CG it saves.
NYSTROM_MAX_RANK = 2000
NYSTROM_SKETCH_BYTES = 256 << 20
# The adaptive sketch's first round: each round is a pass over X (the sparse product, 0.2 s at
# 10,000 x 10,000, whatever the width), so rounds of 200, 400, ...: 12.5 s against 13.1-13.9 s
# for rounds from 50.
NYSTROM_INITIAL_RANK = 200
# Relative residual of the CG on X.T X + alpha I: the coefficients' error is about cond(X.T X + alpha I)
# times this, and the preconditioned CG needs ~2 sqrt(kappa_P) more iterations per factor of 10.
NYSTROM_TOL = 1e-14
# More features than samples, at most this many samples: the ridge in scikit-learn's kernel form,
# coef = A.T (A A.T + alpha I)^-1 b with A the centred, weighted X: an n x n system (its matrix
# 200 MB at 5,000). The normal equations' null space (p - n directions at least, where alpha is
# the only curvature) takes the rounding of every CG product times 1/alpha: at alpha = 1e-8 a
# 150 x 400 design's coef_ was 8e-6 off Ridge's, at 1e-12 390%, without a warning; A.T kills
# those directions of the kernel form's solution (issue 21's probe).
KERNEL_MAX_SAMPLES = 5000
KERNEL_BLOCK_BYTES = 32 << 20


def _library(a) -> str:
    """The top-level module of ``a``'s type, for messages ("cupy", "array_api_strict", "numpy")."""
    return type(a).__module__.split(".")[0]


def _require_dispatch(X, method):
    if not sklearn.get_config()["array_api_dispatch"]:
        raise TypeError(
            f"X is a {_library(X)} array: {method} on it runs on its device under scikit-learn's array API "
            "dispatch; enable it with sklearn.set_config(array_api_dispatch=True) (or within "
            "sklearn.config_context(array_api_dispatch=True)), or pass a NumPy array to compute on the CPU"
        )


def _numpy_converted(a):
    """``np.asarray(a)`` where NumPy converts ``a`` (a host library's array, PyTorch's on the CPU),
    else None (CuPy's, a GPU tensor: they refuse the implicit conversion)."""
    try:
        return np.asarray(a)
    except (TypeError, RuntimeError, ValueError):
        return None


def _without_dispatch(X, method, fitted=None):
    """``X`` as scikit-learn's own estimators take it with array API dispatch off: another library's array
    that NumPy converts (PyTorch's on the CPU) as a NumPy array, computed on the host; one it cannot
    (CuPy's) a ``TypeError`` saying how to turn dispatch on. Under dispatch, or for an estimator whose
    ``fitted`` arrays live in another library (its methods need dispatch), ``X`` as it is.

    scikit-learn's array API checks fit PyTorch CPU tensors without dispatch and expect this; a
    ``TypeError`` for them had failed ``check_array_api_input`` wherever PyTorch is installed."""
    if sklearn.get_config()["array_api_dispatch"] or not is_non_numpy_array(X):
        return X
    if fitted is not None and is_non_numpy_array(fitted):
        return X  # _check_fit_device then asks for dispatch, naming the method
    converted = _numpy_converted(X)
    if converted is None:
        _require_dispatch(X, method)
    return converted


def _follow(a, X):
    """``a`` (``y``, ``sample_weight``) moved to ``X``'s library and device, as scikit-learn does it."""
    if a is None or sp.issparse(a):
        return a
    xp = array_api_compat.array_namespace(X)
    if array_api_compat.is_array_api_obj(a) and array_api_compat.array_namespace(a) is xp:
        # the same library, perhaps another device (whose arrays X's cannot be combined with)
        return a if device(a) == device(X) else array_api_compat.to_device(a, device(X))
    return like(np.asarray(to_host(a)), X)


def _on_host(a, name):
    """``a`` (``y``, ``sample_weight``) for a NumPy ``X``: another library's array moved to the host
    under scikit-learn's array API dispatch (as ``Ridge`` does; it had met an AttributeError); without
    it, converted by NumPy where it can be, else a ``TypeError`` naming it."""
    if not is_non_numpy_array(a):
        return a
    if not sklearn.get_config()["array_api_dispatch"]:
        converted = _numpy_converted(a)  # a host library's array, as scikit-learn converts it
        if converted is None:
            raise TypeError(
                f"{name} is a {_library(a)} array while X is a NumPy array: pass {name} as a NumPy array, "
                "or enable scikit-learn's array API dispatch (sklearn.set_config(array_api_dispatch=True))"
            )
        return converted
    return np.asarray(to_host(a))


def _library_and_device(a):
    if not is_non_numpy_array(a):
        return "numpy", "cpu"
    return _library(a), str(device(a))


def _check_fit_device(estimator, fitted, X, method):
    """scikit-learn's rule (and message) for predict/transform: ``X`` in the library and on the device of
    the fit (``fitted``, a fitted array); then dispatch must be on."""
    fitted, given = _library_and_device(fitted), _library_and_device(X)
    if fitted != given:
        raise ValueError(
            f"Inputs passed to {type(estimator).__name__}.{method}() must use the same namespace and the "
            f"same device as those passed to fit(): fitted on {fitted[0]} arrays (device {fitted[1]}), "
            f"given {given[0]} input (device {given[1]}); pass X on the fit's device, or refit"
        )
    _require_dispatch(X, method)


def _centred_sum_of_squares(X, mean, A, c, xp) -> float:
    """``||(X - 1 mean.T) / c||_F^2``: from the column variances of ``X / c`` for a sparse ``X``, else
    from the centred ``A`` (scaled in place: it is a copy, no longer needed)."""
    # divided by c, not multiplied by 1 / c: below 2**-1024 (float32: 2**-128) that overflows, and
    # data of 1e-310 had ratios of 0 and an infinite noise variance
    if sp.issparse(X):
        scaled = X.tocsr(copy=True)
        scaled.data /= c
        return float(mean_variance_axis(scaled, axis=0)[1].sum()) * X.shape[0]
    if not is_non_numpy_array(A):
        A /= c
        return float(np.einsum("ij,ij->", A, A, dtype=np.float64))
    A = A / c
    return float(xp.sum(A * A, dtype=xp.float64))


def _is_float32(X) -> bool:
    """Whether a validated ``X`` (NumPy, SciPy sparse, or another array-API library's) is float32."""
    if sp.issparse(X) or isinstance(X, np.ndarray):
        return X.dtype == np.float32
    return X.dtype == array_api_compat.array_namespace(X).float32


def _is_wide(n, p):
    return p >= NYSTROM_MIN_FEATURES or (p > n and p >= 200)


def _nystrom_max_rank(X):
    """The most Nyström columns for a wide ridge: ``NYSTROM_MAX_RANK``, at most ``n`` (the rank of
    ``X.T X``), and for a dense ``X`` at most what keeps the sketch's two ``p x l`` buffers within
    ``NYSTROM_SKETCH_BYTES`` or half of ``X``'s bytes, whichever is more (1000 for a sparse or
    device ``X``, the default of :func:`rsketch.linalg.nystrom_pcg`)."""
    n, p = X.shape
    if not isinstance(X, np.ndarray):
        return min(p, 1000)
    budget = max(X.nbytes // 2, NYSTROM_SKETCH_BYTES)
    return int(max(1, min(p, n, NYSTROM_MAX_RANK, budget // (2 * p * X.itemsize))))


def _mean_weights(w, xp):
    """``(v, sum(v))`` with ``v = w 2**-e`` (exact) and ``2**e`` near the largest weight, or None where
    every weight is zero: weights of ``1e306`` had summed to inf and every mean to 0, and weights of
    ``5e-324``, one bit each, been rounded unequally."""
    top = float(xp.max(w)) if w.shape[0] else 0.0
    if not top > 0:
        return None
    v = shift_down(w, unit_exponent(top))
    return v, xp.sum(v)


def _constant_columns(X) -> np.ndarray:
    """Which columns of ``X`` (NumPy, SciPy sparse, or a device array) hold one value: a bool array on
    the host. Two reductions, no copy of ``X`` (a sparse one's implicit zeros count)."""
    if X.shape[0] == 0:
        return np.zeros(X.shape[1], dtype=bool)
    if sp.issparse(X):
        hi, lo = (np.asarray(m.todense()).ravel() for m in (X.max(axis=0), X.min(axis=0)))
        return hi == lo
    xp = array_api_compat.array_namespace(X)
    return np.asarray(to_host(xp.max(X, axis=0) == xp.min(X, axis=0)), dtype=bool)


def _weighted_mean(weights, Z):
    """``v @ Z / sum(v)`` for ``weights = (v, sum(v))``: the sums of entries near the float range's end
    (``7e306``) overflow, and are then taken of ``Z`` scaled by a power of two. (Dividing ``v`` by its
    sum first left a constant column's mean off by rounding, and its centred column not zero.)"""
    v, total = weights
    mean = (v @ Z) / total
    xp = array_api_compat.array_namespace(mean)
    if bool(xp.all(xp.isfinite(mean))):
        return mean
    scaled, e = scale_design(Z)
    return shift_down((v @ scaled) / total, -e)


def _data_norm(A, p) -> float:
    """``||A[:, :p]||_F`` without overflow, for a NumPy, SciPy sparse or device ``A`` (on the host)."""
    if is_non_numpy_array(A):
        return frobenius_norm(column_norms(A[:, :p]))
    return frobenius_norm(A[:, :p])


def _intercept_exponent(A, sw) -> int:
    """The ``e`` with ``2**e ||sw||`` near the mean column norm ``||A||_F / sqrt(p)`` of a weighted
    sparse design (0 where either is zero): the scale of its intercept column."""
    target, weights = frobenius_norm(A) / math.sqrt(A.shape[1]), frobenius_norm(sw)
    if not (target > 0 and weights > 0):
        return 0
    return unit_exponent(target) - unit_exponent(weights)


class _SketchedLinearModel(RegressorMixin, BaseEstimator):
    """Fit/validation shared by the estimators; subclasses say how much ridge penalty to add."""

    def _alpha(self) -> float:
        return 0.0

    def _check_params(self):
        if isinstance(self.sketch, SketchOperator):
            raise TypeError(
                "sketch must be a kind name for an estimator (it is drawn in fit, for the data "
                "seen there); pass sketch_size and random_state to control it"
            )
        check_sketch_kind(self.sketch, "sketch")
        check_option(self.method, "method", LSTSQ_METHODS)
        if self.sketch_size is not None:
            check_int(self.sketch_size, "sketch_size", minimum=1)
        if not isinstance(self.fit_intercept, (bool, np.bool_)):
            raise TypeError(f"fit_intercept must be a bool, got {type(self.fit_intercept).__name__}")
        check_seed(self.random_state, "random_state")  # the solvers' errors would name it "seed"

    def fit(self, X, y, sample_weight=None):
        """Fit the coefficients by sketched least squares.

        Parameters
        ----------
        X : array-like, sparse matrix or dask.array.Array of shape (n_samples, n_features)
            A Dask array is fitted in passes over its chunks (``docs/dask.md``); a CuPy array on its
            device, under scikit-learn's ``array_api_dispatch`` (``docs/gpu.md``).
        y : array-like or dask.array.Array of shape (n_samples,) or (n_samples, n_targets)
        sample_weight : array-like of shape (n_samples,), optional
            Non-negative weights: row ``i`` counts ``sample_weight[i]`` times (rows are scaled by
            ``sqrt(sample_weight)``).

        Returns
        -------
        self
        """
        self._check_params()
        alpha = self._alpha()
        self._coef_dtype = None  # float64 unless the validated X is float32 (_validate_fit_input)
        if is_dask_array(X) or is_dask_array(y):
            return self._fit_dask(X, y, sample_weight, alpha)
        X, y, w = self._validate_fit_input(X, y, sample_weight)
        if self.fit_intercept:
            constant = _constant_columns(X)
            if constant.any():
                return self._fit_without(X, y, w, alpha, constant)
        return self._fit_validated(X, y, w, alpha)

    def _fit_without(self, X, y, w, alpha, constant):
        """The fit with an intercept where some columns of ``X`` are constant: their coefficients are 0
        (the intercept holds them), as scikit-learn's centring makes them, and the rest are fitted
        without them. Centred, a constant column had been rounding noise (its mean is not exact),
        which the solvers fitted: ``coef_`` of ``1.7e11`` (sketch-and-solve), or, with a sparse ``X``,
        a share of the intercept column it is collinear with."""
        keep = np.flatnonzero(~constant)
        xp = numpy_namespace() if sp.issparse(X) else array_api_compat.array_namespace(X)
        if keep.size == 0:
            v = _mean_weights(w, xp)
            y_mean = _weighted_mean(v, y) if v is not None else like(np.zeros(y.shape[1:]), y)
            self.n_iter_, self.solver_ = 0, "direct"
            self._set_coefficients(like(np.zeros((X.shape[1],) + tuple(y.shape[1:])), y), y_mean)
            return self
        rest = X.tocsc()[:, keep] if sp.issparse(X) else xp.take(X, like(keep, X), axis=1)  # (COO: no [])
        self._fit_validated(rest, y, w, alpha)
        # coef_ [..., keep] from the fit, zeros at the constant columns: a gather from [coef_, 0]
        source = np.full(X.shape[1], keep.size)
        source[keep] = np.arange(keep.size)
        cxp = array_api_compat.array_namespace(self.coef_)
        padded = cxp.concat([self.coef_, cxp.zeros_like(self.coef_[..., :1])], axis=-1)
        self.coef_ = cxp.take(padded, like(source, self.coef_), axis=padded.ndim - 1)
        return self

    def _fit_validated(self, X, y, w, alpha):
        """:meth:`fit` on validated ``(X, y, w)``: float64, ``y`` and ``w`` in ``X``'s namespace."""
        # NumPy's namespace, or the device library's (under scikit-learn's array API dispatch).
        xp = numpy_namespace() if sp.issparse(X) else array_api_compat.array_namespace(X)
        n, p = X.shape
        if alpha > 0 and self.method == "precondition" and _is_wide(n, p):
            if p > n and n <= KERNEL_MAX_SAMPLES and not is_non_numpy_array(X):
                return self._fit_kernel(X, y, w, alpha)
            return self._fit_nystrom(X, y, w, alpha)
        sw = xp.sqrt(w)
        intercept_col = None  # the exponent of a sparse X's intercept column
        if self.fit_intercept and not sp.issparse(X):
            v = _mean_weights(w, xp)
            x_mean = _weighted_mean(v, X) if v is not None else like(np.zeros(p), y)
            y_mean = _weighted_mean(v, y) if v is not None else like(np.zeros(y.shape[1:]), y)
            A = (X - x_mean) * sw[:, None]
        else:
            x_mean = like(np.zeros(p), y)
            y_mean = like(np.zeros(y.shape[1:]), y)
            A = sp.diags(sw) @ X if sp.issparse(X) else X * sw[:, None]
            if self.fit_intercept:
                # Centering would fill a sparse X: an unpenalised intercept column instead, 2**e sw
                # with 2**e ||sw|| near the data columns' mean norm (exact: a power of two). A
                # column of ones beside features of 1e16 fell below lstsq's rank cut, 8 u ||A||,
                # and was dropped; beside features of 1e-16 it left the features there (coef_ 0).
                intercept_col = _intercept_exponent(A, sw)
                A = sp.hstack([A, sp.csr_matrix(np.ldexp(sw, intercept_col)[:, None])], format="csr")
        b = (y - y_mean) * (sw[:, None] if y.ndim == 2 else sw)
        q = A.shape[1]
        if alpha > 0 and math.sqrt(alpha) >= _data_norm(A, p):
            return self._fit_penalty_dominated(A, b, alpha, x_mean, y_mean, y, intercept_col)
        if alpha > 0:
            pen = np.sqrt(alpha) * np.eye(q)
            if intercept_col is not None:
                pen[-1, -1] = 0.0
            if sp.issparse(A):
                A = sp.vstack([A, sp.csr_matrix(pen)], format="csr")
            else:
                A = xp.concat([A, like(pen, A)], axis=0)
            b = xp.concat([b, like(np.zeros((q,) + tuple(b.shape[1:])), b)], axis=0)
        m = A.shape[0]
        r = (
            self.sketch_size
            if self.sketch_size is not None
            else default_sketch_size(self.method, max(m, q), q)
        )
        if r >= n or m < q:
            # Tiny data: a sketch as large as the data saves nothing. Solve directly (minimum norm),
            # on the host, singular values below max(m, q) u s_max dropped (NumPy's matrix_rank rule):
            # centring a wide X leaves a rounding-level one of order sqrt(n) u ||X|| (4e-15 of the
            # largest), which lstsq's 8 u kept, and coef_ came out 1-12% off LinearRegression's.
            check_allocation(  # A on the host, dense, and the SVD's copy and factor
                8 * m * q * 3,
                f"{type(self).__name__}'s direct solve of a {m} x {q} design (the sketch, sketch_size={r}, "
                f"is no smaller than the {n} samples)",
                "pass a sketch_size below n_samples" if 2 * q < n else "use fewer features",
            )
            Ad = A.toarray() if sp.issparse(A) else to_host(A)
            rcond = max(Ad.shape) * np.finfo(np.float64).eps
            coef = like(np.linalg.lstsq(Ad, to_host(b), rcond=rcond)[0], b)
            self.n_iter_ = 0
            self.solver_ = "direct"
        else:
            res = lstsq(A, b, sketch=self.sketch, sketch_size=r, method=self.method, seed=self.random_state)
            coef = res.coef
            self.n_iter_ = int(res.iterations)
            self.solver_ = self.method
        if intercept_col is not None:
            intercept = np.ldexp(coef[-1], intercept_col)
            coef = coef[:-1]
        else:
            intercept = y_mean - x_mean @ coef if self.fit_intercept else like(np.zeros(y.shape[1:]), y)
        self._set_coefficients(coef, intercept)
        return self

    def _fit_penalty_dominated(self, A, b, alpha, x_mean, y_mean, y, intercept_col):
        """Ridge where ``alpha >= ||A||_F^2``: the normal equations ``(A.T A + alpha I) coef = A.T b``
        by Cholesky, whose matrix then has a condition number of at most 2, so ``coef`` is accurate to
        ``O(u)``. The augmented least-squares system, backward stable only normwise, lets its
        ``sqrt(alpha)`` rows swamp the data rows there: at ``X`` of ``1e-35`` with ``alpha = 1``, or
        ``alpha = 1e70`` with ``X`` of order one, ``coef_`` was off ``Ridge``'s by ``1e3`` and ``34``.
        A sparse ``A``'s unpenalised intercept column ``a`` (its last) is eliminated first: the
        equations for the rest are those of the centred columns, ``B.T (I - a a.T / a.T a) B``.

        The system is solved scaled by powers of two (exact): ``B / k`` with ``k ~ sqrt(alpha)``, so
        that the penalty is near one and ``||B / k||_F^2 < 2``, and ``b`` and ``a`` out of the safe
        range to entries near one (``scale_design``); at ``X`` of ``2^500`` (``alpha = 2^1000``)
        ``B.T B`` had overflowed to NaN, and at ``2^-500`` underflowed to 0."""
        B = A[:, :-1] if intercept_col is not None else A
        k = math.frexp(alpha)[1] // 2  # alpha / 4**k in [1/2, 2)
        B, (b, eb) = shift_down(B, k), scale_design(b)
        # the p x p products on the host (a device X's are formed there, then moved)
        G = np.asarray((B.T @ B).toarray() if sp.issparse(B) else to_host(B.T @ B), dtype=np.float64)
        rhs = np.asarray(to_host(B.T @ b), dtype=np.float64)
        if intercept_col is not None:
            a = np.asarray(A[:, -1].toarray()).ravel()
            a, ea = scale_design(a)
            ata, Bta, atb = float(a @ a), np.asarray(B.T @ a).ravel(), np.asarray(a @ b)
            if ata > 0:
                G -= np.outer(Bta, Bta) / ata
                rhs -= np.multiply.outer(Bta, atb) / ata
        G[np.diag_indices_from(G)] += math.ldexp(alpha, -2 * k)
        coef = scipy.linalg.cho_solve(scipy.linalg.cho_factor(G), rhs, check_finite=False)
        if intercept_col is not None:  # a's coefficient, then that of sw (a = sw 2**(intercept_col - ea))
            theta = (atb - Bta @ coef) / ata if ata > 0 else np.zeros(y.shape[1:])
            intercept = np.ldexp(theta, eb - ea + intercept_col)
        coef = np.ldexp(coef, eb - k)
        if intercept_col is None:
            means = (to_host(y_mean), to_host(x_mean))  # a device X's, on the host
            intercept = means[0] - means[1] @ coef if self.fit_intercept else np.zeros(y.shape[1:])
        if not (np.isfinite(coef).all() and np.isfinite(intercept).all()):
            raise ValueError(
                f"the ridge solution for alpha={alpha:g} is beyond the float range: scale y, or X and alpha"
            )
        if is_non_numpy_array(y):  # the answer on X's device, as the other paths give it
            coef, intercept = like(coef, y), like(np.asarray(intercept), y)
        self.n_iter_, self.solver_ = 0, "cholesky"
        self._set_coefficients(coef, intercept)
        return self

    def _validate_fit_input(self, X, y, sample_weight):
        """``(X, y, w)`` checked, float64. Arrays of another library (CuPy) stay in it under scikit-learn's
        array API dispatch, ``y`` and ``sample_weight`` moved to ``X``'s namespace and device as scikit-learn
        does; without dispatch, NumPy converts those it can (:func:`_without_dispatch`), and the others
        get a ``TypeError`` saying how to proceed."""
        X = _without_dispatch(X, "fit")
        device_input = is_non_numpy_array(X)  # under dispatch (else X is NumPy's now)
        if device_input:
            y, sample_weight = (_follow(a, X) for a in (y, sample_weight))
        else:
            y, sample_weight = _on_host(y, "y"), _on_host(sample_weight, "sample_weight")
        if sp.issparse(y):
            raise TypeError(
                f"y must be a dense array, got a sparse {type(y).__name__}: pass y.toarray() (scikit-learn's "
                "regressors take dense targets)"
            )
        X, y = _validated(
            self,
            X,
            y,
            accept_sparse=False if device_input else ("csr", "csc", "coo"),
            dtype=None if device_input else [np.float64, np.float32],
            y_numeric=True,
            multi_output=True,
        )
        # solved in float64 (the solvers' accuracy contract); float32 coefficients for float32 X, as
        # scikit-learn's regressors give (coef_, intercept_ and predictions had come out float64)
        self._coef_dtype = X.dtype if _is_float32(X) else None
        if sp.issparse(X):
            X, y = X.astype(np.float64, copy=False), np.asarray(y, dtype=np.float64)
        else:
            xp = array_api_compat.array_namespace(X)
            X = xp.astype(X, xp.float64) if X.dtype != xp.float64 else X
            y = xp.astype(y, xp.float64) if y.dtype != xp.float64 else y
        w = _check_sample_weight(sample_weight, X, dtype=X.dtype, ensure_non_negative=True)
        return X, y, w

    def _set_coefficients(self, coef, intercept):
        dtype = getattr(self, "_coef_dtype", None)
        if dtype is not None:  # float32 X: rounded once, from the float64 solution
            xp = array_api_compat.array_namespace(coef)
            coef = xp.astype(coef, dtype)
            if is_non_numpy_array(intercept):
                intercept = xp.astype(intercept, dtype)
        self.coef_ = coef.T if coef.ndim == 2 else coef
        if not self.fit_intercept:  # 0.0 for every target, as scikit-learn's (it was an array of zeros)
            self.intercept_ = 0.0
        elif is_non_numpy_array(intercept):
            self.intercept_ = intercept  # a 0-d or (n_targets,) array of the device, as scikit-learn's
        else:
            kind = np.float32 if dtype is not None else np.float64
            self.intercept_ = (
                kind(intercept) if np.ndim(intercept) == 0 else np.asarray(intercept, dtype=kind)
            )

    def _weighted_means(self, X, y, w, xp):
        """``(x_mean, y_mean)`` on the host: the columns' means weighted by ``w`` where an intercept
        is fitted (and some weight is positive), zeros otherwise; ``xp`` is ``X``'s namespace."""
        v = _mean_weights(w, xp) if self.fit_intercept else None
        if v is not None:
            return to_host(xp.reshape(xp.asarray(_weighted_mean(v, X)), (-1,))), to_host(_weighted_mean(v, y))
        return np.zeros(X.shape[1]), np.zeros(y.shape[1:])

    def _fit_kernel(self, X, y, w, alpha):
        """Ridge with more features than samples in scikit-learn's kernel form (its ``"cholesky"``
        solver there): ``coef = A.T (A A.T + alpha I)^-1 b``, ``A = W^1/2 (X - 1 x_mean.T)``,
        ``b = W^1/2 (y - y_mean)``. ``A A.T`` (``n x n``) is summed over column blocks of ``X``,
        each centred in a dense copy (a sparse ``X`` too: never whole), and ``coef`` comes from a
        second pass. The problem is first scaled: weights by their largest and ``X`` by a power of
        two near its largest entry, ``alpha`` by both (the same solution; ``X`` of ``1e200`` or
        weights of ``1e150`` overflowed ``A A.T``); ``_kernel_solve`` solves the system."""
        n, p = X.shape
        X = X.tocsc() if sp.issparse(X) else X  # column blocks
        x_mean, y_mean = self._weighted_means(X, y, w, numpy_namespace())
        w_max = float(w.max())
        values = X.data if sp.issparse(X) else X  # the largest |entry|, with no |X| copy of X
        largest = max(float(values.max()), -float(values.min())) if values.size else 0.0
        if w_max == 0 or largest == 0:  # no data: the penalty alone, coef 0
            self.n_iter_, self.solver_ = 0, "kernel"
            self._set_coefficients(np.zeros((p,) + y.shape[1:]), y_mean)
            return self
        e = math.frexp(largest)[1]  # X / 2**e has entries below 1, exactly scaled
        sw = np.sqrt(w / w_max)
        # gamma = alpha / (w_max 4**e), in logarithms: it may be far outside the float range
        log_gamma = math.log(alpha) - math.log(w_max) - 2 * e * math.log(2.0)
        cols = max(1, KERNEL_BLOCK_BYTES // (8 * n))

        def block(a):  # columns a .. a + cols of A, scaled: sw (X - x_mean) / 2**e
            Xb = X[:, a : a + cols]
            Xb = Xb.toarray() if sp.issparse(Xb) else np.array(Xb, dtype=np.float64)
            return np.ldexp(Xb - x_mean[a : a + cols], -e) * sw[:, None]

        K = np.zeros((n, n))
        for a in range(0, p, cols):
            B = block(a)
            K += B @ B.T
        b = (y - y_mean) * (sw[:, None] if y.ndim == 2 else sw)
        z, factor = _kernel_solve(K, b, log_gamma, max(n, p))
        coef = np.empty((p,) + y.shape[1:])
        for a in range(0, p, cols):
            coef[a : a + cols] = block(a).T @ z
        # coef = A.T z / 2**e (gamma below 1), or A.T zeta w_max 2**e / alpha (zeta = gamma z)
        coef = (
            np.ldexp(coef, -e)
            if factor is None
            else coef * math.exp(factor + math.log(w_max) + e * math.log(2.0) - math.log(alpha))
        )
        intercept = y_mean - x_mean @ coef if self.fit_intercept else np.zeros(y.shape[1:])
        self.n_iter_, self.solver_ = 0, "kernel"
        self._set_coefficients(coef, intercept)
        return self

    def _fit_nystrom(self, X, y, w, alpha):
        """Ridge on a wide design: ``(Xc.T W Xc + alpha I) coef = Xc.T W yc`` by Nyström-preconditioned CG
        (:func:`rsketch.linalg.nystrom_pcg`), with ``Xc.T W Xc`` a :class:`~rsketch.linalg.GramOperator`
        (centring and weights inside the products, so ``X`` is never copied and a sparse ``X`` stays
        sparse). The ``n``-sized work stays in ``X``'s library (the products); the ``p``-sized CG runs
        on the host."""
        xp = numpy_namespace() if sp.issparse(X) else array_api_compat.array_namespace(X)
        x_mean, y_mean = self._weighted_means(X, y, w, xp)
        weights = None if bool(xp.all(w == 1)) else to_host(w)
        if weights is not None:  # weights c w and penalty c alpha: the same solution; weights to <= 1
            w_max = float(weights.max())  # (weights of 1e150 overflowed, of 1e-170 gave coef 0)
            if w_max > 0:
                weights, alpha = weights / w_max, alpha / w_max
                if not 0 < alpha < math.inf:
                    raise ValueError(
                        f"alpha / max(sample_weight) = {alpha:g} is outside the float range: give "
                        "alpha and sample_weight on closer scales"
                    )
        center = x_mean if self.fit_intercept else None
        gram = GramOperator(X, center=center, sample_weight=weights, check_finite=False)  # validated
        b = to_host(gram.transpose_weighted(y - like(y_mean, y)))
        # a sparse sign test matrix: for a NumPy X, F S.T from its pattern, so the sketch is one
        # GEMM, not two; every other X gets the same matrix, dense, and so the same preconditioner
        try:
            max_rank = _nystrom_max_rank(X)
            res = nystrom_pcg(
                gram, b, alpha, tol=NYSTROM_TOL, sketch="sparse_sign",
                initial_rank=min(NYSTROM_INITIAL_RANK, max_rank), max_rank=max_rank, seed=self.random_state,
            )  # fmt: skip
        except ValueError as err:
            if "not finite" not in str(err):
                raise
            raise ValueError(
                "X's entries are too large for the products of the normal equations X.T X (their sums "
                "overflow): scale X, e.g. with sklearn.preprocessing.StandardScaler"
            ) from err
        coef = res.x
        intercept = y_mean - x_mean @ coef if self.fit_intercept else np.zeros(y.shape[1:])
        self.n_iter_, self.solver_ = int(res.iterations), "nystrom_pcg"
        if is_non_numpy_array(y):  # the answer on X's device, as the other paths give it
            coef, intercept = like(coef, y), like(np.asarray(intercept), y)
        self._set_coefficients(coef, intercept)
        return self

    def predict(self, X):
        """Predict ``X @ coef_.T + intercept_``.

        Parameters
        ----------
        X : array-like, sparse matrix or dask.array.Array of shape (n_samples, n_features)

        Returns
        -------
        ndarray or dask.array.Array of shape (n_samples,) or (n_samples, n_targets)
            A lazy Dask array for Dask ``X``.
        """
        check_is_fitted(self)
        if is_dask_array(X):  # lazy, chunk by chunk, as dask-ml's estimators predict
            X, _ = check_dask_operand(X, None, "X")
            if X.ndim != 2 or X.shape[1] != self.n_features_in_:
                raise ValueError(
                    f"X has {X.shape[1] if X.ndim == 2 else 'no'} features, but {type(self).__name__} "
                    f"is expecting {self.n_features_in_} features as input"
                )
            return X.astype(np.float64) @ self.coef_.T + self.intercept_
        X = _without_dispatch(X, "predict", self.coef_)
        if is_non_numpy_array(X) or is_non_numpy_array(self.coef_):
            return self._predict_array_api(X)
        X = _validated(self, X, accept_sparse=("csr", "csc", "coo"), reset=False)
        return np.asarray(X @ self.coef_.T) + self.intercept_

    def _predict_array_api(self, X):
        _check_fit_device(self, self.coef_, X, "predict")
        X = _validated(self, X, reset=False)
        xp = array_api_compat.array_namespace(X)
        # NumPy's promotion, as predict on the host: float32 X and coef_ (a float32 fit) stay float32
        dtype = (
            xp.result_type(X.dtype, self.coef_.dtype) if xp.isdtype(X.dtype, "real floating") else xp.float64
        )
        X = xp.astype(X, dtype) if X.dtype != dtype else X
        coef = self.coef_ if self.coef_.ndim == 1 else xp.matrix_transpose(self.coef_)
        coef = xp.astype(coef, dtype) if coef.dtype != dtype else coef
        return X @ coef + self.intercept_

    def _fit_dask(self, X, y, sample_weight, alpha):
        """``fit`` for a Dask ``X``: centring, weights and the ridge rows stay lazy, fused into each pass."""
        import dask.array as da

        X, y, is_vector = validate_dask_problem(X, y)
        if is_vector:
            y = y[:, 0]
        n, p = X.shape
        if is_dask_array(sample_weight):
            sample_weight = sample_weight.compute()
        w = _check_sample_weight(sample_weight, y, dtype=np.float64, ensure_non_negative=True)
        sw = da.from_array(np.sqrt(w), chunks=(X.chunks[0],))[:, None]
        # one pass for the weighted column means and, for ridge, sum_i w_i ||x_i||^2 >= ||A||_F^2
        # (centring only lowers it), which tells a penalty that dominates the data
        v = _mean_weights(w, np) if self.fit_intercept else None
        chunked = lambda a: da.from_array(a, chunks=(X.chunks[0],))  # noqa: E731
        means = [] if v is None else [chunked(v[0]) @ X]
        squares = [chunked(w) @ (X * X).sum(axis=1)] if alpha > 0 else []
        computed = da.compute(*means, *squares)
        x_mean = computed[0] / v[1] if v is not None else np.zeros(p)
        y_mean = _weighted_mean(v, y) if v is not None else np.zeros(y.shape[1:])
        A = (X - x_mean) * sw if self.fit_intercept else X * sw
        b = (y - y_mean) * (np.sqrt(w)[:, None] if y.ndim == 2 else np.sqrt(w))
        if alpha > 0 and alpha >= float(computed[-1]):  # in memory's Cholesky, X.T X in one more pass
            self._fit_penalty_dominated(A, b, alpha, x_mean, y_mean, y, None)
            return self._dask_fitted(p)
        if alpha > 0:
            A = da.concatenate([A, da.from_array(np.sqrt(alpha) * np.eye(p), chunks=(p, p))], axis=0)
            b = np.concatenate([b, np.zeros((p,) + b.shape[1:])])
        r = (
            self.sketch_size
            if self.sketch_size is not None
            else default_sketch_size(self.method, A.shape[0], p)
        )
        if r >= n:  # tiny data: solved directly, as in memory
            Ad = A.compute()
            coef = np.linalg.lstsq(Ad, b, rcond=max(Ad.shape) * np.finfo(np.float64).eps)[0]  # as in memory
            self.n_iter_, self.solver_ = 0, "direct"
        else:
            res = lstsq(A, b, sketch=self.sketch, sketch_size=r, method=self.method, seed=self.random_state)
            coef, self.n_iter_, self.solver_ = res.coef, int(res.iterations), self.method
        intercept = y_mean - x_mean @ coef if self.fit_intercept else np.zeros(y.shape[1:])
        self._set_coefficients(coef, intercept)
        return self._dask_fitted(p)

    def _dask_fitted(self, p):
        self.n_features_in_ = p
        if hasattr(self, "feature_names_in_"):  # a Dask array has no column names: a refit forgets them
            del self.feature_names_in_
        return self

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        tags.target_tags.multi_output = True
        tags.array_api_support = True  # dense input of any array-API library, under array_api_dispatch
        return tags


class SketchedLinearRegression(_SketchedLinearModel):
    """Ordinary least squares solved by sketching (:func:`rsketch.lstsq`).

    With the default ``method="precondition"`` the coefficients match a direct solver's to working
    accuracy (the sketch only speeds the solve); ``method="sketch_and_solve"`` gives the cheaper
    sketched estimator of Raskutti & Mahoney (its residual is within ``1 + O(p/r)`` of optimal);
    ``"ihs"`` is the iterative Hessian sketch.

    When ``sketch_size`` (or its default, see :func:`rsketch.linalg.default_sketch_size`) would reach
    the number of samples, a sketch saves nothing, and the estimator solves the least-squares
    problem directly (``numpy.linalg.lstsq``, minimum norm); ``solver_`` then reads ``"direct"``.

    Parameters
    ----------
    sketch : str, default "sparse_sign"
        Sketch family (see :func:`rsketch.make_sketch`).
    sketch_size : int, optional
        Rows of the sketch; default depends on ``method``.
    method : {"precondition", "sketch_and_solve", "ihs"}, default "precondition"
    fit_intercept : bool, default True
        Dense ``X`` is centred (weighted means); sparse ``X`` gets an intercept column instead (a
        constant, at the data columns' scale), which keeps it sparse (the two agree whenever the
        solution is unique). A constant feature's coefficient is 0, as scikit-learn's centring
        makes it: such columns are left out of the solve.
    random_state : None, int, numpy.random.Generator, numpy.random.SeedSequence or numpy.random.RandomState
        Seed of the sketch(es), passed to :func:`rsketch.lstsq` as ``seed``.

    Attributes
    ----------
    coef_ : ndarray of shape (n_features,) or (n_targets, n_features)
    intercept_ : float or ndarray of shape (n_targets,)
        0.0 without ``fit_intercept``, whatever the number of targets (as scikit-learn's).
    n_iter_ : int
        Iterations of the solver (0 for a direct solve or sketch-and-solve).
    solver_ : str
        ``"direct"`` or the method used.
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        Only when ``X`` had string column names.

    See Also
    --------
    SketchedRidge : the same with an L2 penalty.
    rsketch.lstsq : the solver.

    Examples
    --------
    >>> import numpy as np
    >>> from rsketch import SketchedLinearRegression
    >>> rng = np.random.default_rng(0)
    >>> X = rng.standard_normal((5000, 4)); y = X @ [1.0, 2.0, 0.0, -1.0] + 3.0
    >>> model = SketchedLinearRegression(random_state=0).fit(X, y)
    >>> (np.round(model.coef_, 6) + 0.0).tolist(), round(float(model.intercept_), 6), model.solver_
    ([1.0, 2.0, 0.0, -1.0], 3.0, 'precondition')
    """

    def __init__(
        self,
        sketch="sparse_sign",
        sketch_size=None,
        method="precondition",
        fit_intercept=True,
        random_state=None,
    ):
        self.sketch = sketch
        self.sketch_size = sketch_size
        self.method = method
        self.fit_intercept = fit_intercept
        self.random_state = random_state


class SketchedRidge(_SketchedLinearModel):
    """Ridge regression ``min ||y - X w||^2 + alpha ||w||^2`` by sketching the augmented system.

    The ridge problem is least squares on ``[X; sqrt(alpha) I] w ~ [y; 0]``; sketch-and-precondition
    sketches that augmented matrix (its ``p`` extra rows are the identity part) and solves it to
    working accuracy. The intercept, when fitted, is not penalised. Tiny data are solved directly,
    as in :class:`SketchedLinearRegression`.

    A wide design (``n_features >= 2000``, or more features than samples and at least 200; with
    ``alpha > 0`` and ``method="precondition"``) is solved instead on the normal equations
    ``(X.T X + alpha I) w = X.T y`` by conjugate gradients with the randomized Nyström
    preconditioner of Frangella, Tropp & Udell (2023) (:func:`rsketch.nystrom_pcg`, ``X.T X`` as an
    operator: centring and weights inside its products, ``X`` never copied and a sparse ``X`` never
    densified; a NumPy ``X`` through :class:`rsketch.linalg.GramOperator`, one pass over ``X`` per
    CG product); ``solver_`` then reads ``"nystrom_pcg"``. With more features than samples and at
    most ``KERNEL_MAX_SAMPLES`` (5,000) samples of a NumPy or SciPy ``X``, it takes scikit-learn's
    kernel form instead, ``coef = A.T (A A.T + alpha I)^-1 b`` for the centred, weighted ``A``
    (``solver_`` reads ``"kernel"``): exact to rounding at any ``alpha``, where CG on the normal
    equations meets their null space (``docs/lowrank.md``).

    Parameters
    ----------
    alpha : float >= 0, default 1.0
        The penalty (as in :class:`sklearn.linear_model.Ridge`).
    sketch, sketch_size, method, fit_intercept, random_state
        As in :class:`SketchedLinearRegression`.

    Attributes
    ----------
    coef_, intercept_, n_iter_, n_features_in_, feature_names_in_
        As in :class:`SketchedLinearRegression`.
    solver_ : str
        ``"direct"`` or the method used, as there; ``"cholesky"`` where ``alpha`` is at least
        ``||X||_F^2`` (the normal equations, then well conditioned); ``"nystrom_pcg"`` or
        ``"kernel"`` for a wide design (above).

    Examples
    --------
    >>> import numpy as np
    >>> from sklearn.linear_model import Ridge
    >>> from rsketch import SketchedRidge
    >>> rng = np.random.default_rng(0)
    >>> X = rng.standard_normal((5000, 6)); y = X @ np.arange(6.0) + rng.standard_normal(5000)
    >>> ours = SketchedRidge(alpha=10.0, random_state=0).fit(X, y)
    >>> bool(np.allclose(ours.coef_, Ridge(alpha=10.0).fit(X, y).coef_, rtol=1e-10))
    True
    """

    def __init__(
        self,
        alpha=1.0,
        sketch="sparse_sign",
        sketch_size=None,
        method="precondition",
        fit_intercept=True,
        random_state=None,
    ):
        self.alpha = alpha
        self.sketch = sketch
        self.sketch_size = sketch_size
        self.method = method
        self.fit_intercept = fit_intercept
        self.random_state = random_state

    def _alpha(self) -> float:
        a = self.alpha
        if isinstance(a, np.ndarray) and a.ndim == 0 and a.dtype.kind in "iuf":  # Ridge takes it
            a = a.item()
        if isinstance(a, (np.ndarray, list, tuple)):
            raise TypeError(
                "alpha must be one non-negative real number: one alpha per target (as Ridge allows) "
                "is not supported; fit one SketchedRidge per column of y"
            )
        if isinstance(a, bool) or not isinstance(a, numbers.Real):
            raise TypeError(f"alpha must be a non-negative real number, got {type(a).__name__}")
        if not (np.isfinite(a) and a >= 0):
            raise ValueError(f"alpha must be a finite number >= 0, got {a!r}")
        return float(a)


def _kernel_solve(K, b, log_gamma, size):
    """``(K + gamma I)^-1 b`` for a symmetric positive semi-definite ``K``, ``gamma = exp(log_gamma)``:
    ``(z, None)``; or, where ``gamma >= 1``, ``(zeta, 0.0)`` with ``zeta = gamma z`` from
    ``(I + K / gamma) zeta = b`` (so a ``gamma`` past the float range is no overflow).

    Cholesky where ``gamma`` is above the rounding of ``K`` (``size u trace(K)``): a null direction of
    ``K`` then has ``K + gamma I``'s curvature at least ``gamma``, and ``coef = A.T z`` removes it.
    Below, ``K``'s rounding may exceed ``gamma`` there (Cholesky fails or divides by noise): its
    eigendecomposition, eigenvalues up to ``size u lambda_max`` dropped as zero (NumPy's
    ``matrix_rank`` rule; ``A.T`` maps their directions to zero in exact arithmetic)."""
    n = K.shape[0]
    trace = float(np.trace(K))
    if log_gamma >= 0:
        inv_gamma = math.exp(-log_gamma)
        M = K * inv_gamma
        M[np.diag_indices(n)] += 1.0
        return scipy.linalg.cho_solve(scipy.linalg.cho_factor(M, check_finite=False), b), 0.0
    gamma = math.exp(log_gamma)
    if gamma >= size * np.finfo(np.float64).eps * trace:
        M = K.copy()
        M[np.diag_indices(n)] += gamma
        try:
            return scipy.linalg.cho_solve(scipy.linalg.cho_factor(M, check_finite=False), b), None
        except np.linalg.LinAlgError:
            pass
    lam, Q = np.linalg.eigh(K)
    keep = lam > size * np.finfo(np.float64).eps * max(lam[-1], 0.0)
    Q, lam = Q[:, keep], lam[keep]
    coef = Q.T @ b
    coef /= (lam + gamma)[:, None] if coef.ndim == 2 else lam + gamma
    return Q @ coef, None


def _centred(X, mean):
    """``X - 1 mean.T`` for a sparse ``X`` as a LinearOperator: the centring is never stored, as
    scikit-learn's ``PCA`` does for sparse input (``O(nnz)`` per product, no dense ``n x p`` copy)."""
    n, p = X.shape

    def matmat(V):
        return X @ V - (mean @ V)[None, :] if V.ndim == 2 else X @ V - mean @ V

    def rmatmat(Y):
        return X.T @ Y - (mean[:, None] * Y.sum(axis=0)[None, :] if Y.ndim == 2 else mean * Y.sum())

    return LinearOperator(
        (n, p), matvec=matmat, rmatvec=rmatmat, matmat=matmat, rmatmat=rmatmat, dtype=X.dtype
    )


#: Entries of ``X`` per block of :meth:`SketchedPCA.score_samples` (8 MB of float64).
SCORE_BLOCK = 1 << 20


class SketchedPCA(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Principal component analysis by randomized SVD (:func:`rsketch.svd`) of the centred data.

    The data are centred (dense ``X``: a centred copy, as scikit-learn's ``PCA``; sparse ``X``: a
    ``LinearOperator`` that subtracts the mean inside every product, so ``X`` is never densified),
    and the leading ``n_components`` singular triplets come from :func:`rsketch.svd`: a first pass
    through a sketch operator, ``passes - 1`` more passes of subspace iteration (or a block Krylov
    space), and the SVD of the small projection. Signs follow scikit-learn's ``PCA``
    (``svd_flip(..., u_based_decision=False)``: the largest entry of each component is positive).

    Parameters
    ----------
    n_components : int, optional
        Components kept, ``1 <= n_components <= min(n_samples, n_features)``; default all of them.
    sketch : str, default "sparse_sign"
        The test matrix of the first pass (see :func:`rsketch.make_sketch`).
    oversample : int, default 10
        Extra columns of the basis (``n_components + oversample``).
    passes : int, default 7
        Passes of the range finder over the data (``2 q + 1``: ``q`` rounds of subspace
        iteration); one more pass projects onto the basis.
    method : {"subspace", "block_krylov"}, default "subspace"
        As in :func:`rsketch.range_finder` (``"block_krylov"`` needs an odd ``passes``).
    whiten : bool, default False
        Scale the projections to unit variance.
    random_state : None, int, numpy.random.Generator, numpy.random.SeedSequence or numpy.random.RandomState
        Seed of the sketch (``seed`` of :func:`rsketch.svd`).

    Attributes
    ----------
    components_ : ndarray of shape (n_components, n_features)
        Principal axes, by decreasing explained variance.
    explained_variance_ : ndarray of shape (n_components,)
        ``singular_values_**2 / (n_samples - 1)``.
    explained_variance_ratio_ : ndarray of shape (n_components,)
        The fraction of the total variance (the sum of the columns' variances, computed exactly).
    singular_values_ : ndarray of shape (n_components,)
    mean_ : ndarray of shape (n_features,)
    n_components_ : int
    noise_variance_ : float
        The mean variance left out: ``(total - sum(explained_variance_)) / (min(n, p) - k)``
        (zero when all components are kept).
    n_samples_ : int
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        Only when ``X`` had string column names.

    See Also
    --------
    rsketch.svd : the randomized SVD.
    sklearn.decomposition.PCA : ``svd_solver="randomized"`` is the same idea with Gaussian test
        matrices and LU between the power iterations.

    Examples
    --------
    >>> import numpy as np
    >>> from rsketch import SketchedPCA
    >>> rng = np.random.default_rng(0)
    >>> X = rng.standard_normal((2000, 3)) @ rng.standard_normal((3, 50)) + 5.0  # rank 3, offset
    >>> pca = SketchedPCA(n_components=3, random_state=0).fit(X)
    >>> round(float(pca.explained_variance_ratio_.sum()), 10)
    1.0
    >>> Z = pca.transform(X)
    >>> Z.shape, bool(np.allclose(pca.inverse_transform(Z), X))
    ((2000, 3), True)
    """

    def __init__(
        self,
        n_components=None,
        sketch="sparse_sign",
        oversample=10,
        passes=7,
        method="subspace",
        whiten=False,
        random_state=None,
    ):
        self.n_components = n_components
        self.sketch = sketch
        self.oversample = oversample
        self.passes = passes
        self.method = method
        self.whiten = whiten
        self.random_state = random_state

    def _check_params(self, n, p):
        if isinstance(self.sketch, SketchOperator):
            raise TypeError(
                "sketch must be a kind name for an estimator (it is drawn in fit, for the data seen)"
            )
        check_sketch_kind(self.sketch, "sketch")
        if self.sketch == "leverage":
            raise ValueError("sketch='leverage' cannot be a test matrix for PCA; use another kind")
        check_option(self.method, "method", RANGE_METHODS)
        check_int(self.oversample, "oversample", minimum=0)
        check_passes(self.passes)
        if not isinstance(self.whiten, (bool, np.bool_)):
            raise TypeError(f"whiten must be a bool, got {type(self.whiten).__name__}")
        check_seed(self.random_state, "random_state")
        if self.n_components is None:
            return min(n, p)
        return check_int(self.n_components, "n_components", minimum=1, maximum=min(n, p))

    def _fit(self, X):
        X = _without_dispatch(X, "fit")
        device_input = is_non_numpy_array(X)  # CuPy: fitted on its device, under array API dispatch
        X = _validated(
            self,
            X,
            accept_sparse=False if device_input else ("csr", "csc"),
            dtype=None if device_input else [np.float64, np.float32],
            ensure_min_samples=2,
        )
        xp = numpy_namespace() if sp.issparse(X) else array_api_compat.array_namespace(X)
        if not xp.isdtype(X.dtype, "real floating"):
            X = xp.astype(X, xp.float64)
        if sp.issparse(X) and not X.has_canonical_format:  # the variances square the stored values:
            X = canonical_csr(X)  # each entry stored once (a copy; duplicates doubled the ratios)
        n, p = X.shape
        k = self._check_params(n, p)
        if sp.issparse(X):
            mean = np.asarray(X.mean(axis=0), dtype=X.dtype).ravel()
            A = _centred(X, mean)
        else:
            mean = xp.mean(X, axis=0) if device_input else X.mean(axis=0)
            A = X - mean
        res = svd(
            A,
            k,
            sketch=self.sketch,
            oversample=self.oversample,
            passes=self.passes,
            method=self.method,
            error_probes=False,
            flip_sign=False,
            seed=self.random_state,
        )
        U, Vt = svd_flip(res.U, res.Vt, u_based_decision=False)
        s = res.s
        # The variances in units of c^2, c a power of two near s_1 (exact): the ratios and the noise
        # variance then neither underflow nor overflow (at X of 1e-170 the ratios were 0, at 1e200 NaN)
        # where the variances themselves cannot be represented.
        s64 = xp.astype(s, xp.float64)
        c = math.ldexp(1.0, math.frexp(float(s64[0]))[1]) if float(s64[0]) > 0 else 1.0
        squares = (s64 / c) ** 2
        total = _centred_sum_of_squares(X, mean, A, c, xp)  # ||X - 1 mean.T||_F^2 / c^2
        # c * c first overflowed at X of 1e153, variances of 1e306; variances beyond the range of X's
        # dtype are inf (their ratios are not)
        with np.errstate(over="ignore"):
            ev = xp.astype(squares * c * (c / (n - 1)), X.dtype)
        self.mean_ = mean
        # C-ordered (svd_flip's may be a transposed view): a pickled copy, C-ordered, then projects
        # with the same BLAS path, bit for bit
        self.components_ = np.ascontiguousarray(Vt) if isinstance(Vt, np.ndarray) else Vt
        self.singular_values_ = s
        self.explained_variance_ = ev
        ratio = squares / total if total > 0 else xp.zeros_like(squares)
        self.explained_variance_ratio_ = xp.astype(ratio, X.dtype)
        rest = min(n, p) - k
        left = max(total - float(xp.sum(squares)), 0.0)
        self.noise_variance_ = float(left * c * (c / (n - 1)) / rest) if rest > 0 else 0.0
        self.n_components_ = k
        self.n_samples_ = n
        return U, s

    def fit(self, X, y=None):
        """Fit the principal axes.

        Parameters
        ----------
        X : array-like or sparse matrix of shape (n_samples, n_features)
            Sparse input (CSR/CSC; COO is converted) is centred implicitly, never densified. A CuPy
            array is fitted on its device under scikit-learn's ``array_api_dispatch`` (``docs/gpu.md``).
        y : ignored

        Returns
        -------
        self
        """
        self._fit(X)
        return self

    def fit_transform(self, X, y=None):
        """Fit and return the projections ``U diag(s)`` of the SVD (no further pass over ``X``),
        whitened as :meth:`transform` whitens.

        Parameters
        ----------
        X : array-like or sparse matrix of shape (n_samples, n_features)
        y : ignored

        Returns
        -------
        ndarray of shape (n_samples, n_components)
        """
        U, s = self._fit(X)
        # whitened by transform's clipped scale: U sqrt(n - 1) turned variances of 1e-40 into 1
        return U * s / self._scale() if self.whiten else U * s

    def _scale(self):
        # sqrt(explained_variance_) as s / sqrt(n - 1): at X of 1e160 the variances overflow to inf
        # (transform gave zeros, inverse_transform NaN) where their square roots are representable
        xp = array_api_compat.array_namespace(self.explained_variance_)
        s = xp.astype(self.singular_values_, self.explained_variance_.dtype)
        scale = s / math.sqrt(max(self.n_samples_ - 1, 1))
        return xp.clip(scale, min=float(xp.finfo(scale.dtype).eps))

    def transform(self, X):
        """Project ``X`` onto the principal axes: ``(X - mean_) @ components_.T``.

        Parameters
        ----------
        X : array-like or sparse matrix of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples, n_components)
        """
        check_is_fitted(self)
        X = _without_dispatch(X, "transform", self.components_)
        if is_non_numpy_array(X) or is_non_numpy_array(self.components_):
            X = self._check_device_input(X, "transform", check_features=True)
            xp = array_api_compat.array_namespace(X)
            Ct = xp.matrix_transpose(self.components_)
            Z = X @ Ct - self.mean_ @ Ct
        else:
            X = _validated(self, X, accept_sparse=("csr", "csc"), dtype=[np.float64, np.float32], reset=False)
            Z = np.asarray(X @ self.components_.T) - self.mean_ @ self.components_.T
        return Z / self._scale() if self.whiten else Z

    def _check_device_input(self, X, method, check_features):
        """``X`` of the fit's library and device (scikit-learn's ``ValueError`` otherwise), checked."""
        _check_fit_device(self, self.components_, X, method)
        if check_features:  # transform: X has the features seen in fit
            X = _validated(self, X, reset=False)
        else:
            X = check_array(X)
        xp = array_api_compat.array_namespace(X)
        return X if xp.isdtype(X.dtype, "real floating") else xp.astype(X, self.components_.dtype)

    def inverse_transform(self, X):
        """Map projections back to the data space: ``X @ components_ + mean_``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_components)

        Returns
        -------
        ndarray of shape (n_samples, n_features)
        """
        check_is_fitted(self)
        X = _without_dispatch(X, "inverse_transform", self.components_)
        if is_non_numpy_array(X) or is_non_numpy_array(self.components_):
            X = self._check_device_input(X, "inverse_transform", check_features=False)
        else:
            X = check_array(X, dtype=[np.float64, np.float32])
        if X.shape[1] != self.n_components_:
            raise ValueError(f"X must have {self.n_components_} columns (n_components_), got shape {X.shape}")
        if self.whiten:
            X = X * self._scale()
        return X @ self.components_ + self.mean_

    def _ppca(self):
        """The probabilistic PCA model of the fit (Tipping & Bishop 1999): ``(xp, W, d, sigma2)``, the
        components ``W``, ``d = max(explained_variance_ - noise_variance_, 0)`` and ``sigma2 =
        noise_variance_``, whose covariance is ``W.T diag(d) W + sigma2 I`` (float64 for a NumPy fit,
        the fit's dtype on a device). It does not depend on ``whiten``, which scales ``transform``'s
        output only (scikit-learn's ``PCA`` scales ``W`` by ``sqrt(explained_variance_)`` there: its
        issue #13898)."""
        check_is_fitted(self)
        xp = array_api_compat.array_namespace(self.components_)
        dtype = self.components_.dtype if is_non_numpy_array(self.components_) else xp.float64
        W = xp.astype(self.components_, dtype)
        ev = xp.astype(self.explained_variance_, dtype)
        sigma2 = float(self.noise_variance_)
        # The ratios are exact where the variances leave the float range (fit computes them in units
        # of a power of two near s_1), the model is not: score had returned NaN at X of 1e300.
        stored = self.explained_variance_  # in the fit's dtype, where they were rounded
        if not (math.isfinite(sigma2) and bool(xp.all(xp.isfinite(stored)))):
            raise ValueError(
                f"the model's variances overflow the float range of {stored.dtype} (explained_variance_ "
                "holds inf): its covariance and likelihood cannot be computed; scale X and fit again"
            )
        # below the normal range a variance has lost digits (float64 X of 1e-160: score off by 1e-6)
        # or is 0 (float32 X of 1e-25: no error, and a wrong score; NaN on a device)
        tiny = float(xp.finfo(stored.dtype).smallest_normal)
        ratios = xp.asarray(self.explained_variance_ratio_)
        low_noise = 0 < sigma2 < float(xp.finfo(dtype).smallest_normal)
        if bool(xp.any((ratios > 0) & (stored < tiny))) or low_noise:
            raise ValueError(
                f"the model's variances underflow the float range of {stored.dtype} (explained_variance_ "
                "is below its smallest normal number where explained_variance_ratio_ is positive): its "
                "covariance and likelihood cannot be computed; scale X and fit again"
            )
        if sigma2 <= 0 and (self.n_components_ < W.shape[1] or not bool(xp.all(ev > 0))):
            raise ValueError(
                "the model's covariance is singular (noise_variance_ is 0 with fewer than n_features "
                "positive variances): its likelihood is not defined; fit fewer n_components"
            )
        return xp, W, xp.clip(ev - sigma2, min=0.0), sigma2

    def _identity(self, xp, W):
        p = W.shape[1]
        return xp.eye(p, dtype=W.dtype, device=device(W))

    def get_covariance(self):
        """The data covariance of the probabilistic PCA model: ``W.T diag(d) W + sigma2 I``.

        ``W`` the components, ``d = max(explained_variance_ - noise_variance_, 0)``,
        ``sigma2 = noise_variance_`` (as scikit-learn's ``PCA`` without ``whiten``).

        Returns
        -------
        ndarray of shape (n_features, n_features)

        Examples
        --------
        Every component kept, the model's covariance is the sample covariance:

        >>> import numpy as np
        >>> from rsketch import SketchedPCA
        >>> X = np.random.default_rng(0).standard_normal((500, 4)) * [3.0, 2.0, 1.0, 0.5]
        >>> pca = SketchedPCA(random_state=0).fit(X)
        >>> bool(np.allclose(pca.get_covariance(), np.cov(X.T)))
        True
        """
        xp, W, d, sigma2 = self._ppca()
        p = W.shape[1]
        check_allocation(8 * p * p, f"the covariance of {p} features", "use score_samples, which forms none")
        cov = (W.T * d) @ W + sigma2 * self._identity(xp, W)
        return xp.astype(cov, self.components_.dtype)

    def get_precision(self):
        """The inverse of :meth:`get_covariance`, by the matrix inversion lemma (``W`` has
        orthonormal rows): ``(I - W.T diag(d / (d + sigma2)) W) / sigma2``.

        Returns
        -------
        ndarray of shape (n_features, n_features)

        Examples
        --------
        >>> import numpy as np, rsketch
        >>> pca = rsketch.SketchedPCA(n_components=3, random_state=0)
        >>> P = pca.fit(np.random.default_rng(1).standard_normal((300, 5))).get_precision()
        >>> bool(np.allclose(P @ pca.get_covariance(), np.eye(5)))
        True
        """
        xp, W, d, sigma2 = self._ppca()
        p = W.shape[1]
        check_allocation(8 * p * p, f"the precision of {p} features", "use score_samples, which forms none")
        if sigma2 > 0:
            precision = self._identity(xp, W) / sigma2 - (W.T * (d / (sigma2 * (d + sigma2)))) @ W
        else:  # every component kept, every variance positive: W is orthogonal
            precision = (W.T / d) @ W
        return xp.astype(precision, self.components_.dtype)

    def score_samples(self, X):
        """Log-likelihood of each sample under the probabilistic PCA model (:meth:`get_covariance`).

        Computed from ``X``'s projections and residuals a block of rows at a time: no
        ``n_features x n_features`` matrix and no dense copy of a sparse ``X``.

        Parameters
        ----------
        X : array-like or sparse matrix of shape (n_samples, n_features)

        Returns
        -------
        ndarray of shape (n_samples,)

        Examples
        --------
        >>> from numpy.random import default_rng
        >>> from rsketch import SketchedPCA
        >>> X = default_rng(2).standard_normal((200, 3))
        >>> SketchedPCA(n_components=1, random_state=0).fit(X).score_samples(X[:3]).shape
        (3,)
        """
        xp, W, d, sigma2 = self._ppca()
        X = _without_dispatch(X, "score_samples", self.components_)
        if is_non_numpy_array(X) or is_non_numpy_array(self.components_):
            X = self._check_device_input(X, "score_samples", check_features=True)
        else:
            X = _validated(self, X, accept_sparse=("csr", "csc"), dtype=[np.float64, np.float32], reset=False)
        n, p = X.shape
        mean = xp.astype(self.mean_, W.dtype)
        # quad = ||r - W.T W r||^2 / sigma2 + sum_i (w_i . r)^2 / (d_i + sigma2), r = x - mean: the
        # residual is formed, not ||r||^2 - sum (w_i . r)^2, which cancels where r lies in range(W)
        parts = []
        rows = max(1, SCORE_BLOCK // max(1, p))
        for a in range(0, n, rows):
            block = X[a : min(a + rows, n), :]
            R = xp.astype(xp.asarray(block.toarray()) if sp.issparse(block) else block, W.dtype) - mean
            Z = R @ W.T
            q = xp.sum(Z * Z / (d + sigma2), axis=1)
            if sigma2 > 0:
                E = R - Z @ W
                q = q + xp.sum(E * E, axis=1) / sigma2
            parts.append(q)
        quad = xp.concat(parts) if len(parts) > 1 else parts[0]
        logdet = (p - W.shape[0]) * math.log(sigma2) if sigma2 > 0 else 0.0
        logdet += float(xp.sum(xp.log(d + sigma2)))
        out = -0.5 * (quad + (p * math.log(2 * math.pi) + logdet))
        return xp.astype(out, X.dtype)

    def score(self, X, y=None):
        """Mean log-likelihood of the samples (:meth:`score_samples`): what ``GridSearchCV`` and
        ``cross_val_score`` maximise without a ``scoring``, as for scikit-learn's ``PCA``.

        Parameters
        ----------
        X : array-like or sparse matrix of shape (n_samples, n_features)
            The samples to score: held-out data, for model selection.
        y : None
            Not used (the scikit-learn API passes it).

        Returns
        -------
        float

        Examples
        --------
        >>> import numpy as np
        >>> from rsketch import SketchedPCA
        >>> X = np.random.default_rng(3).standard_normal((400, 6))
        >>> scores = [SketchedPCA(n_components=k, random_state=0).fit(X[:300]).score(X[300:]) for k in (1, 6)]
        >>> len(scores), all(np.isfinite(scores))
        (2, True)
        """
        scores = self.score_samples(X)
        if is_non_numpy_array(scores):  # on its device, in its dtype
            return float(array_api_compat.array_namespace(scores).mean(scores))
        return float(np.mean(scores, dtype=np.float64))

    @property
    def _n_features_out(self):
        return self.components_.shape[0]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        tags.array_api_support = True  # dense input of any array-API library, under array_api_dispatch
        return tags
