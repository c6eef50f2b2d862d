"""S @ A on a real GPU (CuPy arrays through rsketch/kernels/cuda) against the CPU: marked ``gpu``.

Skipped, with the reason, where CuPy, numba-cuda or a CUDA device is missing; ``RSKETCH_REQUIRE_GPU=1``
(set by ``benchmarks/gpu_check.sh``) turns that skip into a failure, so a GPU check cannot pass by
skipping. The kernels' logic is checked on every machine in numba's CUDA simulator
(``test_cuda_kernels.py``); these tests check the compiled kernels on the device at larger sizes.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import rsketch
from rsketch._random import STREAM_GAUSS, STREAM_ROW, ZIG_X
from rsketch.kernels import cpu
from tests.gpu_guard import require_gpu_or_skip

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cp():
    from rsketch.kernels.cuda import require_gpu

    require_gpu_or_skip(require_gpu)
    import cupy

    return cupy


KINDS = {
    "countsketch": lambda n: rsketch.CountSketch(n, 500, seed=1),
    "sparse_sign": lambda n: rsketch.SparseSign(n, 500, seed=2),
    "srht": lambda n: rsketch.SRHT(n, 500, seed=3),
    "srdct": lambda n: rsketch.SRDCT(n, 500, seed=4),
    "uniform": lambda n: rsketch.UniformSampling(n, 500, seed=5),
    "uniform_noreplace": lambda n: rsketch.UniformSampling(n, 500, seed=5, replace=False),
    "leverage": lambda n: rsketch.LeverageSampling(n, 500, seed=6, scores=np.linspace(0.1, 1.0, n)),
    "gaussian": lambda n: rsketch.GaussianSketch(n, 500, seed=7),
}
# Products of exact terms summed in the CPU's order: bitwise (the sparse kernels while the CPU uses one
# chunk, n < 16384).
BITWISE = {"countsketch", "sparse_sign", "srht", "uniform", "uniform_noreplace", "leverage"}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("n", [10_000, 70_000])
@pytest.mark.parametrize("kind", list(KINDS))
def test_device_product_matches_cpu(cp, kind, n, dtype):
    S = KINDS[kind](n)
    A = np.random.default_rng(0).standard_normal((n, 7)).astype(dtype)
    got = S @ cp.asarray(A)
    assert isinstance(got, cp.ndarray) and got.dtype == A.dtype and got.shape == (500, 7)
    ref = S @ A
    got = cp.asnumpy(got)
    if kind in BITWISE and (n < 16384 or not kind.startswith(("countsketch", "sparse"))):
        np.testing.assert_array_equal(got, ref)
    else:
        rtol = 1e-12 if dtype == "float64" else 1e-5
        assert np.linalg.norm(got - ref) <= rtol * np.linalg.norm(ref)


@pytest.mark.parametrize("kind", ["countsketch", "sparse_sign", "srht", "uniform", "gaussian"])
def test_device_product_on_a_non_blocking_stream(cp, kind):
    # The kernels launch on CuPy's current stream: on numba's default stream, a non-blocking stream's
    # work before and after them (the sort of the buckets, reading the result) would not wait for them.
    S = KINDS[kind](200_000)
    A = np.random.default_rng(3).standard_normal((200_000, 9))
    from rsketch.kernels.cuda import kernels as device_kernels

    with cp.cuda.Stream(non_blocking=True) as stream:
        launch = device_kernels._launch_stream(cp.zeros(1))  # the stream every kernel takes here
        assert int(launch) == stream.ptr  # deterministic, where the race below may not show
        got = S @ cp.asarray(A)
        got = got.get(stream=stream)
        stream.synchronize()
    assert device_kernels._launch_stream(cp.zeros(1)) == 0  # the default stream again
    np.testing.assert_allclose(got, S @ A, rtol=1e-12, atol=1e-9)


def test_vector_and_fortran_input(cp):
    S = rsketch.SparseSign(3000, 100, seed=0)
    x = np.random.default_rng(1).standard_normal(3000)
    y = S @ cp.asarray(x)
    assert y.shape == (100,)
    np.testing.assert_array_equal(cp.asnumpy(y), S @ x)
    A = np.asfortranarray(np.random.default_rng(2).standard_normal((3000, 5)))
    np.testing.assert_array_equal(cp.asnumpy(S @ cp.asarray(A, order="F")), S @ A)


def test_gaussian_entries_within_two_ulp(cp):
    from rsketch.kernels.cuda import kernels as ck

    start, stop, r = 1000, 1256, 3000
    ref = np.empty((stop - start, r))
    cpu.gaussian_columns(11, 12, start, stop, r, STREAM_GAUSS, ref, ZIG_X)
    got = cp.empty((stop - start, r))
    ck.gaussian_columns(11, 12, start, stop, r, STREAM_GAUSS, got, cp.asarray(ZIG_X))
    np.testing.assert_array_max_ulp(cp.asnumpy(got), ref, maxulp=2)


def test_hash_buckets_and_signs_are_bitwise(cp):
    from rsketch.kernels.cuda import kernels as ck

    rows, signs = ck.sparse_pattern(3, 4, 2**32 - 50_000, 2**32 + 50_000, 8, 2000, STREAM_ROW, cp)
    ref_rows, ref_signs = cpu.sparse_pattern(3, 4, 2**32 - 50_000, 2**32 + 50_000, 8, 2000, STREAM_ROW)
    np.testing.assert_array_equal(cp.asnumpy(rows), ref_rows)
    np.testing.assert_array_equal(cp.asnumpy(signs), ref_signs)


def test_same_bits_on_every_run(cp):
    S = rsketch.CountSketch(200_000, 1000, seed=0)
    A = cp.asarray(np.random.default_rng(3).standard_normal((200_000, 20)))
    first = S @ A
    assert bool((S @ A == first).all())  # no atomics: the sums' order is fixed


@pytest.mark.parametrize("kind", ["countsketch", "uniform"])
def test_non_finite_input_is_a_value_error(cp, kind):
    A = np.ones((1000, 2))
    A[7, 1] = np.nan
    S = KINDS[kind](1000)
    if kind == "uniform":  # sampling reads only its rows: make sure row 7 is one of them
        A[:, 1] = np.nan
    with pytest.raises(ValueError, match="A contains NaN"):
        S @ cp.asarray(A)


@pytest.mark.parametrize("kind", list(KINDS))
def test_device_csr_product_matches_cpu(cp, kind):
    import cupyx.scipy.sparse as csp
    import scipy.sparse as sp

    n = 10_000
    A = sp.random(n, 6, density=0.2, format="csr", random_state=0, dtype=np.float64)
    S = KINDS[kind](n)
    got = S @ csp.csr_matrix(A)
    assert isinstance(got, cp.ndarray) and got.shape == (500, 6)
    ref = S @ A
    if kind in BITWISE:
        np.testing.assert_array_equal(cp.asnumpy(got), ref)
    else:
        assert np.linalg.norm(cp.asnumpy(got) - ref) <= 1e-12 * np.linalg.norm(ref)


# ------------------------------------------------------------------- solvers and estimators on the device
@pytest.mark.parametrize("accuracy", ["exact", "compensated"])
def test_careful_gradient_on_the_device_is_the_cpu_kernels_bits(cp, accuracy):
    from rsketch.kernels.cuda import kernels as ck

    rng = np.random.default_rng(8)
    X = rng.standard_normal((50_000, 37))
    B = rng.standard_normal((37, 2))
    Y = np.ascontiguousarray(X @ B + 1e-9 * rng.standard_normal((50_000, 2)))
    g, nrm = ck.residual_gradient(cp.asarray(X), cp.asarray(Y), B, 1000, accuracy)
    ref = cpu.residual_gradient(X, Y, B, 1000, accuracy)
    np.testing.assert_array_equal(cp.asnumpy(g), ref[0])
    np.testing.assert_array_equal(cp.asnumpy(nrm), ref[1])


@pytest.mark.parametrize("method", ["precondition", "sketch_and_solve", "ihs"])
def test_lstsq_on_the_device_is_the_host_answer(cp, method):
    from rsketch.linalg.problems import stability_problem

    kappa = 1e8 if method == "precondition" else 1e3  # the others' answers depend on kappa's rounding
    P = stability_problem(200_000, 40, kappa=kappa, residual_norm=1e-4, n_rhs=2, seed=1)
    res = rsketch.lstsq(cp.asarray(P.X), cp.asarray(P.y), method=method, seed=3)
    ref = rsketch.lstsq(P.X, P.y, method=method, seed=3)
    assert isinstance(res.coef, cp.ndarray) and res.converged == ref.converged
    be = rsketch.linalg.backward_error(P.X, P.y, cp.asnumpy(res.coef))
    if method == "precondition":
        assert res.converged and np.max(be) <= 10 * np.finfo(np.float64).eps / 2
    else:
        np.testing.assert_allclose(cp.asnumpy(res.coef), ref.coef, rtol=1e-6)


def test_lstsq_mixing_device_and_host_is_a_type_error(cp):
    with pytest.raises(TypeError, match="CuPy"):
        rsketch.lstsq(cp.ones((100, 3)), np.ones(100))


def test_estimators_fit_and_predict_on_the_device(cp):
    import sklearn

    if os.environ.get("SCIPY_ARRAY_API") != "1":  # scikit-learn's dispatch needs it (gpu_check.sh sets it)
        message = "scikit-learn's array API dispatch needs SCIPY_ARRAY_API=1 set before SciPy is imported"
        if os.environ.get("RSKETCH_REQUIRE_GPU") == "1":
            pytest.fail(message)
        pytest.skip(message)

    rng = np.random.default_rng(9)
    X = rng.standard_normal((100_000, 20))
    y = X @ rng.standard_normal(20) + 2.0 + 0.1 * rng.standard_normal(100_000)
    for est in (
        rsketch.SketchedLinearRegression(random_state=0),
        rsketch.SketchedRidge(alpha=5.0, random_state=0),
    ):
        ref = sklearn.base.clone(est).fit(X, y)
        with sklearn.config_context(array_api_dispatch=True):
            est.fit(cp.asarray(X), cp.asarray(y))
            pred = est.predict(cp.asarray(X[:100]))
        assert isinstance(est.coef_, cp.ndarray) and isinstance(pred, cp.ndarray)
        np.testing.assert_allclose(cp.asnumpy(est.coef_), ref.coef_, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(cp.asnumpy(pred), ref.predict(X[:100]), rtol=1e-10)


def test_efficiency_on_the_device_is_the_host_result(cp):
    rng = np.random.default_rng(10)
    X = rng.standard_normal((100_000, 20))
    y = X @ np.ones(20) + rng.standard_normal(100_000)
    for sketch in ("sparse_sign", "srht", "gaussian", "leverage"):
        ours = rsketch.efficiency(
            cp.asarray(X), y=cp.asarray(y), sketch=sketch, sketch_size=1000, n_sketches=4, seed=0
        )
        ref = rsketch.efficiency(X, y=y, sketch=sketch, sketch_size=1000, n_sketches=4, seed=0)
        for measure in ("pe", "re", "wc"):
            np.testing.assert_allclose(ours.draws(measure), ref.draws(measure), rtol=1e-10)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_svd_on_the_device_is_the_host_svd(cp, dtype):
    rng = np.random.default_rng(11)
    A = (
        (rng.standard_normal((100_000, 300)) * np.exp(-np.arange(300) / 15)) @ rng.standard_normal((300, 400))
    ).astype(dtype)
    ours = rsketch.svd(cp.asarray(A), 30, seed=1)
    ref = rsketch.svd(A, 30, seed=1)
    assert all(isinstance(getattr(ours, name), cp.ndarray) for name in ("U", "s", "Vt"))
    tol = 1e-10 if dtype == "float64" else 1e-4
    np.testing.assert_allclose(cp.asnumpy(ours.s), ref.s, rtol=tol)
    np.testing.assert_allclose(cp.asnumpy(ours.Vt), ref.Vt, atol=tol)
    assert ours.passes == ref.passes


def test_pca_on_the_device(cp):
    import sklearn

    if os.environ.get("SCIPY_ARRAY_API") != "1":
        message = "scikit-learn's array API dispatch needs SCIPY_ARRAY_API=1 set before SciPy is imported"
        if os.environ.get("RSKETCH_REQUIRE_GPU") == "1":
            pytest.fail(message)
        pytest.skip(message)
    rng = np.random.default_rng(12)
    X = rng.standard_normal((100_000, 5)) @ rng.standard_normal((5, 80)) + 0.01 * rng.standard_normal(
        (100_000, 80)
    )
    ref = rsketch.SketchedPCA(n_components=5, random_state=0).fit(X)
    with sklearn.config_context(array_api_dispatch=True):
        pca = rsketch.SketchedPCA(n_components=5, random_state=0).fit(cp.asarray(X))
        Z = pca.transform(cp.asarray(X[:100]))
    assert isinstance(pca.components_, cp.ndarray) and isinstance(Z, cp.ndarray)
    np.testing.assert_allclose(cp.asnumpy(pca.components_), ref.components_, atol=1e-8)
    np.testing.assert_allclose(cp.asnumpy(Z), ref.transform(X[:100]), atol=1e-7)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("kind", ["countsketch", "sparse_sign", "srht", "gaussian"])
def test_adjoint_on_the_device_matches_cpu(cp, kind, dtype):
    S = KINDS[kind](70_000)
    Z = np.random.default_rng(13).standard_normal((500, 5)).astype(dtype)
    got = S.T @ cp.asarray(Z)
    ref = S.T @ Z
    assert isinstance(got, cp.ndarray) and got.dtype == Z.dtype and got.shape == (70_000, 5)
    if kind in ("countsketch", "sparse_sign"):  # the gather kernel: the CPU's bits
        np.testing.assert_array_equal(cp.asnumpy(got), ref)
    else:  # the portable path on the device
        np.testing.assert_allclose(
            cp.asnumpy(got), ref, rtol=1e-5 if dtype == "float32" else 1e-12, atol=1e-5
        )
