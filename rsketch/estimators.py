"""scikit-learn estimators over :func:`rsketch.lstsq`: ordinary least squares and ridge by sketching."""

from __future__ import annotations

import numbers

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import _check_sample_weight, check_is_fitted, validate_data

from rsketch._validation import LSTSQ_METHODS, check_int, check_option, check_sketch_kind
from rsketch.dask import check_dask_operand, is_dask_array, validate_dask_problem
from rsketch.linalg import default_sketch_size, lstsq
from rsketch.linalg._precondition import RANK_CUTOFF
from rsketch.operators import SketchOperator


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

    def fit(self, X, y, sample_weight=None):
        """Fit the coefficients by sketched least squares.

        Parameters
        ----------
        X : array-like, sparse matrix or dask.array.Array of shape (n_samples, n_features)
            A Dask array is fitted in passes over its chunks (``docs/dask.md``).
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
        if is_dask_array(X) or is_dask_array(y):
            return self._fit_dask(X, y, sample_weight, alpha)
        X, y = validate_data(
            self,
            X,
            y,
            accept_sparse=("csr", "csc", "coo"),
            dtype=[np.float64, np.float32],
            y_numeric=True,
            multi_output=True,
        )
        X = X.astype(np.float64, copy=False)
        y = np.asarray(y, dtype=np.float64)
        n, p = X.shape
        w = _check_sample_weight(sample_weight, X, dtype=np.float64, ensure_non_negative=True)
        sw = np.sqrt(w)
        intercept_col = False
        if self.fit_intercept and not sp.issparse(X):
            wsum = w.sum()
            x_mean = (w @ X) / wsum if wsum > 0 else np.zeros(p)
            y_mean = (w @ y) / wsum if wsum > 0 else np.zeros(y.shape[1:])
            A = (X - x_mean) * sw[:, None]
        else:
            x_mean = np.zeros(p)
            y_mean = np.zeros(y.shape[1:])
            if self.fit_intercept:
                # Centering would fill a sparse X: add an unpenalised column of ones instead.
                X = sp.hstack([X, sp.csr_matrix(np.ones((n, 1)))], format="csr")
                intercept_col = True
            A = sp.diags(sw) @ X if sp.issparse(X) else X * sw[:, None]
        b = (y - y_mean) * (sw[:, None] if y.ndim == 2 else sw)
        q = A.shape[1]
        if alpha > 0:
            pen = np.sqrt(alpha) * np.eye(q)
            if intercept_col:
                pen[-1, -1] = 0.0
            A = sp.vstack([A, sp.csr_matrix(pen)], format="csr") if sp.issparse(A) else np.vstack([A, pen])
            b = np.concatenate([b, np.zeros((q,) + b.shape[1:])])
        m = A.shape[0]
        r = (
            self.sketch_size
            if self.sketch_size is not None
            else default_sketch_size(self.method, max(m, q), q)
        )
        if r >= n or m < q:
            # Tiny data: a sketch as large as the data saves nothing. Solve directly (minimum norm,
            # singular values below 8 u s_max dropped: the rank rule of rsketch.lstsq).
            Ad = A.toarray() if sp.issparse(A) else A
            coef = np.linalg.lstsq(Ad, b, rcond=RANK_CUTOFF * np.finfo(np.float64).eps / 2)[0]
            self.n_iter_ = 0
            self.solver_ = "direct"
        else:
            res = lstsq(A, b, sketch=self.sketch, sketch_size=r, method=self.method, seed=self.random_state)
            coef = res.coef
            self.n_iter_ = int(res.iterations)
            self.solver_ = self.method
        if intercept_col:
            intercept = coef[-1]
            coef = coef[:-1]
        else:
            intercept = y_mean - x_mean @ coef if self.fit_intercept else np.zeros(y.shape[1:])
        self.coef_ = coef.T if coef.ndim == 2 else coef
        self.intercept_ = float(intercept) if np.ndim(intercept) == 0 else np.asarray(intercept)
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
        X = validate_data(self, X, accept_sparse=("csr", "csc", "coo"), reset=False)
        return np.asarray(X @ self.coef_.T) + self.intercept_

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
        if self.fit_intercept:  # one pass for the weighted column means
            wsum = w.sum()
            x_mean = (
                (da.from_array(w, chunks=(X.chunks[0],)) @ X).compute() / wsum if wsum > 0 else np.zeros(p)
            )
            y_mean = (w @ y) / wsum if wsum > 0 else np.zeros(y.shape[1:])
            A = (X - x_mean) * sw
        else:
            x_mean, y_mean = np.zeros(p), np.zeros(y.shape[1:])
            A = X * sw
        b = (y - y_mean) * (np.sqrt(w)[:, None] if y.ndim == 2 else np.sqrt(w))
        if alpha > 0:
            A = da.concatenate([A, da.from_array(np.sqrt(alpha) * np.eye(p), chunks=(p, p))], axis=0)
            b = np.concatenate([b, np.zeros((p,) + b.shape[1:])])
        r = (
            self.sketch_size
            if self.sketch_size is not None
            else default_sketch_size(self.method, A.shape[0], p)
        )
        if r >= n:  # tiny data: solved directly, as in memory
            coef = np.linalg.lstsq(A.compute(), b, rcond=RANK_CUTOFF * np.finfo(np.float64).eps / 2)[0]
            self.n_iter_, self.solver_ = 0, "direct"
        else:
            res = lstsq(A, b, sketch=self.sketch, sketch_size=r, method=self.method, seed=self.random_state)
            coef, self.n_iter_, self.solver_ = res.coef, int(res.iterations), self.method
        intercept = y_mean - x_mean @ coef if self.fit_intercept else np.zeros(y.shape[1:])
        self.n_features_in_ = p
        self.coef_ = coef.T if coef.ndim == 2 else coef
        self.intercept_ = float(intercept) if np.ndim(intercept) == 0 else np.asarray(intercept)
        return self

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = True
        tags.target_tags.multi_output = True
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
        Dense ``X`` is centred (weighted means); sparse ``X`` gets a column of ones instead, which
        keeps it sparse (the two agree whenever the solution is unique).
    random_state : None, int, numpy.random.Generator or numpy.random.SeedSequence
        Seed of the sketch(es), passed to :func:`rsketch.lstsq` as ``seed``.

    Attributes
    ----------
    coef_ : ndarray of shape (n_features,) or (n_targets, n_features)
    intercept_ : float or ndarray of shape (n_targets,)
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
    >>> (np.round(model.coef_, 6) + 0.0).tolist(), round(model.intercept_, 6), model.solver_
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

    Parameters
    ----------
    alpha : float >= 0, default 1.0
        The penalty (as in :class:`sklearn.linear_model.Ridge`).
    sketch, sketch_size, method, fit_intercept, random_state
        As in :class:`SketchedLinearRegression`.

    Attributes
    ----------
    coef_, intercept_, n_iter_, solver_, n_features_in_, feature_names_in_
        As in :class:`SketchedLinearRegression`.

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
        if isinstance(a, bool) or not isinstance(a, numbers.Real):
            raise TypeError(f"alpha must be a non-negative real number, got {type(a).__name__}")
        if not (np.isfinite(a) and a >= 0):
            raise ValueError(f"alpha must be a finite number >= 0, got {a!r}")
        return float(a)
