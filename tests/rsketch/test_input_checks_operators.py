"""Bad input to the operators and their Dask path is refused up front, with an error naming the argument."""

import numpy as np
import pytest

import rsketch
from rsketch.operators.factory import SKETCH_KINDS

OTHER_KINDS = [kind for kind in SKETCH_KINDS if kind != "leverage"]


# ------------------------------------------------------------------------- make_sketch's kind-specific A
@pytest.mark.parametrize("kind", OTHER_KINDS)
def test_make_sketch_refuses_A_for_kinds_that_ignore_it(kind):
    with pytest.raises(TypeError, match=r"A is used only by kind='leverage' without scores.*got kind="):
        rsketch.make_sketch(kind, 100, 10, seed=0, A=np.ones((7, 2)))


def test_make_sketch_refuses_A_next_to_scores():
    # A is not even looked at when scores are given: junk must not pass for a matrix
    for A in ("junk", np.ones((100, 2))):
        with pytest.raises(TypeError, match=r"A is used only by kind='leverage' without scores.*not both"):
            rsketch.make_sketch("leverage", 100, 10, seed=0, A=A, scores=np.ones(100))


def test_make_sketch_refuses_method_next_to_scores():
    # method picks how scores are computed from A: with scores given it would be ignored
    with pytest.raises(TypeError, match=r"method is used only by kind='leverage' without scores"):
        rsketch.make_sketch("leverage", 100, 10, seed=0, scores=np.ones(100), method="approx")


@pytest.mark.parametrize("kind", list(SKETCH_KINDS))
def test_make_sketch_still_takes_A_none_and_leverage_from_A(kind):
    # A=None means "no A" for every kind (rsketch.demo passes it so)
    options = {"scores": np.ones(100)} if kind == "leverage" else {}
    S = rsketch.make_sketch(kind, 100, 10, seed=0, A=None, **options)
    assert S.shape == (10, 100)
    X = np.random.default_rng(0).standard_normal((100, 3))
    S = rsketch.make_sketch("leverage", 100, 10, seed=0, A=X, method="approx")
    assert S.shape == (10, 100)


# ------------------------------------------------------------------- Dask arrays of non-NumPy chunks
def _sparse_chunked(n=4000, p=3):
    import dask.array as da
    import scipy.sparse as sp

    M = sp.random(n, p, density=0.2, format="csr", random_state=0)
    return da.from_array(M, chunks=(n // 4, p), asarray=False), M


def _sketch(kind, n):
    options = {"scores": np.ones(n)} if kind == "leverage" else {}
    return rsketch.make_sketch(kind, n, 40, seed=0, **options)


@pytest.mark.parametrize("kind", list(SKETCH_KINDS))
def test_sketch_refuses_dask_array_of_sparse_chunks_before_compute(kind):
    # The chunk kernels failed only at compute time ("setting an array element with a sequence")
    A, _ = _sparse_chunked()
    with pytest.raises(TypeError, match=r"A is a Dask array of scipy\.sparse.*map_blocks"):
        _sketch(kind, A.shape[0]) @ A


def test_dask_functions_refuse_sparse_chunks_naming_the_argument():
    import rsketch.dask as rdask

    A, _ = _sparse_chunked()
    calls = [
        ("X", lambda: rsketch.lstsq(A, np.ones(A.shape[0]), seed=0)),
        ("A", lambda: rsketch.range_finder(A, 2, seed=0)),
        ("A", lambda: rsketch.svd(A, 2, seed=0)),
        ("A", lambda: rsketch.qr_pivoted(A, seed=0)),
        ("A", lambda: rdask.leverage_sampling(A, 40, seed=0)),
        ("A", lambda: rdask.approximate_leverage(A, (1, 2))),
    ]
    for name, call in calls:
        with pytest.raises(TypeError, match=rf"^{name} is a Dask array of scipy\.sparse"):
            call()
    X = A.map_blocks(lambda b: b.toarray(), dtype=A.dtype)
    with pytest.raises(TypeError, match=r"^y is a Dask array of scipy\.sparse"):
        rsketch.lstsq(X, A[:, :1], seed=0)


def test_the_suggested_dense_chunks_give_the_in_memory_sketch():
    A, M = _sparse_chunked()
    S = rsketch.make_sketch("sparse_sign", A.shape[0], 40, seed=0)
    dense = (S @ A.map_blocks(lambda b: b.toarray(), dtype=A.dtype)).compute()
    np.testing.assert_allclose(dense, S @ M.toarray(), rtol=1e-12, atol=1e-12)


def test_sketch_refuses_dask_array_of_masked_chunks():
    # The kernels read the data under the mask; in memory a masked A with masked entries is refused
    import dask.array as da

    X = np.random.default_rng(0).standard_normal((400, 3))
    A = da.ma.masked_greater(da.from_array(X, chunks=100), 1.0)
    with pytest.raises(TypeError, match=r"A is a Dask array of masked.*getdata"):
        rsketch.make_sketch("gaussian", 400, 20, seed=0) @ A


class _DeviceChunk:
    """A chunk of another array library (as CuPy's): array-like, but not a NumPy array."""

    def __init__(self, a):
        self.a = np.asarray(a)
        self.shape, self.ndim, self.dtype = self.a.shape, self.a.ndim, self.a.dtype

    def __getitem__(self, index):
        return _DeviceChunk(self.a[index])

    def astype(self, dtype, **kwargs):
        return _DeviceChunk(self.a.astype(dtype))


@pytest.mark.parametrize("module, fix", [("cupy", "cupy.asnumpy"), (__name__, "np.asarray")])
def test_sketch_refuses_dask_array_of_other_libraries_chunks(module, fix, monkeypatch):
    import dask.array as da

    monkeypatch.setattr(_DeviceChunk, "__module__", module)
    A = da.from_array(np.ones((400, 3)), chunks=100).map_blocks(
        _DeviceChunk, meta=_DeviceChunk(np.ones((0, 0)))
    )
    with pytest.raises(TypeError, match=rf"A is a Dask array of {module}\._DeviceChunk.*{fix}"):
        rsketch.make_sketch("gaussian", 400, 20, seed=0) @ A


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix
@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.bool_, np.float16, np.float32, np.float64])
def test_dask_arrays_of_numpy_chunks_still_sketch(dtype):
    import dask.array as da

    X = (np.random.default_rng(0).standard_normal((400, 3)) * 3).astype(dtype)
    for meta_kind in (X, np.asmatrix(X)):  # an ndarray subclass without a mask is still NumPy data
        A = da.from_array(meta_kind, chunks=(100, 3))
        S = rsketch.make_sketch("countsketch", 400, 20, seed=0)
        np.testing.assert_allclose((S @ A).compute(), S @ np.asarray(X), rtol=1e-5, atol=1e-5)


def test_leverage_scores_none_is_no_scores():
    A = np.random.default_rng(2).standard_normal((300, 4))
    S = rsketch.make_sketch("leverage", 300, 30, seed=1, A=A, scores=None)
    np.testing.assert_array_equal(
        S.indices(), rsketch.make_sketch("leverage", 300, 30, seed=1, A=A).indices()
    )
    with pytest.raises(ValueError, match="needs either scores"):
        rsketch.make_sketch("leverage", 300, 30, seed=1, scores=None)


# ------------------------------------------------------------------ the operators' probe of 2026-12-06
def test_sparse_sizes_the_hashing_cannot_reach_are_refused():
    # A row within a block is drawn from 32 bits: a CountSketch of 3 * 2**31 rows put none of its
    # nonzeros past row 2**32 (83% in the first half). And block bounds t * r of 4 * 2**62
    # overflowed int64 into negative row indices.
    with pytest.raises(ValueError, match=r"CountSketch .* at most 2\*\*32 rows; use a smaller sketch_size"):
        rsketch.CountSketch(200_000, 3 * 2**31, seed=0)
    with pytest.raises(ValueError, match=r"SparseSign .* at most 2\*\*32 rows"):
        rsketch.SparseSign(1000, 2**62, seed=0, nnz_per_column=4)
    with pytest.raises(ValueError, match=r"sketch_size \* nnz_per_column < 2\*\*63"):
        rsketch.SparseSign(10, 2**61, seed=0, nnz_per_column=2**30)
    # at the limit a block's rows are all reachable: 2**32 rows, the word itself
    rows = rsketch.CountSketch(20_000, 2**32, seed=0).pattern()[0][:, 0]
    assert rows.min() >= 0 and rows.max() < 2**32 and (rows >= 2**31).mean() > 0.45
    rows = rsketch.SparseSign(20_000, 2**34, seed=0, nnz_per_column=4).pattern()[0]
    for t in range(4):  # each block [t 2**32, (t + 1) 2**32) is drawn over, both of its halves
        within = rows[:, t] - t * 2**32
        assert within.min() >= 0 and within.max() < 2**32 and (within >= 2**31).mean() > 0.45


def test_leverage_probabilities_of_subnormal_scores_sum_to_one():
    # (1 - mix) * s of subnormal scores lost their digits: [5e-324, 0, 0] gave probabilities
    # [1.033, 0.033, 0.033] (sum 1.1), so E[S.T S] was not I.
    for scores in ([5e-324, 0.0, 0.0], [1e-320, 3e-320], [2.0**-1000, 2.0**-1001, 0.0]):
        S = rsketch.make_sketch("leverage", len(scores), 10, scores=np.array(scores), seed=0)
        ref = rsketch.make_sketch("leverage", len(scores), 10, scores=np.array(scores) / max(scores), seed=0)
        assert abs(S.probabilities.sum() - 1.0) < 4e-16
        np.testing.assert_allclose(S.probabilities, ref.probabilities, rtol=1e-15)
    # scores of ordinary size keep their exact probabilities (no rescaling: the same bits)
    s = np.array([0.3, 0.5, 0.2])
    S = rsketch.make_sketch("leverage", 3, 10, scores=s, seed=0)
    assert np.array_equal(S.probabilities, 0.9 * s / s.sum() + 0.1 / 3)


@pytest.mark.parametrize("kind", list(SKETCH_KINDS))
def test_reference_paths_check_their_operand_as_the_product_does(kind):
    # reference_apply truncated the sketch to an integer A's dtype (a Gaussian sketch of arange
    # came out [[0 0] [0 0] [-8 -9]]), and a bool A gave a bool matrix
    options = {"scores": np.linspace(1, 2, 10)} if kind == "leverage" else {}
    S = rsketch.make_sketch(kind, 10, 3 if kind != "srht" else 4, seed=0, **options)
    Ai = np.arange(20).reshape(10, 2)
    for A in (Ai, Ai > 5):
        np.testing.assert_allclose(S.reference_apply(A), S @ A, rtol=1e-12, atol=1e-12)
    Zi = np.arange(2 * S.sketch_size).reshape(S.sketch_size, 2)
    np.testing.assert_allclose(S.reference_adjoint(Zi), S.T @ Zi, rtol=1e-12, atol=1e-12)
    assert S.reference_apply(np.arange(10)).shape == (S.sketch_size,)
    with pytest.raises(ValueError, match=r"A must have 10 rows \(the sketch's input_dim\)"):
        S.reference_apply(np.ones((9, 2)))
    with pytest.raises(TypeError, match="A must be real-valued"):
        S.reference_apply(np.ones((10, 2), dtype=complex))


def test_sparse_sign_counts_its_hash_buffers_before_allocating(monkeypatch):
    # Each chunk hashes 256 rows ahead into buffers of 256 s entries that the estimate left out:
    # nnz_per_column = 3e7 leaked numba's "SystemError ... MemoryError" after trying 7.8 GB.
    from rsketch import _validation

    monkeypatch.setattr(_validation, "available_memory", lambda: 8 * 2**30)
    S = rsketch.make_sketch("sparse_sign", 10, 30_000_000, nnz_per_column=30_000_000, seed=0)
    with pytest.raises(MemoryError, match=r"SparseSign @ A .* needs"):
        S @ np.ones(10)
    with pytest.raises(MemoryError, match=r"SparseSign @ A .* needs"):
        S @ np.ones((10, 2), order="F")


def test_a_left_operand_sketches_rows_through_the_adjoint():
    # A @ S.T was a NumPy error ("matmul: Input operand 1 does not have enough dimensions") and,
    # for a sparse A, "unsupported operand type(s) for @"
    import scipy.sparse as sparse

    rng = np.random.default_rng(0)
    for kind in SKETCH_KINDS:
        options = {"scores": np.linspace(1, 2, 12)} if kind == "leverage" else {}
        S = rsketch.make_sketch(kind, 12, 4, seed=0, **options)
        A = rng.standard_normal((3, 12))
        dense = S.to_dense()
        np.testing.assert_allclose(A @ S.T, A @ dense.T, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(sparse.csr_matrix(A) @ S.T, A @ dense.T, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(A[0] @ S.T, A[0] @ dense.T, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(A.tolist() @ S.T, A @ dense.T, rtol=1e-12, atol=1e-12)  # a list
        B = rng.standard_normal((2, 4))
        np.testing.assert_allclose(B @ S, B @ dense, rtol=1e-12, atol=1e-12)
        with pytest.raises(ValueError, match=r"A @ S.T needs A 1-D or 2-D, got shape \(2, 3, 12\)"):
            np.ones((2, 3, 12)) @ S.T
        with pytest.raises(ValueError, match=r"A @ S.T needs A with 12 columns \(the sketch's input_dim\)"):
            rng.standard_normal((3, 11)) @ S.T
        with pytest.raises(ValueError, match=r"A @ S needs A with 4 columns \(the sketch's sketch_size\)"):
            B[:, :3] @ S


def test_cached_sketch_state_is_read_only():
    # indices() handed out the cached array: a caller's sort changed every later S @ A, and a
    # row of an SRHT set to 10**6 read out of bounds
    A = np.arange(20.0).reshape(10, 2)
    for kind, options in (("uniform", {}), ("leverage", {"scores": np.linspace(1, 2, 10)})):
        S = rsketch.make_sketch(kind, 10, 4, seed=0, **options)
        with pytest.raises(ValueError, match="read-only"):
            S.indices().sort()
    S = rsketch.make_sketch("leverage", 10, 4, seed=0, scores=np.linspace(1, 2, 10))
    with pytest.raises(ValueError, match="read-only"):
        S.probabilities[0] = 1.0
    H = rsketch.make_sketch("srht", 10, 4, seed=0)
    before = H @ A
    with pytest.raises(ValueError, match="read-only"):
        H.rows[0] = 10**6
    assert np.array_equal(H @ A, before)
    # pickling and deepcopy drop an array's flags: the copies hand out read-only views too
    import copy
    import pickle

    for T in (pickle.loads(pickle.dumps(S)), copy.deepcopy(S)):
        with pytest.raises(ValueError, match="read-only"):
            T.indices().sort()
        with pytest.raises(ValueError, match="read-only"):
            T.probabilities[0] = 1.0
    for T in (pickle.loads(pickle.dumps(H)), copy.deepcopy(H)):
        with pytest.raises(ValueError, match="read-only"):
            T.rows[0] = 10**6


def test_helpers_check_their_ranges_and_dtypes():
    S = rsketch.make_sketch("sparse_sign", 10, 8, seed=0, nnz_per_column=4)
    with pytest.raises(TypeError, match="dtype must be numpy.float32 or numpy.float64"):
        S.sparse_columns(0, 3, dtype=int)
    with pytest.raises(ValueError, match="stop must be >= 5"):
        S.reference_pattern(5, 2)
    H = rsketch.make_sketch("srht", 10, 4, seed=0)
    with pytest.raises(ValueError, match="start must be >= 0"):
        H.signs(-3, 2)
    with pytest.raises(ValueError, match="stop must be <= 10"):
        H.signs(0, 100)
    with pytest.raises(IndexError, match=r"only column blocks S\[:, a:b\]"):
        S[np.arange(2), 0:3]


def test_huge_helper_arrays_and_densified_sparse_input_are_refused_up_front(monkeypatch):
    import scipy.sparse as sparse

    from rsketch import _validation

    monkeypatch.setattr(_validation, "available_memory", lambda: 8 * 2**30)
    with pytest.raises(MemoryError, match="the pattern of columns 0:1000000000000"):
        rsketch.CountSketch(10**12, 5, seed=0).pattern()
    with pytest.raises(MemoryError, match="signs 0:1099511627776"):
        rsketch.SRHT(2**40, 5, seed=0).signs()
    with pytest.raises(MemoryError, match="row scales"):
        rsketch.UniformSampling(10, 10**12, seed=0).scales()
    with pytest.raises(MemoryError, match="selected rows"):
        rsketch.SRHT(2**40, 2**38, seed=0).reference_rows()
    # SRHT densifies a sparse A (the transform mixes every row): 2**20 x 4000 is 31 GiB
    A = sparse.csr_matrix(([1.0, 2.0, 3.0], ([0, 5, 9], [0, 1, 2])), shape=(2**20, 4000))
    with pytest.raises(MemoryError, match=r"sparse 1048576 x 4000 A \(densified"):
        rsketch.SRHT(2**20, 16, seed=0) @ A


def test_integers_too_long_to_print_are_named_by_their_size():
    # printing an int of over 4,300 digits raises Python's own ValueError ("Exceeds the limit"),
    # which replaced the message naming the argument
    with pytest.raises(
        ValueError, match=r"seed must be a non-negative integer, got -\(an integer of 16610 bits\)"
    ):
        rsketch.make_sketch("gaussian", 10, 3, seed=-(10**5000))
    with pytest.raises(ValueError, match=r"sketch_size must be >= 1, got -\(an integer of 16610 bits\)"):
        rsketch.make_sketch("gaussian", 10, -(10**5000))
    with pytest.raises(ValueError, match=r"sketch_size must be >= 1, got -3$"):
        rsketch.make_sketch("gaussian", 10, -3)


@pytest.mark.parametrize("kind", ["gaussian", "srht", "srdct", "countsketch", "sparse_sign"])
@pytest.mark.parametrize("sparse_input", [False, True])
def test_a_finite_product_near_the_float_range_is_finite(kind, sparse_input):
    # The kernels sum unscaled entries and scale last: two entries of 1e308 made S @ A infinite
    # (Gaussian 26 entries, SRDCT 100, SRHT 54) where every exact entry was below 5.3e307
    import scipy.sparse as sparse

    A = np.random.default_rng(0).standard_normal((3000, 5))
    A[10, 1] = A[11, 1] = 1e308
    A[:, 3] *= 1e-310  # subnormal columns beside it: their scales are beyond the range (NaN once)
    A[:, 4] = 0.0
    A[7, 4] = 5e-324
    S = rsketch.make_sketch(kind, 3000, 100, seed=3)
    exact = S.to_dense() @ A
    assert np.isfinite(exact).all()
    got = S @ (sparse.csr_matrix(A) if sparse_input else A)
    assert np.isfinite(got).all()
    for j in range(5):  # each column to its own scale
        np.testing.assert_allclose(got[:, j], exact[:, j], rtol=1e-10, atol=1e-12 * np.abs(exact[:, j]).max())


def test_a_product_beyond_the_float_range_is_still_infinite():
    S = rsketch.CountSketch(4, 1, seed=0)
    signs = S.to_dense()[0]
    got = S @ (1e308 * signs[:, None])  # exactly 4e308: beyond the range
    assert np.isposinf(got).all()


@pytest.mark.parametrize("method", ["exact", "approx"])
@pytest.mark.parametrize("scale", [1e307, 1e-307, 2.0**-1000, 1e-310])
def test_leverage_scores_of_a_at_any_scale_are_those_of_a(method, scale):
    # the SVD of entries of 1e307 overflowed: "A is zero (rank 0)" for a full-rank A
    X = np.random.default_rng(0).standard_normal((500, 6))
    S = rsketch.LeverageSampling.from_matrix(X * scale, 50, seed=0, method=method)
    ref = rsketch.LeverageSampling.from_matrix(X, 50, seed=0, method=method)
    # subnormal X * 1e-310 holds ~40 of the 53 bits (the scaling itself is exact)
    rtol = 1e-9 if scale < 2.0**-1022 else 1e-12
    np.testing.assert_allclose(S.scores, ref.scores, rtol=rtol, atol=1e-15)
    assert np.array_equal(S.indices(), ref.indices())


@pytest.mark.parametrize("kind", ["gaussian", "srht", "srdct", "countsketch", "sparse_sign"])
def test_a_finite_float32_product_near_the_float32_range_is_finite(kind):
    # The overflow retry scaled only columns beyond float64's safe range (2^200): a float32 SRHT of
    # entries near 1e38 gave inf where every exact entry was finite
    A = np.random.default_rng(0).standard_normal((3000, 3)).astype(np.float32)
    A[10, 1] = A[11, 1] = np.float32(3e38)
    S = rsketch.make_sketch(kind, 3000, 100, seed=3, dtype=np.float32)
    exact = S.to_dense().astype(np.float64) @ A.astype(np.float64)
    assert np.abs(exact).max() < np.finfo(np.float32).max
    got = S @ A
    assert got.dtype == np.float32 and np.isfinite(got).all()
    for j in range(3):
        np.testing.assert_allclose(got[:, j], exact[:, j], rtol=1e-4, atol=1e-5 * np.abs(exact[:, j]).max())


def test_approximate_leverage_scores_of_a_rank_deficient_float32_a_count_its_float32_rank():
    # The rank rule used float64's eps for the float32 sketch: the rounding of a rank-5 float32 A counted
    # as 5 more directions, and an R^-1 that scaled it up by 1e7 made the scores sum to 19.8
    rng = np.random.default_rng(0)
    A = rng.standard_normal((2000, 5)) @ rng.standard_normal((5, 10))
    S32 = rsketch.LeverageSampling.from_matrix(A.astype(np.float32), 100, seed=0, method="approx")
    S64 = rsketch.LeverageSampling.from_matrix(A, 100, seed=0, method="approx")
    np.testing.assert_allclose(S32.scores, S64.scores, rtol=1e-4, atol=1e-7)


def test_exact_leverage_of_float32_data_keeps_a_column_of_another_scale():
    # float32's eps at max(n, p) = 100,000 cut at 1.2e-2 of s_1: a column of 1e-3 the others' scale was
    # dropped (the scores summed to 4, rows carrying only that column scored 0; float64: 0.555)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((100_000, 5))
    X[:, 4] *= 1e-3
    X32 = X.astype(np.float32)
    scores = rsketch.LeverageSampling.from_matrix(X32, 500, seed=0, method="exact").scores
    assert scores.sum() == pytest.approx(5.0, rel=1e-6)


@pytest.mark.parametrize(
    "call, what",
    [
        (lambda: rsketch.GaussianSketch(10, 2**40).reference_apply(np.ones(10)), "portable Gaussian"),
        (lambda: rsketch.GaussianSketch(2**40, 10).reference_adjoint(np.ones(10)), "portable GaussianSketch"),
        (lambda: rsketch.UniformSampling(100, 2**40).indices(np), "sampled rows of a UniformSampling"),
        (lambda: rsketch.SparseSign(2**62, 10).reference_pattern(), "portable pattern of columns"),
    ],
    ids=["reference_apply", "reference_adjoint", "indices(np)", "reference_pattern"],
)
def test_the_portable_paths_check_their_memory_as_the_fast_paths_do(call, what):
    # numpy's "Unable to allocate 8 TiB" or "array is too big", or a loop that ran until killed
    with pytest.raises(MemoryError, match=what):
        call()


def test_sparse_sign_reference_columns_of_many_nonzeros_fit_their_check():
    # an (m, s, r) one-hot took 9.7 GiB for 100 columns of 10**4 nonzeros, past the columns' check of
    # 16 r m bytes; now one (m, r) one-hot per nonzero, the same columns
    import tracemalloc

    S = rsketch.SparseSign(300, 2_000, seed=1, nnz_per_column=500)
    tracemalloc.start()
    cols = S.reference_columns(0, 40)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert np.array_equal(cols, S.columns(0, 40))
    assert peak <= 3 * 16 * 2_000 * 40  # the check's 16 r m, with room for the pattern's words


def test_the_demo_refuses_options_before_it_runs(monkeypatch, capsys):
    # python -m rsketch.demo --bogus-flag (or --help) had run the whole demo, about 6 s
    import rsketch.demo

    ran = []
    monkeypatch.setattr(rsketch.demo, "operator_table", lambda **kw: ran.append(kw) or "")
    for argv in (["--bogus-flag"], ["--help"]):
        with pytest.raises(SystemExit) as exit_info:
            rsketch.demo.main(argv)
        assert exit_info.value.code == (2 if argv[0] == "--bogus-flag" else 0)
    assert ran == [] and "usage: python -m rsketch.demo" in capsys.readouterr().out


def test_the_finiteness_check_allocates_nothing_of_the_data_s_size():
    # np.isfinite(A).all() had allocated an n x k boolean mask: n k bytes for the sampling sketches,
    # whose own memory is O(r); a finite sum proves A finite, else blocks of rows settle it
    import tracemalloc

    from rsketch._validation import check_finite

    A = np.random.default_rng(0).standard_normal((400_000, 8))
    S = rsketch.make_sketch("uniform", A.shape[0], 50, seed=0)
    S @ np.ones((A.shape[0], 1))  # once before: the first product draws the indices, loads its kernels
    tracemalloc.start()
    check_finite(A)
    S @ A
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < A.size // 8  # the mask alone was A.size bytes
    for bad in (np.nan, np.inf, -np.inf):
        B = A.copy()
        B[399_999, 7] = bad
        for view in (B, np.asfortranarray(B), B[::-1], B[1::2, 1::2]):  # each holds B[399_999, 7]
            with pytest.raises(ValueError, match="A contains NaN or infinite values"):
                check_finite(view)
    check_finite(np.full((1000, 3), 1e308))  # finite, though its sum overflows
    check_finite(np.float32([3e38, 3e38]))
    with pytest.raises(ValueError, match="NaN"):
        S @ np.where(A > 3, np.nan, A)


def test_a_left_operand_is_named_as_the_caller_wrote_it():
    # A @ S checks A.T as S.T's operand: its NaN and dtype errors had named it Z
    S = rsketch.make_sketch("gaussian", 5, 3, seed=0)
    with pytest.raises(ValueError, match="^A contains NaN or infinite values"):
        np.array([[np.nan, 1, 1]]) @ S
    with pytest.raises(TypeError, match="^A must be real-valued"):
        np.ones((1, 3), complex) @ S
    with pytest.raises(ValueError, match="^Z contains NaN"):  # S.T @ Z names Z, as the caller wrote it
        S.T @ np.array([np.nan, 1.0, 1.0])


@pytest.mark.parametrize(
    "product",
    [lambda S: S @ S, lambda S: S.T @ S.T, lambda S: S @ S.T, lambda S: S.T @ S],
    ids=["SS", "TT", "ST", "TS"],
)
def test_operators_do_not_compose(product):
    # it had read as "A must be a numeric (real) array; got dtype object"
    S = rsketch.make_sketch("sparse_sign", 5, 5, seed=0)  # square: every product is shape-compatible
    with pytest.raises(TypeError, match="sketch operators do not compose"):
        product(S)


def test_fill_transposed_checks_its_out():
    S = rsketch.GaussianSketch(50, 5, seed=0)
    out = np.empty((50, 5))
    out.flags.writeable = False  # numba's typing error had come instead
    with pytest.raises(ValueError, match="writeable C-contiguous float64 .* got a read-only float64 array"):
        S.fill_transposed(out)
    with pytest.raises(TypeError, match="out must be a NumPy array, got list"):
        S.fill_transposed([[0.0] * 5] * 50)
