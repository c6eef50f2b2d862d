"""Low-rank and Nyström-PCG cases found by probing: scales where squares underflow or overflow,
LinearOperators that return the wrong products or lack A.T, and block Krylov's passes."""

import re
import warnings

import numpy as np
import pytest
from scipy.sparse.linalg import LinearOperator

import rsketch

rng = np.random.default_rng(0)
A = rng.standard_normal((300, 40)) * np.exp(-np.arange(40) / 3)
P, b = A.T @ A, rng.standard_normal(40)


@pytest.mark.parametrize("b_scale", [1e-300, 1e-170, 1e-150, 1e160, 1e300])
def test_nystrom_pcg_solves_right_hand_sides_of_any_scale(b_scale):
    # b of 1e-300 came back as x = 0, "converged"; 1e-150 met a division by zero; 1e160 gave x = 0
    base = rsketch.nystrom_pcg(P, b, 1e-3, seed=0)
    res = rsketch.nystrom_pcg(P, b * b_scale, 1e-3, seed=0)
    assert res.converged
    np.testing.assert_allclose(res.x / b_scale, base.x, rtol=1e-12, atol=1e-12 * np.abs(base.x).max())


@pytest.mark.parametrize("a_scale", [1e-300, 1e-170, 1e155, 1e200])
def test_nystrom_pcg_solves_systems_of_any_scale(a_scale):
    # A of 1e-170: a zero preconditioner (its squares underflowed), 40 iterations for 4; 1e-300 a
    # division by zero; 1e155 "products with A are not finite"
    base = rsketch.nystrom_pcg(P, b, 1e-3, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = rsketch.nystrom_pcg(P * a_scale, b, 1e-3 * a_scale, seed=0)
    assert res.converged and res.iterations == base.iterations
    np.testing.assert_allclose(res.x * a_scale, base.x, rtol=1e-11, atol=1e-11 * np.abs(base.x).max())
    top = res.preconditioner.eigenvalues.max() / a_scale
    assert top == pytest.approx(base.preconditioner.eigenvalues.max(), rel=1e-10)


@pytest.mark.parametrize("scale", [2.0**-600, 1e160])
def test_error_estimates_do_not_depend_on_the_scale(scale):
    # svd's estimate was 0 at 2**-600 (the probes' squares underflowed), and the adaptive range
    # finder returned no column (estimate 0) there and at 1e160 (estimate inf)
    base_svd = rsketch.svd(A, 5, seed=0)
    assert rsketch.svd(A * scale, 5, seed=0).error_estimate / scale == pytest.approx(
        base_svd.error_estimate, rel=1e-12
    )
    with pytest.warns(rsketch.ConvergenceWarning, match="stopped at rank=5"):  # both: the same estimate
        base = rsketch.range_finder(A, 5, tol=1e-3, seed=0)
        res = rsketch.range_finder(A * scale, 5, tol=1e-3 * scale, seed=0)
    assert res.Q.shape == base.Q.shape == (300, 5)
    assert res.error_estimate / scale == pytest.approx(base.error_estimate, rel=1e-12)


def test_a_linear_operator_with_products_of_another_shape_is_refused():
    # an (m, 1) product for (m, k) was broadcast into the basis: singular values 22.0, 16.0, 10.8
    # for 23.1, 22.5, 22.0
    X = rng.standard_normal((300, 40))
    bad = LinearOperator(
        X.shape, matvec=lambda v: X @ v, rmatvec=lambda v: X.T @ v, matmat=lambda V: (X @ V)[:, :1],
        rmatmat=lambda V: X.T @ V, dtype=float,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"returned A @ Y of shape \(300, 1\)"):
        rsketch.svd(bad, 5, seed=0)
    square = LinearOperator((40, 40), matvec=lambda v: P @ v, matmat=lambda V: (P @ V)[:, :1], dtype=float)
    with pytest.raises(ValueError, match=r"shape \(40, 1\)"):
        rsketch.nystrom_pcg(square, b, 1e-3, seed=0)
    ints = LinearOperator(
        X.shape, matvec=lambda v: (X @ v).astype(int), rmatvec=lambda v: X.T @ v, dtype=float
    )
    with pytest.raises(ValueError, match="dtype int64"):
        rsketch.svd(ints, 5, seed=0)


def test_an_operator_s_results_are_in_the_dtype_it_declares():
    # a float32 operator whose products came back float64: svd gave float64 U and Vt beside float32 s,
    # eigh all float64, nystrom float64 U beside float32 eigenvalues
    op = LinearOperator((40, 40), matvec=lambda v: P @ v, rmatvec=lambda v: P @ v, dtype=np.float32)
    res = rsketch.svd(op, 3, seed=0)
    assert res.U.dtype == res.s.dtype == res.Vt.dtype == np.float32
    res = rsketch.eigh(op, 3, seed=0)
    assert res.eigenvalues.dtype == res.eigenvectors.dtype == np.float32
    res = rsketch.nystrom(op, 3, seed=0)
    assert res.U.dtype == res.eigenvalues.dtype == np.float32
    assert rsketch.range_finder(op, 3, seed=0).Q.dtype == np.float32


def test_eigh_takes_a_symmetric_operator_with_a_matvec_only():
    # it met "'NoneType' object is not callable" asking for A.T products; svd needs them, and says so
    only = LinearOperator((40, 40), matvec=lambda v: P @ v, dtype=float)
    res = rsketch.eigh(only, 3, passes=7, seed=0)
    np.testing.assert_allclose(res.eigenvalues, rsketch.eigh(P, 3, passes=7, seed=0).eigenvalues, rtol=1e-12)
    with pytest.raises(TypeError, match="without rmatvec/rmatmat"):
        rsketch.svd(LinearOperator((300, 40), matvec=lambda v: A @ v, dtype=float), 5, seed=0)


def test_block_krylov_without_room_for_a_second_block_iterates_and_reports_its_passes():
    # rank 60 of 2,000 x 100: no second block fits, and block Krylov made 2 products, reported 6
    # and missed the optimum by 78% (subspace iteration: 8%)
    U, _ = np.linalg.qr(rng.standard_normal((2000, 100)))
    V, _ = np.linalg.qr(rng.standard_normal((100, 100)))
    s = 1 / np.sqrt(np.arange(1, 101))
    M = (U * s) @ V.T
    products = [0]

    def counted(f):
        def g(Y):
            products[0] += 1
            return f(Y)

        return g

    L = LinearOperator(
        M.shape, matvec=counted(lambda v: M @ v), rmatvec=counted(lambda v: M.T @ v),
        matmat=counted(lambda V: M @ V), rmatmat=counted(lambda V: M.T @ V), dtype=float,
    )  # fmt: skip
    res = rsketch.svd(L, 60, seed=0, error_probes=False)
    assert res.passes == products[0] == 6
    excess = np.linalg.norm(M - (res.U * res.s) @ res.Vt, 2) / s[60] - 1
    assert excess < 0.2
    assert rsketch.svd(M, 20, seed=0, passes=999).passes < 10  # the passes it made (room for 3 blocks)


@pytest.mark.parametrize("kw", [{}, {"rank": 20}])
def test_nystrom_pcg_with_mu_far_above_a(kw):
    # the scaling by ||A|| alone overflowed mu / 2**e (math.ldexp's OverflowError at A of 1e-300, mu 1e10)
    res = rsketch.nystrom_pcg(P * 1e-300, b, 1e10, seed=0, **kw)
    x = np.linalg.solve(P * 1e-300 + 1e10 * np.eye(40), b)
    assert res.converged
    np.testing.assert_allclose(res.x, x, rtol=1e-13)


def test_nystrom_reports_a_negative_eigenvalue_in_as_units():
    # the core is of A / 2**e: the message gave its eigenvalues (-0.177, largest 0.727) at any scale
    def reported(A):
        with pytest.raises(ValueError, match="not positive semi-definite") as info:
            rsketch.nystrom(A, 3, oversample=0, seed=0)
        low, high = re.search(
            r"eigenvalue (\S+) relative to Omega.T Omega \(largest (\S+)\)", str(info.value)
        ).groups()
        return float(low), float(high)

    A = np.diag([3.0, 2.0, -1.0, 0.5])
    low, high = reported(A)
    assert low < 0 and -1.0 <= low and high <= 3.0
    assert reported(A * 2.0**40) == pytest.approx((low * 2.0**40, high * 2.0**40), rel=1e-2)


@pytest.mark.parametrize("scale", [2.0**50, 2.0**83, 2.0**-83])  # powers of two: M * scale is exact
@pytest.mark.parametrize("fn", ["eigh", "svd", "nystrom"])
def test_float32_low_rank_at_scales_whose_squares_leave_float32(fn, scale):
    # The orthonormalisation rescaled a Gram that overflowed by float64's safe range, which left
    # float32 entries of 1e15-1e30 alone: eigh raised LinAlgError ("SVD did not converge") at
    # 1e15, svd warned of overflow in matmul at 1e18-1e30
    A32 = (A / np.abs(A).max()).astype(np.float32)
    M = (A32.T @ A32).astype(np.float32) if fn != "svd" else A32
    call = {"eigh": rsketch.eigh, "svd": rsketch.svd, "nystrom": rsketch.nystrom}[fn]
    base = call(M, 5, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = call((M * np.float32(scale)).astype(np.float32), 5, seed=0)
    values = {"svd": "s"}.get(fn, "eigenvalues")
    assert getattr(res, values).dtype == np.float32
    np.testing.assert_allclose(getattr(res, values)[:5] / scale, getattr(base, values)[:5], rtol=1e-5)


@pytest.mark.parametrize("library", ["numpy", "array_api_strict"])
def test_float32_block_krylov_uses_all_its_passes(library):
    # Its orthogonality check (1e-10, float64's) read every float32 block after the first as noise
    # and stopped the space there: the singular values were 2.5e-2 off at any number of passes
    rng = np.random.default_rng(0)
    U, _ = np.linalg.qr(rng.standard_normal((2000, 500)))
    V, _ = np.linalg.qr(rng.standard_normal((500, 500)))
    A32 = ((U / (1 + np.arange(500))) @ V.T).astype(np.float32)
    s = np.linalg.svd(A32.astype(np.float64), compute_uv=False)[:20]
    X = A32 if library == "numpy" else pytest.importorskip("array_api_strict").asarray(A32)
    errors = [np.max(np.abs(np.from_dlpack(rsketch.svd(X, 20, seed=0, passes=p).s) - s) / s) for p in (3, 7)]
    assert errors[1] < 1e-5 < errors[0]
    if library != "numpy":
        return
    # and past the rank of A its noise blocks are still caught: exact singular values, orthonormal U
    B = (rng.standard_normal((400, 3)) @ rng.standard_normal((3, 150))).astype(np.float32)
    res = rsketch.svd(B, 3, seed=0)
    np.testing.assert_allclose(res.s, np.linalg.svd(B.astype(np.float64), compute_uv=False)[:3], rtol=1e-5)
    assert np.allclose(res.U.T @ res.U, np.eye(3), atol=1e-5)


def test_float32_adaptive_nystrom_pcg_builds_a_definite_preconditioner():
    # The adaptive rounds formed the l x l core B.T B, and U = B V Sigma^-1, in float32: U came out
    # 27 away from orthonormal, the preconditioner indefinite (an eigenvalue of -13), and CG stopped
    # at max_iter with a residual of 0.075. The rounds now run in float64 on float32 products.
    rng = np.random.default_rng(0)
    X = rng.standard_normal((1000, 2000)) * np.exp(-np.arange(2000) / 60)
    A64 = X.T @ X
    b = rng.standard_normal(2000)
    x = np.linalg.solve(A64 + 1e-2 * np.eye(2000), b)
    res = rsketch.nystrom_pcg(A64.astype(np.float32), b, 1e-2, seed=0)
    assert res.converged and res.iterations < 100
    assert np.linalg.norm(res.x - x) <= 1e-6 * np.linalg.norm(x)
    U = res.preconditioner.U
    assert U.dtype == np.float32
    U = U[:, np.linalg.norm(U, axis=0) > 0].astype(np.float64)  # zero columns: unresolved eigenvalues
    assert np.linalg.norm(U.T @ U - np.eye(U.shape[1]), 2) < 1e-2


def test_frobenius_norm_of_a_sparse_matrix_counts_each_entry_once():
    import scipy.sparse as sp

    from rsketch.linalg._common import frobenius_norm

    twice = sp.csr_matrix(([1.0, 2.0], [1, 1], [0, 2]), shape=(1, 2))  # 1 + 2 stored at one place
    assert frobenius_norm(twice) == 3.0 and frobenius_norm(twice.tocoo()) == 3.0  # it read sqrt(5)
    assert frobenius_norm(sp.lil_matrix(twice.toarray())) == 3.0


@pytest.mark.parametrize(
    "call",
    [
        lambda passes: rsketch.range_finder(A, 5, passes=passes),
        lambda passes: rsketch.svd(A, 5, passes=passes, method="subspace"),
        lambda passes: rsketch.eigh(P, 5, passes=passes),
        lambda passes: rsketch.SketchedPCA(n_components=2, passes=passes).fit(A),
    ],
)
def test_an_absurd_number_of_passes_is_refused_by_name(call):
    # passes had no upper bound: 2**62 + 1 ran until killed
    for passes in (2**62 + 1, rsketch.linalg._lowrank.MAX_PASSES + 2):
        with pytest.raises(ValueError, match=r"^passes must be <= 1000, got"):
            call(passes)


@pytest.mark.parametrize(
    "kw",
    [dict(method="block_krylov"), dict(method="subspace"), dict(tol=1e-12)],
    ids=["krylov", "subspace", "tol"],
)
# tol=1e-12 is out of reach on purpose: the basis grows to its largest, rank, and warns that it stopped there
@pytest.mark.filterwarnings("ignore:the adaptive range finder stopped at rank=60:rsketch.ConvergenceWarning")
def test_the_range_finders_memory_estimate_covers_what_it_allocates(kw, monkeypatch):
    # basis and scratch alone were counted: measured peaks were 1.3-2x the estimate, so a call the check
    # accepted at half the memory could need all of it
    import tracemalloc

    import scipy.sparse as sp

    import rsketch.linalg._lowrank as lowrank

    estimates = []
    monkeypatch.setattr(lowrank, "check_allocation", lambda nbytes, *a, **k: estimates.append(nbytes))
    M = sp.random(20_000, 600, density=0.002, format="csr", random_state=0)
    call = rsketch.range_finder if "tol" in kw else rsketch.svd
    call(M, 60, seed=0, **kw)  # once before: a first call's compilation is not the call's memory
    tracemalloc.start()
    call(M, 60, seed=0, **kw)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert estimates and peak <= max(estimates)


# -- flags and options checked whatever else is given ---------------------------------------------
@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (
            lambda A: rsketch.range_finder(A, 5, block_size="x", seed=0),
            TypeError,
            "block_size must be an integer",
        ),
        (lambda A: rsketch.range_finder(A, 5, block_size=0, seed=0), ValueError, "block_size must be >= 1"),
        (
            lambda A: rsketch.range_finder(A, 5, error_probes="no", seed=0),
            TypeError,
            "error_probes must be True or False",
        ),
        (lambda A: rsketch.svd(A, 5, flip_sign="no", seed=0), TypeError, "flip_sign must be True or False"),
        (
            lambda A: rsketch.svd(A, 5, error_probes=None, seed=0),
            TypeError,
            "error_probes must be True or False",
        ),
        (
            lambda A: rsketch.eigh(A.T @ A, 3, error_probes="yes", seed=0),
            TypeError,
            "error_probes must be True or False",
        ),
    ],
)
def test_flags_and_block_size_are_checked_without_tol(call, exc, match):
    # block_size was checked only with tol (where the adaptive finder uses it), and a string flag
    # counted as True ("no" gave an error estimate)
    A = np.random.default_rng(0).standard_normal((100, 30))
    with pytest.raises(exc, match=match):
        call(A)


def test_flags_take_bools_and_zero_or_one():
    A = np.random.default_rng(0).standard_normal((100, 30))
    assert rsketch.range_finder(A, 5, error_probes=0, seed=0).error_estimate is None
    assert rsketch.svd(A, 5, error_probes=np.True_, flip_sign=1, seed=0).error_estimate > 0


def test_messages_name_what_the_caller_chose():
    # nystrom's MemoryError had named "columns 0:n of a GaussianSketch", qr_pivoted's a sketch_size
    # the caller never gave (for a sketch operator of too few rows)
    n = 10**9
    op = LinearOperator((n, n), matvec=lambda v: v, matmat=lambda V: V, dtype=np.float64)
    with pytest.raises(MemoryError, match=r"nystrom's 1,000,000,000 x 15 blocks .* use a smaller rank"):
        rsketch.nystrom(op, 5, seed=0)
    X = np.random.default_rng(0).standard_normal((100, 20))
    with pytest.raises(ValueError, match=r"sketch must have at least n = 20 rows .* got \(5, 100\)"):
        rsketch.qr_pivoted(X, sketch=rsketch.make_sketch("gaussian", 100, 5, seed=0))


def test_adaptive_blocks_that_keep_missing_the_range_warn():
    # Uniform test columns of a matrix with 5 nonzero columns in 1,000: after 8 draws that found no
    # new direction, the finder took its basis for A's range, with the error 11 and its estimate 266,
    # and said nothing.
    rng = np.random.default_rng(0)
    A = np.zeros((100, 1000))
    A[:, rng.choice(1000, 5, replace=False)] = rng.standard_normal((100, 5))
    with pytest.warns(rsketch.ConvergenceWarning, match="found no new direction.*sketch='gaussian'"):
        res = rsketch.range_finder(A, 20, tol=1e-8, sketch="uniform", block_size=2, seed=0)
    assert res.error_estimate > 1e-8
    good = rsketch.range_finder(A, 20, tol=1e-8, sketch="gaussian", block_size=2, seed=0)
    assert np.linalg.norm(A - good.Q @ (good.Q.T @ A), 2) <= 1e-8


def test_adaptive_finder_refuses_an_operator():
    # One operator served every block: the same draw again on a retry, and a shape error at the last,
    # narrower block.
    B = np.random.default_rng(0).standard_normal((200, 150))
    S = rsketch.make_sketch("gaussian", 150, 7, seed=0)
    for call in (
        lambda: rsketch.range_finder(B, 30, tol=1e-10, sketch=S, passes=3, block_size=7),
        lambda: rsketch.svd(B, 30, tol=1e-10, sketch=S, passes=1, block_size=7),
    ):
        with pytest.raises(ValueError, match="tol draws a new test block.*kind name"):
            call()


@pytest.mark.parametrize("fmt", ["csr", "csc"])
@pytest.mark.parametrize("shape", [(20, 10), (10, 20)])
def test_sparse_svd_of_an_empty_adaptive_basis(fmt, shape):
    # A sparse A whose adaptive basis had no column: "cond is not defined on empty arrays".
    import scipy.sparse as sp

    A = sp.random(*shape, density=0.3, format=fmt, random_state=0)
    for M, tol in ((A * 0, 1e-8), (A, 1e300)):
        res = rsketch.svd(M, 5, tol=tol, seed=0)
        assert res.U.shape == (shape[0], 0) and res.s.shape == (0,) and res.Vt.shape == (0, shape[1])


def test_range_finder_takes_block_size_as_svd_does():
    # Without tol, range_finder ignored block_size: a block Krylov space of rank + oversample columns
    # a block, whatever was asked.
    B = np.random.default_rng(0).standard_normal((200, 150))
    res = rsketch.range_finder(B, 5, method="block_krylov", passes=9, block_size=3, seed=0)
    assert res.Q.shape == (200, 15)  # five blocks of 3
    assert rsketch.range_finder(B, 5, method="block_krylov", passes=9, seed=0).Q.shape == (200, 75)
    with pytest.raises(ValueError, match="subspace iteration's block is rank \\+ oversample"):
        rsketch.range_finder(B, 5, method="subspace", block_size=3, seed=0)


def test_adaptive_draws_that_run_out_short_of_rank_say_why():
    # Blocks that each found fewer directions than their columns used up the draws before the basis
    # reached rank: the warning said "raise rank", which cannot help (3 of 4 columns, estimate 1e2).
    rng = np.random.default_rng(0)
    U = np.linalg.qr(rng.standard_normal((100, 4)))[0]
    A = np.zeros((100, 1000))
    A[:, :300] = U[:, :3] @ rng.standard_normal((3, 300))
    A[:, 500] = 5 * U[:, 3]  # one column in a fourth direction, which uniform draws rarely meet
    with pytest.warns(rsketch.ConvergenceWarning, match=r"stopped at 3 of rank=4 columns.*sketch='gaussian'"):
        rsketch.range_finder(A, 4, tol=1e-8, sketch="uniform", block_size=2, passes=1, seed=0)
