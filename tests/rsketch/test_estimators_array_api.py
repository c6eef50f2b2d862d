"""The estimators under scikit-learn's array API dispatch, with ``array_api_strict`` standing in for CuPy.

scikit-learn enables dispatch only when SciPy's own array API support is on (``SCIPY_ARRAY_API=1``, read
when SciPy is first imported), so the tests marked ``dispatch`` run in a child process that sets it:
:func:`test_dispatch_tests_pass_in_a_scipy_array_api_process` runs this file there. In the parent
process they skip, saying so.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import sklearn
from sklearn.linear_model import Ridge
from sklearn.utils.estimator_checks import check_estimator

import rsketch.estimators
from rsketch import SketchedLinearRegression, SketchedPCA, SketchedRidge

from .array_api_standin import DEVICE, host, on_device, xps

CHILD = os.environ.get("SCIPY_ARRAY_API") == "1"
dispatch = pytest.mark.skipif(not CHILD, reason="runs in the SCIPY_ARRAY_API=1 child process")
ESTIMATORS = [
    SketchedLinearRegression(random_state=0),
    SketchedRidge(alpha=3.0, random_state=0),
    SketchedLinearRegression(method="ihs", random_state=0),
    SketchedRidge(alpha=3.0, method="sketch_and_solve", fit_intercept=False, random_state=0),
]
PCAS = [SketchedPCA(n_components=2, random_state=0), SketchedPCA(n_components=2, whiten=True, random_state=0)]


def data(n=3000, p=6, k=None, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p)) + 2.0
    shape = (p,) if k is None else (p, k)
    y = X @ rng.standard_normal(shape) + 1.5 + 0.1 * rng.standard_normal((n,) if k is None else (n, k))
    return X, y, rng.uniform(0.5, 2.0, n)


@pytest.mark.skipif(CHILD, reason="this is the parent; the child runs the dispatch tests")
@pytest.mark.slow
def test_dispatch_tests_pass_in_a_scipy_array_api_process():
    env = dict(os.environ, SCIPY_ARRAY_API="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", __file__]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout


@dispatch
@pytest.mark.parametrize("estimator", ESTIMATORS + PCAS, ids=lambda e: repr(e))
def test_scikit_learn_array_api_checks(estimator, monkeypatch):
    # scikit-learn's own checks: array_api_strict on two devices and dtypes (CuPy and PyTorch where
    # installed), y and sample_weight from another library moved to X's, predict on another refused.
    # Not PyTorch on a GPU, which rsketch does not support (docs/gpu.md: its generic generator needs
    # uint64 arithmetic PyTorch lacks). scikit-learn 1.9 skips those rounds (and its mixed-input
    # rounds with PyTorch on CUDA) only where PyTorch was built without CUDA:
    # `torch.backends.cuda.is_built()`, which the GPU image's PyTorch is (it never asks
    # `torch.cuda.is_available()`, which this test patched alone until 2026-12-07).
    try:
        import torch

        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: False)
    except ImportError:
        pass
    results = check_estimator(estimator, on_fail=None)
    ran = [r for r in results if "array_api" in r["check_name"] and r["status"] != "skipped"]
    failed = [(r["check_name"], str(r["exception"])[:500]) for r in ran if r["status"] == "failed"]
    assert not failed
    assert len(ran) >= 4  # numpy, array_api_strict x 2 devices, same-namespace


@dispatch
@pytest.mark.parametrize("estimator", [e for e in ESTIMATORS if e.fit_intercept], ids=lambda e: repr(e))
def test_a_constant_feature_on_strict_arrays_gets_a_zero_coefficient(estimator):
    # the constant column is left out on the device too, and its zero put back there
    X, y, w = data()
    X[:, 2] = 0.3
    ref = sklearn.base.clone(estimator).fit(X, y, sample_weight=w)
    with sklearn.config_context(array_api_dispatch=True):
        est = sklearn.base.clone(estimator).fit(on_device(X), on_device(y), sample_weight=on_device(w))
    assert est.coef_.device == DEVICE and host(est.coef_)[2] == 0.0 == ref.coef_[2]
    np.testing.assert_allclose(host(est.coef_), ref.coef_, rtol=0, atol=1e-12 * np.abs(ref.coef_).max())


@dispatch
@pytest.mark.parametrize("estimator", ESTIMATORS, ids=lambda e: repr(e))
@pytest.mark.parametrize("k", [None, 2])
def test_fit_on_strict_arrays_is_the_numpy_fit(estimator, k):
    X, y, w = data(k=k)
    ref = sklearn.base.clone(estimator).fit(X, y, sample_weight=w)
    # With two targets, y and sample_weight come as NumPy arrays: moved to X's library, as scikit-learn does.
    y_in, w_in = (on_device(y), on_device(w)) if k is None else (y, w)
    with sklearn.config_context(array_api_dispatch=True):
        est = sklearn.base.clone(estimator).fit(on_device(X), y_in, sample_weight=w_in)
        pred = est.predict(on_device(X[:50]))
    assert type(est.coef_).__module__.startswith("array_api_strict") and est.coef_.device == DEVICE
    assert type(pred).__module__.startswith("array_api_strict") and pred.device == DEVICE
    assert est.solver_ == ref.solver_
    scale = np.abs(ref.coef_).max()
    np.testing.assert_allclose(host(est.coef_), ref.coef_, rtol=0, atol=1e-12 * scale)
    np.testing.assert_allclose(host(est.intercept_), ref.intercept_, rtol=1e-12, atol=1e-12 * scale)
    np.testing.assert_allclose(host(pred), ref.predict(X[:50]), rtol=1e-11)


@dispatch
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_wide_ridge_runs_nystrom_pcg_on_strict_arrays(fit_intercept, monkeypatch):
    # on the host, a design this small takes the kernel form; a device one, Nyström: the host's
    # Nyström (as for more than 5,000 samples) is the reference
    monkeypatch.setattr(rsketch.estimators, "KERNEL_MAX_SAMPLES", 0)
    X, y, w = data(n=150, p=260, seed=1)
    est = SketchedRidge(alpha=2.0, fit_intercept=fit_intercept, random_state=0)
    ref = sklearn.base.clone(est).fit(X, y, sample_weight=w)
    with sklearn.config_context(array_api_dispatch=True):
        est.fit(on_device(X), on_device(y), sample_weight=on_device(w))
    assert est.solver_ == ref.solver_ == "nystrom_pcg"
    assert type(est.coef_).__module__.startswith("array_api_strict")
    # The same test matrix and CG, but not the same products: NumPy's X goes through GramOperator
    # (fused, the sketch's first product from the sparse pattern), the device's through two
    # products. Each solution is within cond(A + alpha I) * 1e-14 (CG's tolerance) of the exact one.
    exact = Ridge(alpha=2.0, fit_intercept=fit_intercept, solver="cholesky").fit(X, y, sample_weight=w)
    for coef in (host(est.coef_), ref.coef_):
        np.testing.assert_allclose(coef, exact.coef_, rtol=0, atol=1e-10 * np.abs(exact.coef_).max())
    np.testing.assert_allclose(host(est.coef_), ref.coef_, rtol=0, atol=1e-10 * np.abs(ref.coef_).max())
    np.testing.assert_allclose(
        host(est.intercept_), ref.intercept_, atol=1e-10 * abs(ref.intercept_) + 1e-300
    )


@dispatch
@pytest.mark.parametrize(
    ("dtype", "scale", "what"), [(np.float32, 1e-25, "underflow"), (np.float64, 1e160, "overflow")]
)
def test_pca_likelihood_on_strict_arrays_says_when_the_variances_leave_the_float_range(dtype, scale, what):
    # on a device a float32 fit of X of 1e-25 (variances 0) had given a score of NaN
    rng = np.random.default_rng(0)
    X = on_device((rng.standard_normal((300, 20)) * np.exp(-np.arange(20) / 3) * scale).astype(dtype))
    with sklearn.config_context(array_api_dispatch=True):
        est = SketchedPCA(n_components=3, random_state=0).fit(X)
        with pytest.raises(ValueError, match=f"variances {what} the float range"):
            est.score(X)


@dispatch
@pytest.mark.parametrize("whiten", [False, True])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_pca_on_strict_arrays_is_the_numpy_pca(whiten, dtype):
    rng = np.random.default_rng(2)
    X = (rng.standard_normal((2000, 4)) @ rng.standard_normal((4, 40)) + 5.0).astype(dtype)
    X += (0.01 * rng.standard_normal(X.shape)).astype(dtype)
    est = SketchedPCA(n_components=4, whiten=whiten, random_state=0)
    ref = sklearn.base.clone(est).fit(X)
    with sklearn.config_context(array_api_dispatch=True):
        est.fit(on_device(X))
        Z = est.transform(on_device(X))
        back = est.inverse_transform(Z)
        F = sklearn.base.clone(est).fit_transform(on_device(X))
    tol = 1e-10 if dtype == np.float64 else 1e-3
    for name in (
        "components_",
        "explained_variance_",
        "explained_variance_ratio_",
        "singular_values_",
        "mean_",
    ):
        got = getattr(est, name)
        assert type(got).__module__.startswith("array_api_strict") and got.dtype == on_device(X).dtype
        np.testing.assert_allclose(host(got), getattr(ref, name), rtol=tol, atol=tol)
    assert est.noise_variance_ == pytest.approx(
        ref.noise_variance_, rel=1e-6 if dtype == np.float64 else 1e-2
    )
    for got, want in (
        (Z, ref.transform(X)),
        (F, ref.fit_transform(X)),
        (back, ref.inverse_transform(ref.transform(X))),
    ):
        assert type(got).__module__.startswith("array_api_strict")
        np.testing.assert_allclose(host(got), want, rtol=tol, atol=tol * np.abs(want).max())


@dispatch
def test_tiny_data_is_solved_directly_and_returned_on_the_device():
    X, y, _ = data(n=30, p=4)
    with sklearn.config_context(array_api_dispatch=True):
        est = SketchedRidge(alpha=1.0).fit(on_device(X), on_device(y))
    assert est.solver_ == "direct" and type(est.coef_).__module__.startswith("array_api_strict")
    ref = SketchedRidge(alpha=1.0).fit(X, y)
    np.testing.assert_allclose(host(est.coef_), ref.coef_, rtol=1e-12)


@dispatch
def test_predict_on_another_library_is_refused_as_scikit_learn_does():
    X, y, _ = data()
    with sklearn.config_context(array_api_dispatch=True):
        est = SketchedLinearRegression(random_state=0).fit(on_device(X), on_device(y))
        refused = r"SketchedLinearRegression.predict\(\) must use the same namespace"
        with pytest.raises(ValueError, match=refused):
            est.predict(X)
    numpy_fit = SketchedLinearRegression(random_state=0).fit(X, y)
    with sklearn.config_context(array_api_dispatch=True):
        with pytest.raises(ValueError, match="same namespace"):
            numpy_fit.predict(on_device(X))


def test_device_input_without_dispatch_says_how_to_enable_it():
    X, y, _ = data(n=100, p=3)
    with pytest.raises(TypeError, match=r"array_api_dispatch=True"):
        SketchedLinearRegression().fit(on_device(X), on_device(y))


@dispatch
def test_y_of_another_library_or_device_follows_X():
    xps = pytest.importorskip("array_api_strict")
    X, y, _ = data()
    ref = SketchedLinearRegression(random_state=0).fit(X, y).coef_
    with sklearn.config_context(array_api_dispatch=True):
        # a NumPy X and a y of another library: y to the host, as Ridge does (an AttributeError)
        on_host = SketchedLinearRegression(random_state=0).fit(X, xps.asarray(y))
        # X on the stand-in device, y on the default one: y to X's ("two different devices")
        on_device_ = SketchedLinearRegression(random_state=0).fit(on_device(X), xps.asarray(y))
    np.testing.assert_allclose(on_host.coef_, ref, rtol=1e-10)
    np.testing.assert_allclose(host(on_device_.coef_), ref, rtol=1e-10)


def test_y_of_another_library_without_dispatch_names_y():
    X, y, _ = data()
    with pytest.raises(TypeError, match="y is a array_api_strict array while X is a NumPy array"):
        SketchedLinearRegression(random_state=0).fit(X, on_device(y))  # NumPy cannot convert it


@pytest.mark.parametrize("estimator", ESTIMATORS + PCAS, ids=lambda e: repr(e))
def test_host_arrays_of_another_library_without_dispatch_are_converted(estimator):
    # As scikit-learn's own estimators do with dispatch off, and as its check_array_api_input expects
    # of PyTorch CPU tensors: NumPy converts them, and the fit is the NumPy fit. A TypeError for them
    # had failed that check wherever PyTorch is installed. (Arrays on the stand-in's second device,
    # which NumPy cannot convert, still get the TypeError that says how to turn dispatch on.)
    xps = pytest.importorskip("array_api_strict")
    X, y, _ = data()
    ref = sklearn.base.clone(estimator).fit(X, y)
    est = sklearn.base.clone(estimator).fit(xps.asarray(X), xps.asarray(y))
    fitted = "coef_" if hasattr(ref, "coef_") else "components_"
    assert isinstance(getattr(est, fitted), np.ndarray)
    np.testing.assert_array_equal(getattr(est, fitted), getattr(ref, fitted))
    method = "predict" if hasattr(ref, "predict") else "transform"
    np.testing.assert_array_equal(getattr(est, method)(xps.asarray(X[:5])), getattr(ref, method)(X[:5]))
    with pytest.raises(TypeError, match="array API dispatch"):
        sklearn.base.clone(estimator).fit(on_device(X), y)


@dispatch
@pytest.mark.parametrize("alpha, scale", [(1e70, 1.0), (1.0, 1e-35)])
def test_penalty_dominated_ridge_on_the_device(alpha, scale):
    # device X skipped the Cholesky path: the augmented sketch gave coef_ 6-9 times off Ridge's
    X, y, _ = data()
    X = X * scale
    ref = Ridge(alpha=alpha, solver="cholesky").fit(X, y)
    with sklearn.config_context(array_api_dispatch=True):
        model = SketchedRidge(alpha=alpha, random_state=0).fit(on_device(X), on_device(y))
    assert model.solver_ == "cholesky" and model.coef_.device == DEVICE
    np.testing.assert_allclose(host(model.coef_), ref.coef_, rtol=1e-12)
    np.testing.assert_allclose(host(model.intercept_), ref.intercept_, rtol=1e-12)


@dispatch
@pytest.mark.parametrize("estimator", ESTIMATORS, ids=lambda e: repr(e))
def test_float32_strict_arrays_get_float32_coefficients(estimator):
    # as on the host (and as scikit-learn's regressors): solved in float64, rounded once to float32
    X, y, w = data()
    X, y = X.astype(np.float32), y.astype(np.float32)
    ref = sklearn.base.clone(estimator).fit(X, y, sample_weight=w)
    with sklearn.config_context(array_api_dispatch=True):
        est = sklearn.base.clone(estimator).fit(on_device(X), on_device(y), sample_weight=on_device(w))
        pred = est.predict(on_device(X[:50]))
    assert est.coef_.dtype == on_device(X).dtype and pred.dtype == on_device(X).dtype
    assert ref.coef_.dtype == np.float32 and ref.predict(X[:50]).dtype == np.float32
    np.testing.assert_allclose(host(est.coef_), ref.coef_, rtol=1e-6, atol=1e-6 * np.abs(ref.coef_).max())


@dispatch
@pytest.mark.parametrize("estimator", ESTIMATORS[:1] + PCAS[:1], ids=lambda e: repr(e))
def test_a_device_fit_asks_for_dispatch_in_its_methods(estimator):
    # Fitted on the stand-in device, then called with dispatch off on that library's arrays: the
    # arrays were converted to NumPy first, and the error said "given numpy input ... refit"
    # where the fix is to turn dispatch on.
    X, y, _ = data()
    method = "predict" if hasattr(estimator, "predict") else "transform"
    for put in (on_device, xps.asarray):  # NumPy converts arrays of the default device
        with sklearn.config_context(array_api_dispatch=True):
            est = sklearn.base.clone(estimator).fit(put(X), put(y))
        with pytest.raises(TypeError, match="array API dispatch"):
            getattr(est, method)(put(X[:5]))
