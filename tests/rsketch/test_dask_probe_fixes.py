"""Fixes from a probe of rsketch's Dask paths; each test failed on the code before its fix.

Small arrays on Dask's synchronous scheduler (one thread: the chunk reads are counted exactly).
"""

import threading
import warnings

import dask
import dask.array as da
import numpy as np
import pytest

import rsketch


@pytest.fixture(autouse=True)
def synchronous():
    with dask.config.set(scheduler="synchronous"):
        yield


class Reads:
    """A pass-through for ``map_blocks`` that counts the chunks read."""

    def __init__(self):
        self.count = 0
        self._lock = threading.Lock()

    def __call__(self, block):
        with self._lock:
            self.count += 1
        return block


def counted(A, rows):
    """``A`` as a Dask array of row chunks of ``rows`` rows, and the counter of its chunk reads."""
    reads = Reads()
    return da.from_array(A, chunks=(rows, A.shape[1])).map_blocks(reads, meta=np.empty((0, 0))), reads


# ------------------------------------------------------- 1: the passes block Krylov reports are the reads
@pytest.mark.parametrize(
    "function, method, passes",
    [
        ("svd", "block_krylov", 3),
        ("svd", "block_krylov", 5),
        ("svd", "block_krylov", 7),
        ("svd", "subspace", 4),
        ("range_finder", "block_krylov", 5),
        ("range_finder", "subspace", 3),
    ],
)
def test_lowrank_passes_are_the_reads_of_a(function, method, passes):
    A = np.random.default_rng(3).standard_normal((3000, 48))
    D, reads = counted(A, 500)  # 6 chunks
    res = getattr(rsketch, function)(D, 3, oversample=5, passes=passes, method=method, seed=0)
    # block Krylov's CGS2 read A once per earlier block (Y = A @ Z was left lazy): svd(passes=7) read
    # A 15 times and reported 9
    assert reads.count == 6 * res.passes
    ref = getattr(rsketch, function)(A, 3, oversample=5, passes=passes, method=method, seed=0)
    assert res.passes == ref.passes + 1  # the estimate's probes take a pass of their own on Dask


# ------------------------------------------- 2: the error estimate's column norms at tiny (and huge) scale
@pytest.fixture(scope="module")
def decaying():
    rng = np.random.default_rng(3)
    Q = np.linalg.qr(rng.standard_normal((20, 20)))[0]
    return (rng.standard_normal((2000, 20)) * np.exp(-np.arange(20) / 3)) @ Q


@pytest.mark.parametrize("exponent", [-560, -600, 600])
@pytest.mark.parametrize("function", ["svd", "range_finder"])
def test_error_estimate_on_dask_at_any_scale(decaying, exponent, function):
    A = np.ldexp(decaying, exponent)
    ours = getattr(rsketch, function)(da.from_array(A, chunks=500), 4, seed=0)
    ref = getattr(rsketch, function)(A, 4, seed=0)
    unscaled = getattr(rsketch, function)(da.from_array(decaying, chunks=500), 4, seed=0)
    # the residual's squares underflowed to 0 (an estimate of 0 at 2**-560 and 2**-600, where in memory
    # it was 7e-167 and 6e-179)
    assert ours.error_estimate == pytest.approx(ref.error_estimate, rel=1e-10, abs=0)
    assert ours.error_estimate == pytest.approx(np.ldexp(unscaled.error_estimate, exponent), rel=1e-10, abs=0)


# -------------------------------------------- 3: qr_pivoted's rank check at tiny scale, in memory and on Dask
@pytest.fixture(scope="module")
def spike():
    """Four Gaussian columns and a fifth of one nonzero row, which a uniform sample of rows misses."""
    A = np.zeros((4000, 5))
    A[:, :4] = np.random.default_rng(0).standard_normal((4000, 4))
    A[1234, 4] = 1.0
    return A


@pytest.mark.parametrize("exponent", [-600, -300, 300])
def test_qr_pivoted_rank_check_at_any_scale_in_memory(spike, exponent):
    ref = rsketch.qr_pivoted(spike, sketch="uniform", seed=0)
    res = rsketch.qr_pivoted(np.ldexp(spike, exponent), sketch="uniform", seed=0)
    # at 2**-600 the left-out column's squared norm underflowed to 0: accepted, rank 4 and
    # ||A P - Q R|| / ||A|| = 7.9e-3; at scale 1 the check fails and geqp3 factors A (rank 5)
    assert ref.rank == res.rank == 5
    np.testing.assert_array_equal(res.perm, ref.perm)
    np.testing.assert_allclose(res.Q, ref.Q, rtol=0, atol=1e-13)
    np.testing.assert_allclose(np.ldexp(res.R, -exponent), ref.R, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("exponent", [0, -600, -300, 300])
def test_qr_pivoted_rank_check_at_any_scale_on_dask(spike, exponent):
    with pytest.raises(ValueError, match="the sketch did not reveal A's rank: it found 4 of 5 columns"):
        rsketch.qr_pivoted(da.from_array(np.ldexp(spike, exponent), chunks=1000), sketch="uniform", seed=0)


def test_qr_pivoted_of_entries_near_the_overflow_threshold_is_refused():
    # The operators now rescale an S @ A that overflowed: the sketch is finite (entries to 1.4e308), its
    # QRCP's pivots inf, and the rank came out 0 with Q R = 0 for a nonzero A, in memory and on Dask.
    A = np.random.default_rng(0).standard_normal((600, 20)) * 1e307
    with np.errstate(over="ignore"), pytest.raises(ValueError, match="column norms exceed the float64 range"):
        rsketch.qr_pivoted(A, seed=0)
    with pytest.raises(ValueError, match="the products of A are not finite"):
        rsketch.qr_pivoted(da.from_array(A, chunks=200), seed=0)


# --------------------------------------------------------- 4: lstsq's log.passes counts every pass over X
@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((4000, 6))
    return X, X @ np.arange(6.0) + rng.standard_normal(4000)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"sketch": "leverage"},  # reported 3, read 5: the scores' two passes
        {"sketch": "leverage", "method": "sketch_and_solve"},  # reported 2, read 4
        {"method": "ihs"},  # None; 71 passes in the probe
        {"method": "ihs", "sketch": "leverage"},
        {"inner_solver": "cg"},
    ],
)
@pytest.mark.parametrize("scale", [1.0, 2.0**700, 2.0**199.5])
def test_lstsq_log_passes_are_the_reads_of_x(problem, options, scale):
    X, y = problem
    # 2**700: X is rescaled (the sketch, X's largest entry, the sketch again); 2**199.5: the sketch
    # leaves the safe range, X's largest entry is read and is inside it (two passes, reported as one)
    X = X / np.abs(X).max() * scale
    D, reads = counted(X, 1000)  # 4 chunks: a sampled sketch reads all (it reads only chunks it samples)
    res = rsketch.lstsq(D, y, seed=0, **options)
    assert res.converged
    assert reads.count == 4 * res.log.passes


# ------------------------------------------------ 5: Dask arrays of np.matrix chunks give the ndarray results
@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix's own
def test_dask_array_of_matrix_chunks_is_read_as_plain_arrays():
    X = np.random.default_rng(0).standard_normal((3000, 4))
    y = X.sum(axis=1) + 1
    M = da.from_array(np.asmatrix(X), chunks=(700, 4))
    D = da.from_array(X, chunks=(700, 4))
    assert type(M._meta) is np.matrix  # the chunks are np.matrix ("*" a matrix product)
    for kind in ("uniform", "srht", "gaussian"):
        S = rsketch.make_sketch(kind, 3000, 100, seed=1)
        SM = (S @ M).compute()
        assert type(SM) is np.ndarray
        np.testing.assert_array_equal(SM, (S @ D).compute())
    np.testing.assert_array_equal(
        rsketch.lstsq(M, y, seed=0, sketch="uniform").coef, rsketch.lstsq(D, y, seed=0, sketch="uniform").coef
    )
    ours, ref = rsketch.svd(M, 2, seed=0), rsketch.svd(X, 2, seed=0)
    np.testing.assert_allclose(ours.s, ref.s, rtol=1e-12)
    assert type(ours.U.compute()) is np.ndarray
    fit = rsketch.SketchedLinearRegression(random_state=0).fit
    np.testing.assert_array_equal(fit(M, y).coef_, fit(D, y).coef_)
    assert type(fit(M, y).predict(M).compute()) is np.ndarray
    sampled = [rsketch.dask.leverage_sampling(A, 100, seed=0).indices() for A in (M, D)]
    np.testing.assert_array_equal(*sampled)
    assert rsketch.qr_pivoted(M, seed=0).rank == 4


# ----------------------------------------------------------- 6: qr_pivoted keeps float32 for Dask input
def test_qr_pivoted_of_float32_dask_input_returns_float32():
    A = np.random.default_rng(0).standard_normal((5000, 12)).astype(np.float32)
    ref = rsketch.qr_pivoted(A, seed=0)
    res = rsketch.qr_pivoted(da.from_array(A, chunks=1000), seed=0)
    assert ref.R.dtype == res.R.dtype == res.Q.dtype == np.float32  # R was float64
    np.testing.assert_array_equal(res.perm, ref.perm)
    np.testing.assert_allclose(res.R, ref.R, rtol=0, atol=1e-5 * np.abs(ref.R).max())
    Q = res.Q.compute()
    assert np.linalg.norm(A[:, res.perm] - Q @ res.R) <= 1e-6 * np.linalg.norm(A)


# ------------------------------------------------ 7: no RuntimeWarning for valid data near the float range
@pytest.mark.parametrize("method", ["precondition", "sketch_and_solve", "ihs"])
@pytest.mark.parametrize("kind", ["uniform", "leverage", "sparse_sign", "countsketch", "gaussian", "srht"])
@pytest.mark.parametrize("scale", [1e250, 1e307])
def test_lstsq_on_dask_near_the_float_range_warns_nothing(problem, kind, method, scale):
    X, y = problem
    y = X @ np.full(6, 0.125) + 1e-3 * (y - X @ np.arange(6.0))  # entries of X and y below 5
    if kind == "leverage" and scale == 1e307:  # the scores' SRHT sketch overflows: said (not LinAlgError)
        with pytest.raises(ValueError, match=r"too large for its approximate leverage scores.*scale A"):
            Xd = da.from_array(X * scale, chunks=1000)
            rsketch.lstsq(Xd, y * scale, seed=0, sketch=kind, method=method)
        return
    ref = rsketch.lstsq(da.from_array(X, chunks=1000), y, seed=0, sketch=kind, method=method)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the products overflowed (the solver rescales), and warned
        Xd = da.from_array(X * scale, chunks=1000)
        res = rsketch.lstsq(Xd, y * scale, seed=0, sketch=kind, method=method)
    assert res.converged
    np.testing.assert_allclose(res.coef, ref.coef, rtol=1e-6)


@pytest.mark.parametrize("kind", ["gaussian", "srht", "srdct"])
def test_a_finite_sketch_near_the_float_range_is_finite_on_dask(kind):
    # a chunk's unscaled sums overflowed (SRHT: 54 entries inf) where every exact entry of S @ A
    # was below 5.3e307; the chunk is applied again with its columns scaled, as in memory
    A = np.random.default_rng(0).standard_normal((3000, 4))
    A[10, 1] = A[11, 1] = 1e308
    A[:, 3] *= 1e-310  # a subnormal column beside it: its scale is beyond the range (NaN once)
    S = rsketch.make_sketch(kind, 3000, 100, seed=3)
    exact = S.to_dense() @ A
    with dask.config.set(scheduler="synchronous"):
        got = (S @ da.from_array(A, chunks=1000)).compute()
    assert np.isfinite(got).all()
    for j in range(4):
        np.testing.assert_allclose(got[:, j], exact[:, j], rtol=1e-10, atol=1e-12 * np.abs(exact[:, j]).max())


def test_dask_leverage_scores_of_a_rank_deficient_float32_a_count_its_float32_rank():
    # float64's eps for float32 chunks: the rounding of a rank-5 A counted as 5 more directions, and
    # R^-1 scaled it up by 1e7 (the scores summed to about 20 where the float64 ones sum to 4.2)
    rng = np.random.default_rng(0)
    A = rng.standard_normal((2000, 5)) @ rng.standard_normal((5, 10))
    key = (1, 2)
    s32 = rsketch.dask.approximate_leverage(da.from_array(A.astype(np.float32), chunks=500), key)
    s64 = rsketch.dask.approximate_leverage(da.from_array(A, chunks=500), key)
    np.testing.assert_allclose(s32, s64, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize(
    "S",
    [
        rsketch.GaussianSketch(1000, 2**40),
        rsketch.SparseSign(1000, 2**32),
        rsketch.UniformSampling(1000, 2**40),
    ],
    ids=["gaussian", "sparse_sign", "uniform"],
)
def test_a_dask_sketch_too_large_for_memory_is_refused_as_the_graph_is_built(S):
    # S @ A on Dask skipped the memory check: numpy's "Unable to allocate 16 TiB" inside compute()
    A = da.ones((1000, 2), chunks=(500, 2))
    what = rf"{type(S).__name__} @ A on Dask with sketch_size={S.sketch_size}"
    with pytest.raises(MemoryError, match=what):
        S @ A  # lazy: refused before anything runs


def test_lstsq_on_dask_refuses_a_first_pass_too_large_for_memory():
    X, y = da.ones((1000, 2), chunks=(500, 2)), da.ones(1000, chunks=500)
    with pytest.raises(MemoryError, match=r"first pass over a Dask X \(1000 x 2\) with sketch_size=1099511"):
        rsketch.lstsq(X, y, sketch="gaussian", sketch_size=2**40)


def test_from_npy_refuses_what_is_not_one_real_array(tmp_path):
    from rsketch.dask import from_npy
    from rsketch.dask._io import MAX_CHUNKS

    np.savez(tmp_path / "a.npz", x=np.ones((4, 2)))  # had met "'NpzFile' object has no attribute 'ndim'"
    with pytest.raises(ValueError, match=r"path must be a \.npy file.*NpzFile"):
        from_npy(tmp_path / "a.npz", chunk_rows=2)
    np.save(tmp_path / "c.npy", np.ones((4, 2), dtype=complex))
    with pytest.raises(TypeError, match="path must hold real numbers, got dtype complex128"):
        from_npy(tmp_path / "c.npy", chunk_rows=2)
    # one task a row: 200,000 rows had taken 59 s and 1.2 GB to build the graph
    np.save(tmp_path / "tall.npy", np.zeros((MAX_CHUNKS + 1, 1)))
    with pytest.raises(ValueError, match=r"chunk_rows=1 makes 100,001 chunks.*chunk_rows >= 2"):
        from_npy(tmp_path / "tall.npy", chunk_rows=1)


def test_approximate_leverage_checks_its_arguments():
    from rsketch.dask import approximate_leverage

    A = da.from_array(np.random.default_rng(0).standard_normal((100, 3)), chunks=30)
    # (1.9, 1) had given the scores of (1, 1), (2**32, 1) those of (0, 1), and (1, 2, 3) those of (1, 2)
    bad = (((1.9, 1), TypeError), ((2**32, 1), ValueError), ((1, 2, 3), TypeError), (0, TypeError))
    for key, error in bad:
        with pytest.raises(error, match="key must be two integers"):
            approximate_leverage(A, key)
    with pytest.raises(TypeError, match="A must be a dask.array.Array, got ndarray"):
        approximate_leverage(np.ones((10, 2)), (1, 2))  # had been "no attribute 'rechunk'"
    np.testing.assert_allclose(
        approximate_leverage(A, (1, 2)), approximate_leverage(A, (np.uint32(1), np.int64(2))), rtol=0
    )
