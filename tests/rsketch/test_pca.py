"""SketchedPCA: check_estimator, agreement with scikit-learn's PCA, sparse input without densifying."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.decomposition import PCA
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.utils.estimator_checks import parametrize_with_checks

from rsketch import SketchedPCA


@parametrize_with_checks([SketchedPCA(), SketchedPCA(n_components=1, whiten=True, method="block_krylov")])
def test_sklearn_compatible(estimator, check):
    check(estimator)


def decaying(n=2000, p=120, seed=0, offset=3.0, dtype=np.float64, rate=4):
    rng = np.random.default_rng(seed)
    s = np.exp(-np.arange(p) / rate)
    U = np.linalg.qr(rng.standard_normal((n, p)))[0]
    V = np.linalg.qr(rng.standard_normal((p, p)))[0]
    return ((U * s) @ V.T * np.sqrt(n) + offset * rng.standard_normal(p)).astype(dtype)


def test_matches_full_pca():
    X = decaying()
    k = 10
    ours = SketchedPCA(n_components=k, random_state=0).fit(X)
    ref = PCA(n_components=k, svd_solver="full").fit(X)
    # s_i = e^(-i/4), l = 20 columns, 7 passes: the leading k singular values and vectors carry
    # relative errors of order (s_21 / s_10)^(2 * 7) = e^-38.5 ~ 2e-17 (Gu 2015, Thm 4.3), so they
    # agree with LAPACK's to rounding; the tolerances allow ~1e6 times that.
    np.testing.assert_allclose(ours.mean_, ref.mean_, rtol=1e-12)
    np.testing.assert_allclose(ours.singular_values_, ref.singular_values_, rtol=1e-10)
    np.testing.assert_allclose(ours.explained_variance_, ref.explained_variance_, rtol=1e-10)
    np.testing.assert_allclose(ours.explained_variance_ratio_, ref.explained_variance_ratio_, rtol=1e-10)
    np.testing.assert_allclose(ours.noise_variance_, ref.noise_variance_, rtol=1e-8)
    np.testing.assert_allclose(ours.components_, ref.components_, atol=1e-8)  # same signs
    np.testing.assert_allclose(
        ours.transform(X), ref.transform(X), atol=1e-7 * np.abs(ref.transform(X)).max()
    )
    np.testing.assert_allclose(ours.fit_transform(X), ref.transform(X), atol=1e-7 * np.abs(X).max())
    Z = ours.transform(X)
    np.testing.assert_allclose(
        ours.inverse_transform(Z), ref.inverse_transform(Z), atol=1e-8 * np.abs(X).max()
    )


def test_no_worse_than_sklearn_randomized_on_a_slow_decay():
    # s_i = 1 / sqrt(i + 1): a hard case for randomized PCA. At the same passes (sklearn's
    # iterated_power=3 is 7 passes for its range, as ours) the captured variance is at least as large.
    rng = np.random.default_rng(1)
    n, p, k = 1500, 200, 20
    s = 1 / np.sqrt(np.arange(p) + 1)
    X = (np.linalg.qr(rng.standard_normal((n, p)))[0] * s) @ np.linalg.qr(rng.standard_normal((p, p)))[0].T
    best = PCA(n_components=k, svd_solver="full").fit(X).explained_variance_.sum()
    ours = SketchedPCA(n_components=k, random_state=0).fit(X).explained_variance_.sum()
    theirs = PCA(n_components=k, svd_solver="randomized", iterated_power=3, random_state=0).fit(X)
    assert ours <= best * (1 + 1e-12)
    assert ours >= theirs.explained_variance_.sum() * (1 - 1e-3)
    assert ours >= 0.99 * best


@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
def test_sparse_input_is_centred_implicitly(fmt, monkeypatch):
    X = sp.random(1500, 80, density=0.05, random_state=3, format="csr") @ sp.diags(np.exp(-np.arange(80) / 3))
    X = X.asformat(fmt) + 0.0
    dense = X.toarray()
    for cls in (sp.csr_matrix, sp.csc_matrix, sp.coo_matrix, sp.csr_array, sp.csc_array, sp.coo_array):
        monkeypatch.setattr(cls, "toarray", lambda *a, **k: pytest.fail("densified"), raising=False)
        monkeypatch.setattr(cls, "todense", lambda *a, **k: pytest.fail("densified"), raising=False)
    ours = SketchedPCA(n_components=8, random_state=0).fit(X)
    ref = PCA(n_components=8, svd_solver="full").fit(dense)
    np.testing.assert_allclose(ours.mean_, ref.mean_, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(ours.explained_variance_ratio_, ref.explained_variance_ratio_, rtol=1e-8)
    np.testing.assert_allclose(ours.components_, ref.components_, atol=1e-6)
    np.testing.assert_allclose(ours.transform(X), ref.transform(dense), atol=1e-6 * np.abs(dense).max())


def test_float32_stays_float32():
    X = decaying(n=800, p=40, dtype=np.float32)
    pca = SketchedPCA(n_components=5, random_state=0).fit(X)
    Z = pca.transform(X)
    assert pca.components_.dtype == Z.dtype == pca.fit_transform(X).dtype == np.float32
    ref = PCA(n_components=5, svd_solver="full").fit(X.astype(np.float64))
    np.testing.assert_allclose(pca.explained_variance_ratio_, ref.explained_variance_ratio_, rtol=1e-4)


def test_whiten_gives_unit_variance():
    X = decaying(n=1000, p=30)
    pca = SketchedPCA(n_components=6, whiten=True, random_state=0)
    Z = pca.fit_transform(X)
    np.testing.assert_allclose(np.var(Z, axis=0, ddof=1), 1.0, rtol=1e-8)
    np.testing.assert_allclose(pca.transform(X), Z, atol=1e-8)
    np.testing.assert_allclose(
        pca.inverse_transform(Z), PCA(6, whiten=True).fit(X).inverse_transform(Z), atol=1e-6
    )


def test_same_seed_same_result_and_all_components_by_default():
    X = decaying(n=300, p=20)
    a = SketchedPCA(random_state=5).fit(X)
    b = SketchedPCA(random_state=5).fit(X)
    assert a.n_components_ == 20
    np.testing.assert_array_equal(a.components_, b.components_)
    np.testing.assert_allclose(a.explained_variance_ratio_.sum(), 1.0, rtol=1e-12)


def test_pipeline_and_grid_search():
    X = decaying(n=600, p=30, seed=4)
    y = (X[:, :3].sum(axis=1) > np.median(X[:, :3].sum(axis=1))).astype(int)
    pipe = make_pipeline(SketchedPCA(random_state=0), LogisticRegression())
    grid = GridSearchCV(pipe, {"sketchedpca__n_components": [1, 2, 10]}, cv=3).fit(X, y)
    # the same search over scikit-learn's PCA: the same scores and choice (the test had asserted only
    # that the best n_components was one of those given)
    ref_pipe = make_pipeline(PCA(), LogisticRegression())
    ref = GridSearchCV(ref_pipe, {"pca__n_components": [1, 2, 10]}, cv=3).fit(X, y)
    assert grid.best_params_["sketchedpca__n_components"] == ref.best_params_["pca__n_components"]
    scores = grid.cv_results_["mean_test_score"], ref.cv_results_["mean_test_score"]
    np.testing.assert_allclose(*scores, atol=0.02)
    names = pipe.fit(X, y)[0].get_feature_names_out()
    assert list(names[:2]) == ["sketchedpca0", "sketchedpca1"]


@pytest.mark.parametrize(
    "params, exc, match",
    [
        ({"n_components": 0}, ValueError, "n_components must be >= 1"),
        ({"n_components": 31}, ValueError, "n_components must be <= 30"),
        ({"n_components": 0.5}, TypeError, "n_components must be an integer"),
        ({"method": "lanczos"}, ValueError, "method must be one of"),
        ({"sketch": "hadamard"}, ValueError, "sketch must be one of"),
        ({"sketch": "leverage"}, ValueError, "leverage"),
        ({"passes": 0}, ValueError, "passes must be >= 1"),
        ({"oversample": -1}, ValueError, "oversample must be >= 0"),
        ({"whiten": "yes"}, TypeError, "whiten must be a bool"),
        ({"method": "block_krylov", "passes": 4}, ValueError, "odd number of passes"),
    ],
)
def test_bad_parameters(params, exc, match):
    X = decaying(n=100, p=30)
    with pytest.raises(exc, match=match):
        SketchedPCA(**params).fit(X)


def test_bad_input():
    pca = SketchedPCA(n_components=2).fit(decaying(n=100, p=30))
    with pytest.raises(ValueError, match="30 features"):
        pca.transform(np.ones((5, 4)))
    with pytest.raises(ValueError, match="n_components_"):
        pca.inverse_transform(np.ones((5, 3)))
    with pytest.raises(ValueError, match="NaN"):
        SketchedPCA().fit(np.full((10, 3), np.nan))


@pytest.mark.parametrize("fmt", ["dense", "csr"])
def test_explained_variance_ratio_at_any_scale(fmt):
    # The ratios are scale-free; the variances underflowed or overflowed, and the ratios with them
    # ([0, 0, 0] at X of 1e-170, NaN at 1e200) while components_ and singular_values_ were right.
    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, 20)) * np.exp(-np.arange(20) / 3)
    base = SketchedPCA(3, random_state=0).fit(X)
    for scale in (1e-170, 1e-160, 1e200):
        Xs = X * scale
        pca = SketchedPCA(3, random_state=0).fit(sp.csr_matrix(Xs) if fmt == "csr" else Xs)
        np.testing.assert_allclose(pca.explained_variance_ratio_, base.explained_variance_ratio_, rtol=1e-12)
        np.testing.assert_allclose(pca.singular_values_ / scale, base.singular_values_, rtol=1e-12)


@pytest.mark.parametrize("fmt", ["dense", "csr"])
@pytest.mark.parametrize(
    ("dtype", "scale", "shift", "rtol"), [(np.float64, 1e-310, 1060, 1e-12), (np.float32, 1e-40, 140, 1e-4)]
)
def test_explained_variance_ratio_of_subnormal_data(fmt, dtype, scale, shift, rtol):
    # the ratios' scaling multiplied by 1 / c, which overflows where c (a power of two near s_1) is
    # below 2**-1024 (float32: 2**-128): the ratios came out 0 and the noise variance inf (NaN sparse).
    # The reference: scikit-learn's PCA of the same (rounded) data scaled up exactly.
    rng = np.random.default_rng(14)
    Xs = (rng.standard_normal((300, 20)) * np.exp(-np.arange(20) / 4) * scale).astype(dtype)
    ref = PCA(5, svd_solver="full").fit(np.ldexp(Xs.astype(np.float64), shift))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow in a cast either
        pca = SketchedPCA(5, random_state=0).fit(sp.csr_matrix(Xs) if fmt == "csr" else Xs)
    np.testing.assert_allclose(pca.explained_variance_ratio_, ref.explained_variance_ratio_, rtol=rtol)
    assert np.isfinite(pca.noise_variance_) and pca.noise_variance_ >= 0


@pytest.mark.parametrize("fmt", ["dense", "csr"])
@pytest.mark.parametrize(
    ("dtype", "out_of_range", "in_range"),
    [
        (np.float64, ((1e160, "overflow"), (1e-160, "underflow"), (1e-170, "underflow")), (1e153, 1e-150)),
        (np.float32, ((1e20, "overflow"), (1e-20, "underflow"), (1e-25, "underflow")), (1e19, 1e-15)),
    ],
)
def test_the_likelihood_says_when_the_variances_leave_the_float_range(fmt, dtype, out_of_range, in_range):
    # Beyond the range the variances are inf, below it subnormal or 0, while the ratios stay exact:
    # score had returned NaN at X of 1e200 (with overflow warnings), called 1e-170's covariance
    # singular (saying to fit fewer components), and at float32 1e-25 returned a wrong number; the
    # variances at X of 1e153 (about 1e306) had overflowed in fit's scaling (c * c)
    rng = np.random.default_rng(0)
    X = (rng.standard_normal((300, 20)) * np.exp(-np.arange(20) / 3)).astype(dtype)
    base = SketchedPCA(3, random_state=0).fit(X)
    for scale, what in out_of_range:
        Xs = (X * scale).astype(dtype)
        Xs = sp.csr_matrix(Xs) if fmt == "csr" else Xs
        pca = SketchedPCA(3, random_state=0).fit(Xs)
        for method, args in (
            ("score", (Xs,)),
            ("score_samples", (Xs,)),
            ("get_covariance", ()),
            ("get_precision", ()),
        ):
            with pytest.raises(
                ValueError, match=f"variances {what} the float range of {np.dtype(dtype)}.*scale X"
            ):
                getattr(pca, method)(*args)
    for scale in in_range:  # inside the range: the likelihood of the scaled model
        Xs = (X * scale).astype(dtype)
        pca = SketchedPCA(3, random_state=0).fit(sp.csr_matrix(Xs) if fmt == "csr" else Xs)
        assert np.isfinite(pca.explained_variance_).all()
        rel = 1e-10 if dtype == np.float64 else 1e-5
        assert pca.score(Xs) == pytest.approx(base.score(X) - 20 * np.log(scale), rel=rel)


@pytest.mark.parametrize("fmt", ["csr", "csc"])
def test_sparse_input_with_entries_stored_twice_is_the_dense_input(fmt):
    # Each entry stored as two halves (a CSR/CSC may hold one position more than once; the stored
    # values add up): the variance total squared the stored values, and the ratios came out twice the
    # dense ones ([0.419, 0.396] for [0.206, 0.195]), the noise variance 0.129 for 0.851
    D = np.random.default_rng(0).standard_normal((200, 6))

    def halves(M):  # a CSR of M with every entry stored as two halves
        rows, cols = M.shape
        minor = np.tile(np.repeat(np.arange(cols), 2), rows)
        data = np.repeat(M, 2, axis=1).ravel() * 0.5
        return sp.csr_matrix((data, minor, np.arange(rows + 1) * 2 * cols), M.shape)

    X = halves(D) if fmt == "csr" else halves(D.T).T  # the transpose of a CSR is a CSC of the same arrays
    assert X.format == fmt and not X.has_canonical_format and np.allclose(X.toarray(), D)
    stored = X.copy()
    sparse = SketchedPCA(n_components=2, random_state=0).fit(X)
    dense = SketchedPCA(n_components=2, random_state=0).fit(D)
    np.testing.assert_allclose(sparse.explained_variance_ratio_, dense.explained_variance_ratio_, rtol=1e-12)
    assert sparse.noise_variance_ == pytest.approx(dense.noise_variance_, rel=1e-12)
    assert (X != stored).nnz == 0 and not X.has_canonical_format  # the caller's matrix as it was


def test_the_likelihood_methods_match_pca_and_serve_model_selection():
    # SketchedPCA had no score, score_samples, get_covariance or get_precision: GridSearchCV and
    # cross_val_score without a scoring raised TypeError (found by probing, 2026-12-06)
    from sklearn.model_selection import cross_val_score

    rng = np.random.default_rng(0)
    X = rng.standard_normal((600, 12)) @ rng.standard_normal((12, 12)) + 3.0
    for k in (3, 12):
        ours = SketchedPCA(n_components=k, passes=15, random_state=0).fit(X)
        ref = PCA(n_components=k, svd_solver="full").fit(X)
        np.testing.assert_allclose(ours.get_covariance(), ref.get_covariance(), rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(ours.get_precision(), ref.get_precision(), rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(ours.score_samples(X), ref.score_samples(X), rtol=1e-12)
        assert ours.score(X) == pytest.approx(ref.score(X), rel=1e-12)
    pca = SketchedPCA(n_components=3, random_state=0).fit(X)
    np.testing.assert_allclose(pca.score_samples(sp.csr_matrix(X)), pca.score_samples(X), rtol=1e-13)
    # the model is of the data: whitening the projections changes no likelihood
    white = SketchedPCA(n_components=3, whiten=True, random_state=0).fit(X)
    np.testing.assert_allclose(white.score_samples(X), pca.score_samples(X), rtol=1e-13)
    grid = GridSearchCV(SketchedPCA(random_state=0), {"n_components": [2, 5]}, cv=3).fit(X)
    assert grid.best_params_ == GridSearchCV(PCA(), {"n_components": [2, 5]}, cv=3).fit(X).best_params_
    assert np.all(np.isfinite(cross_val_score(SketchedPCA(n_components=4, random_state=0), X, cv=3)))
    # all components of a wide X: the covariance is singular, the likelihood undefined
    wide = SketchedPCA(random_state=0).fit(rng.standard_normal((5, 8)))
    with pytest.raises(ValueError, match="covariance is singular"):
        wide.score(rng.standard_normal((2, 8)))
