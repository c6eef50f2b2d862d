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
