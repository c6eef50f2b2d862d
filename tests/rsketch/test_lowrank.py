"""Randomized low-rank approximation against theory and against SciPy/scikit-learn.

HMT = Halko, Martinsson & Tropp, SIAM Review 2011. With a Gaussian test matrix of ``k + p`` columns
(``p >= 2``), Theorem 10.5 and 10.6 (Proposition 10.1 for the means):

    E ||A - Q Q.T A||_F <= (1 + k / (p - 1))^(1/2) (sum_{j > k} s_j^2)^(1/2)
    E ||A - Q Q.T A||_2 <= (1 + sqrt(k / (p - 1))) s_{k+1} + e sqrt(k + p) / p (sum_{j > k} s_j^2)^(1/2)

The tests average over 40 fixed seeds and allow a 10% margin for the sample mean (its standard
deviation is a few percent of the mean at these sizes: HMT 10.3 gives sub-Gaussian tails).
"""

import warnings

import numpy as np
import pytest
import scipy.linalg
import scipy.linalg.interpolative as sli
import scipy.sparse as sp
import scipy.sparse.linalg
from scipy.sparse.linalg import LinearOperator, aslinearoperator
from sklearn.utils.extmath import randomized_svd

import rsketch
from rsketch.linalg import eigh, interpolative, nystrom, qr_pivoted, range_finder, svd


def matrix_with_spectrum(m, n, s, seed=0):
    rng = np.random.default_rng(seed)
    U = np.linalg.qr(rng.standard_normal((m, len(s))))[0]
    V = np.linalg.qr(rng.standard_normal((n, len(s))))[0]
    return (U * s) @ V.T


DECAY = 0.8 ** np.arange(40)


# ------------------------------------------------------------------------------------------- theory
def test_hmt_expected_error_bounds_with_gaussian_test_matrices():
    A = matrix_with_spectrum(300, 120, DECAY, seed=1)
    k, p = 8, 5
    tail = np.sqrt(np.sum(DECAY[k:] ** 2))
    frob, spec = [], []
    for seed in range(40):
        Q = range_finder(A, k, oversample=p, passes=1, sketch="gaussian", error_probes=False, seed=seed).Q
        E = A - Q @ (Q.T @ A)
        frob.append(np.linalg.norm(E))
        spec.append(np.linalg.norm(E, 2))
    frob_bound = np.sqrt(1 + k / (p - 1)) * tail
    spec_bound = (1 + np.sqrt(k / (p - 1))) * DECAY[k] + np.e * np.sqrt(k + p) / p * tail
    assert np.mean(frob) <= 1.1 * frob_bound
    assert np.mean(spec) <= 1.1 * spec_bound
    # Never better than the rank-(k + p) optimum (Eckart-Young): the test can fail in both directions.
    l = k + p
    assert min(frob) >= np.sqrt(np.sum(DECAY[l:] ** 2)) * (1 - 1e-12) and min(spec) >= DECAY[l] * (1 - 1e-12)


@pytest.mark.parametrize("kind", ["sparse_sign", "srht", "countsketch", "uniform"])
def test_every_operator_is_a_test_matrix_as_good_as_gaussian_within_a_factor(kind):
    # No theorem for these at k + p columns; the embedding property gives the same rate, so the
    # mean error over seeds stays within 1.5x of the Gaussian bound (observed: 1.0-1.1x).
    A = matrix_with_spectrum(300, 128, DECAY, seed=2)
    k, p = 8, 5
    tail = np.sqrt(np.sum(DECAY[k:] ** 2))
    errs = [
        np.linalg.norm(
            A
            - (Q := range_finder(A, k, oversample=p, passes=1, sketch=kind, seed=s, error_probes=False).Q)
            @ (Q.T @ A)
        )
        for s in range(20)
    ]
    assert np.mean(errs) <= 1.5 * np.sqrt(1 + k / (p - 1)) * tail


def test_exact_recovery_of_an_exactly_low_rank_matrix_in_every_input_format():
    rng = np.random.default_rng(3)
    A = rng.standard_normal((400, 6)) @ rng.standard_normal((6, 150))
    s_true = np.linalg.svd(A, compute_uv=False)[:6]
    for X in (A, sp.csr_matrix(A), sp.csc_matrix(A), aslinearoperator(A)):
        res = svd(X, 6, oversample=2, passes=1, seed=0)
        np.testing.assert_allclose(res.s, s_true, rtol=1e-10)
        assert np.linalg.norm(A - (res.U * res.s) @ res.Vt) <= 1e-10 * np.linalg.norm(A)
        assert res.error_estimate <= 1e-9 * s_true[0]


def test_error_estimate_is_an_upper_bound_and_adaptive_meets_tol():
    A = matrix_with_spectrum(300, 150, 0.7 ** np.arange(60), seed=4)
    for seed in range(10):
        res = svd(A, 10, seed=seed)
        true = np.linalg.norm(A - (res.U * res.s) @ res.Vt, 2)
        assert true <= res.error_estimate  # fails with probability 1e-10 per draw
    tol = 1e-6
    found = range_finder(A, 100, tol=tol, block_size=5, passes=1, seed=0)
    Q = found.Q
    assert found.error_estimate <= tol and np.linalg.norm(A - Q @ (Q.T @ A), 2) <= tol
    assert np.allclose(Q.T @ Q, np.eye(Q.shape[1]), atol=1e-13)
    # The basis is not much larger than the rank the tolerance needs (0.7^j < 1e-6 from j = 39).
    assert Q.shape[1] <= 39 + 10 + 10


@pytest.mark.parametrize("passes", [1, 2, 3])
@pytest.mark.parametrize("block_size", [1, 3, 10])
def test_adaptive_range_finder_stops_at_rounding_with_an_orthonormal_basis(passes, block_size):
    # An exactly rank-6 A and a tolerance below rounding: once range(A) is in Q a new block is noise.
    # It used to be appended (||Q.T Q - I|| = 33, an estimate of 5e-13 where the error was 1.7e3).
    rng = np.random.default_rng(5)
    B = rng.standard_normal((80, 6)) @ rng.standard_normal((6, 50))
    res = range_finder(B, 50, tol=1e-14, block_size=block_size, passes=passes, seed=0)  # no warning
    Q = res.Q
    assert Q.shape[1] == 6 and np.linalg.norm(Q.T @ Q - np.eye(6), 2) <= 1e-14
    norm = np.linalg.norm(B, 2)
    assert np.linalg.norm(B - Q @ (Q.T @ B), 2) <= 1e-12 * norm and res.error_estimate <= 1e-10 * norm
    # A smooth decay with power rounds: each block iterates on the deflated (I - Q Q.T) A. On A
    # itself a power round returned to the leading directions, Q held them, and the search stopped
    # at 53 columns with the error at 5e-4 (sigma_53 = 4e-4, tol 1.8e-11).
    A = rng.standard_normal((300, 200)) * np.exp(-np.arange(200) / 5)
    tol = 1e-12 * np.linalg.norm(A, 2)
    Q = range_finder(A, 200, tol=tol, block_size=block_size, passes=passes, seed=0).Q
    assert np.linalg.norm(Q.T @ Q - np.eye(Q.shape[1]), 2) <= 1e-14
    assert np.linalg.norm(A - Q @ (Q.T @ A), 2) <= tol and Q.shape[1] <= 160


def test_adaptive_range_finder_warns_when_it_stops_at_rank_above_tol():
    # The basis reached rank first: the estimate, 1e8 times tol, came back with no signal. And with
    # tol, method is not used (each block is subspace iteration): block_krylov's odd-passes rule
    # refused svd(tol=..., passes=4).
    A = np.random.default_rng(0).standard_normal((300, 200)) / np.sqrt(np.arange(1, 201))
    for call in (lambda: svd(A, 20, tol=1e-6, seed=0), lambda: range_finder(A, 20, tol=1e-6, seed=0)):
        with pytest.warns(
            rsketch.ConvergenceWarning, match=r"stopped at rank=20 columns: raise rank \(error estimate 2"
        ):
            res = call()
        assert res.error_estimate > 100
    with pytest.warns(rsketch.ConvergenceWarning):
        even = svd(A, 10, tol=1e-3, passes=4, seed=0)
    assert even.s.size == 10
    with pytest.raises(ValueError, match="odd number of passes"):
        svd(A, 10, passes=4)
    # No warning where no larger basis would help (a review's find: "raise rank" where rank was
    # already min(m, n), or with the exact rank and an estimate at rounding above a tol the error met)
    rng = np.random.default_rng(0)
    B = rng.standard_normal((300, 5)) @ rng.standard_normal((5, 60))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        range_finder(rng.standard_normal((300, 40)), 40, tol=1e-14, seed=0)
        res = range_finder(B, 5, tol=1e-12, block_size=5, seed=0)
    assert np.linalg.norm(B - res.Q @ (res.Q.T @ B), 2) <= 1e-12


def test_block_krylov_beats_subspace_iteration_at_equal_passes_on_a_slow_decay():
    s = 1 / np.sqrt(np.arange(1, 201))
    A = matrix_with_spectrum(600, 200, s, seed=5)
    k = 10
    opt = np.sqrt(np.sum(s[k:] ** 2))
    err = {}
    for method in ("subspace", "block_krylov"):
        res = svd(A, k, passes=5, method=method, oversample=5, seed=0)
        err[method] = np.linalg.norm(A - (res.U * res.s) @ res.Vt) / opt - 1
    assert 0 <= err["block_krylov"] < err["subspace"]


# ---------------------------------------------------------------------------------- against peers
def test_svd_matches_scikit_learn_randomized_svd_with_its_sign_convention():
    A = matrix_with_spectrum(500, 80, np.exp(-np.arange(80) / 4), seed=6)
    # Both are approximations (to about 1e-7 in the vectors here): the same signs, the same numbers.
    U, s, Vt = randomized_svd(A, 5, random_state=0)
    res = svd(A, 5, passes=5, seed=0)
    np.testing.assert_allclose(res.s, s, rtol=1e-10)
    np.testing.assert_allclose(res.U, U, atol=1e-5)
    np.testing.assert_allclose(res.Vt, Vt, atol=1e-5)
    assert np.all(np.einsum("ij,ij->j", res.U, U) > 0.99)


def test_float32_stays_float32_and_sparse_is_not_densified():
    A = matrix_with_spectrum(300, 100, DECAY, seed=7).astype(np.float32)
    res = svd(A, 5, seed=0)
    assert res.U.dtype == res.s.dtype == res.Vt.dtype == np.float32
    np.testing.assert_allclose(res.s, np.linalg.svd(A.astype(np.float64), compute_uv=False)[:5], rtol=1e-4)
    # A sparse matrix with a decaying spectrum (columns scaled by 1 / (j + 1)).
    X = sp.random(5000, 2000, density=1e-3, format="csr", random_state=0) @ sp.diags(1 / np.arange(1, 2001))
    X = sp.csr_matrix(X)

    class NoDense(sp.csr_matrix):
        def toarray(self, *a, **k):  # pragma: no cover - the test fails if it is called
            raise AssertionError("densified")

        todense = toarray

    res = svd(NoDense(X), 5, seed=0)
    ref = scipy.sparse.linalg.svds(X, 5, random_state=0)[1][::-1]
    assert np.all(res.s <= ref * (1 + 1e-12)) and np.all(res.s >= (1 - 1e-3) * ref)


def test_eigh_of_an_indefinite_matrix_takes_the_largest_magnitudes():
    rng = np.random.default_rng(8)
    V = np.linalg.qr(rng.standard_normal((300, 30)))[0]
    w = np.concatenate([[10.0, -9.0, 8.0, -7.0], 0.5 ** np.arange(26)])
    A = (V * w) @ V.T
    res = eigh(A, 4, passes=3, seed=0)
    np.testing.assert_allclose(res.eigenvalues, [10.0, -9.0, 8.0, -7.0], rtol=1e-10)
    approx = (res.eigenvectors * res.eigenvalues) @ res.eigenvectors.T
    assert np.linalg.norm(A - approx, 2) <= res.error_estimate
    with pytest.raises(ValueError, match="must be symmetric"):
        eigh(A + np.triu(A, 1), 2)


# ------------------------------------------------------------------------------------------ Nyström
def test_nystrom_error_against_its_bound_and_exact_recovery():
    # Tropp, Yurtsever, Udell & Cevher (2017), Theorem 4.1 with a Gaussian test matrix of l columns:
    # E ||A - A_nys||_* <= (1 + k / (l - k - 1)) sum_{j > k} lambda_j, for 2 <= k < l - 1.
    rng = np.random.default_rng(9)
    V = np.linalg.qr(rng.standard_normal((300, 60)))[0]
    lam = 0.8 ** np.arange(60)
    A = (V * lam) @ V.T
    k, ell = 8, 16
    errs = []
    for seed in range(30):
        res = nystrom(A, ell, oversample=0, seed=seed)
        errs.append(np.sum(np.abs(np.linalg.eigvalsh(A - res.matvec(np.eye(300))))))
    assert np.mean(errs) <= 1.1 * (1 + k / (ell - k - 1)) * np.sum(lam[k:])
    G = rng.standard_normal((300, 5))
    exact = nystrom(G @ G.T, 5, oversample=3, seed=0)
    assert np.linalg.norm(G @ G.T - exact.matvec(np.eye(300))) <= 1e-10 * np.linalg.norm(G @ G.T)
    assert np.all(exact.eigenvalues >= 0)


@pytest.mark.parametrize("fmt", ["dense", "csr"])
def test_methods_for_symmetric_matrices_refuse_a_nonsymmetric_one(fmt, monkeypatch):
    from rsketch.linalg import _lowrank

    monkeypatch.setattr(_lowrank, "SYMMETRY_BLOCK_BYTES", 64)  # several blocks of rows
    A = np.triu(np.ones((6, 6)))
    A = sp.csr_matrix(A) if fmt == "csr" else A
    for call in (lambda: nystrom(A, 2), lambda: eigh(A, 2), lambda: rsketch.nystrom_pcg(A, np.ones(6), 1.0)):
        with pytest.raises(ValueError, match=r"A must be symmetric: \|\|A - A.T\|\|_F / \|\|A\|\|_F = 1.2"):
            call()
    # The blocked sums give the whole array's norms: sqrt(2) 0.1 / sqrt(6.01) = 0.0577 here.
    B = np.eye(6)
    B[0, 1] = 0.1
    with pytest.raises(ValueError, match="= 0.0577"):
        nystrom(B, 2)
    # A float32 Gram symmetric to its rounding passes.
    G = np.random.default_rng(0).standard_normal((60, 40)).astype(np.float32)
    G = G.T @ G
    G[3, 5] *= 1 + 1e-6
    assert eigh(G, 3, seed=0).eigenvalues.dtype == np.float32


def test_methods_for_symmetric_matrices_check_an_operator_through_its_projection():
    # A LinearOperator cannot be read: its projection V.T A V, formed anyway, must be symmetric to
    # rounding. An upper-triangular operator of ones (every eigenvalue 1) had given eigenvalues
    # [96.1, 0.5, 0.5] from eigh and [388, 112, 57] from nystrom, with no error.
    T = np.triu(np.ones((200, 200)))
    for call in (
        lambda: eigh(aslinearoperator(T), 3, seed=0),
        lambda: nystrom(aslinearoperator(T), 3, seed=0),
    ):
        with pytest.raises(ValueError, match=r"A must be symmetric: its projection V.T A V .* = 1\.[0-9]"):
            call()
    # Operators symmetric to their own accuracy only are taken as their symmetric part: a
    # shift-invert matvec by CG at rtol=1e-6 (1.5e-7 from symmetric) and a float64 operator that
    # computes in float32 (3.7e-7) were refused by a bound of sqrt(u) (a review's find).
    L = sp.diags([-1, 2.05, -1], [-1, 0, 1], shape=(400, 400), format="csr")
    inv = np.linalg.inv(L.toarray())
    solve = lambda v: scipy.sparse.linalg.cg(L, v, rtol=1e-6)[0]  # noqa: E731
    shift_invert = LinearOperator(
        (400, 400), matvec=solve, matmat=lambda V: np.column_stack([solve(c) for c in V.T]), dtype=float
    )
    # accepted, and taken as its symmetric part: the values of the same sketch of the exact inverse,
    # to the operator's own accuracy (a 1% closeness to the true eigenvalues, 19.98, 19.90, 19.78,
    # had let a result that missed the largest one pass)
    ref = eigh(inv, 3, passes=7, seed=0).eigenvalues
    np.testing.assert_allclose(eigh(shift_invert, 3, passes=7, seed=0).eigenvalues, ref, rtol=1e-4)
    X32 = np.random.default_rng(2).standard_normal((3000, 200)).astype(np.float32)
    in32 = lambda v: X32.T @ (X32 @ v.astype(np.float32))  # noqa: E731
    in_float32 = LinearOperator((200, 200), matvec=in32, dtype=float)
    assert nystrom(in_float32, 5, seed=0).eigenvalues.dtype == np.float64
    # A symmetric operator whose products round differently from A's (X.T (X v)) passes.
    X = np.random.default_rng(1).standard_normal((300, 120))
    op = LinearOperator((120, 120), matvec=lambda v: X.T @ (X @ v), dtype=np.float64)
    np.testing.assert_allclose(
        eigh(op, 3, seed=0).eigenvalues, eigh(X.T @ X, 3, seed=0).eigenvalues, rtol=1e-10
    )
    assert nystrom(op, 3, seed=0).eigenvalues.size == 13


def test_any_scale_gives_the_same_answer_or_a_clear_overflow_error():
    # Powers of two commute with rounding: the same results, scaled, from 2^-500 to 2^1000, to the
    # rounding of LAPACK's own scaling of far-out matrices (the error estimate's squares overflowed
    # from entries of 1e154 on, and it read inf).
    rng = np.random.default_rng(3)
    A = rng.standard_normal((60, 25))
    P = A.T @ A
    base, base_nys = svd(A, 4, seed=0), nystrom(P, 4, seed=0)
    for e in (-500, 600, 1000):
        res = svd(np.ldexp(A, e), 4, seed=0)
        np.testing.assert_allclose(np.ldexp(res.s, -e), base.s, rtol=1e-14)
        assert np.ldexp(res.error_estimate, -e) == pytest.approx(base.error_estimate, rel=1e-14)
        if e < 1000:  # P's entries reach 2^1000 times 70: beyond float64 at e = 1000
            nys = nystrom(np.ldexp(P, e), 4, seed=0)
            np.testing.assert_allclose(np.ldexp(nys.eigenvalues, -e), base_nys.eigenvalues, rtol=1e-14)
    # Entries near the top of the range: their sums overflow, an error that says to scale A (it was a
    # bare LinAlgError from the basis' condition number, or SciPy's "A has a NaN entry").
    huge = np.full((2, 2), 1e308)
    with np.errstate(over="ignore", invalid="ignore"):  # NumPy's warnings of the overflow, before ours
        for call in (lambda: svd(huge, 1), lambda: range_finder(huge, 1), lambda: eigh(huge, 1)):
            with pytest.raises(ValueError, match="products with A are not finite.*scale A"):
                call()
        with pytest.raises(
            ValueError, match="largest eigenvalue, about 1.11 \\* 2\\^1024, exceeds the float64 range"
        ):
            nystrom(huge, 1)


def test_nystrom_refuses_a_matrix_that_is_not_psd_with_the_eigenvalue():
    A = np.diag([3.0, 2.0, -1.0, 0.5])
    with pytest.raises(ValueError, match=r"not positive semi-definite.*eigenvalue -"):
        nystrom(A, 3, oversample=1, seed=0)
    # A float32 kernel in float64 is indefinite at float64's rounding, and a sketch sees that or not
    # by its seed (2 of 5 seeds accepted it): the message says so, names the precision and the way
    # out, the kernel in float32, which every seed accepts.
    X = np.random.default_rng(0).standard_normal((300, 3)).astype(np.float32)
    K = np.exp(-0.01 * ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1))  # float32
    with pytest.raises(
        ValueError, match=r"beyond float64 rounding .* another seed may miss .* pass it in it"
    ):
        nystrom(K.astype(np.float64), 20, seed=0)
    for seed in range(5):
        assert nystrom(K, 20, seed=seed).eigenvalues.dtype == np.float32
    with pytest.raises(ValueError, match=r"beyond float32 rounding"):
        rsketch.nystrom_pcg(
            np.diag(np.float32([3, 2, -1, 0.5])), np.ones(4, np.float32), 1e-3, rank=3, seed=0
        )


# --------------------------------------------------------------------------------------------- CQRRPT
def test_cqrrpt_is_a_stable_rank_revealing_qr_with_householders_r():
    rng = np.random.default_rng(10)
    A = rng.standard_normal((5000, 60)) * np.logspace(0, -10, 60)
    res = qr_pivoted(A, seed=0)
    assert res.rank == 60
    assert np.linalg.norm(A[:, res.perm] - res.Q @ res.R) <= 1e-15 * 10 * np.linalg.norm(A)
    assert np.linalg.norm(res.Q.T @ res.Q - np.eye(60), 2) <= 1e-14
    # R equals Householder QR's R of A[:, perm] up to the signs of its rows, to rounding: relative to
    # each row's size (the triangle's rows span 10 orders of magnitude), within a small multiple of
    # n u times the condition number of A[:, perm] with unit columns (the graded columns' scaling
    # does not count: both R's are column-scaling invariant). Measured: 6e-16 against 2e-13.
    AP = A[:, res.perm]
    R_h = scipy.linalg.qr(AP, mode="r")[0][:60]
    rows = np.linalg.norm(R_h, axis=1, keepdims=True)
    cond_unit_columns = np.linalg.cond(AP / np.linalg.norm(AP, axis=0))
    rounding = 10 * 60 * np.finfo(np.float64).eps * cond_unit_columns
    assert np.max(np.abs(np.abs(res.R) - np.abs(R_h)) / rows) <= rounding
    # Rank-revealing: the diagonal tracks the singular values within the sketch's distortion and
    # QRCP's own factor (Melnichenko et al., Theorem 2: within sqrt((1+eps)/(1-eps)) of QRCP's).
    sv = np.linalg.svd(A, compute_uv=False)
    ratio = np.abs(np.diag(res.R)) / sv
    assert 1 / 50 <= ratio.min() and ratio.max() <= 50


@pytest.mark.parametrize("max_cond", [0.0, np.inf])
def test_cqrrpt_is_as_accurate_through_the_inverses_as_through_the_solves(monkeypatch, max_cond):
    # Both triangular solves (R_sk's and R_pre's) go through the explicit inverse while the
    # row-equilibrated triangle is well conditioned, else through trsm; both branches, on a graded
    # and on a rotated spectrum, with sketches of n rows (a poor embedding: cond(R_pre) well above one)
    from rsketch.linalg import _cqrrpt

    monkeypatch.setattr(_cqrrpt, "INVERSE_MAX_COND", max_cond)
    rng = np.random.default_rng(11)
    U, _ = np.linalg.qr(rng.standard_normal((5000, 50)))
    V, _ = np.linalg.qr(rng.standard_normal((50, 50)))
    graded = rng.standard_normal((5000, 50)) * np.logspace(0, -8, 50)
    rotated = (U * np.logspace(0, -8, 50)) @ V.T
    for A in (graded, rotated):
        for size in (50, 100):
            res = qr_pivoted(A, sketch="countsketch", sketch_size=size, seed=0)
            assert res.rank == 50
            assert np.linalg.norm(A[:, res.perm] - res.Q @ res.R) <= 10 * 2.2e-16 * np.linalg.norm(A)
            assert np.linalg.norm(res.Q.T @ res.Q - np.eye(50), 2) <= 1e-12


def test_cqrrpt_takes_the_inverse_by_the_equilibrated_triangles_condition():
    from rsketch.linalg._cqrrpt import INVERSE_MAX_COND, _solve_right_upper

    rng = np.random.default_rng(12)
    A = rng.standard_normal((300, 40))
    R_graded = np.diag(np.logspace(0, -9, 40)) @ (np.eye(40) + np.triu(rng.uniform(-0.1, 0.1, (40, 40)), 1))
    V = np.linalg.qr(rng.standard_normal((40, 40)))[0]
    R_rotated = np.linalg.qr((rng.standard_normal((80, 40)) * np.logspace(0, -9, 40)) @ V.T)[1]
    trsm = scipy.linalg.blas.get_blas_funcs("trsm", (A,))
    for R, inverse in ((R_graded, True), (R_rotated, False)):
        R_hat = R / np.diag(R)[:, None]
        assert (np.linalg.cond(R_hat) <= INVERSE_MAX_COND) == inverse
        X = _solve_right_upper(R, np.array(A.T, order="F")).T
        X_trsm = trsm(1.0, R, np.array(A.T, order="F"), side=0, lower=0, trans_a=1).T
        if inverse:  # rounding of the order of u cond(R_hat), not u cond(R) (1e9 here)
            assert np.linalg.norm(X @ R - A) <= 50 * 2.2e-16 * np.linalg.norm(A)
        else:
            assert np.array_equal(X, X_trsm)


def test_cqrrpt_keeps_float32_to_its_rounding():
    rng = np.random.default_rng(13)
    A = (rng.standard_normal((4000, 30)) * np.logspace(0, -3, 30)).astype(np.float32)
    res = qr_pivoted(A, seed=0)
    assert res.Q.dtype == res.R.dtype == np.float32 and res.rank == 30
    u = np.finfo(np.float32).eps
    assert np.linalg.norm(A[:, res.perm] - res.Q @ res.R) <= 10 * u * np.linalg.norm(A)
    assert np.linalg.norm(res.Q.T @ res.Q - np.eye(30), 2) <= 100 * u


def test_cqrrpt_detects_the_numerical_rank_and_pivots_like_qrcp():
    rng = np.random.default_rng(11)
    A = rng.standard_normal((3000, 7)) @ rng.standard_normal((7, 40))
    res = qr_pivoted(A, seed=0)
    assert res.rank == 7
    assert np.linalg.norm(A[:, res.perm] - res.Q @ res.R) <= 1e-13 * np.linalg.norm(A)
    _, _, P = scipy.linalg.qr(A, mode="economic", pivoting=True)
    # The skeletons both span range(A): the 7 pivots of either are independent columns.
    for cols in (res.perm[:7], P[:7]):
        assert np.linalg.matrix_rank(A[:, cols]) == 7


def _is_householder(monkeypatch):
    """Count the calls of qr_pivoted's LAPACK path (geqp3 of A itself)."""
    from rsketch.linalg import _cqrrpt

    calls = []
    real = _cqrrpt._householder
    monkeypatch.setattr(_cqrrpt, "_householder", lambda *a: calls.append(1) or real(*a))
    return calls


@pytest.mark.parametrize("sketch", ["sparse_sign", "gaussian", "countsketch", "srht", "uniform"])
def test_cqrrpt_factors_square_and_nearly_square_matrices_exactly(monkeypatch, sketch):
    # With m < 2n the default sketch has m rows: no smaller than A, and a square sparse sign of +-1
    # entries can be singular (it made [[1, 2], [3, 4]] rank 1, with A P != Q R). Such an A is
    # factored by geqp3 itself.
    calls = _is_householder(monkeypatch)
    A = np.array([[1.0, 2.0], [3.0, 4.0]])
    res = qr_pivoted(A, sketch=sketch, seed=0)
    assert res.rank == 2 and np.abs(A[:, res.perm] - res.Q @ res.R).max() <= 1e-15 * 8
    for m, n in ((40, 40), (40, 39), (300, 300), (41, 30)):
        for seed in range(3):
            A = np.random.default_rng(seed).standard_normal((m, n))
            res = qr_pivoted(A, sketch=sketch, seed=seed)
            assert res.rank == n
            assert np.linalg.norm(A[:, res.perm] - res.Q @ res.R) <= 1e-14 * np.linalg.norm(A)
            assert np.linalg.norm(res.Q.T @ res.Q - np.eye(n), 2) <= 1e-13
    assert len(calls) == 13
    assert interpolative(np.array([[1.0, 2.0], [3.0, 4.0]]), 2, seed=0).rank == 2


def test_cqrrpt_of_subnormal_or_huge_entries_is_right_or_refused():
    # A subnormal triangle made the inverse's condition number a bare LinAlgError, and a sketch that
    # overflowed gave a wrong rank: geqp3 of A (LAPACK scales safely), or an error where R cannot be
    # represented.
    A = np.random.default_rng(0).standard_normal((600, 20))
    for scale, err in ((1e-310, 1e-12), (1e300, 1e-15)):
        res = qr_pivoted(A * scale, seed=0)
        assert res.rank == 20 and np.isfinite(res.R).all()
        assert np.abs((A * scale)[:, res.perm] - res.Q @ res.R).max() <= err * scale * np.abs(A).max()
    with np.errstate(over="ignore"), pytest.raises(ValueError, match="column norms exceed the float64 range"):
        qr_pivoted(A * 1e307, seed=0)


def test_cqrrpt_checks_a_lower_rank_than_n_and_falls_back_where_the_sketch_missed_a_direction(monkeypatch):
    calls = _is_householder(monkeypatch)
    # A good sketch of an exactly rank-7 A: the check passes, and the result is CQRRPT's.
    rng = np.random.default_rng(11)
    A = rng.standard_normal((3000, 7)) @ rng.standard_normal((7, 40))
    assert qr_pivoted(A, seed=0).rank == 7 and not calls
    # A sampling sketch of a coherent A: 5 rows hold most of it, 3 columns live in the other rows at
    # 1e-3 of the size. Uniform sampling of 16 of 400 rows misses them (rank 5 on the sketch); the
    # check finds those columns outside range(Q), and geqp3 of A gives the rank 8.
    C = np.zeros((400, 8))
    C[:5] = rng.standard_normal((5, 8))
    C[5:, :3] = 1e-3 * rng.standard_normal((395, 3))
    res = qr_pivoted(C, sketch="uniform", sketch_size=16, seed=0)
    assert len(calls) == 1 and res.rank == 8
    assert np.linalg.norm(C[:, res.perm] - res.Q @ res.R) <= 1e-14 * np.linalg.norm(C)
    # A zero sketch of a nonzero A (every sampled row zero) is not rank 0.
    Z = np.zeros((400, 3))
    Z[7] = [1.0, 2.0, 3.0]
    assert qr_pivoted(Z, sketch="uniform", sketch_size=6, seed=1).rank == 1 and len(calls) == 2
    assert qr_pivoted(np.zeros((400, 3)), seed=0).rank == 0 and len(calls) == 2


def test_interpolative_against_scipy_interpolative():
    rng = np.random.default_rng(12)
    A = rng.standard_normal((2000, 50)) * 0.5 ** np.arange(50)
    k = 20
    ours = interpolative(A, k, seed=0)
    err = np.linalg.norm(A - ours.skeleton(A) @ ours.interpolation_matrix(), 2)
    idx, proj = sli.interp_decomp(A, k, rand=False)
    B = A[:, idx[:k]]
    P = np.hstack([np.eye(k), proj])[:, np.argsort(idx)]
    err_scipy = np.linalg.norm(A - B @ P, 2)
    assert err <= 3 * err_scipy
    assert err >= 0.5**k * 0.5  # at least s_{k+1}, within rounding: the test can fail
    # SciPy's tools take our (idx, proj): its id_to_svd refused LAPACK's int32 pivots
    assert ours.idx.dtype == idx.dtype == np.int64
    U, s, V = sli.id_to_svd(ours.skeleton(A), ours.idx, ours.proj)
    assert np.linalg.norm(A - (U * s) @ V.conj().T, 2) == pytest.approx(err, rel=1e-6)


# ------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "call, match",
    [
        (lambda A: svd(A, 0), "rank must be >= 1"),
        (lambda A: svd(A, 31), "rank must be <= 30"),
        (lambda A: svd(A, 3, method="lanczos"), "method must be one of"),
        (lambda A: svd(A, 3, passes=0), "passes must be >= 1"),
        (lambda A: svd(A, 3, passes=2, method="block_krylov"), "odd number of passes"),
        (lambda A: svd(A, 3, sketch="leverage"), "sketch must be one of"),
        (lambda A: range_finder(A, 3, tol=-1.0), "tol must be a finite number > 0"),
        (lambda A: range_finder(A, 3, tol=np.inf), "tol must be a finite number > 0, got inf"),
        (lambda A: svd(A, 3, tol=np.inf), "tol must be a finite number > 0, got inf"),
        (
            lambda A: rsketch.nystrom_pcg(A.T @ A, np.ones(30), 1.0, target_ratio="10"),
            "target_ratio must be a real",
        ),
        (
            lambda A: rsketch.nystrom_pcg(A.T @ A, np.ones(30), 1.0, target_ratio=-1.0),
            "target_ratio must be a finite",
        ),
        (lambda A: rsketch.nystrom_pcg(A.T @ A, np.ones(30), 1.0, sketch="bogus"), "sketch must be one of"),
        (lambda A: rsketch.nystrom_pcg(A.T @ A, np.ones(30), 1.0, callback=3), "callback must be callable"),
        (lambda A: rsketch.nystrom_pcg(A.T @ A, np.ones(30), 1.0, oversample=-5), "oversample must be >= 0"),
        (lambda A: rsketch.nystrom_pcg(A.T @ A, np.ones((30, 0)), 1.0), r"b is empty \(shape \(30, 0\)\)"),
        (
            lambda A: rsketch.nystrom_pcg(
                A.T @ A, np.ones(30), 1.0, sketch=rsketch.make_sketch("gaussian", 30, 5)
            ),
            "sketch must be a kind name for the adaptive rank",
        ),
        (lambda A: qr_pivoted(A.T), "must be tall"),
        (lambda A: interpolative(A.T, 3), r"tall \(m >= n\) for interpolative.*scipy.linalg.interpolative"),
        (lambda A: interpolative(aslinearoperator(A), 3), "dense array for interpolative.*LinearOperator"),
        (lambda A: qr_pivoted(sp.csr_matrix(A)), "dense array for CQRRPT.*csr_matrix.*use svd"),
        (lambda A: qr_pivoted(A, sketch="foo"), "sketch must be one of"),
        (lambda A: qr_pivoted(A, sketch="leverage"), "sketch must be one of"),
        (lambda A: interpolative(A, 0), "rank must be >= 1"),
        (lambda A: nystrom(A, 3), "must be square"),
        (lambda A: svd(np.where(A > 2, np.nan, A), 3), "NaN or infinite"),
        (lambda A: qr_pivoted(np.where(A > 2, np.inf, A)), "NaN or infinite"),
        (lambda A: svd(A.astype(complex), 3), "real"),
        (lambda A: svd(np.zeros((0, 3)), 1), "empty"),
    ],
)
def test_bad_input_gets_a_clear_error(call, match):
    A = np.random.default_rng(0).standard_normal((100, 30))
    with pytest.raises((ValueError, TypeError), match=match):
        call(A)


def test_a_basis_beyond_the_memory_is_a_memory_error_before_any_allocation():
    from scipy.sparse.linalg import LinearOperator

    n = 10**9
    op = LinearOperator((n, n), matvec=lambda v: v, matmat=lambda V: V, dtype=np.float64)
    for call in (
        lambda: range_finder(op, 10_000),
        lambda: svd(op, 10_000),
        lambda: range_finder(op, 100, tol=1.0),
    ):
        with pytest.raises(MemoryError, match="the range finder's basis of 1,000,000,000 x"):
            call()


def test_low_rank_names_are_public():
    for name in ("range_finder", "svd", "eigh", "nystrom", "qr_pivoted", "interpolative"):
        assert getattr(rsketch, name) is getattr(rsketch.linalg, name)


@pytest.mark.parametrize("shape", [(400, 150), (3, 3), (40, 12)])
def test_block_krylov_past_the_rank_of_a_stays_exact(shape):
    # The Krylov space outgrows rank(A) (or min(m, n)): its later blocks are rounding noise that must
    # not come back as spurious directions (a wrong U and repeated singular values).
    rng = np.random.default_rng(13)
    m, n = shape
    r = min(3, m, n)
    A = rng.standard_normal((m, r)) @ rng.standard_normal((r, n))
    s = np.linalg.svd(A, compute_uv=False)[:r]
    for X in (A, sp.csr_matrix(A)):
        res = svd(X, r, seed=0)  # block Krylov, 5 passes
        np.testing.assert_allclose(res.s, s, rtol=1e-10)
        assert np.allclose(res.U.T @ res.U, np.eye(r), atol=1e-12)
        assert np.linalg.norm(A - (res.U * res.s) @ res.Vt) <= 1e-10 * np.linalg.norm(A)


@pytest.mark.parametrize("sketch", ["sparse_sign", "countsketch", "gaussian", "srht", "uniform"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_qr_pivoted_finds_one_bad_entry_without_a_separate_pass(sketch, bad):
    # qr_pivoted checks A through the sketch and the Gram; one entry in a column that is not a
    # pivot, and a sampling sketch that may not read its row, must still be refused
    A = np.random.default_rng(1).standard_normal((3000, 10)) * np.logspace(0, -3, 10)
    A[1234, 9] = bad
    op = rsketch.make_sketch(sketch, 3000, 40, seed=0)
    with pytest.raises(ValueError, match="A contains NaN or infinite"):
        qr_pivoted(A, sketch=op if sketch == "uniform" else sketch, sketch_size=40, seed=0)


def test_flip_signs_is_scikit_learns_svd_flip_bit_for_bit():
    from sklearn.utils.extmath import svd_flip

    from rsketch.linalg._lowrank import _flip_signs

    rng = np.random.default_rng(7)
    U, Vt = rng.standard_normal((500, 6)), rng.standard_normal((6, 9))
    U[:, 2] = 0.0  # a zero column: sign 0, as svd_flip gives it
    U[[3, 10], 4] = [-5.0, 5.0]  # a tie of +a and -a: the first in row order decides
    U[[3, 10], 5] = [5.0, -5.0]
    for dtype in (np.float64, np.float32):
        ours = _flip_signs(U.astype(dtype), Vt.astype(dtype))
        theirs = svd_flip(U.astype(dtype), Vt.astype(dtype))
        for a, b in zip(ours, theirs, strict=True):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("fmt", ["csr", "csc"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_threaded_sparse_products_match_scipy(fmt, dtype):
    from rsketch.linalg._lowrank import _matmat, _rmatmat

    rng = np.random.default_rng(3)
    A = sp.random(20_000, 700, density=0.02, format=fmt, random_state=rng, dtype=dtype)
    A = A.tolil()
    A[5, :] = 0  # an empty row
    A = A.asformat(fmt)
    A.indices[A.indptr[1] : A.indptr[2]] = A.indices[A.indptr[1] : A.indptr[2]][::-1]  # unsorted
    Y, Q = rng.standard_normal((700, 9)).astype(dtype), rng.standard_normal((20_000, 9)).astype(dtype)
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    for got, want in ((_matmat(A, Y), A @ Y), (_rmatmat(A, Q), A.T @ Q)):
        assert got.dtype == dtype
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max())
    out = np.empty((20_000, 9), dtype=dtype, order="F")  # written in place, as block Krylov does
    assert _matmat(A, Y, out=out) is out
    np.testing.assert_allclose(out, A @ Y, rtol=rtol, atol=rtol * np.abs(out).max())


@pytest.mark.parametrize("passes, method", [(1, "subspace"), (4, "subspace"), (5, "block_krylov")])
def test_the_estimates_probes_ride_in_the_first_product(passes, method):
    # svd and range_finder multiply the estimate's probes by A in the range finder's first product;
    # the estimate equals HMT's formula with A @ W computed on its own, and costs no pass
    from rsketch._validation import seed_sequence

    rng = np.random.default_rng(12)
    A = rng.standard_normal((3000, 80)) * np.exp(-np.arange(80) / 8)
    res = svd(A, 6, passes=passes, method=method, seed=5)
    assert res.passes == passes + 1
    W = np.random.default_rng(seed_sequence(5).spawn(3)[2]).standard_normal((80, 10))
    R = A @ W - res.U @ (res.s[:, None] * (res.Vt @ W))
    expected = 10 * np.sqrt(2 / np.pi) * np.linalg.norm(R, axis=0).max()
    assert res.error_estimate == pytest.approx(expected, rel=1e-12)
    found = range_finder(A, 6, passes=passes, method=method, seed=5)
    assert found.passes == passes
    W = np.random.default_rng(seed_sequence(5).spawn(2)[1]).standard_normal((80, 10))
    R = A @ W - found.Q @ (found.Q.T @ (A @ W))
    expected = 10 * np.sqrt(2 / np.pi) * np.linalg.norm(R, axis=0).max()
    assert found.error_estimate == pytest.approx(expected, rel=1e-10)


@pytest.mark.parametrize("fmt", ["dense", "csr", "csc"])
def test_block_krylov_past_a_low_rank_into_a_capped_space_stays_orthonormal(fmt):
    # rank 5, 18 + 2 columns wanted from blocks of 3 capped at 18 (min(m, n) = 20): the space is spent
    # from the third block on and never reaches 20 columns, so its noise blocks went into U unorthogonalised
    # (||U.T U - I|| = 6.6, the singular values 62.6, 56.3, ... for 38.8, 36.4, ...)
    rng = np.random.default_rng(0)
    A = rng.standard_normal((60, 5)) @ np.random.default_rng(0).standard_normal((5, 20))
    X = A if fmt == "dense" else getattr(sp, f"{fmt}_matrix")(A)
    res = svd(X, 18, oversample=2, block_size=3, passes=13, seed=0)
    np.testing.assert_allclose(res.U.T @ res.U, np.eye(18), atol=1e-13)
    true = np.linalg.svd(A, compute_uv=False)
    np.testing.assert_allclose(res.s[:5], true[:5], rtol=1e-13)
    assert np.linalg.norm(A - (res.U * res.s) @ res.Vt, 2) <= 1e-13 * true[0]


@pytest.mark.parametrize("sketch", ["sparse_sign", "countsketch", "uniform"])
@pytest.mark.parametrize("shape", [(100, 3), (3, 100)])
def test_a_test_block_as_wide_as_a_gives_its_range_exactly(sketch, shape):
    # rank + oversample >= the sketched side: a square sparse sign (CountSketch, sampling) test matrix is
    # often singular, and one pass lost a singular value (10.5, 9.9, 0.46 for 10.9, 10.2, 9.4) in 6 of
    # 10 seeds; the identity there gives A's range whatever the seed
    A = np.random.default_rng(0).standard_normal(shape)
    true = np.linalg.svd(A, compute_uv=False)
    for seed in range(10):
        for passes, method in [(1, "block_krylov"), (2, "subspace"), (3, "subspace")]:
            res = svd(A, 3, passes=passes, sketch=sketch, method=method, seed=seed)
            np.testing.assert_allclose(res.s, true, rtol=1e-12)
            Q = range_finder(A, 3, passes=passes, sketch=sketch, method=method, seed=seed).Q
            np.testing.assert_allclose(Q @ (Q.T @ A), A, atol=1e-12)


def test_the_adaptive_range_finder_draws_again_after_a_degenerate_block():
    # blocks of one +-1 column: one can depend on those before, adding no direction while the probes
    # still see range outside Q; 30 of 100 seeds had stopped at 9 of 10 columns (error 13.9, estimate
    # 220, no warning)
    A = np.random.default_rng(4).standard_normal((200, 10))
    for seed in range(100):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a shortfall must at least warn; here none is left
            res = range_finder(A, 10, tol=1e-6, block_size=1, passes=1, seed=seed)
        assert np.linalg.norm(A - res.Q @ (res.Q.T @ A)) <= 1e-6
