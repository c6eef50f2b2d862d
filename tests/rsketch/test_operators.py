"""Sketch operators: products against the dense matrix, adjoints, block independence,
reproducibility, unbiasedness, subspace embedding, bad input."""

import math

import numpy as np
import pytest
import scipy.linalg
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import rsketch
from rsketch.kernels import cpu

KINDS = ["gaussian", "srht", "srht_dct", "countsketch", "sparse_sign", "leverage", "uniform", "uniform_norep"]


def build(kind, n, r, seed=0, dtype=np.float64):
    if kind == "srht_dct":
        return rsketch.SRDCT(n, r, seed=seed, dtype=dtype)
    if kind == "uniform_norep":
        return rsketch.UniformSampling(n, r, seed=seed, dtype=dtype, replace=False)
    if kind == "leverage":
        scores = np.random.default_rng(1).random(n) ** 3
        return rsketch.LeverageSampling(n, r, scores=scores, seed=seed, dtype=dtype)
    return rsketch.make_sketch(kind, n, r, seed=seed, dtype=dtype)


def rel_err(a, b):
    return np.abs(a - b).max() / max(1.0, np.abs(b).max())


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_matmul_equals_dense_product(kind, dtype):
    n, r = 300, 37
    S = build(kind, n, r, seed=3)
    D = S.to_dense().astype(np.float64)
    assert S.shape == (r, n) and D.shape == (r, n)
    rng = np.random.default_rng(0)
    A = rng.standard_normal((n, 6)).astype(dtype)
    tol = 50 * np.finfo(dtype).eps * math.log2(n)
    for X in (A, np.asfortranarray(A), A[:, 2]):
        out = S @ X
        assert out.dtype == dtype and out.shape == (r,) + X.shape[1:]
        assert rel_err(out, D @ X.astype(np.float64)) < tol
    for fmt in ("csr", "csc", "coo"):
        As = sp.random(n, 6, density=0.2, format=fmt, random_state=2, dtype=dtype)
        out = S @ As
        assert isinstance(out, np.ndarray) and out.dtype == dtype
        assert rel_err(out, D @ As.toarray().astype(np.float64)) < tol


@pytest.mark.parametrize("kind", KINDS)
def test_fast_path_equals_portable_reference(kind):
    n, r = 257, 19
    S = build(kind, n, r, seed=11)
    np.testing.assert_array_equal(S.to_dense(), S.reference_columns(0, n))
    A = np.random.default_rng(5).standard_normal((n, 4))
    assert rel_err(S @ A, S.reference_apply(A)) < 1e-12
    Z = np.random.default_rng(6).standard_normal((r, 3))
    assert rel_err(S.T @ Z, S.reference_adjoint(Z)) < 1e-12


@pytest.mark.parametrize("kind", KINDS)
def test_adjoint(kind):
    n, r = 200, 16
    S = build(kind, n, r, seed=4)
    rng = np.random.default_rng(1)
    x, z = rng.standard_normal(n), rng.standard_normal(r)
    assert math.isclose((S @ x) @ z, x @ (S.T @ z), rel_tol=1e-10, abs_tol=1e-10)
    Z = rng.standard_normal((r, 5))
    assert rel_err(S.T @ Z, S.to_dense().T @ Z) < 1e-12
    assert S.T.shape == (n, r) and S.T.T is S
    L = S.as_linear_operator()
    assert rel_err(L.matvec(x), S @ x) == 0 and rel_err(L.rmatvec(z), S.T @ z) == 0
    X = rng.standard_normal((n, 2))
    assert rel_err(L.matmat(X), S @ X) == 0 and rel_err(L.rmatmat(Z), S.T @ Z) == 0


@pytest.mark.parametrize("kind", KINDS)
def test_block_independence(kind):
    n, r = 500, 24
    S = build(kind, n, r, seed=8)
    D = S.to_dense()
    # Any column block alone equals the same block of the whole, bitwise.
    for a, b in [(0, 1), (17, 113), (250, 500), (499, 500)]:
        np.testing.assert_array_equal(S[:, a:b], D[:, a:b])
        np.testing.assert_array_equal(build(kind, n, r, seed=8).columns(a, b), D[:, a:b])
    # S @ A equals the sum over row blocks of A of S[:, block] @ A[block].
    A = np.random.default_rng(2).standard_normal((n, 3))
    edges = [0, 77, 78, 300, 500]
    total = sum(S[:, a:b] @ A[a:b] for a, b in zip(edges[:-1], edges[1:], strict=True))
    assert rel_err(S @ A, total) < 1e-12


@pytest.mark.parametrize("kind", KINDS)
def test_reproducible_and_seed_sensitive(kind):
    n, r = 400, 20
    A = np.random.default_rng(0).standard_normal((n, 3))
    same = [build(kind, n, r, seed=s) @ A for s in (5, 5, np.random.SeedSequence(5))]
    np.testing.assert_array_equal(same[0], same[1])
    np.testing.assert_array_equal(same[0], same[2])
    assert not np.array_equal(same[0], build(kind, n, r, seed=6) @ A)
    g = build(kind, n, r, seed=np.random.default_rng(9)).to_dense()
    np.testing.assert_array_equal(g, build(kind, n, r, seed=np.random.default_rng(9)).to_dense())


def test_sparse_sign_structure():
    S = rsketch.SparseSign(1000, 64, seed=1, nnz_per_column=5)
    D = S.to_dense()
    nz = D != 0
    assert (nz.sum(axis=0) == 5).all()
    assert np.allclose(np.abs(D[nz]), 1 / math.sqrt(5))
    rows, signs = S.pattern()
    blocks = (rows * 5) // 64  # nonzero t of each column lies in row block t
    # Block t spans rows floor(t r/s) .. floor((t+1) r/s) - 1.
    lo = (np.arange(5) * 64) // 5
    hi = ((np.arange(5) + 1) * 64) // 5
    assert ((rows >= lo) & (rows < hi)).all()
    assert blocks.shape == (1000, 5)
    C = rsketch.CountSketch(1000, 64, seed=1).to_dense()
    assert ((C != 0).sum(axis=0) == 1).all() and np.isin(C[C != 0], [-1.0, 1.0]).all()


def test_fwht_against_scipy_hadamard():
    rng = np.random.default_rng(0)
    for m in (1, 2, 4, 8, 64, 1024, 8192, 16384):
        H = scipy.linalg.hadamard(m) if m <= 1024 else None
        x = rng.standard_normal(m)
        y = x.copy()
        cpu.fwht_vector(y)
        if H is not None:
            np.testing.assert_allclose(y, H @ x, rtol=1e-12, atol=1e-12 * m)
        # Orthogonality: H H = m I.
        cpu.fwht_vector(y)
        np.testing.assert_allclose(y, m * x, rtol=1e-12, atol=1e-10)
    X = rng.standard_normal((3, 256))
    Y = X.copy()
    cpu.fwht_columns(Y)
    np.testing.assert_allclose(Y, X @ scipy.linalg.hadamard(256).T, atol=1e-10)


def test_srht_full_size_is_orthogonal():
    for cls in (rsketch.SRHT, rsketch.SRDCT):
        S = cls(64, 64, seed=2).to_dense()
        np.testing.assert_allclose(S.T @ S, np.eye(64), atol=1e-12)
    S = rsketch.UniformSampling(50, 50, seed=1, replace=False).to_dense()
    np.testing.assert_array_equal(S.T @ S, np.eye(50))
    assert rsketch.SRHT(1000, 10, seed=0).padded_size == 1024


@pytest.mark.parametrize("kind", KINDS)
def test_unbiased_gram(kind):
    # E[S^T S] = I: the Monte Carlo mean over many seeds is within 5 standard errors, entry by
    # entry (standard errors from the sample variance), and the total squared z-score is
    # consistent with its chi-square distribution.
    n, r, draws = 8, 4, 800
    total = np.zeros((n, n))
    total_sq = np.zeros((n, n))
    ss = np.random.SeedSequence(2024).spawn(draws)
    for s in ss:
        D = build(kind, n, r, seed=s).to_dense()
        G = D.T @ D
        total += G
        total_sq += G * G
    mean = total / draws
    var = np.maximum(total_sq / draws - mean**2, 0)
    se = np.sqrt(var / draws)
    dev = np.abs(mean - np.eye(n))
    exact = se < 1e-12  # entries that are constant across draws must be exact
    assert (dev[exact] < 1e-12).all()
    assert (dev[~exact] < 5 * se[~exact]).all()


def _embedding_singular_values(kind, U, r, seed):
    S = build(kind, U.shape[0], r, seed=seed)
    return np.linalg.svd(S @ U, compute_uv=False)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gaussian", "srht", "sparse_sign"])
def test_subspace_embedding(kind):
    n, p, r = 4096, 20, 400
    U = np.linalg.qr(np.random.default_rng(7).standard_normal((n, p)))[0]
    eps = 2 * math.sqrt(p / r)
    ok = 0
    for seed in range(50):
        s = _embedding_singular_values(kind, U, r, seed)
        ok += bool((s.min() >= 1 - eps) and (s.max() <= 1 + eps))
    assert ok >= 48


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["countsketch", "uniform"])
def test_embedding_second_moment(kind):
    # CountSketch and uniform sampling: the exact second moment of the Gram error
    # E||U^T S^T S U - I||_F^2, derived in docs/operators.md,
    #   CountSketch:           (p^2 + p - 2 sum_j ||u_j||^4) / r
    #   uniform (replacement): (n sum_j ||u_j||^4 - p) / r
    # The mean over 50 seeds must lie within 4 standard errors of it.
    n, p, r = 4096, 20, 400
    U = np.linalg.qr(np.random.default_rng(7).standard_normal((n, p)))[0]
    lev4 = np.sum(np.sum(U * U, axis=1) ** 2)
    expected = (p * p + p - 2 * lev4) / r if kind == "countsketch" else (n * lev4 - p) / r
    vals = []
    for seed in range(50):
        SU = build(kind, n, r, seed=seed) @ U
        vals.append(np.linalg.norm(SU.T @ SU - np.eye(p), "fro") ** 2)
    vals = np.array(vals)
    se = vals.std(ddof=1) / math.sqrt(len(vals))
    assert abs(vals.mean() - expected) < 4 * se
    # Frobenius error bounds the spectral one: every singular value squared of SU lies in
    # 1 +- ||.||_F; check that consequence on the draws themselves.
    for seed in range(5):
        s2 = _embedding_singular_values(kind, U, r, seed) ** 2
        SU = build(kind, n, r, seed=seed) @ U
        f = np.linalg.norm(SU.T @ SU - np.eye(p), "fro")
        assert (np.abs(s2 - 1) <= f + 1e-12).all()


@pytest.mark.slow
def test_leverage_sampling_keeps_coherent_embedding_uniform_does_not():
    # A coherent matrix: p rows carry leverage ~1 each, the rest almost none.
    n, p, r = 4096, 20, 400
    rng = np.random.default_rng(3)
    A = 1e-3 * rng.standard_normal((n, p))
    A[rng.choice(n, p, replace=False)] += 10 * np.eye(p)
    U = np.linalg.qr(A)[0]
    lev = np.sum(U * U, axis=1)
    # Matrix Chernoff (Tropp 2012) for r i.i.d. rank-one terms of norm <= p / ((1 - alpha) r):
    # P(lambda_min(U^T S^T S U) <= 1 - eps) <= p exp(-eps^2 (1 - alpha) r / (2 p)).
    # With delta = 0.01 this gives eps below; we test lambda_min >= 1 - eps in >= 48 of 50 seeds.
    alpha = 0.1
    eps = math.sqrt(2 * p * math.log(p / 0.01) / ((1 - alpha) * r))
    assert eps < 1
    lev_ok = uni_ok = 0
    for seed in range(50):
        S = rsketch.LeverageSampling(n, r, scores=lev, seed=seed, uniform_mix=alpha)
        lev_ok += np.linalg.svd(S @ U, compute_uv=False).min() ** 2 >= 1 - eps
        s_uni = np.linalg.svd(rsketch.UniformSampling(n, r, seed=seed) @ U, compute_uv=False)
        uni_ok += s_uni.min() ** 2 >= 1 - eps
    assert lev_ok >= 48
    assert uni_ok <= 5  # uniform sampling misses heavy rows: the embedding visibly fails


def test_leverage_from_matrix():
    rng = np.random.default_rng(0)
    A = rng.standard_normal((3000, 8)) * np.exp(rng.standard_normal((3000, 1)))
    exact = rsketch.LeverageSampling.from_matrix(A, 100, seed=0)
    U = np.linalg.qr(A)[0]
    np.testing.assert_allclose(exact.scores, np.sum(U * U, axis=1), atol=1e-12)
    approx = rsketch.LeverageSampling.from_matrix(A, 100, method="approx", seed=0)
    ratio = approx.scores / exact.scores
    # DMMW 2012: within a constant factor w.h.p.; with r2 = 32 JL columns, the chi-square(32)/32
    # ratio lies in [0.3, 2.2] except with probability ~1e-5 per row (and R's distortion adds
    # a few percent); over 3000 rows allow [0.2, 3].
    assert 0.2 < ratio.min() and ratio.max() < 3
    assert np.isclose(approx.scores.sum(), 8, rtol=0.25)
    assert (exact.probabilities >= 0.1 / 3000 - 1e-18).all()
    np.testing.assert_allclose(exact.probabilities.sum(), 1)
    # Rank-deficient A: scores of the rank-r range.
    B = np.hstack([A, A[:, :2]])
    np.testing.assert_allclose(
        rsketch.LeverageSampling.from_matrix(B, 50, seed=1).scores.sum(), 8, rtol=1e-10
    )
    S = rsketch.make_sketch("leverage", 3000, 100, seed=0, A=A)
    np.testing.assert_array_equal(S.to_dense(), exact.to_dense())


def test_leverage_scores_whose_sum_overflows():
    # Finite scores near the float64 maximum: their sum overflows, yet only proportions matter.
    S = rsketch.make_sketch("leverage", 4, 100000, scores=[1e308] * 4, seed=0)
    np.testing.assert_allclose(S.probabilities, 0.25, rtol=1e-15)
    D = S.to_dense()
    np.testing.assert_allclose(np.diag(D.T @ D), 1, rtol=0.05)
    S = rsketch.make_sketch("leverage", 4, 5, scores=[1e308, 1e308, 0, 0], uniform_mix=0.0, seed=0)
    np.testing.assert_allclose(S @ np.ones(4), math.sqrt(2 / 5), rtol=1e-15)
    # Scores of ordinary size keep their probabilities bitwise (no rescaling).
    scores = np.random.default_rng(1).random(50) ** 3
    mix = 0.1
    expect = (1 - mix) * scores / scores.sum() + mix / 50
    np.testing.assert_array_equal(rsketch.LeverageSampling(50, 5, scores=scores).probabilities, expect)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 300),
    k=st.integers(1, 5),
    kind=st.sampled_from(KINDS),
    dtype=st.sampled_from([np.float32, np.float64, np.int64, np.int32]),
    order=st.sampled_from("CF"),
    frac=st.floats(0.01, 1.0),
    seed=st.integers(0, 2**32),
)
def test_fuzz_shapes_and_dtypes(n, k, kind, dtype, order, frac, seed):
    r = max(1, int(frac * n))
    S = build(kind, n, r, seed=seed)
    A = (np.random.default_rng(seed).standard_normal((n, k)) * 10).astype(dtype, order=order)
    out = S @ A
    expect_dtype = np.float32 if dtype == np.float32 else np.float64
    assert out.dtype == expect_dtype and out.shape == (r, k)
    tol = 100 * np.finfo(expect_dtype).eps * max(1, math.log2(n))
    ref = S.to_dense() @ A.astype(np.float64)
    assert np.abs(out - ref).max() <= tol * max(1.0, np.abs(A).max() * math.sqrt(n) * 10)


class TestBadInput:
    def test_matmul_errors(self):
        S = rsketch.GaussianSketch(10, 3, seed=0)
        with pytest.raises(ValueError, match="10 rows"):
            S @ np.ones((9, 2))
        with pytest.raises(ValueError, match="1-D or 2-D"):
            S @ np.ones((10, 2, 2))
        with pytest.raises(ValueError, match="empty"):
            S @ np.ones((10, 0))
        with pytest.raises(TypeError, match="complex"):
            S @ np.ones(10, dtype=complex)
        with pytest.raises(TypeError, match="numeric"):
            S @ np.array(["a"] * 10)
        with pytest.raises(TypeError, match="numeric"):
            S @ np.array([object()] * 10)
        with pytest.raises(ValueError, match="NaN or infinite"):
            S @ np.full(10, np.inf)
        with pytest.raises(ValueError, match="NaN or infinite"):
            S @ sp.csr_matrix(np.array([[np.nan]] + [[1.0]] * 9))
        with pytest.raises(ValueError, match="3 rows"):
            S.T @ np.ones(4)

    @pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
    @pytest.mark.parametrize("kind", KINDS)
    def test_ndarray_subclasses(self, kind):
        # np.matrix makes '*' a matrix product: it must be taken as a plain array.
        S = build(kind, 300, 20, seed=0)
        X = np.random.default_rng(0).standard_normal((300, 3))
        out = S @ np.matrix(X)
        assert type(out) is np.ndarray
        np.testing.assert_array_equal(out, S @ X)
        np.testing.assert_array_equal(S.T @ np.matrix(out), S.T @ out)
        np.testing.assert_array_equal(S @ np.ma.masked_array(X), S @ X)  # nothing masked
        with pytest.raises(TypeError, match=r"A is a masked array.*A.filled"):
            S @ np.ma.masked_array(X, mask=X > 1)

    @pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
    def test_lstsq_of_a_matrix(self):
        X = np.random.default_rng(0).standard_normal((300, 3))
        y = X @ np.arange(1.0, 4.0)
        res = rsketch.lstsq(np.matrix(X), y, sketch="uniform", seed=0)
        np.testing.assert_allclose(res.coef, [1, 2, 3], rtol=1e-10)
        with pytest.raises(TypeError, match="masked"):
            rsketch.LeverageSampling(3, 2, scores=np.ma.masked_array([1.0, 2, 3], mask=[0, 1, 0]))

    @pytest.mark.parametrize("kind", KINDS)
    def test_nan_anywhere_is_reported(self, kind):
        S = build(kind, 50, 5, seed=0)
        for i in (0, 17, 49):
            A = np.ones((50, 2))
            A[i, 1] = np.nan
            with pytest.raises(ValueError, match="NaN"):
                S @ A

    def test_construction_errors(self):
        with pytest.raises(ValueError, match="sketch_size"):
            rsketch.GaussianSketch(10, 0)
        with pytest.raises(TypeError, match="input_dim"):
            rsketch.GaussianSketch(10.5, 3)
        with pytest.raises(ValueError, match="sketch_size must be <= input_dim"):
            rsketch.SRHT(10, 11)
        with pytest.raises(ValueError, match="sketch_size must be <= input_dim"):
            rsketch.UniformSampling(10, 11, replace=False)
        rsketch.UniformSampling(10, 11)  # with replacement it is allowed
        with pytest.raises(TypeError, match="transform"):
            rsketch.SRHT(10, 3, transform="dct")  # the SRDCT is its own class
        with pytest.raises(ValueError, match="nnz_per_column"):
            rsketch.SparseSign(10, 3, nnz_per_column=4)
        with pytest.raises(TypeError, match="dtype"):
            rsketch.GaussianSketch(10, 3, dtype=np.int64)
        with pytest.raises(ValueError, match="kind"):
            rsketch.make_sketch("fourier", 10, 3)
        with pytest.raises(TypeError, match="unknown option"):
            rsketch.make_sketch("gaussian", 10, 3, nnz_per_column=2)
        with pytest.raises(ValueError, match="scores=... or the matrix A"):
            rsketch.make_sketch("leverage", 10, 3)

    @pytest.mark.parametrize(
        "scores,match",
        [
            (-np.ones(10), "non-negative"),
            (np.zeros(10), "all zero"),
            (np.full(10, np.nan), "NaN"),
            (np.ones(9), "shape"),
            (np.array(["x"] * 10), "real"),
        ],
    )
    def test_leverage_scores(self, scores, match):
        with pytest.raises((ValueError, TypeError), match=match):
            rsketch.LeverageSampling(10, 3, scores=scores)

    def test_block_indexing(self):
        S = rsketch.CountSketch(10, 3, seed=0)
        with pytest.raises(IndexError):
            S[0, 1]
        with pytest.raises(ValueError, match="stop"):
            S.columns(5, 11)


@pytest.mark.parametrize("kind", KINDS)
def test_portable_path_runs_on_a_strict_array_namespace(kind):
    # array_api_strict implements only the Python array API standard: an operator that runs on
    # it is written against the namespace, not against NumPy (the CuPy/Dask path).
    xps = pytest.importorskip("array_api_strict", reason="install the test extra: array-api-strict")
    n, r = 150, 12
    S = build(kind, n, r, seed=21)
    A = np.random.default_rng(3).standard_normal((n, 3))
    out = S @ xps.asarray(A)
    assert type(out).__module__.startswith("array_api_strict")
    assert rel_err(np.asarray(out), S @ A) < 1e-12
    Z = np.random.default_rng(4).standard_normal((r, 2))
    back = S.T @ xps.asarray(Z)
    assert rel_err(np.asarray(back), S.T @ Z) < 1e-12
