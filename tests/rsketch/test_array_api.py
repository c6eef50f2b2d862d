"""Solvers on arrays of another array-API library: ``array_api_strict`` stands in for CuPy on a CPU.

``array_api_strict`` implements only the standard (no NumPy functions, no implicit conversion), so a
solver that runs on it keeps its ``n``-sized work in the input's namespace, as it must for CuPy. The
CUDA kernel of the careful gradient is checked against the CPU's in ``test_cuda_kernels.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

import rsketch
from rsketch.kernels import cpu
from rsketch.linalg import _design
from rsketch.linalg._array_design import ArrayDesign
from rsketch.linalg._backward_error import backward_error
from rsketch.linalg.problems import stability_problem

from .array_api_standin import DEVICE, device_by_default, host, on_device, xps  # noqa: F401 (a fixture)

# Every test here runs with new arrays on the stand-in device unless told otherwise, as CuPy makes them.
pytestmark = pytest.mark.usefixtures("device_by_default")

U = np.finfo(np.float64).eps / 2


def strict_problem(n=3000, p=20, k=None, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p))
    y = X @ rng.standard_normal((p,) if k is None else (p, k)) + 0.1 * rng.standard_normal(
        (n,) if k is None else (n, k)
    )
    return X, y


@pytest.mark.parametrize("method", ["precondition", "sketch_and_solve", "ihs"])
@pytest.mark.parametrize("sketch", ["sparse_sign", "gaussian", "srht", "countsketch", "uniform", "leverage"])
def test_lstsq_on_strict_arrays_is_the_numpy_answer(method, sketch):
    X, y = strict_problem()
    res = rsketch.lstsq(on_device(X), on_device(y), method=method, sketch=sketch, seed=1)
    ref = rsketch.lstsq(X, y, method=method, sketch=sketch, seed=1)
    assert type(res.coef).__module__.startswith("array_api_strict") and res.coef.device == DEVICE
    assert res.coef.shape == ref.coef.shape
    # The same sketch; products in another order (BLAS here, the fused kernels there).
    np.testing.assert_allclose(host(res.coef), ref.coef, rtol=0, atol=1e-13)
    assert res.converged == ref.converged
    assert res.rank == ref.rank and res.sketch_size == ref.sketch_size
    assert abs(res.residual_norm - ref.residual_norm) <= 1e-12 * ref.residual_norm


@pytest.mark.parametrize("inner_solver", ["cg", "gram"])
@pytest.mark.parametrize("kappa", [1e4, 1e10])
def test_precondition_on_strict_arrays_is_backward_stable(kappa, inner_solver):
    P = stability_problem(4000, 30, kappa=kappa, residual_norm=1e-6, n_rhs=2, seed=3)
    res = rsketch.lstsq(on_device(P.X), on_device(P.y), seed=2, inner_solver=inner_solver)
    assert res.converged
    assert np.max(backward_error(P.X, P.y, host(res.coef))) <= 10 * U


def test_scaled_data_on_strict_arrays():
    # Entries near 1e200 and 1e-100: powers-of-two scaling in the namespace (no ldexp there).
    X, y = strict_problem(k=2)
    Xs, ys = X * 1e200, y * np.array([1e-100, 1e250])
    res = rsketch.lstsq(on_device(Xs), on_device(ys), seed=4)
    ref = rsketch.lstsq(Xs, ys, seed=4)
    assert res.converged
    np.testing.assert_allclose(host(res.coef), ref.coef, rtol=1e-12)


def test_careful_gradient_blocks_sum_in_double_double(monkeypatch):
    rng = np.random.default_rng(5)
    X = rng.standard_normal((1000, 7))
    B = rng.standard_normal((7, 2))
    Y = X @ B + 1e-10 * rng.standard_normal((1000, 2))
    one = ArrayDesign(on_device(X)).residual_gradient(on_device(Y), B, accuracy="exact")
    # One block: the CPU kernel itself, bit for bit.
    ref = cpu.residual_gradient(X, Y, B, cpu.n_chunks(1000), "exact")
    np.testing.assert_array_equal(one[0], ref[0])
    np.testing.assert_array_equal(one[1], ref[1])
    monkeypatch.setattr(_design, "_BLOCK_ROWS", 128)  # eight blocks
    blocks = ArrayDesign(on_device(X)).residual_gradient(on_device(Y), B, accuracy="exact")
    # Each block's partial is rounded once (u of itself); their sum is exact but for its last rounding.
    parts = [
        cpu.residual_gradient(X[a : a + 128], Y[a : a + 128], B, 1, "exact")[0] for a in range(0, 1000, 128)
    ]
    bound = U * (sum(np.abs(g) for g in parts) + 2 * np.abs(ref[0]))
    assert np.all(np.abs(blocks[0] - ref[0]) <= bound)
    np.testing.assert_allclose(blocks[1], ref[1], rtol=1e-14)


def test_fast_products_match_the_numpy_design():
    from rsketch.linalg._design import Design

    rng = np.random.default_rng(6)
    X = rng.standard_normal((500, 6))
    V = rng.standard_normal((6, 3))
    ours, theirs = ArrayDesign(on_device(X)), Design(X)
    for a, b in zip(ours.gram(V), theirs.gram(V), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-13)
    np.testing.assert_allclose(ours.gram_matrix(), theirs.gram_matrix(), rtol=1e-13)
    np.testing.assert_allclose(host(ours.matmul(V)), theirs.matmul(V), rtol=1e-13)


def test_bad_strict_input_is_named():
    X, y = strict_problem(n=100, p=3)
    Xn = X.copy()
    Xn[7, 1] = np.nan
    with pytest.raises(ValueError, match="X"):
        rsketch.lstsq(on_device(Xn), on_device(y))
    yn = y.copy()
    yn[3] = np.inf
    with pytest.raises(ValueError, match="y"):
        rsketch.lstsq(on_device(X), on_device(yn))
    with pytest.raises(TypeError, match="y must be an array of X's library"):
        rsketch.lstsq(on_device(X), y)
    with pytest.raises(TypeError, match="real"):
        rsketch.lstsq(on_device(X.astype(np.complex128)), on_device(y))
    with pytest.raises(ValueError, match="2-D"):
        rsketch.lstsq(on_device(y), on_device(y))
    with pytest.raises(ValueError, match="n >= p"):
        rsketch.lstsq(on_device(X[:2]), on_device(y[:2]))
    with pytest.raises(ValueError, match=r"shape \(100,\)"):
        rsketch.lstsq(on_device(X), on_device(y[:50]))


def test_integer_and_float32_strict_input_is_solved_in_float64():
    X, y = strict_problem(n=400, p=4)
    Xi = np.round(10 * X).astype(np.int64)
    res = rsketch.lstsq(on_device(Xi), on_device(y.astype(np.float32)), seed=0)
    assert res.coef.dtype == xps.float64
    ref = np.linalg.lstsq(Xi.astype(np.float64), y.astype(np.float32).astype(np.float64), rcond=None)[0]
    np.testing.assert_allclose(host(res.coef), ref, rtol=1e-12)


@pytest.mark.parametrize("sketch", ["gaussian", "srht", "countsketch", "sparse_sign", "uniform", "leverage"])
def test_efficiency_on_strict_arrays_is_the_numpy_result(sketch):
    rng = np.random.default_rng(7)
    X = rng.standard_normal((2000, 10))
    y = X @ np.ones(10) + rng.standard_normal(2000)
    ours = rsketch.efficiency(
        on_device(X), y=on_device(y), sketch=sketch, sketch_size=200, n_sketches=6, seed=0
    )
    ref = rsketch.efficiency(X, y=y, sketch=sketch, sketch_size=200, n_sketches=6, seed=0)
    for measure in ("pe", "re", "wc"):
        np.testing.assert_allclose(ours.draws(measure), ref.draws(measure), rtol=1e-13)
    assert ours.n_rank_deficient == ref.n_rank_deficient == 0


@pytest.mark.parametrize("sketch", ["srht", "sparse_sign", "uniform"])
def test_simulated_efficiency_on_strict_arrays_is_the_numpy_result(sketch):
    rng = np.random.default_rng(13)
    X = rng.standard_normal((1500, 8))
    y = X @ np.ones(8) + rng.standard_normal(1500)
    kw = dict(y=y, sketch=sketch, sketch_size=150, n_sketches=4, seed=1, method="simulate", n_noise=20)
    ref = rsketch.efficiency(X, **kw)
    ours = rsketch.efficiency(on_device(X), **{**kw, "y": on_device(y)})
    for measure in ("pe", "re", "wc"):  # the same noise (drawn on the host), sums in another order
        np.testing.assert_allclose(ours.draws(measure), ref.draws(measure), rtol=1e-10)


def test_efficiency_on_strict_arrays_refuses_what_it_cannot_do():
    rng = np.random.default_rng(8)
    X = rng.standard_normal((300, 4))
    Xd = on_device(X)
    with pytest.raises(ValueError, match="executor"):
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1) as pool:
            rsketch.efficiency(Xd, sketch="srht", sketch_size=50, executor=pool)
    with pytest.raises(TypeError, match="y must be an array of X's library"):
        rsketch.efficiency(Xd, y=np.ones(300), sketch="srht", sketch_size=50)
    bad = X.copy()
    bad[3, 2] = np.inf
    with pytest.raises(ValueError, match="X"):
        rsketch.efficiency(on_device(bad), sketch="srht", sketch_size=50)
    with pytest.raises(ValueError, match="full column rank"):
        rsketch.efficiency(on_device(np.column_stack([X, X[:, 0]])), sketch="srht", sketch_size=50)
    with pytest.raises(ValueError, match="column space"):
        rsketch.efficiency(Xd, y=on_device(X[:, 0]), sketch="srht", sketch_size=50)


LOWRANK_CASES = [("block_krylov", 5), ("block_krylov", 3), ("subspace", 5), ("subspace", 4), ("subspace", 1)]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize(("method", "passes"), LOWRANK_CASES)
def test_svd_on_strict_arrays_is_the_numpy_svd(method, passes, dtype):
    rng = np.random.default_rng(9)
    A = (
        (rng.standard_normal((1500, 120)) * np.exp(-np.arange(120) / 8)) @ rng.standard_normal((120, 200))
    ).astype(dtype)
    ours = rsketch.svd(on_device(A), 15, method=method, passes=passes, seed=1)
    ref = rsketch.svd(A, 15, method=method, passes=passes, seed=1)
    for name in ("U", "s", "Vt"):
        got = getattr(ours, name)
        assert type(got).__module__.startswith("array_api_strict") and got.dtype == on_device(A).dtype
        assert got.device == DEVICE
    tol = 1e-12 if dtype == np.float64 else 2e-5  # the same sketch, products in another order
    np.testing.assert_allclose(host(ours.s), ref.s, rtol=tol)
    np.testing.assert_allclose(host(ours.U), ref.U, atol=tol)  # the same signs (svd_flip's rule)
    np.testing.assert_allclose(host(ours.Vt), ref.Vt, atol=tol)
    assert ours.passes == ref.passes
    assert ours.error_estimate == pytest.approx(
        ref.error_estimate, rel=1e-10 if dtype == np.float64 else 1e-4
    )


def test_range_finder_on_strict_arrays_is_the_numpy_basis():
    rng = np.random.default_rng(10)
    A = rng.standard_normal((800, 12)) @ rng.standard_normal((12, 300))  # rank 12
    ours = rsketch.range_finder(on_device(A), 12, oversample=3, seed=2)
    ref = rsketch.range_finder(A, 12, oversample=3, seed=2)
    Q = host(ours.Q)
    np.testing.assert_allclose(Q.T @ Q, np.eye(15), atol=1e-13)
    assert np.linalg.norm(A - Q @ (Q.T @ A)) <= 1e-12 * np.linalg.norm(A)  # exact recovery
    np.testing.assert_allclose(Q @ Q.T, ref.Q @ ref.Q.T, atol=1e-12)
    assert ours.passes == ref.passes
    # A of rank 12: both estimates are rounding, far below ||A||.
    assert max(ours.error_estimate, ref.error_estimate) <= 1e-12 * np.linalg.norm(A, 2)


def test_passes_on_strict_arrays_are_those_made_where_block_krylov_finds_the_range_spent():
    # rank 3 with blocks of 5: block Krylov finds the range spent (on rounding noise, so the round
    # depends on the seed and the products' order) and stops; it keeps its blocks, one per pass pair,
    # so the basis' width says how many passes it made. The device path had reported the 15 asked.
    rng = np.random.default_rng(1)
    X = rng.standard_normal((400, 3)) @ rng.standard_normal((3, 90))
    for seed in range(4):
        kwargs = {"oversample": 2, "passes": 15, "error_probes": False, "seed": seed}
        found = rsketch.range_finder(on_device(X), 3, method="block_krylov", **kwargs)
        assert found.passes < 15 and host(found.Q).shape[1] == 5 * (found.passes + 1) // 2
        decomposed = rsketch.svd(on_device(X), 3, **kwargs)
        assert decomposed.passes == found.passes + 1  # the same basis, then one pass for B
        np.testing.assert_allclose(host(decomposed.s), np.linalg.svd(X, compute_uv=False)[:3], rtol=1e-12)


def test_lowrank_on_strict_arrays_says_what_it_cannot_do():
    A = on_device(np.random.default_rng(11).standard_normal((60, 20)))
    with pytest.raises(ValueError, match="tol"):
        rsketch.svd(A, 5, tol=1e-3)
    with pytest.raises(TypeError, match="only range_finder and svd"):
        rsketch.qr_pivoted(A)
    with pytest.raises(TypeError, match="only range_finder and svd"):
        rsketch.nystrom(on_device(np.eye(20)), 5)
    bad = np.ones((60, 20))
    bad[5, 5] = np.nan
    with pytest.raises(ValueError, match="A"):
        rsketch.svd(on_device(bad), 5)
    with pytest.raises(ValueError, match="rank"):
        rsketch.svd(A, 21)


@pytest.mark.parametrize("shape", [(400, 12), (12, 12), (8, 12)])
def test_sketched_factor_of_a_device_sketch_is_the_host_one(shape):
    from rsketch.linalg._precondition import sketched_factor

    rng = np.random.default_rng(12)
    SX = rng.standard_normal(shape) * np.logspace(0, -10, shape[1])
    SY = rng.standard_normal((shape[0], 2))
    ours, ref = sketched_factor(on_device(SX), on_device(SY)), sketched_factor(SX, SY)
    assert isinstance(ours.M, np.ndarray) and ours.rank == ref.rank
    np.testing.assert_allclose(ours.s, ref.s, rtol=1e-10)
    # the two QRs differ by rounding: the answers by about kappa u = 1e-6 (kappa = 1e10)
    np.testing.assert_allclose(ours.presolve, ref.presolve, rtol=1e-5, atol=1e-12)


def test_svd_of_huge_strict_entries_warns_of_nothing():
    # the error estimate's column norms squared 1e300 on the device with a NumPy overflow warning
    # (the host path computes the same norms quietly); the norms are scaled into range either way
    import warnings

    A = np.random.default_rng(3).standard_normal((300, 40)) * 1e300
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = rsketch.svd(on_device(A), 3, seed=0)
    np.testing.assert_allclose(host(res.s), rsketch.svd(A, 3, seed=0).s, rtol=1e-10)
    assert np.isfinite(res.error_estimate) and res.error_estimate > 0


@pytest.mark.parametrize("kind", ["srht", "sparse_sign", "countsketch"])
def test_device_sums_that_overflow_are_scaled_as_on_the_host(kind):
    # a finite A of 1e308 entries whose sums overflow on the way (here they cancel exactly): the host
    # applies the sketch again on A's columns scaled by powers of two; a device A had got inf back
    S = rsketch.make_sketch(kind, 8, 1, seed=1)
    signs = np.sign(S.to_dense()[0])
    A = np.zeros((8, 1))
    A[:4, 0] = signs[:4] * np.array([1e308, 1e308, -1e308, -1e308])
    ref = S @ A
    got = host(S @ on_device(A))
    np.testing.assert_array_equal(ref, [[0.0]])
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_exact_scaling_on_a_device_keeps_the_dtype(dtype):
    # The CUDA sparse kernels sum float32 in float32, so their overflow rescue scales float32 device
    # arrays: the factors were float64, and the product came back float64.
    from rsketch._exact_scaling import shift_down

    A = np.array([[3.0, 1.0], [-6.0, 2.0]], dtype=dtype)
    got = shift_down(on_device(A), np.array([100, -90]))
    assert got.dtype == on_device(A).dtype
    np.testing.assert_array_equal(host(got), np.ldexp(A, -np.array([100, -90])))


DEVICE_MADE_OPERATORS = {
    "countsketch": lambda n, r: rsketch.CountSketch(n, r, seed=3),
    "sparse_sign": lambda n, r: rsketch.SparseSign(n, r, seed=3),
    "srht": lambda n, r: rsketch.SRHT(n, r, seed=3),
    "gaussian": lambda n, r: rsketch.GaussianSketch(n, r, seed=3),
    "uniform": lambda n, r: rsketch.UniformSampling(n, r, seed=3),
    "uniform without replacement": lambda n, r: rsketch.UniformSampling(n, r, seed=3, replace=False),
    "leverage": lambda n, r: rsketch.LeverageSampling(n, r, scores=np.linspace(1.0, 2.0, n), seed=3),
}


@pytest.mark.parametrize("kind", list(DEVICE_MADE_OPERATORS))
def test_operators_where_every_new_array_is_on_the_device(kind):
    # The sampling adjoints converted words they drew on the device with np.asarray: on CuPy, a TypeError.
    rng = np.random.default_rng(0)
    S = DEVICE_MADE_OPERATORS[kind](500, 40)
    A, Z = rng.standard_normal((500, 3)), rng.standard_normal((40, 2))
    np.testing.assert_allclose(host(S @ on_device(A)), S @ A, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(host(S.T @ on_device(Z)), S.T @ Z, rtol=1e-12, atol=1e-12)


def test_leverage_statistics_where_every_new_array_is_on_the_device():
    X, y = strict_problem(n=2000, p=5)
    kw = dict(sketch="leverage", sketch_size=200, n_sketches=2, seed=0)
    ours = rsketch.efficiency(on_device(X), y=on_device(y), **kw)
    ref = rsketch.efficiency(X, y=y, **kw)
    for measure in ("pe", "re", "wc"):
        np.testing.assert_allclose(ours.draws(measure), ref.draws(measure), rtol=1e-13)


def test_flip_signs_on_the_device_is_scikit_learns_svd_flip():
    # the column maxima are read in one k x k gather (an element at a time had cost k transfers)
    from sklearn.utils.extmath import svd_flip

    from rsketch.linalg._lowrank_array import flip_signs

    rng = np.random.default_rng(5)
    U = rng.standard_normal((40, 6))
    U[7, 2], U[3, 4] = -9.0, 9.0  # a column whose maximum is negative, one whose is positive
    U[[5, 9], 1] = [4.0, -4.0]  # a tie of +a and -a: the first in row order decides
    U[:, 1] = np.clip(U[:, 1], -4.0, 4.0)
    Vt = rng.standard_normal((6, 5))
    got_U, got_Vt = flip_signs(on_device(U), Vt.copy())
    ref_U, ref_Vt = svd_flip(U.copy(), Vt.copy(), u_based_decision=True)
    assert np.array_equal(host(got_U), ref_U) and np.array_equal(got_Vt, ref_Vt)
