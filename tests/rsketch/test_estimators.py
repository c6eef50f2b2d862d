"""The scikit-learn estimators: check_estimator, agreement with sklearn, Pipeline/GridSearchCV, inputs."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.linear_model import LinearRegression, Ridge
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from rsketch import SketchedLinearRegression, SketchedRidge


@parametrize_with_checks([SketchedLinearRegression(), SketchedRidge()])
def test_sklearn_compatible(estimator, check):
    check(estimator)


def _data(n=3000, p=8, k=None, seed=0, cond=1e3):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p)) * np.logspace(0, -np.log10(cond), p) + 2.0  # offset: intercept matters
    coef = rng.standard_normal((p,) if k is None else (p, k))
    y = X @ coef + 0.5 + 0.1 * rng.standard_normal(n if k is None else (n, k))
    return X, y


@pytest.mark.parametrize("method", ["precondition", "ihs"])
@pytest.mark.parametrize("k", [None, 2])
def test_linear_regression_matches_sklearn(method, k):
    X, y = _data(k=k)
    ours = SketchedLinearRegression(method=method, random_state=0).fit(X, y)
    ref = LinearRegression().fit(X, y)
    assert ours.solver_ == method and ours.n_iter_ > 0
    # Both are accurate to ~ eps * kappa(centred X) ~ 1e-12 here; 1e-8 leaves a wide margin.
    np.testing.assert_allclose(ours.coef_, ref.coef_, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(ours.intercept_, ref.intercept_, rtol=1e-8, atol=1e-10)
    assert ours.score(X, y) == pytest.approx(ref.score(X, y), rel=1e-12)


@pytest.mark.parametrize("alpha", [1e-3, 1.0, 100.0])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_ridge_matches_sklearn(alpha, fit_intercept):
    X, y = _data(k=2)
    ours = SketchedRidge(alpha=alpha, fit_intercept=fit_intercept, random_state=1).fit(X, y)
    ref = Ridge(alpha=alpha, fit_intercept=fit_intercept, solver="cholesky").fit(X, y)
    assert ours.solver_ == "precondition"
    np.testing.assert_allclose(ours.coef_, ref.coef_, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(ours.intercept_, ref.intercept_, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("Est", [SketchedLinearRegression, SketchedRidge])
def test_sparse_matches_dense(Est):
    X, y = _data()
    X[np.abs(X - 2) < 0.8] = 0.0
    dense = Est(random_state=0).fit(X, y)
    for fmt in ("csr", "csc", "coo"):
        sparse = Est(random_state=0).fit(sp.csr_matrix(X).asformat(fmt), y)
        np.testing.assert_allclose(sparse.coef_, dense.coef_, rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(sparse.intercept_, dense.intercept_, rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(sparse.predict(sp.csr_matrix(X)), dense.predict(X), rtol=1e-8)


def test_sample_weight_equals_repetition():
    X, y = _data(n=2000)
    w = np.random.default_rng(3).integers(0, 4, size=2000)
    weighted = SketchedLinearRegression(random_state=0).fit(X, y, sample_weight=w)
    repeated = SketchedLinearRegression(random_state=0).fit(np.repeat(X, w, axis=0), np.repeat(y, w))
    assert weighted.solver_ == repeated.solver_ == "precondition"
    np.testing.assert_allclose(weighted.coef_, repeated.coef_, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(weighted.intercept_, repeated.intercept_, rtol=1e-8)
    ref = LinearRegression().fit(X, y, sample_weight=w)
    np.testing.assert_allclose(weighted.coef_, ref.coef_, rtol=1e-8, atol=1e-10)


def test_integer_X_and_random_state_types():
    X, y = _data()
    Xi = np.round(10 * X).astype(np.int64)
    ref = LinearRegression().fit(Xi, y).coef_
    for rs in (0, np.random.default_rng(0), np.random.SeedSequence(0), None):
        model = SketchedLinearRegression(random_state=rs).fit(Xi, y)
        np.testing.assert_allclose(model.coef_, ref, rtol=1e-8, atol=1e-10)


def test_sketch_and_solve_is_the_sketched_estimator():
    X, y = _data(n=4000, p=5)
    model = SketchedLinearRegression(method="sketch_and_solve", sketch_size=200, random_state=0).fit(X, y)
    ref = LinearRegression().fit(X, y)
    assert model.solver_ == "sketch_and_solve" and model.n_iter_ == 0
    # Residual efficiency ~ 1 + p/r: the sketched fit is close to, but not equal to, OLS.
    rss = np.sum((y - model.predict(X)) ** 2)
    rss_ref = np.sum((y - ref.predict(X)) ** 2)
    assert rss_ref < rss < 1.5 * rss_ref


def test_tiny_data_solves_directly():
    X, y = _data(n=30, p=4)
    model = SketchedLinearRegression().fit(X, y)
    assert model.solver_ == "direct" and model.n_iter_ == 0
    np.testing.assert_allclose(model.coef_, LinearRegression().fit(X, y).coef_, rtol=1e-10)


def test_a_wide_fit_is_the_minimum_norm_solution():
    # Centring a wide X leaves a singular value of rounding size (4e-15 of the largest); the direct
    # solve kept it at 8 u, and coef_ was 1-12% off LinearRegression's. NumPy's rank rule drops it.
    rng = np.random.default_rng(0)
    for n, p in ((150, 400), (30, 80)):
        X, y = rng.standard_normal((n, p)) + 2, rng.standard_normal(n)
        ours, ref = SketchedLinearRegression(random_state=0).fit(X, y), LinearRegression().fit(X, y)
        assert ours.solver_ == "direct"
        np.testing.assert_allclose(ours.coef_, ref.coef_, rtol=1e-10, atol=1e-12 * np.abs(ref.coef_).max())
        assert ours.intercept_ == pytest.approx(ref.intercept_, rel=1e-10)


@pytest.mark.parametrize("fmt", ["dense", "csr"])
def test_ridge_where_the_penalty_dominates_matches_sklearn(fmt):
    # alpha >= ||X||_F^2: the augmented least-squares system lets its sqrt(alpha) rows swamp the data
    # rows (coef_ off Ridge's by 1e3 at X of 1e-35, by 34 at alpha 1e70); the normal equations then
    # have a condition number of at most 2 and are solved by Cholesky.
    rng = np.random.default_rng(1)
    y, w = rng.standard_normal((2000, 2)) + 5, rng.uniform(0, 2, 2000)
    for scale, alpha, fit_intercept in ((1e-35, 1.0, True), (1.0, 1e70, True), (1.0, 1e100, False)):
        X = scale * (rng.standard_normal((2000, 6)) + 3)
        Xin = sp.csr_matrix(X) if fmt == "csr" else X
        ours = SketchedRidge(alpha=alpha, fit_intercept=fit_intercept, random_state=0).fit(
            Xin, y, sample_weight=w
        )
        ref = Ridge(alpha=alpha, fit_intercept=fit_intercept, solver="cholesky").fit(X, y, sample_weight=w)
        assert ours.solver_ == "cholesky"
        np.testing.assert_allclose(ours.coef_, ref.coef_, rtol=1e-10, atol=1e-12 * np.abs(ref.coef_).max())
        np.testing.assert_allclose(ours.intercept_, ref.intercept_, rtol=1e-12, atol=1e-12)


def test_a_dask_refit_forgets_the_feature_names():
    import dask
    import dask.array as da
    import pandas as pd

    rng = np.random.default_rng(2)
    X, y = rng.standard_normal((400, 6)), rng.standard_normal(400)
    model = SketchedLinearRegression(random_state=0).fit(pd.DataFrame(X, columns=list("abcdef")), y)
    with dask.config.set(scheduler="threads"):
        model.fit(da.from_array(X[:, :4], chunks=100), da.from_array(y, chunks=100))
    assert model.n_features_in_ == 4 and not hasattr(model, "feature_names_in_")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # sklearn warned that the feature names did not match
        model.predict(X[:, :4])


def test_pipeline_and_grid_search():
    X, y = _data(n=2500, p=6)
    pipe = make_pipeline(StandardScaler(), SketchedRidge(random_state=0))
    alphas = [0.1, 10.0, 1e3, 1e5]
    grid = GridSearchCV(pipe, {"sketchedridge__alpha": alphas}, cv=3).fit(X, y)
    # the same search over scikit-learn's Ridge: the same scores and choice (the test had asserted
    # only that the best alpha was one of those given)
    ref = GridSearchCV(make_pipeline(StandardScaler(), Ridge()), {"ridge__alpha": alphas}, cv=3).fit(X, y)
    assert grid.best_params_["sketchedridge__alpha"] == ref.best_params_["ridge__alpha"]
    scores = grid.cv_results_["mean_test_score"], ref.cv_results_["mean_test_score"]
    np.testing.assert_allclose(*scores, rtol=1e-8)
    pipe2 = make_pipeline(StandardScaler(), SketchedLinearRegression(random_state=0)).fit(X, y)
    assert pipe2.score(X, y) == pytest.approx(LinearRegression().fit(X, y).score(X, y), rel=1e-10)


@pytest.mark.parametrize(
    "params, exc, match",
    [
        ({"method": "qr"}, ValueError, "method must be one of"),
        ({"sketch": "hadamard"}, ValueError, "sketch must be one of"),
        ({"sketch_size": 0}, ValueError, "sketch_size must be >= 1"),
        ({"sketch_size": 1.5}, TypeError, "sketch_size must be an integer"),
        ({"fit_intercept": "yes"}, TypeError, "fit_intercept must be a bool"),
        ({"alpha": -1.0}, ValueError, "alpha must be"),
        ({"alpha": "big"}, TypeError, "alpha must be"),
        ({"alpha": np.array([1.0, 10.0])}, TypeError, "one alpha per target .* is not supported"),
        ({"alpha": [1.0]}, TypeError, "one alpha per target"),
        ({"random_state": "abc"}, TypeError, "random_state must be"),
    ],
)
def test_bad_parameters(params, exc, match):
    X, y = _data(n=2000, p=4)
    with pytest.raises(exc, match=match):
        SketchedRidge(**params).fit(X, y)


def test_a_zero_dimensional_alpha_is_a_number():
    # Ridge takes np.array(2.0); it was refused as "got ndarray"
    X, y = _data(n=2000, p=4)
    a = SketchedRidge(alpha=np.array(2.0), random_state=0).fit(X, y).coef_
    np.testing.assert_array_equal(a, SketchedRidge(alpha=2.0, random_state=0).fit(X, y).coef_)


def test_bad_sample_weight():
    X, y = _data(n=500, p=3)
    with pytest.raises(ValueError, match="sample_weight"):
        SketchedLinearRegression().fit(X, y, sample_weight=np.ones(10))
    with pytest.raises(ValueError, match="[Nn]egative"):
        SketchedLinearRegression().fit(X, y, sample_weight=-np.ones(500))


@pytest.mark.parametrize("Est", [SketchedLinearRegression, SketchedRidge])
def test_feature_names_from_a_dataframe(Est):
    pd = pytest.importorskip("pandas", reason="pandas is in the test extra")
    rng = np.random.default_rng(0)
    X = pd.DataFrame(rng.standard_normal((300, 3)), columns=["a", "b", "c"])
    y = X.to_numpy() @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.standard_normal(300)
    est = Est(random_state=0).fit(X, y)
    assert list(est.feature_names_in_) == ["a", "b", "c"] and est.n_features_in_ == 3
    with pytest.warns(UserWarning, match="does not have valid feature names"):
        plain = est.predict(X.to_numpy())
    np.testing.assert_allclose(est.predict(X), plain)
    with pytest.raises(ValueError, match="feature names"):
        est.predict(X.rename(columns={"a": "z"}))


# float32 X: coef_, intercept_ and predictions float32, as scikit-learn's Ridge and LinearRegression
# give (they had come out float64); solved in float64, so the float32 coefficients are the float64
# fit's rounded once
@pytest.mark.parametrize("fmt", ["dense", "csr"])
@pytest.mark.parametrize(
    ("make", "shape", "solver"),
    [
        (lambda: SketchedLinearRegression(random_state=0), (300, 10), "direct"),
        (lambda: SketchedLinearRegression(random_state=0), (4000, 10), "precondition"),
        (lambda: SketchedRidge(alpha=1.0, random_state=0), (4000, 10), "precondition"),
        (lambda: SketchedRidge(alpha=1.0, random_state=0), (200, 300), "kernel"),
    ],
)
def test_float32_data_gets_float32_coefficients_and_predictions(fmt, make, shape, solver):
    rng = np.random.default_rng(7)
    X = rng.standard_normal(shape).astype(np.float32)
    y = (X[:, :3].sum(axis=1) + 0.1 * rng.standard_normal(shape[0])).astype(np.float32)
    Xf = sp.csr_matrix(X) if fmt == "csr" else X
    est, est64 = make().fit(Xf, y), make().fit(Xf.astype(np.float64), y.astype(np.float64))
    assert est.solver_ == est64.solver_ == solver
    assert est.coef_.dtype == np.float32 and np.asarray(est.intercept_).dtype == np.float32
    assert est.predict(Xf).dtype == np.float32
    np.testing.assert_array_equal(est.coef_, est64.coef_.astype(np.float32))
    assert est64.coef_.dtype == np.float64 and est64.predict(Xf.astype(np.float64)).dtype == np.float64


@pytest.mark.parametrize("method", ["precondition", "sketch_and_solve", "ihs"])
def test_a_constant_feature_gets_a_zero_coefficient(method):
    # Centred, a constant column had been rounding noise (its mean is not exact), and the solvers
    # fitted it: coef_ 1.7e11 (sketch-and-solve), 0.02 or 0.07 by memory layout (precondition), a share
    # of the intercept column with a sparse X. scikit-learn's centring gives exactly 0 (a probe, 2026-12-07).
    rng = np.random.default_rng(1)
    X = rng.normal(size=(3000, 3))
    X[:, 1] = 1 / 3
    y = X[:, 0] + 1 + 0.01 * rng.normal(size=3000)
    w = rng.random(3000)
    ref = LinearRegression().fit(X, y, sample_weight=w)
    fits = [
        SketchedLinearRegression(method=method, random_state=0).fit(XX, y, sample_weight=w)
        for XX in (X, np.asfortranarray(X), sp.csr_matrix(X), sp.coo_matrix(X))
    ]
    for est in fits:
        assert est.coef_[1] == 0.0 and est.coef_.shape == (3,) and est.n_features_in_ == 3
        if method != "sketch_and_solve":  # the exact solvers: scikit-learn's answer
            np.testing.assert_allclose(est.coef_, ref.coef_, rtol=0, atol=1e-10)
            assert est.intercept_ == pytest.approx(ref.intercept_, abs=1e-10)
    assert np.array_equal(fits[0].coef_, fits[1].coef_)  # the same bits in either memory order
    ridge = SketchedRidge(alpha=1.0, random_state=0).fit(X, np.stack([y, 2 * y], axis=1))
    assert ridge.coef_.shape == (2, 3) and (ridge.coef_[:, 1] == 0).all()
    flat = SketchedLinearRegression().fit(np.ones((50, 2)), y[:50])  # every column constant
    assert (flat.coef_ == 0).all() and flat.intercept_ == pytest.approx(y[:50].mean(), rel=1e-14)
    unfitted = SketchedLinearRegression(fit_intercept=False, random_state=0).fit(X, y)
    assert unfitted.coef_[1] != 0  # without an intercept a constant column is a feature like any
