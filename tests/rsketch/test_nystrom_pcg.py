"""Nyström-preconditioned CG (Frangella, Tropp & Udell, SIMAX 2023) and SketchedRidge on wide designs.

Their Theorem 5.1: with a Gaussian Nyström sketch of ``l >= 2 ceil(1.5 d_eff(mu)) + 1`` columns,
``E[kappa(P^-1/2 (A + mu I) P^-1/2)] < 28``; CG then contracts the ``(A + mu I)``-norm error by
``2 ((sqrt(kappa) - 1) / (sqrt(kappa) + 1))^t`` after ``t`` iterations (the classical CG bound).
"""

import math

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.linalg import aslinearoperator
from sklearn.linear_model import Ridge

from rsketch import SketchedRidge, estimators
from rsketch._validation import seed_sequence
from rsketch.linalg import ConvergenceWarning, nystrom, nystrom_pcg, nystrom_preconditioner


def psd(n=200, seed=0, decay=0.8):
    # A Gaussian Nyström sketch is rotation invariant in distribution: a diagonal A is as general as
    # V diag(lam) V.T, and its eigenvalues need no solver. The order is shuffled so that no test
    # matrix can favour the leading coordinates.
    lam = decay ** np.arange(n)
    return np.diag(np.random.default_rng(seed).permutation(lam)), lam


def preconditioned_condition_number(approx, mu, A):
    """kappa(P^-1/2 (A + mu I) P^-1/2), with P^-1/2 = I + U diag(sqrt(P^-1's scale) - 1) U.T."""
    U, lam = approx.U, approx.eigenvalues
    root = np.sqrt((lam[-1] + mu) / (lam + mu)) - 1
    R = np.eye(len(A)) + (U * root) @ U.T
    ev = np.linalg.eigvalsh(R @ (A + mu * np.eye(len(A))) @ R)
    return ev[-1] / ev[0]


def effective_dimension(lam, mu):
    return float(np.sum(lam / (lam + mu)))


def test_preconditioner_is_the_papers_formula():
    A, _ = psd(n=100, seed=10)
    approx = nystrom(A, 20, seed=0)
    U, lam, mu = approx.U, approx.eigenvalues, 1e-2
    dense = (lam[-1] + mu) * (U / (lam + mu)) @ U.T + np.eye(100) - U @ U.T
    V = np.random.default_rng(0).standard_normal((100, 3))
    np.testing.assert_allclose(nystrom_preconditioner(approx, mu) @ V, dense @ V, rtol=1e-12, atol=1e-12)


def test_condition_number_below_28_at_the_theorems_rank():
    A, lam = psd()
    mu = 1e-4
    l = 2 * math.ceil(1.5 * effective_dimension(lam, mu)) + 1
    kappas = []
    for seed in range(20):
        kappas.append(preconditioned_condition_number(nystrom(A, l, oversample=0, seed=seed), mu, A))
    assert np.mean(kappas) < 28
    # Without a preconditioner: cond(A + mu I) ~ 1e4, so the test separates the two.
    assert (lam[0] + mu) / (lam[-1] + mu) > 1000 * np.mean(kappas)


def test_cg_error_follows_the_condition_number_bound():
    A, lam = psd(seed=1)
    mu = 1e-4
    n = len(lam)
    Amu = A + mu * np.eye(n)
    b = np.random.default_rng(2).standard_normal(n)
    x_star = np.linalg.solve(Amu, b)
    l = 2 * math.ceil(1.5 * effective_dimension(lam, mu)) + 1
    errors = []

    def anorm(e):
        return math.sqrt(e @ Amu @ e)

    res = nystrom_pcg(
        A, b, mu, rank=l, oversample=0, tol=1e-13, seed=3, callback=lambda x: errors.append(x.copy())
    )
    assert res.converged and res.preconditioner.U.shape[1] == l
    kappa = preconditioned_condition_number(res.preconditioner, mu, A)
    rho = (math.sqrt(kappa) - 1) / (math.sqrt(kappa) + 1)
    e0 = anorm(x_star)
    for t, x in enumerate(errors, start=1):
        assert anorm(x - x_star) <= 2 * rho**t * e0 * (1 + 1e-6) + 1e-12 * e0
    # The bound's iteration count for 1e-13 with kappa < 28 is ~ 75; unpreconditioned CG needs hundreds.
    assert res.iterations <= math.ceil(math.log(2e13 * math.sqrt(kappa)) / -math.log(rho)) + 1
    np.testing.assert_allclose(res.x, x_star, rtol=1e-9)


def test_adaptive_rank_stops_near_the_effective_dimension():
    A, lam = psd(n=300, seed=4, decay=0.95)
    mu = 1e-3
    res = nystrom_pcg(A, np.ones(300), mu, seed=0)
    assert res.preconditioner.eigenvalues[-1] <= 10 * mu
    # lambda_l <= 10 mu bounds the preconditioned condition number by about 11 plus the tail's
    # error over mu (Frangella et al., Prop. 5.3); 28 is the theorem's bound at its rank.
    assert preconditioned_condition_number(res.preconditioner, mu, A) < 28
    assert res.preconditioner.U.shape[1] < len(lam) / 2 and res.iterations < 60 and res.converged


@pytest.mark.parametrize("kind", ["sparse_sign", "gaussian"])
def test_drawn_test_blocks_give_the_orthonormalised_approximation(kind, monkeypatch):
    # At most n/4 columns the blocks are used as drawn; the Nystrom approximation depends on
    # range(Omega) only, so forcing the orthonormalising path gives the same one to rounding.
    from rsketch.linalg import _nystrom_pcg

    A, lam = psd(n=400, seed=6, decay=0.93)
    mu, b = 1e-3, np.random.default_rng(8).standard_normal(400)
    drawn = nystrom_pcg(A, b, mu, max_rank=100, sketch=kind, tol=1e-13, seed=0)
    monkeypatch.setattr(_nystrom_pcg, "DRAWN_MAX_FRACTION", 10**9)
    orthonormal = nystrom_pcg(A, b, mu, max_rank=100, sketch=kind, tol=1e-13, seed=0)
    assert drawn.preconditioner.U.shape == orthonormal.preconditioner.U.shape
    lam_drawn, lam_orthonormal = drawn.preconditioner.eigenvalues, orthonormal.preconditioner.eigenvalues
    np.testing.assert_allclose(lam_drawn, lam_orthonormal, rtol=0, atol=1e-10 * lam.max())
    V = np.random.default_rng(9).standard_normal((400, 3))
    P, Q = (nystrom_preconditioner(r.preconditioner, mu) @ V for r in (drawn, orthonormal))
    np.testing.assert_allclose(P, Q, rtol=0, atol=1e-8 * np.abs(Q).max())
    assert drawn.preconditioner.eigenvalues[-1] <= 10 * mu
    # ||x - x*|| <= cond(A + mu I) ||r|| / ||b|| ||x*||, and cond = (lam_max + mu) / mu ~ 1000
    x_star = np.linalg.solve(A + mu * np.eye(400), b)
    assert drawn.converged and np.linalg.norm(drawn.x - x_star) <= 1e-9 * np.linalg.norm(x_star)


def test_an_ill_conditioned_drawn_block_is_orthonormalised_instead(monkeypatch):
    # DRAWN_MIN_DISTANCE = 1 finds every drawn block ill-conditioned: the rounds start again
    # orthonormalised, from the same test blocks, and give that path's result bit for bit
    from rsketch.linalg import _nystrom_pcg

    A, _ = psd(n=400, seed=6, decay=0.93)
    b = np.random.default_rng(3).standard_normal(400)
    options = dict(max_rank=100, sketch="sparse_sign", seed=0)
    monkeypatch.setattr(_nystrom_pcg, "DRAWN_MIN_DISTANCE", 1.0)
    restarted = nystrom_pcg(A, b, 1e-3, **options)
    monkeypatch.setattr(_nystrom_pcg, "DRAWN_MAX_FRACTION", 10**9)
    orthonormal = nystrom_pcg(A, b, 1e-3, **options)
    np.testing.assert_array_equal(restarted.preconditioner.U, orthonormal.preconditioner.U)
    np.testing.assert_array_equal(restarted.x, orthonormal.x)


def test_a_wide_ridge_keeps_its_drawn_blocks(monkeypatch):
    # a sparse sign of up to p / 4 columns is well conditioned as drawn: no restart (a 1-norm
    # condition estimate once sent such a sketch down the orthonormalising path after its rounds)
    from rsketch.linalg import _nystrom_pcg

    calls = []
    rounds = _nystrom_pcg._nystrom_rounds

    def spy(*args, drawn):
        result = rounds(*args, drawn=drawn)
        calls.append((drawn, result is not None))
        return result

    monkeypatch.setattr(_nystrom_pcg, "_nystrom_rounds", spy)
    monkeypatch.setattr(estimators, "KERNEL_MAX_SAMPLES", 0)  # Nyström, as for more than 5,000 samples
    X, y = random_fourier_features(500, 2000)
    SketchedRidge(alpha=1e-3, random_state=0).fit(X, y)
    assert calls == [(True, True)]
    # the benchmark's blocks: 200, 200, 400 and 800 columns at p = 10,000, cond(Omega) 3.7
    from rsketch.linalg._gram import sketch_matrix
    from rsketch.operators import make_sketch

    children = seed_sequence(0).spawn(4)
    M = sp.vstack([sketch_matrix(make_sketch("sparse_sign", 10_000, w, seed=c), np.float64)
                   for w, c in zip((200, 200, 400, 800), children, strict=True)])  # fmt: skip
    gram = (M @ M.T).toarray()
    ev = np.linalg.eigvalsh(gram)
    assert math.sqrt(ev[-1] / ev[0]) < 5 and _nystrom_pcg._well_conditioned(gram)


def test_a_test_block_with_dependent_columns_is_refused_clearly():
    # seed 0's first CountSketch block of 10 columns leaves a bucket of the 40 rows empty: not
    # well-conditioned as drawn, and orthonormalised it has a zero column; uniform sampling draws a
    # column twice. Either is a clear error, not a singular solve.
    from rsketch.linalg._gram import sketch_matrix
    from rsketch.linalg._nystrom_pcg import _well_conditioned
    from rsketch.operators import make_sketch

    M = sketch_matrix(make_sketch("countsketch", 40, 10, seed=seed_sequence(0).spawn(64)[0]), np.float64)
    assert (abs(M).sum(axis=1) == 0).any() and not _well_conditioned((M @ M.T).toarray())
    A, _ = psd(n=40, seed=2, decay=0.7)
    with pytest.raises(ValueError, match="linearly dependent columns"):
        nystrom_pcg(A, np.ones(40), 1e-3, initial_rank=10, max_rank=10, sketch="countsketch", seed=0)


def test_uniform_sampling_takes_a_rank_not_the_adaptive_rounds():
    # each adaptive round sampled anew: a column twice, at every max_rank and mu tried, and the
    # error came after the products; refused first now, and one sample without replacement works
    rng = np.random.default_rng(19)
    X = rng.standard_normal((400, 300))
    A, b = X.T @ X, rng.standard_normal(300)
    with pytest.raises(ValueError, match="sketch='uniform' with the adaptive rank samples each round"):
        nystrom_pcg(A, b, 1e-2, sketch="uniform", seed=0)
    res = nystrom_pcg(A, b, 1e-2, sketch="uniform", rank=100, seed=0)
    assert res.converged
    np.testing.assert_allclose(res.x, np.linalg.solve(A + 1e-2 * np.eye(300), b), rtol=1e-8)


def test_the_preconditioner_checks_mu_and_its_approximation():
    from rsketch.linalg import nystrom, nystrom_preconditioner

    approx = nystrom(np.diag([3.0, 2.0, 0.0, 0.0]), 2, oversample=1, seed=0)
    for mu in (0.0, -1.0, math.inf, math.nan):  # 0 had given a singular "preconditioner"
        with pytest.raises(ValueError, match="mu must be a finite number > 0"):
            nystrom_preconditioner(approx, mu)
    with pytest.raises(TypeError, match="mu"):
        nystrom_preconditioner(approx, "1")
    with pytest.raises(TypeError, match="approx must be a NystromResult"):
        nystrom_preconditioner(np.eye(4), 1.0)
    assert nystrom_preconditioner(approx, np.float32(1.0)).shape == (4, 4)


def test_several_right_hand_sides_and_operator_input():
    A, _ = psd(n=200, seed=5)
    A = A + np.random.default_rng(9).standard_normal((200, 200)) * 1e-3
    A = A @ A.T  # not diagonal
    B = np.random.default_rng(6).standard_normal((200, 3))
    res = nystrom_pcg(aslinearoperator(A), B, 1e-3, seed=0)
    np.testing.assert_allclose(res.x, np.linalg.solve(A + 1e-3 * np.eye(200), B), rtol=1e-9, atol=1e-12)
    assert res.residual_norms.shape == (3,) and np.all(res.residual_norms <= 1e-12)


def test_bad_input_and_max_iter_warning():
    A, _ = psd(n=50)
    with pytest.raises(ValueError, match="mu must be"):
        nystrom_pcg(A, np.ones(50), 0.0)
    with pytest.raises(ValueError, match="b must have 50 rows"):
        nystrom_pcg(A, np.ones(49), 1.0)
    with pytest.raises(ValueError, match="b contains NaN"):
        nystrom_pcg(A, np.full(50, np.nan), 1.0)
    with pytest.raises(ValueError, match="square"):
        nystrom_pcg(np.ones((50, 40)), np.ones(50), 1.0)
    with pytest.raises(ValueError, match="positive semi-definite"):
        nystrom_pcg(-A, np.ones(50), 1.0, rank=5)
    with pytest.raises(ValueError, match="initial_rank"):
        nystrom_pcg(A, np.ones(50), 1.0, initial_rank=0)
    # contradictory options ran (and stopped short with a ConvergenceWarning); as given, not as cut
    # to n: the defaults (50, 1000) on n = 30 are no contradiction
    with pytest.raises(ValueError, match=r"initial_rank \(100\) must not exceed max_rank \(10\)"):
        nystrom_pcg(A, np.ones(50), 1.0, initial_rank=100, max_rank=10, seed=0)
    assert nystrom_pcg(A[:30, :30], np.ones(30), 1.0, seed=0).converged
    # max_rank alone below the default first round (50) is no contradiction, with or without rank=
    assert nystrom_pcg(A, np.ones(50), 1.0, max_rank=30, seed=0).converged
    assert nystrom_pcg(A, np.ones(50), 1.0, max_rank=30, rank=10, seed=0).converged
    with pytest.warns(ConvergenceWarning, match="max_iter=1"):
        res = nystrom_pcg(A, np.ones(50), 1e-8, rank=2, max_iter=1)
    assert not res.converged


def test_b_of_any_real_dtype_is_taken_as_every_operand_is():
    # b had its own check: a longdouble b gave a float128 x, a bool b was refused, a complex one was
    # a ValueError; now as check_operand (and S @ A) takes an operand
    A, _ = psd(n=50)
    ref = nystrom_pcg(A, np.ones(50), 1.0, seed=0).x
    for b in (np.ones(50, np.longdouble), np.ones(50, bool), np.ones(50, np.int8), [1.0] * 50):
        res = nystrom_pcg(A, b, 1.0, seed=0)
        assert res.x.dtype == np.float64 and np.array_equal(res.x, ref)
    assert nystrom_pcg(A.astype(np.float32), np.ones(50, np.float16), 1.0, seed=0).x.dtype == np.float32
    with pytest.raises(TypeError, match="b must be real-valued"):
        nystrom_pcg(A, np.ones(50, complex), 1.0)
    with pytest.raises(TypeError, match="b must be a dense NumPy array"):
        nystrom_pcg(A, sp.csr_matrix(np.ones((50, 1))), 1.0)


def test_a_zero_or_rounding_level_psd_matrix_is_psd():
    # A Omega = 0: the approximation is zero and the preconditioner the identity (the shift was zero
    # and the Cholesky of a zero core failed, reported as "not PSD, eigenvalue 0").
    res = nystrom_pcg(np.zeros((5, 5)), np.ones(5), 2.0, seed=0)
    assert res.converged and np.array_equal(res.x, np.full(5, 0.5))
    assert not nystrom(np.zeros((5, 5)), 2, seed=0).eigenvalues.any()
    # A float32 X.T X of rank one: eigenvalues of -5e-7 of the largest (4 u) are rounding, not
    # indefiniteness; 3 of 5 seeds were refused.
    for seed in range(10):
        X = np.random.default_rng(seed).standard_normal((1, 40)).astype(np.float32)
        A = X.T @ X
        res = nystrom_pcg(A, np.ones(40, np.float32), 1.0, seed=seed)
        ref = np.linalg.solve(A.astype(np.float64) + np.eye(40), np.ones(40))
        assert res.converged and np.abs(res.x - ref).max() <= 1e-5
    # A negative eigenvalue beyond rounding is still refused, with its value.
    with pytest.raises(ValueError, match=r"eigenvalue -1 relative to Omega.T Omega \(largest 3\)"):
        nystrom_pcg(np.diag([3.0, 2.0, -1.0, 0.5]), np.ones(4), 0.1, seed=0)


def test_residuals_are_those_of_x_and_converged_means_tol_or_the_rounding_floor():
    # CG's recurrence drifts from the residual of x in float32: it said 7e-13 where x's was 2e-6,
    # and converged=True claimed tol=1e-12. The reported residual is x's now, and converged means
    # tol or the floor below which the residual cannot be computed.
    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, 500)) * np.exp(-np.arange(500) / 30)
    y = rng.standard_normal(500)
    for dtype, mu in ((np.float32, 1e-1), (np.float64, 1e-4), (np.float64, 1e-1)):
        A, b = (X.T @ X).astype(dtype), y.astype(dtype)
        res = nystrom_pcg(A, b, mu, seed=0)
        A64, x64 = A.astype(np.float64), res.x.astype(np.float64)
        true = np.linalg.norm(b - A64 @ x64 - mu * x64) / np.linalg.norm(b)
        assert res.residual_norms[0] == pytest.approx(true, rel=0.05, abs=10 * float(np.finfo(dtype).eps))
        assert res.converged
        ref = np.linalg.solve(A64 + mu * np.eye(500), y)
        assert np.linalg.norm(x64 - ref) <= 1e3 * np.finfo(dtype).eps * np.linalg.norm(ref)
    # mu = 1e-4 in float32 (cond(A + mu I) u = 0.2): within the floor and accurate (with the adaptive
    # rounds' core in float32 its preconditioner was indefinite, and this was not converged)
    A32, b32 = (X.T @ X).astype(np.float32), y.astype(np.float32)
    res = nystrom_pcg(A32, b32, 1e-4, seed=0)
    ref = np.linalg.solve(A32.astype(np.float64) + 1e-4 * np.eye(500), b32.astype(np.float64))
    assert res.converged and np.linalg.norm(res.x - ref) <= 1e-5 * np.linalg.norm(ref)
    # stopped early it is not converged, and says why
    with pytest.warns(ConvergenceWarning, match="above tol=1e-12 and the rounding floor of float32"):
        res = nystrom_pcg(A32, b32, 1e-4, seed=0, max_iter=5)
    assert not res.converged


@pytest.mark.parametrize("kernel_max_samples", [None, 0])
def test_wide_ridge_on_a_constant_design_is_the_mean(kernel_max_samples, monkeypatch):
    # Centred, X is zero: X.T X = 0 (the wide paths had failed as "not positive semi-definite");
    # Ridge gives coef 0 and the intercept mean(y), as for one sample. Every column is constant, so
    # none reaches a solver (constant columns are left out with an intercept), whichever wide form
    # (the kernel form, or Nystrom beyond KERNEL_MAX_SAMPLES samples) would have taken it.
    if kernel_max_samples is not None:
        monkeypatch.setattr(estimators, "KERNEL_MAX_SAMPLES", kernel_max_samples)
    for X, y in ((np.ones((10, 300)), np.arange(10.0)), (np.arange(300.0)[None], np.array([2.0]))):
        ours = SketchedRidge(random_state=0).fit(X, y)
        ref = Ridge().fit(X, y)
        assert ours.solver_ == "direct" and not ours.coef_.any()
        assert ours.intercept_ == pytest.approx(ref.intercept_, rel=1e-15)


# ----------------------------------------------------------------------------- SketchedRidge, wide
def random_fourier_features(n, p, d=5, bandwidth=2.0, seed=0):
    """``sqrt(2/p) cos(Z W + c)``: features of the Gaussian kernel, whose spectrum decays fast."""
    rng = np.random.default_rng(seed)
    Z = rng.standard_normal((n, d))
    W = rng.standard_normal((d, p)) / bandwidth
    c = rng.uniform(0, 2 * np.pi, p)
    X = np.sqrt(2 / p) * np.cos(Z @ W + c)
    y = np.sin(Z[:, 0]) + Z[:, 1] ** 2 / 4 + 0.1 * rng.standard_normal(n)
    return X, y


@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("n", [800, 400])  # the sketch's test blocks orthonormalised; as drawn (l <= p/4)
def test_ridge_on_random_fourier_features_matches_sklearn(fit_intercept, n, monkeypatch):
    X, y = random_fourier_features(n, 2000)
    alpha = 1e-3
    ref = Ridge(alpha=alpha, fit_intercept=fit_intercept, solver="cholesky").fit(X, y)
    kernel = SketchedRidge(alpha=alpha, fit_intercept=fit_intercept, random_state=0).fit(X, y)
    assert kernel.solver_ == "kernel"
    np.testing.assert_allclose(kernel.coef_, ref.coef_, rtol=1e-10, atol=1e-10 * np.abs(ref.coef_).max())
    monkeypatch.setattr(estimators, "KERNEL_MAX_SAMPLES", 0)  # Nyström, as for more than 5,000 samples
    ours = SketchedRidge(alpha=alpha, fit_intercept=fit_intercept, random_state=0).fit(X, y)
    assert ours.solver_ == "nystrom_pcg" and 0 < ours.n_iter_ < 100
    np.testing.assert_allclose(ours.coef_, ref.coef_, rtol=1e-8, atol=1e-8 * np.abs(ref.coef_).max())
    np.testing.assert_allclose(ours.intercept_, ref.intercept_, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("solver", ["kernel", "nystrom_pcg"])
def test_wide_sparse_weighted_multi_target(solver, monkeypatch):
    if solver == "nystrom_pcg":
        monkeypatch.setattr(estimators, "KERNEL_MAX_SAMPLES", 0)
    rng = np.random.default_rng(7)
    X = sp.random(300, 600, density=0.05, random_state=8, format="csr") @ sp.diags(
        np.exp(-np.arange(600) / 60)
    )
    Y = rng.standard_normal((300, 2))
    w = rng.uniform(0.5, 2.0, 300)
    ours = SketchedRidge(alpha=0.1, random_state=0).fit(X, Y, sample_weight=w)
    ref = Ridge(alpha=0.1, solver="cholesky").fit(X.toarray(), Y, sample_weight=w)
    assert ours.solver_ == solver
    np.testing.assert_allclose(ours.coef_, ref.coef_, rtol=1e-8, atol=1e-8 * np.abs(ref.coef_).max())
    np.testing.assert_allclose(ours.intercept_, ref.intercept_, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("kind", ["sparse_sign", "countsketch", "gaussian"])
def test_the_adaptive_sketch_draws_the_operators_own_test_matrix(kind):
    # the block is the operator's own dense form, bit for bit (GramOperator.sketch applies a sparse
    # sign from its pattern: the same matrix), Fortran-ordered, in the dtype asked for
    from rsketch.linalg._nystrom_pcg import _test_block
    from rsketch.operators import make_sketch

    for dtype in (np.float64, np.float32):
        S = make_sketch(kind, 300, 40, seed=3, dtype=dtype)
        G = _test_block(S, dtype)
        assert G.flags.f_contiguous and G.dtype == dtype
        np.testing.assert_array_equal(G, np.asarray(S.to_dense().T, dtype=dtype))


def test_the_adaptive_sketch_too_large_for_memory_is_refused_by_max_rank(monkeypatch):
    # the rounds' buffers (n x max_rank) were allocated unchecked: n = 10**7 met numpy's "Unable to
    # allocate 74.5 GiB"
    from scipy.sparse.linalg import LinearOperator

    import rsketch._validation

    monkeypatch.setattr(rsketch._validation, "available_memory", lambda: 2**30)
    n = 200_000
    A = LinearOperator((n, n), matvec=lambda v: v, matmat=lambda V: V, rmatvec=lambda v: v, dtype=np.float64)
    with pytest.raises(MemoryError, match=r"Nystrom sketch of 500 columns .*smaller max_rank"):
        nystrom_pcg(A, np.ones(n), 1.0, initial_rank=500)
    # checked a round at a time: the default max_rank (1000 columns, 4.8 GB) does not refuse a call
    # whose first round (50 columns, 240 MB) is enough (the identity: lambda_l <= 10 mu at once)
    assert nystrom_pcg(A, np.ones(n), 1.0, seed=0).converged


def test_a_tol_below_rounding_stops_at_an_exact_zero_instead_of_dividing_by_it():
    # CG reaches r = 0 exactly in float64 on this small Gram; tol 1e-300 then met d @ A d = 0 and a
    # ZeroDivisionError. Now it stops there, converged by the rounding floor's rule.
    rng = np.random.default_rng(0)
    X = rng.standard_normal((60, 60)) * np.exp(-np.arange(60) / 5)
    A, b = X.T @ X, rng.standard_normal(60)
    res = nystrom_pcg(A, b, 1e-3, tol=1e-300, seed=0)
    assert res.converged
    assert np.linalg.norm(A @ res.x + 1e-3 * res.x - b) <= 1e-12 * np.linalg.norm(b)


@pytest.mark.parametrize(("n", "max_rank"), [(200, None), (800, 200)])  # orthonormalised, drawn blocks
def test_a_spectrum_wider_than_the_rounding_square_root_keeps_the_preconditioner_definite(n, max_rank):
    # eigenvalues exp(-i/10) down to 1e-9 of the largest: the fast factor squares B (B.T B from Y.T Y), and
    # its small directions came out with U 7 away from orthonormal, the preconditioner's smallest
    # eigenvalue -6.99 and CG at 88 times ||b|| after 200 iterations
    rng = np.random.default_rng(0 if n == 200 else 1)
    X = rng.standard_normal((n, n)) * np.exp(-np.arange(n) / 20)
    A, b, mu = X.T @ X, rng.standard_normal(n), 1e-10
    res = nystrom_pcg(A, b, mu, seed=0, **({} if max_rank is None else {"max_rank": max_rank}))
    U = res.preconditioner.U[:, res.preconditioner.eigenvalues > 0]
    np.testing.assert_allclose(U.T @ U, np.eye(U.shape[1]), atol=1e-10)
    P = nystrom_preconditioner(res.preconditioner, mu) @ np.eye(n)
    assert np.linalg.eigvalsh((P + P.T) / 2)[0] > 0
    assert res.converged
    assert np.linalg.norm(A @ res.x + mu * res.x - b) <= 1e-8 * np.linalg.norm(b)


def test_sketched_ridge_on_a_wide_spectrum_equals_sklearns():
    # column scales exp(-j/150) over 2,000 columns and alpha 1e-6: the coefficients had been 58% off
    # Ridge's (180% at alpha 1e-9), with a ConvergenceWarning
    rng = np.random.default_rng(2)
    X = rng.standard_normal((2500, 2000)) * np.exp(-np.arange(2000) / 150)
    y = rng.standard_normal(2500)
    ours = SketchedRidge(alpha=1e-6, random_state=0).fit(X, y)
    ref = Ridge(alpha=1e-6, solver="cholesky").fit(X, y)
    assert ours.solver_ == "nystrom_pcg"
    assert np.linalg.norm(ours.coef_ - ref.coef_) <= 1e-8 * np.linalg.norm(ref.coef_)
