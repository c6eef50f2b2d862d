"""SketchedRidge with more features than samples: scikit-learn's kernel form, exact to rounding.

The reference is the SVD of the centred, weighted design (Tikhonov filter factors
``s / (s^2 + alpha)``), which neither squares the conditioning nor meets a null space.
"""

import numpy as np
import pytest
import scipy.sparse as sp

from rsketch import SketchedRidge


def svd_ridge(X, y, alpha, fit_intercept=True, w=None):
    X = X.toarray() if sp.issparse(X) else X
    w = np.ones(X.shape[0]) if w is None else w
    x_mean = w @ X / w.sum() if fit_intercept else np.zeros(X.shape[1])
    y_mean = w @ y / w.sum() if fit_intercept else np.zeros(y.shape[1:])
    sw = np.sqrt(w)
    A, b = sw[:, None] * (X - x_mean), (y - y_mean) * (sw[:, None] if y.ndim == 2 else sw)
    U, s, Vt = np.linalg.svd(A, full_matrices=False)
    keep = s > max(A.shape) * np.finfo(float).eps * s[0]
    f = 1 / (s[keep] + alpha / s[keep])  # s / (s^2 + alpha), with no square to overflow
    proj = U[:, keep].T @ b
    coef = Vt[keep].T @ (f[:, None] * proj if proj.ndim == 2 else f * proj)
    return coef, y_mean - x_mean @ coef


rng = np.random.default_rng(0)
X0, y0 = rng.standard_normal((150, 400)), rng.standard_normal(150)


@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("alpha", [1.0, 1e-3, 1e-8, 1e-12, 1e-300])
def test_small_penalties_are_solved_exactly(alpha, fit_intercept):
    # Nyström-PCG on the normal equations gave coef_ 8e-6 off at alpha = 1e-8 and 390% at 1e-12
    # (with the intercept), silently: CG's rounding grows by 1/alpha in their null space
    ours = SketchedRidge(alpha=alpha, fit_intercept=fit_intercept, random_state=0).fit(X0, y0)
    coef, intercept = svd_ridge(X0, y0, alpha, fit_intercept)
    assert ours.solver_ == "kernel"
    np.testing.assert_allclose(ours.coef_, coef, rtol=0, atol=1e-12 * np.abs(coef).max())
    assert ours.intercept_ == pytest.approx(intercept, rel=1e-12, abs=1e-13)


@pytest.mark.parametrize("fit_intercept", [True, False])
def test_repeated_rows(fit_intercept):
    # a rank-deficient design without the intercept went wrong the same way (8e-4 at 1e-10)
    X = np.vstack([X0[:140], X0[:10]])
    ours = SketchedRidge(alpha=1e-10, fit_intercept=fit_intercept, random_state=0).fit(X, y0)
    coef, _ = svd_ridge(X, y0, 1e-10, fit_intercept)
    np.testing.assert_allclose(ours.coef_, coef, rtol=0, atol=1e-11 * np.abs(coef).max())


@pytest.mark.parametrize(
    "scale, weight", [(1e200, 1.0), (1e-200, 1.0), (1.0, 1e150), (1.0, 1e-170), (1e40, 1.0)]
)
def test_any_scale_of_the_design_and_the_weights(scale, weight):
    # weights of 1e150 gave NaN coefficients, X of 1e76 an error naming an internal "A" (LAPACK's
    # SVD scales its input: the reference holds at any scale)
    w = np.full(150, weight)
    ours = SketchedRidge(alpha=1.0, random_state=0).fit(X0 * scale, y0, sample_weight=w)
    coef, intercept = svd_ridge(X0 * scale, y0, 1.0, True, w)
    assert np.isfinite(ours.coef_).all()
    np.testing.assert_allclose(ours.coef_, coef, rtol=0, atol=1e-12 * np.abs(coef).max())
    assert ours.intercept_ == pytest.approx(intercept, rel=1e-12, abs=1e-13)


def test_sparse_weighted_multi_target_and_a_penalty_past_the_data():
    X = sp.random(150, 400, density=0.05, random_state=1, format="csr")
    Y, w = rng.standard_normal((150, 3)), rng.uniform(0.0, 3.0, 150)
    for alpha in (1e-6, 1e3, 1e300):  # 1e300: solved as (I + K / alpha) zeta = b
        ours = SketchedRidge(alpha=alpha, random_state=0).fit(X, Y, sample_weight=w)
        coef, intercept = svd_ridge(X, Y, alpha, True, w)
        assert ours.coef_.shape == (3, 400) and ours.solver_ == "kernel"
        np.testing.assert_allclose(ours.coef_, coef.T, rtol=0, atol=1e-12 * np.abs(coef).max())
        np.testing.assert_allclose(ours.intercept_, intercept, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("weight", [1e150, 1e200, 1e-170])
def test_nystrom_path_takes_weights_of_any_scale(weight, monkeypatch):
    # the solution of (c W, c alpha) is that of (W, alpha): weights of 1e150 gave an error naming an
    # internal "A" (their products overflowed), weights of 1e-170 coef_ = 0
    from rsketch import estimators

    monkeypatch.setattr(estimators, "KERNEL_MAX_SAMPLES", 0)  # Nyström, as for more than 5,000 samples
    base = SketchedRidge(alpha=1.0, random_state=0).fit(X0, y0)
    w = np.full(150, weight)
    ours = SketchedRidge(alpha=weight, random_state=0).fit(X0, y0, sample_weight=w)
    assert ours.solver_ == base.solver_ == "nystrom_pcg"
    np.testing.assert_allclose(ours.coef_, base.coef_, rtol=0, atol=1e-12 * np.abs(base.coef_).max())


def test_nystrom_path_names_x_when_its_products_overflow(monkeypatch):
    from rsketch import estimators

    monkeypatch.setattr(estimators, "KERNEL_MAX_SAMPLES", 0)
    with pytest.raises(ValueError, match="X's entries are too large"), np.errstate(all="ignore"):
        SketchedRidge(random_state=0).fit(X0 * 1e160, y0)
