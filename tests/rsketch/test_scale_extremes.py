"""Data at the edges of the float range, where a probe of the public API found silent failures.

Each answer is compared with the same problem at scale one: scaling by powers of two is exact, so
the results must agree to rounding (or a clear error must say the answer is out of range).
"""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.linear_model import LinearRegression, Ridge

import rsketch


def _rel(a, b):
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(b)).max())


@pytest.fixture(scope="module")
def sparse_problem():
    rng = np.random.default_rng(0)
    X = sp.random(3000, 20, density=0.3, random_state=0, format="csr")
    y = X @ rng.standard_normal(20) + 0.1 * rng.standard_normal(3000) + 5
    return X, y


@pytest.mark.parametrize("method", ["precondition", "ihs"])
@pytest.mark.parametrize("c", [2.0**-54, 2.0**-47, 2.0**54])
def test_sparse_intercept_at_any_feature_scale(sparse_problem, method, c):
    # the intercept column was a column of ones: beside features of 1e16 it fell below lstsq's rank
    # cut and was dropped (intercept 6e-32), beside features of 1e-16 it took the rank (coef_ 0)
    X, y = sparse_problem
    ref = LinearRegression().fit(X.toarray(), y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = rsketch.SketchedLinearRegression(method=method, random_state=0).fit(X * c, y)
    assert _rel(model.coef_ * c, ref.coef_) < 1e-10
    assert abs(model.intercept_ - ref.intercept_) < 1e-10 * abs(ref.intercept_)


@pytest.mark.parametrize("c", [2.0**-54, 2.0**54])
def test_sparse_ridge_intercept_at_any_feature_scale(sparse_problem, c):
    X, y = sparse_problem
    ref = Ridge(alpha=1e-2).fit(X.toarray(), y)
    model = rsketch.SketchedRidge(alpha=1e-2 * c * c, random_state=0).fit(X * c, y)
    assert _rel(model.coef_ * c, ref.coef_) < 1e-10
    assert abs(model.intercept_ - ref.intercept_) < 1e-10 * abs(ref.intercept_)


@pytest.mark.parametrize("weight", [1e306, 5e-324])
def test_weighted_means_neither_overflow_nor_round_tiny_weights(weight):
    # the weights' sum overflowed (every mean 0, intercept_ 0) or, at one bit each, rounded unequally
    rng = np.random.default_rng(1)
    X = (rng.standard_normal((2000, 20)) + 3) * 1e-3
    y = X @ rng.standard_normal(20) + 1e-4 * rng.standard_normal(2000) + 5e-3
    plain = rsketch.SketchedLinearRegression(random_state=0).fit(X, y)
    weighted = rsketch.SketchedLinearRegression(random_state=0).fit(X, y, sample_weight=np.full(2000, weight))
    assert _rel(weighted.coef_, plain.coef_) < 1e-12
    assert abs(weighted.intercept_ - plain.intercept_) < 1e-12 * abs(plain.intercept_)


def test_kernel_ridge_with_huge_weights():
    # weights c and alpha c: the same solution; the means' sum overflowed and coef_ came back NaN
    rng = np.random.default_rng(2)
    X = rng.standard_normal((100, 300)) + 3
    y = X @ rng.standard_normal(300) + 5
    plain = rsketch.SketchedRidge(alpha=1.0, random_state=0).fit(X, y)
    weighted = rsketch.SketchedRidge(alpha=1e306, random_state=0).fit(X, y, sample_weight=np.full(100, 1e306))
    assert weighted.solver_ == plain.solver_ == "kernel"
    assert _rel(weighted.coef_, plain.coef_) < 1e-12
    assert abs(weighted.intercept_ - plain.intercept_) < 1e-12 * abs(plain.intercept_)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("c, d", [(2.0**500, 2.0**600), (2.0**-500, 2.0**-600), (2.0**-530, 1.0)])
def test_penalty_dominated_ridge_at_extreme_scales(sparse, c, d):
    # alpha >= ||X||_F^2 goes to a Cholesky of X.T X + alpha I, which overflowed to NaN at 2^500
    # and underflowed to 0 at 2^-500
    rng = np.random.default_rng(3)
    X = rng.standard_normal((2000, 20)) + 3
    if sparse:
        X = sp.random(2000, 20, density=0.3, random_state=1, format="csr")
    X = X / (sp.linalg.norm(X) if sparse else np.linalg.norm(X))
    y = X @ rng.standard_normal(20) * 50 + 5
    ref = Ridge(alpha=1.0).fit(X.toarray() if sparse else X, y)
    model = rsketch.SketchedRidge(alpha=c * c, random_state=0).fit(X * c, y * d)
    assert model.solver_ == "cholesky"
    assert _rel(model.coef_ * (c / d), ref.coef_) < 1e-12
    assert abs(model.intercept_ / d - ref.intercept_) < 1e-12 * abs(ref.intercept_)


@pytest.mark.parametrize(
    "A, b, mu, where",
    [
        (np.zeros((300, 300)), 1e10, 1e-300, "beyond"),  # x = 1e310: came back inf, "converged"
        (1e300 * np.eye(300), 1e-300, 1e300, "below"),  # x = 5e-601: came back 0, "converged"
        (1e30 * np.eye(300, dtype=np.float32), 1e-30, 1e30, "below"),  # float32's range
    ],
)
def test_nystrom_pcg_solution_outside_the_float_range(A, b, mu, where):
    rhs = (b * np.random.default_rng(0).standard_normal(300)).astype(A.dtype)
    with pytest.raises(ValueError, match=f"solution x is {where} the float"):
        rsketch.nystrom_pcg(A, rhs, mu, seed=0)


def test_nystrom_pcg_mu_below_the_range_of_A():
    # mu / ||A|| = 1e-400: CG met A alone, singular, and returned NaN with a warning of "met tol"
    rng = np.random.default_rng(0)
    Q, _ = np.linalg.qr(rng.standard_normal((300, 300)))
    A = (Q * np.r_[np.ones(10), np.zeros(290)] * 1e300) @ Q.T
    with pytest.raises(ValueError, match="mu = 1e-100 is below the float range"):
        rsketch.nystrom_pcg((A + A.T) / 2, rng.standard_normal(300), 1e-100, seed=0)


@pytest.mark.parametrize("kappa", [1e20, 1e30])
def test_ihs_rank_deficient_consistent_problem_stays_minimum_norm(kappa):
    # each new sketch's kept directions span a different near-null part of X: IHS's steps gathered
    # there, coef 1e10 times the minimum-norm one and a residual of 6e-5 of ||y||, converged=True
    from rsketch.linalg.problems import stability_problem

    P = stability_problem(2000, 30, kappa=kappa, residual_norm=0.0, seed=0)
    ihs = rsketch.lstsq(P.X, P.y, method="ihs", seed=1)
    ref = rsketch.lstsq(P.X, P.y, method="precondition", seed=1)
    assert ihs.converged and ihs.rank == ref.rank < 30
    assert np.linalg.norm(ihs.coef) < 1.01 * np.linalg.norm(ref.coef)
    assert np.linalg.norm(P.X @ ihs.coef - P.y) < 1e-14 * np.linalg.norm(P.y)


@pytest.mark.parametrize("kind", ["gaussian", "srht", "srdct"])
def test_adjoint_products_near_overflow(kind):
    # S.T @ Z and Z.T @ S summed unscaled and overflowed (inf, NaN) where every exact entry was
    # at most 1e308; the forward product rescales, and now the adjoint too
    A = np.random.default_rng(0).standard_normal((64, 5))
    S = rsketch.make_sketch(kind, 1000, 64, seed=0)
    ref = S.T @ A
    c = 1e308 / np.abs(ref).max()
    for out in (S.T @ (A * c), ((A * c).T @ S).T):
        assert np.isfinite(out).all()
        assert _rel(out / c, ref) < 1e-14


def test_interpolative_at_subnormal_scale():
    # R11^-1 R12 of a subnormal R overflowed through 1 / diag: proj NaN (the same matrix times 2^600
    # gave a finite one). Subnormals carry fewer bits: the decomposition is checked, not the bits.
    rng = np.random.default_rng(0)
    B = rng.standard_normal((1000, 3))
    A = np.hstack([B, B @ rng.standard_normal((3, 3))]) * 1e-310
    res = rsketch.interpolative(A, 3, seed=0)
    assert np.isfinite(res.proj).all()
    scaled = np.ldexp(A, 600)
    assert np.linalg.norm(
        scaled - res.skeleton(scaled) @ res.interpolation_matrix()
    ) < 1e-10 * np.linalg.norm(scaled)


@pytest.mark.parametrize("dtype, top", [(np.float64, 5e306), (np.float32, 3e37)])
def test_adaptive_range_finder_near_overflow(dtype, top):
    # the probes' products overflowed: a basis of no column and an estimate of inf, with no warning,
    # where the fixed-rank finder raised its ValueError
    rng = np.random.default_rng(0)
    U, _ = np.linalg.qr(rng.standard_normal((600, 80)))
    V, _ = np.linalg.qr(rng.standard_normal((80, 80)))
    A = (U * np.exp(-np.arange(80) / 5)) @ V.T
    A = (A / np.abs(A).max() * top).astype(dtype)
    with pytest.raises(ValueError, match="products with A are not finite"):
        rsketch.range_finder(A, 10, tol=top * 1e-3, seed=0)


@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("alpha, scale", [(1e70, 1.0), (1.0, 1e-35)])
def test_dask_ridge_takes_the_cholesky_path_where_the_penalty_dominates(fit_intercept, alpha, scale):
    # the augmented sketch swamped the data rows: coef_ 6-10 times off Ridge's, with no warning
    da = pytest.importorskip("dask.array")
    rng = np.random.default_rng(0)
    X = rng.standard_normal((3000, 6)) * scale
    y = X @ np.arange(6.0) / scale + 1 + rng.standard_normal(3000)
    w = rng.uniform(0.5, 2.0, 3000)
    ref = Ridge(alpha=alpha, solver="cholesky", fit_intercept=fit_intercept).fit(X, y, sample_weight=w)
    model = rsketch.SketchedRidge(alpha=alpha, fit_intercept=fit_intercept, random_state=0)
    model.fit(da.from_array(X, chunks=(500, 6)), da.from_array(y, chunks=500), sample_weight=w)
    assert model.solver_ == "cholesky"
    assert _rel(model.coef_, ref.coef_) < 1e-12
    assert abs(model.intercept_ - ref.intercept_) <= 1e-12 * max(1.0, abs(ref.intercept_))


def test_efficiency_simulate_beta_too_large_is_named():
    # X @ beta finite (1e301) but no sigma could work: the error gave the range [7.9e293, -1.6e300]
    X = np.random.default_rng(0).standard_normal((500, 10))
    with pytest.raises(ValueError, match="beta is too large for method='simulate'"):
        rsketch.efficiency(X, sketch="gaussian", sketch_size=50, method="simulate", beta=np.full(10, 1e300))


@pytest.mark.parametrize("c", [1e160, 1e200])
def test_whitened_pca_where_the_variances_overflow(c):
    # the variances (1e320 and up) overflow to inf: whitening divided by their square root, and
    # transform gave zeros, inverse_transform NaN; the whitened scores are scale-free
    rng = np.random.default_rng(0)
    X = rng.standard_normal((2000, 20)) * np.geomspace(10, 1, 20) + 3
    plain = rsketch.SketchedPCA(n_components=3, whiten=True, random_state=0).fit(X)
    big = rsketch.SketchedPCA(n_components=3, whiten=True, random_state=0).fit(X * c)
    T = big.transform(X * c)
    assert _rel(T, plain.transform(X)) < 1e-12
    assert _rel(big.inverse_transform(T) / c, plain.inverse_transform(plain.transform(X))) < 1e-12
