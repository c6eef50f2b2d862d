"""The sparse path of ``svd``: the basis on the short side, the Gram finish and its exact fallback,
and block Krylov with blocks narrower than ``rank + oversample``."""

import numpy as np
import pytest
import scipy.sparse as sp

import rsketch
import rsketch.linalg._lowrank as lowrank
from rsketch.linalg._lowrank import _orth, _sparse_finish


def _captured(A, U):
    UA = np.asarray(A.T @ U)
    return float(np.sum(UA * UA))


def _flat(m=8000, n=1000):
    """A uniformly random sparse matrix: one large singular value, then a flat bulk."""
    return sp.random(m, n, density=0.01, format="csr", random_state=np.random.default_rng(5))


def test_small_blocks_capture_more_of_a_flat_spectrum_than_wide_ones_for_the_same_products():
    # 20 columns x 9 passes and 4 columns x 45 passes: 180 column-products each
    A = _flat()
    k = 10
    optimum = float(np.sum(np.linalg.svd(A.toarray(), compute_uv=False)[:k] ** 2))
    wide = rsketch.svd(A, k, passes=9, seed=0)
    narrow = rsketch.svd(A, k, block_size=4, passes=45, seed=0)
    assert _captured(A, narrow.U) >= 0.999 * optimum
    assert _captured(A, wide.U) <= 0.99 * optimum  # measured 0.988: the narrow blocks' gain is real
    for res in (wide, narrow):
        np.testing.assert_allclose(res.U.T @ res.U, np.eye(k), atol=1e-12)
        np.testing.assert_allclose(res.Vt @ res.Vt.T, np.eye(k), atol=1e-12)
        np.testing.assert_allclose(res.U.T @ (A @ res.Vt.T), np.diag(res.s), atol=1e-12 * res.s[0])


@pytest.mark.parametrize("fmt", ["csr", "csc"])
def test_a_tall_sparse_matrix_decomposed_through_its_transpose_matches_the_dense_path(fmt):
    # A spectrum that the default space resolves: both paths reach the leading triplets to rounding
    rng = np.random.default_rng(2)
    m, n, k = 3000, 300, 6
    U = np.linalg.qr(rng.standard_normal((m, n)))[0]
    V = np.linalg.qr(rng.standard_normal((n, n)))[0]
    s = 0.5 ** np.arange(n)
    dense = (U * s) @ V.T
    sparse = sp.csr_matrix(dense).asformat(fmt)
    a, b = rsketch.svd(dense, k, passes=7, seed=0), rsketch.svd(sparse, k, passes=7, seed=0)
    np.testing.assert_allclose(b.s, s[:k], rtol=1e-12)
    np.testing.assert_allclose(a.s, b.s, rtol=1e-12)
    np.testing.assert_allclose(np.abs(a.U.T @ b.U), np.eye(k), atol=1e-9)
    np.testing.assert_allclose((b.U * b.s) @ b.Vt, (a.U * a.s) @ a.Vt, atol=1e-12)
    assert b.error_estimate >= s[k]


def test_the_gram_finish_equals_the_exact_factorisation():
    # The same M and Q through the Gram (a flat spectrum passes its test) and with the Gram refused
    M = _flat(1000, 6000).T.tocsr()  # short side 1000 (rows), long side 6000
    Q = np.linalg.qr(M @ np.random.default_rng(1).standard_normal((M.shape[1], 40)))[0]
    gram = Q.T @ (M @ (M.T @ Q))
    U1, s1, Vt1, passes1 = _sparse_finish(M, Q, 8, (gram + gram.T) / 2)
    margin = lowrank.GRAM_FINISH_MARGIN
    try:
        lowrank.GRAM_FINISH_MARGIN = np.inf  # every Gram refused
        U2, s2, Vt2, passes2 = _sparse_finish(M, Q, 8, (gram + gram.T) / 2)
    finally:
        lowrank.GRAM_FINISH_MARGIN = margin
    assert passes1 == passes2 == 1
    B = Q.T @ M  # the exact answer: the SVD of the small B
    Ub, sb, Vtb = np.linalg.svd(B.toarray() if sp.issparse(B) else B, full_matrices=False)
    np.testing.assert_allclose(s2, sb[:8], rtol=1e-12)
    np.testing.assert_allclose(s1, sb[:8], rtol=1e-10)
    for U, Vt in ((U1, Vt1), (U2, Vt2)):
        np.testing.assert_allclose(np.abs((Q @ Ub[:, :8]).T @ U), np.eye(8), atol=1e-6)
        np.testing.assert_allclose(np.abs(Vtb[:8] @ Vt.T), np.eye(8), atol=1e-6)
    np.testing.assert_allclose((U1 * s1) @ Vt1, (U2 * s2) @ Vt2, atol=1e-10 * sb[0])


def test_an_exactly_low_rank_tall_sparse_matrix_is_recovered_to_rounding():
    # lambda_{k+1} of the Gram is rounding (the exact finish); with blocks of 2 the space is spent
    # after three blocks and re-orthonormalised
    rng = np.random.default_rng(4)
    A = sp.csr_matrix(rng.standard_normal((5000, 5)) @ rng.standard_normal((5, 300)))
    for kwargs in ({}, {"block_size": 2, "passes": 15}):
        res = rsketch.svd(A, 5, seed=0, **kwargs)
        np.testing.assert_allclose(res.s, np.linalg.svd(A.toarray(), compute_uv=False)[:5], rtol=1e-12)
        assert np.linalg.norm(A.toarray() - (res.U * res.s) @ res.Vt) <= 1e-12 * np.linalg.norm(A.toarray())


def test_block_size_is_checked():
    A = _flat(500, 200)
    with pytest.raises(ValueError, match="block_size sets block Krylov's block"):
        rsketch.svd(A, 5, method="subspace", block_size=4)
    fewer = r"spans 10 columns, fewer than rank \+ oversample = 30: give passes >= 11"
    with pytest.raises(ValueError, match=fewer):
        rsketch.svd(A, 20, block_size=5, passes=3)
    with pytest.raises(ValueError, match="block_size"):
        rsketch.svd(A, 5, block_size=0)
    assert rsketch.svd(A, 20, block_size=5, passes=11, seed=0).s.shape == (20,)


@pytest.mark.parametrize("kind", ["well-conditioned", "ill-conditioned", "overflowing"])
def test_orth_returns_the_triangle_of_every_branch(kind):
    rng = np.random.default_rng(6)
    Y = rng.standard_normal((2000, 12))
    if kind == "ill-conditioned":  # beyond CholeskyQR's limit: Householder
        Y *= np.logspace(0, -12, 12)
    if kind == "overflowing":  # the Gram overflows: rescaled by a power of two
        Y *= 1e300
    Q, R = _orth(Y.copy(), with_r=True)
    np.testing.assert_allclose(Q.T @ Q, np.eye(12), atol=1e-13)
    np.testing.assert_allclose(Q @ R, Y, atol=1e-14 * np.abs(Y).max() * 50)


# Found by a review of the sparse path (2026-12-06): each failed on the code before its fix.


@pytest.mark.parametrize("sparse", [True, False])
def test_narrow_blocks_on_a_spent_space_still_return_rank_components(sparse):
    # rank 3 asked at rank 5 with blocks of 2: the space is spent after two blocks (4 columns)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((500, 3)) @ rng.standard_normal((3, 60))
    res = rsketch.svd(sp.csr_matrix(X) if sparse else X, 5, block_size=2, passes=15, seed=0)
    assert res.U.shape == (500, 5) and res.s.shape == (5,) and res.Vt.shape == (5, 60)
    np.testing.assert_allclose(res.s[:3], np.linalg.svd(X, compute_uv=False)[:3], rtol=1e-12)
    assert np.all(res.s[3:] <= 1e-12 * res.s[0])


@pytest.mark.parametrize("dtype, scale", [(np.float64, 1e160), (np.float32, 1e20)])
def test_a_sparse_matrix_whose_gram_overflows_is_decomposed_without_warnings(dtype, scale):
    # sigma_1^2 overflows: the Gram is refused and B.T factored by the rescaling CholeskyQR
    A = sp.random(600, 80, density=0.1, format="csr", random_state=1, dtype=dtype) * dtype(scale)
    s_true = np.linalg.svd(A.toarray().astype(np.float64) / scale, compute_uv=False)
    for M in (A, A.T.tocsr()):
        for kwargs in ({}, {"passes": 1}):
            with np.errstate(all="raise"):  # no overflow reaches NumPy's warnings
                res = rsketch.svd(M, 5, seed=0, **kwargs)
            assert res.s.dtype == dtype and np.isfinite(res.s).all()
            if not kwargs:  # (one pass on this flat spectrum is 14% off sigma_1 at any scale)
                assert abs(res.s[0] / scale / s_true[0] - 1) < 1e-3


def test_a_sparse_matrix_at_subnormal_gram_scale_keeps_its_digits():
    # A scaled by 2^-530 (exact): its Gram is subnormal, where eigh's eigenvectors had lost 1e-5
    rng = np.random.default_rng(2)
    m, n, k = 3000, 300, 6
    U = np.linalg.qr(rng.standard_normal((m, n)))[0]
    V = np.linalg.qr(rng.standard_normal((n, n)))[0]
    s = 0.9 ** np.arange(n)
    c = 2.0**-530
    res = rsketch.svd(sp.csr_matrix((U * s) @ V.T * c), k, passes=7, seed=0)
    np.testing.assert_allclose(res.s / c, s[:k], rtol=1e-12)


def test_a_sketch_operator_fixes_the_side_of_a_tall_sparse_matrix():
    A = sp.random(600, 80, density=0.1, format="csr", random_state=1)
    S = rsketch.make_sketch("gaussian", 80, 15, seed=0)  # shaped for A's columns
    ours, dense = rsketch.svd(A, 5, sketch=S, seed=0), rsketch.svd(A.toarray(), 5, sketch=S, seed=0)
    np.testing.assert_allclose(ours.s, dense.s, rtol=1e-12)


def test_block_size_for_dask_input_is_passed_on_or_refused():
    da = pytest.importorskip("dask.array")
    X = np.random.default_rng(3).standard_normal((2000, 60)) * np.exp(-np.arange(60) / 6)
    D = da.from_array(X, chunks=(500, 60))
    with pytest.raises(ValueError, match="block_size=3 below rank \\+ oversample is available for in-memory"):
        rsketch.svd(D, 5, block_size=3, passes=11)
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        rsketch.svd(D, 5, block_size=0)
    wide = rsketch.svd(D, 5, block_size=20, passes=5, seed=0)
    np.testing.assert_allclose(wide.s, rsketch.svd(X, 5, block_size=20, passes=5, seed=0).s, rtol=1e-10)
    assert wide.s.shape == (5,)


def test_a_space_capped_by_min_m_n_need_only_hold_the_rank():
    A = sp.random(500, 20, density=0.5, format="csr", random_state=0)
    res = rsketch.svd(A, 15, block_size=3, passes=41, seed=0)  # 6 blocks of 3 fit: 18 columns
    s_true = np.linalg.svd(A.toarray(), compute_uv=False)[:15]
    assert res.s.shape == (15,) and np.all(res.s <= s_true * (1 + 1e-12))
    np.testing.assert_allclose(res.s[0], s_true[0], rtol=1e-10)
    with pytest.raises(ValueError, match="spans at most 18 columns within min"):
        rsketch.svd(A, 20, block_size=3, passes=41)


def test_passes_counts_the_products_made_when_block_krylov_finds_the_range_spent():
    # A rank-3 operator: the space is spent at the second block; 16 passes had been reported for 12
    from scipy.sparse.linalg import LinearOperator

    rng = np.random.default_rng(1)
    X = rng.standard_normal((400, 3)) @ rng.standard_normal((3, 90))
    made = []
    op = LinearOperator(
        X.shape, matvec=lambda v: X @ v, rmatvec=lambda v: X.T @ v, dtype=float,
        matmat=lambda V: made.append("A") or X @ V, rmatmat=lambda V: made.append("A.T") or X.T @ V,
    )  # fmt: skip
    kwargs = {"oversample": 2, "passes": 15, "error_probes": False, "seed": 0}
    found = rsketch.range_finder(op, 3, method="block_krylov", **kwargs)
    assert found.passes == len(made) < 15
    made.clear()
    res = rsketch.svd(op, 3, **kwargs)
    assert res.passes == len(made) < 16
    np.testing.assert_allclose(res.s, np.linalg.svd(X, compute_uv=False)[:3], rtol=1e-12)
