"""GramOperator: ``F.T F`` for ``F = diag(sqrt(w)) (X - 1 c.T)``, products and sketches against the
dense matrix, and Nyström-preconditioned CG through it against the same CG on the dense matrix."""

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.linalg import aslinearoperator
from sklearn.linear_model import Ridge

from rsketch import SketchedRidge, estimators, make_sketch
from rsketch.linalg import GramOperator, _gram, nystrom_pcg


def design(n, p, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p)) * np.exp(-np.arange(p) / (p / 8))
    w = rng.uniform(0.2, 3.0, n)
    return X, w, (w @ X) / w.sum()


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("centred", [False, True])
@pytest.mark.parametrize("shape", [(700, 300), (300, 700)])
def test_products_equal_the_dense_gram(shape, centred, weighted, monkeypatch):
    X, w, c = design(*shape)
    F = (np.sqrt(w)[:, None] if weighted else 1.0) * (X - (c if centred else 0.0))
    A = F.T @ F
    G = GramOperator(X, center=c if centred else None, sample_weight=w if weighted else None)
    monkeypatch.setattr(_gram, "FUSED_BLOCK_BYTES", 64 * X.shape[1] * 8)  # several blocks, a short last one
    V = np.random.default_rng(1).standard_normal((X.shape[1], 12))
    scale = np.abs(A).max()
    for cols in (V[:, 0], V[:, :3], V):  # fused: a vector, three columns; two GEMMs: twelve
        np.testing.assert_allclose(G @ cols, A @ cols, rtol=0, atol=1e-12 * scale * X.shape[0])
    np.testing.assert_allclose(G.T @ V[:, :2], A @ V[:, :2], rtol=0, atol=1e-12 * scale * X.shape[0])


@pytest.mark.parametrize(
    "kind, size", [("sparse_sign", 40), ("countsketch", 64), ("sparse_sign", 8), ("gaussian", 40)]
)
def test_sketch_equals_the_dense_product(kind, size, monkeypatch):
    X, w, c = design(900, 250)
    F = np.sqrt(w)[:, None] * (X - c)
    monkeypatch.setattr(_gram, "SKETCH_CHUNK_BYTES", 300 * size * 8)  # chunks of 256 rows and a remainder
    S = make_sketch(kind, 250, size, seed=3)
    Y = GramOperator(X, center=c, sample_weight=w).sketch(S)
    expected = F.T @ (F @ S.to_dense().T)
    assert Y.shape == (250, size)
    np.testing.assert_allclose(Y, expected, rtol=0, atol=1e-12 * np.abs(expected).max() * 900)


# test blocks orthonormalised, and used as drawn (at most p / 4 columns; with a larger mu, which
# such a sketch can precondition)
@pytest.mark.parametrize("max_rank, mu", [(1000, 1e-3), (100, 1.0)])
def test_nystrom_pcg_through_the_operator_is_the_dense_one(max_rank, mu):
    # The same seed draws the same test blocks; the operator's sparse first pass changes rounding only.
    X, w, c = design(600, 400, seed=4)
    F = np.sqrt(w)[:, None] * (X - c)
    b = F.T @ np.random.default_rng(5).standard_normal(600)
    options = dict(sketch="sparse_sign", max_rank=max_rank, seed=0)
    fast = nystrom_pcg(GramOperator(X, center=c, sample_weight=w), b, mu, **options)
    dense = nystrom_pcg(aslinearoperator(F.T @ F), b, mu, **options)
    assert fast.preconditioner.U.shape == dense.preconditioner.U.shape
    # the eigenvalues come from an l x l eigenproblem formed from Y.T Y: accurate to rounding
    # relative to the largest (observed 3e-10 of it), not each to its own size
    lam = dense.preconditioner.eigenvalues
    np.testing.assert_allclose(fast.preconditioner.eigenvalues, lam, rtol=0, atol=1e-8 * lam[0])
    x_star = np.linalg.solve(F.T @ F + mu * np.eye(400), b)
    for res in (fast, dense):
        assert res.converged
        np.testing.assert_allclose(res.x, x_star, rtol=1e-8, atol=1e-8 * np.abs(x_star).max())


def test_wide_dense_weighted_multi_target_ridge_matches_sklearn(monkeypatch):
    monkeypatch.setattr(estimators, "KERNEL_MAX_SAMPLES", 0)  # Nyström, as for more than 5,000 samples
    X, _, _ = design(400, 2100, seed=6)
    rng = np.random.default_rng(7)
    Y, w = rng.standard_normal((400, 2)), rng.uniform(0.5, 2.0, 400)
    ours = SketchedRidge(alpha=0.1, random_state=0).fit(X, Y, sample_weight=w)
    ref = Ridge(alpha=0.1, solver="cholesky").fit(X, Y, sample_weight=w)
    assert ours.solver_ == "nystrom_pcg"
    np.testing.assert_allclose(ours.coef_, ref.coef_, rtol=1e-8, atol=1e-8 * np.abs(ref.coef_).max())
    np.testing.assert_allclose(ours.intercept_, ref.intercept_, rtol=1e-8, atol=1e-10)


def test_bad_input():
    X, w, c = design(50, 20)
    with pytest.raises(TypeError, match=r"X must be a 2-D float32 or float64 array \(NumPy, SciPy sparse"):
        GramOperator(X.astype(np.int64))
    with pytest.raises(TypeError, match="X must be"):
        GramOperator(X.tolist())
    with pytest.raises(ValueError, match=r"center must have shape \(20,\)"):
        GramOperator(X, center=c[:5])
    with pytest.raises(ValueError, match=r"sample_weight must have shape \(50,\)"):
        GramOperator(X, sample_weight=w[:-1])
    with pytest.raises(ValueError, match="sample_weight must be non-negative"):
        GramOperator(X, sample_weight=-w)
    bad = X.copy()
    bad[3, 4] = np.nan
    with pytest.raises(ValueError, match="X contains NaN or infinite values"):
        GramOperator(bad)
    GramOperator(bad, check_finite=False)  # the caller's word
    with pytest.raises(ValueError, match="center contains NaN"):
        GramOperator(X, center=np.full(20, np.inf))
    with pytest.raises(ValueError, match="sample_weight contains NaN"):
        GramOperator(X, sample_weight=np.full(50, np.nan))
    with pytest.raises(ValueError, match="input_dim 20"):
        GramOperator(X).sketch(make_sketch("sparse_sign", 21, 5, seed=0))
    # complex values were cast to their real part (a center of 1j became 0, G @ 1j v gave zeros)
    with pytest.raises(TypeError, match="center must be a real numeric array, got dtype complex128"):
        GramOperator(X, center=c + 1j)
    with pytest.raises(TypeError, match="center must be a real numeric array, got dtype <U1"):
        GramOperator(X, center=["a"] * 20)
    with pytest.raises(TypeError, match="GramOperator multiplies real arrays, got dtype complex128"):
        GramOperator(X) @ (1j * np.ones(20))
    for shape in ((5, 0), (0, 5)):
        with pytest.raises(ValueError, match=r"X must have at least one row and one column, got shape"):
            GramOperator(np.ones(shape))


def test_sparse_and_device_designs_give_the_dense_products():
    # a sparse X stays sparse and a device X on its device: two products in its library, on the host
    from .array_api_standin import host, on_device

    X, w, c = design(400, 90, seed=10)
    X[np.abs(X) < 0.5] = 0.0
    ref = GramOperator(X, center=c, sample_weight=w)
    V = np.random.default_rng(11).standard_normal((90, 3))
    y = np.random.default_rng(12).standard_normal(400)
    S = make_sketch("sparse_sign", 90, 40, seed=2)
    sparse = GramOperator(sp.csr_matrix(X), center=c, sample_weight=w)
    device = GramOperator(on_device(X), center=c, sample_weight=w)
    right_sides = (
        (sparse, sparse.transpose_weighted(y)),
        (device, host(device.transpose_weighted(on_device(y)))),  # in X's library: on the device
    )
    for other, rhs in right_sides:
        for got, expected in (
            (other @ V, ref @ V),
            (other @ V[:, 0], ref @ V[:, 0]),
            (other.sketch(S), ref.sketch(S)),
            (rhs, ref.transpose_weighted(y)),
        ):
            assert isinstance(got, np.ndarray)
            np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12 * np.abs(expected).max())


def test_a_fortran_ordered_design_is_used_in_place():
    X, w, c = design(500, 120, seed=8)
    Xf = np.asfortranarray(X)
    G = GramOperator(Xf, center=c, sample_weight=w)
    assert G.X is Xf
    V = np.random.default_rng(9).standard_normal((120, 2))
    ref = GramOperator(X, center=c, sample_weight=w)
    expected = ref @ V  # the same sums in another order: equal to rounding of the largest entry
    np.testing.assert_allclose(G @ V, expected, rtol=0, atol=1e-12 * np.abs(expected).max())
    S = make_sketch("sparse_sign", 120, 40, seed=1)
    expected = ref.sketch(S)
    np.testing.assert_allclose(G.sketch(S), expected, rtol=0, atol=1e-12 * np.abs(expected).max())
