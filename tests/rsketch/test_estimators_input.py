"""Estimator inputs found by probing: seeds named as the estimator names them, sparse targets,
whitening that agrees between fit_transform and transform, and pickled PCA projecting alike."""

import pickle

import numpy as np
import pytest
import scipy.sparse as sp

from rsketch import SketchedLinearRegression, SketchedPCA, SketchedRidge

rng = np.random.default_rng(0)
X, y = rng.standard_normal((3000, 5)), rng.standard_normal(3000)


@pytest.mark.parametrize("est", [SketchedLinearRegression, SketchedRidge])
@pytest.mark.parametrize("bad, error", [("x", TypeError), (-1, ValueError), (1.5, TypeError)])
def test_a_bad_random_state_is_named_random_state(est, bad, error):
    with pytest.raises(error, match="^random_state must be"):
        est(random_state=bad).fit(X, y)


@pytest.mark.parametrize("est", [SketchedLinearRegression, SketchedRidge, SketchedPCA])
def test_a_random_state_instance_is_taken_as_scikit_learn_takes_it(est):
    # scikit-learn's convention (check_random_state): a RandomState was refused with a TypeError. A key
    # is drawn from it, as from a Generator: the same state gives the same fit, and a shared one moves on
    params = dict(method="sketch_and_solve") if est is not SketchedPCA else dict(n_components=2)
    # PCA on 40 features: on 5, its 2 + 10 columns span them all, and the fit (the identity's) has no
    # random part for a moved-on state to change
    Xs = X if est is not SketchedPCA else np.random.default_rng(1).standard_normal((3000, 40))
    fits = [est(random_state=np.random.RandomState(3), **params).fit(Xs, y) for _ in range(2)]
    shared = np.random.RandomState(3)
    moved = [est(random_state=shared, **params).fit(Xs, y) for _ in range(2)]
    attr = "components_" if est is SketchedPCA else "coef_"
    assert np.array_equal(getattr(fits[0], attr), getattr(fits[1], attr))
    assert np.array_equal(getattr(moved[0], attr), getattr(fits[0], attr))
    assert not np.array_equal(getattr(moved[1], attr), getattr(moved[0], attr))


def test_pca_names_random_state_too():
    with pytest.raises(TypeError, match="^random_state must be"):
        SketchedPCA(2, random_state="x").fit(X)


@pytest.mark.parametrize("make", [sp.csr_matrix, sp.csr_array])
@pytest.mark.parametrize("Xin", [X, sp.csr_matrix(X)])
def test_a_sparse_target_is_refused_by_name(make, Xin):
    # it met "shapes (3000,1) and (3000,1) not aligned" or "setting an array element with a
    # sequence", and a csr_array was taken silently
    with pytest.raises(TypeError, match="^y must be a dense array.*toarray"):
        SketchedLinearRegression(random_state=0).fit(Xin, make(y[:, None]))


@pytest.mark.parametrize("scale", [1.0, 1e-20])
def test_whitened_fit_transform_is_transform(scale):
    # fit_transform returned U sqrt(n - 1): on data of 1e-20 columns of std 1, where transform,
    # dividing by the scale clipped at eps as scikit-learn's PCA does, gave 5e-5
    Xs = rng.standard_normal((200, 6)) * scale
    pca = SketchedPCA(3, whiten=True, random_state=0)
    Z = pca.fit_transform(Xs)
    np.testing.assert_allclose(Z, pca.transform(Xs), rtol=1e-10, atol=1e-10 * np.abs(Z).max())


def test_a_pickled_pca_projects_bit_for_bit():
    # components_ was a transposed (Fortran-ordered) view, its pickled copy C-ordered: another BLAS
    # path, and transform 1 ulp apart (a few rows of an 8-feature fit showed it)
    X8 = rng.standard_normal((3000, 8))
    pca = SketchedPCA(3, random_state=0).fit(X8)
    again = pickle.loads(pickle.dumps(pca))
    assert pca.components_.flags.c_contiguous
    for rows in (X8[:3], X8):
        np.testing.assert_array_equal(again.transform(rows), pca.transform(rows))


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (lambda: SketchedLinearRegression(fit_intercept=False), "LinearRegression"),
        (lambda: SketchedRidge(alpha=1.0, fit_intercept=False), "Ridge"),
        (lambda: SketchedRidge(alpha=1.0, fit_intercept=False, method="sketch_and_solve"), "Ridge"),
    ],
)
def test_intercept_without_fit_intercept_is_zero_as_scikit_learns(ours, theirs):
    # it was an array of zeros for a 2-D y, where scikit-learn's is the float 0.0
    import sklearn.linear_model

    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((300, 5)), rng.standard_normal((300, 2))
    ref = getattr(sklearn.linear_model, theirs)(fit_intercept=False).fit(X, y).intercept_
    for target in (y, y[:, :1], y[:, 0]):
        got = ours().fit(X, target).intercept_
        assert type(got) is float and got == 0.0 == ref
