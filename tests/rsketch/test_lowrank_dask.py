"""range_finder, svd and qr_pivoted of tall Dask arrays (issue 21, item 6), on Dask's threaded scheduler.

The same seed draws the same sketch as in memory, and the passes are the same products summed over
row chunks, so the results agree with the in-memory ones to rounding; ``svd_compressed`` is the peer.
"""

import warnings

import dask
import dask.array as da
import numpy as np
import pytest

import rsketch

M, N = 6000, 40


@pytest.fixture(scope="module")
def matrix():
    rng = np.random.default_rng(0)
    s = np.exp(-np.arange(N) / 4)
    U = np.linalg.qr(rng.standard_normal((M, N)))[0]
    V = np.linalg.qr(rng.standard_normal((N, N)))[0]
    return (U * s) @ V.T, s


@pytest.mark.parametrize("passes, method", [(1, "subspace"), (4, "subspace"), (3, "block_krylov")])
def test_svd_equals_in_memory(matrix, passes, method):
    A, _ = matrix
    Ad = da.from_array(A, chunks=((1000, 2500, 7, 2493), (25, 15)))
    with dask.config.set(scheduler="threads"):
        res = rsketch.svd(Ad, 8, passes=passes, method=method, seed=3)
        U = res.U.compute()
    ref = rsketch.svd(A, 8, passes=passes, method=method, seed=3)
    # in memory the estimate's probes ride in the first product; on Dask they take a pass of their own
    assert isinstance(res.U, da.Array) and res.passes == ref.passes + 1
    np.testing.assert_allclose(res.s, ref.s, rtol=1e-12)
    np.testing.assert_allclose(U, ref.U, atol=1e-10)  # same signs (svd_flip on U)
    np.testing.assert_allclose(res.Vt, ref.Vt, atol=1e-10)
    assert res.error_estimate == pytest.approx(ref.error_estimate, rel=1e-10)


def test_range_finder_is_orthonormal_and_matches_in_memory(matrix):
    A, _ = matrix
    Ad = da.from_array(A, chunks=(1500, N))
    with dask.config.set(scheduler="threads"):
        res = rsketch.range_finder(Ad, 10, passes=3, seed=1)
        Q = res.Q.compute()
    ref = rsketch.range_finder(A, 10, passes=3, seed=1)
    np.testing.assert_allclose(Q.T @ Q, np.eye(20), atol=1e-14)
    np.testing.assert_allclose(Q @ (Q.T @ A), ref.Q @ (ref.Q.T @ A), atol=1e-12)


def test_svd_against_dask_svd_compressed(matrix):
    A, s = matrix
    k = 8
    Ad = da.from_array(A, chunks=(1500, N))
    optimum = np.sqrt(np.sum(s[k:] ** 2))
    with dask.config.set(scheduler="threads"):
        # Four passes each: svd_compressed's sketch, one power iteration (two), and its projection.
        ours = rsketch.svd(Ad, k, passes=3, error_probes=False, seed=0)
        ours_err = np.linalg.norm(A - (ours.U.compute() * ours.s) @ ours.Vt)
        U, sv, Vt = da.linalg.svd_compressed(Ad, k, n_power_iter=1, seed=0, compute=True)
        theirs_err = np.linalg.norm(A - (U.compute() * sv.compute()) @ Vt.compute())
    assert ours.passes == 4
    assert optimum <= ours_err <= 1.001 * optimum
    assert ours_err <= theirs_err * (1 + 1e-6)
    np.testing.assert_allclose(ours.s, sv.compute(), rtol=1e-6)


def test_qr_pivoted_equals_in_memory_and_is_accurate():
    rng = np.random.default_rng(5)
    A = rng.standard_normal((8000, 30)) * np.logspace(0, -10, 30)  # condition number 1e10
    Ad = da.from_array(A, chunks=(3000, 30))
    with dask.config.set(scheduler="threads"):
        res = rsketch.qr_pivoted(Ad, seed=2)
        Q = res.Q.compute()
    ref = rsketch.qr_pivoted(A, seed=2)
    np.testing.assert_array_equal(res.perm, ref.perm)
    assert res.rank == ref.rank == 30
    u = np.finfo(np.float64).eps
    assert np.linalg.norm(A[:, res.perm] - Q @ res.R) <= 10 * u * np.linalg.norm(A)
    assert np.linalg.norm(Q.T @ Q - np.eye(30), 2) <= 1e-14
    np.testing.assert_allclose(res.R, ref.R, rtol=1e-10, atol=1e-10 * np.abs(ref.R).max())


def test_qr_pivoted_checks_the_sketchs_rank_on_dask_input():
    # As in memory: a rank below n is checked against the columns it leaves out (two passes).
    rng = np.random.default_rng(6)
    A = rng.standard_normal((3000, 5)) @ rng.standard_normal((5, 12))  # rank 5, found
    C = np.zeros((400, 8))  # coherent: a uniform sample of 16 rows misses three of its directions
    C[:5] = rng.standard_normal((5, 8))
    C[5:, :3] = 1e-3 * rng.standard_normal((395, 3))
    with dask.config.set(scheduler="threads"):
        res = rsketch.qr_pivoted(da.from_array(A, chunks=(1000, 12)), seed=0)
        assert res.rank == 5
        assert np.linalg.norm(A[:, res.perm] - res.Q.compute() @ res.R) <= 1e-13 * np.linalg.norm(A)
        with pytest.raises(ValueError, match="did not reveal A's rank: it found [0-7] of 8"):
            rsketch.qr_pivoted(da.from_array(C, chunks=(100, 8)), sketch="uniform", sketch_size=16, seed=0)
        # no sketch is smaller than a nearly square A: geqp3 of it, Q still a Dask array
        B = np.array([[1.0, 2.0], [3.0, 4.0]])
        res = rsketch.qr_pivoted(da.from_array(B, chunks=(1, 2)), seed=0)
        assert isinstance(res.Q, da.Array) and res.rank == 2
        assert np.abs(B[:, res.perm] - res.Q.compute() @ res.R).max() <= 1e-14


@pytest.mark.parametrize("shape", [(40, 30), (30, 400), (1, 30)])
def test_block_krylov_on_dask_stops_where_the_space_fills_min_m_n(shape):
    # As in memory, the block Krylov space takes at most min(m, n) // l - 1 rounds: with more, the
    # basis had more columns than rows and svd's singular values came out too large (12.9 for 11.9).
    X = np.random.default_rng(1).standard_normal(shape)
    k = min(5, *shape)
    with dask.config.set(scheduler="threads"):
        Q = rsketch.range_finder(da.from_array(X, chunks=(max(1, shape[0] // 2), -1)), k, passes=7, seed=0).Q
        res = rsketch.svd(da.from_array(X, chunks=(max(1, shape[0] // 2), -1)), k, passes=7, seed=0)
    ref = rsketch.svd(X, k, passes=7, seed=0)
    assert Q.shape[1] <= min(shape)
    np.testing.assert_allclose(res.s, np.linalg.svd(X, compute_uv=False)[:k], rtol=1e-10)
    np.testing.assert_allclose(res.s, ref.s, rtol=1e-12)


@pytest.mark.parametrize("passes", [1, 2, 3])
def test_nan_in_dask_input_is_named_by_its_rows(passes):
    C = np.random.default_rng(0).standard_normal((100, 30))
    C[57, 3] = np.nan
    with (
        dask.config.set(scheduler="threads"),
        pytest.raises(ValueError, match=r"A \(rows 40:60\) contains NaN"),
    ):
        rsketch.svd(da.from_array(C, chunks=(20, 30)), 5, passes=passes, method="subspace", seed=0)


@pytest.mark.parametrize(("passes", "method"), [(1, "subspace"), (3, "subspace"), (3, "block_krylov")])
def test_inf_in_dask_input_is_named_without_a_numpy_warning(passes, method):
    # the first products (A @ S.T, A @ Z) ran in the scheduler's threads outside any errstate, and
    # NumPy's "invalid value encountered in matmul" came before the error
    C = np.random.default_rng(0).standard_normal((1000, 4))
    C[555, 2] = np.inf
    with (
        warnings.catch_warnings(),
        dask.config.set(scheduler="threads"),
        pytest.raises(ValueError, match=r"A \(rows 300:600\) contains NaN or infinite values"),
    ):
        warnings.simplefilter("error")
        rsketch.svd(da.from_array(C, chunks=(300, 4)), 2, passes=passes, method=method, seed=0)


def test_qr_pivoted_on_dask_refuses_nan_the_sketch_did_not_read():
    # a uniform sample of the rows missed row 555: Q and R came back NaN with no error
    B = np.random.default_rng(0).standard_normal((600, 30))
    B[555, 3] = np.nan
    S = rsketch.make_sketch("uniform", 600, 60, seed=1)
    with (
        dask.config.set(scheduler="threads"),
        pytest.raises(ValueError, match=r"A \(rows 500:600\) contains NaN"),
    ):
        rsketch.qr_pivoted(da.from_array(B, chunks=100), sketch=S)


def test_dask_svd_at_any_scale():
    # the basis' Gram and the estimate's squares overflowed from entries of 1e154 ("scale A"),
    # where the in-memory svd works: Y is scaled by a power of two, the norms in a scaled sum
    A = np.random.default_rng(0).uniform(-1, 1, (600, 20))
    with dask.config.set(scheduler="threads"):
        base = rsketch.svd(da.from_array(A, chunks=100), 3, seed=0)
        for scale in (1e154, 1e300):
            res = rsketch.svd(da.from_array(A * scale, chunks=100), 3, seed=0)
            np.testing.assert_allclose(res.s / scale, base.s, rtol=1e-13)
            assert res.error_estimate / scale == pytest.approx(base.error_estimate, rel=1e-12)


def test_unsupported_dask_calls_say_so():
    Ad = da.ones((100, 5), chunks=(30, 5))
    with pytest.raises(ValueError, match="not available for Dask"):
        rsketch.range_finder(Ad, 2, tol=1e-3)
    with pytest.raises(ValueError, match="not available for Dask"):  # svd ignored tol on Dask input
        rsketch.svd(Ad, 2, tol=1e-3)
    with pytest.raises(TypeError, match="Dask array"):
        rsketch.eigh(da.eye(10, chunks=5), 2)
    with pytest.raises(ValueError, match="tall"):
        rsketch.qr_pivoted(da.ones((5, 10), chunks=(5, 10)))
    with pytest.raises(ValueError, match="2-D"):
        rsketch.svd(da.ones(10, chunks=5), 1)


def test_on_a_distributed_cluster_against_svd_compressed(matrix):
    # An in-process LocalCluster (threads): the distributed scheduler, persist and gathers to the
    # client, without the cost of starting worker processes (test_dask.py's process cluster covers those).
    from distributed import Client, LocalCluster

    A, s = matrix
    k = 8
    Ad = da.from_array(A, chunks=(1500, N))
    optimum = np.sqrt(np.sum(s[k:] ** 2))
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=False,
            dashboard_address=None,
            scheduler_kwargs={"dashboard_address": ":0"},  # HTTP on any free port (test_dask.py)
        ) as cluster,
        Client(cluster),  # the default scheduler inside the block
    ):
        ours = rsketch.svd(Ad, k, passes=3, error_probes=False, seed=0)
        ours_U = ours.U.compute()
        U, sv, Vt = da.linalg.svd_compressed(Ad, k, n_power_iter=1, seed=0)
        U, sv, Vt = dask.compute(U, sv, Vt)
        qr = rsketch.qr_pivoted(Ad, seed=2)
        Q = qr.Q.compute()
    ref = rsketch.svd(A, k, passes=3, error_probes=False, seed=0)
    np.testing.assert_allclose(ours.s, ref.s, rtol=1e-12)
    np.testing.assert_allclose(ours_U, ref.U, atol=1e-10)
    ours_err = np.linalg.norm(A - (ours_U * ours.s) @ ours.Vt)
    assert optimum <= ours_err <= np.linalg.norm(A - (U * sv) @ Vt) * (1 + 1e-6)
    assert np.linalg.norm(A[:, qr.perm] - Q @ qr.R) <= 10 * np.finfo(float).eps * np.linalg.norm(A)


def test_a_test_block_as_wide_as_a_gives_its_range_exactly():
    A = np.random.default_rng(0).standard_normal((100, 3))  # a square sparse sign of seed 2 has rank 2
    with dask.config.set(scheduler="threads"):
        res = rsketch.svd(da.from_array(A, chunks=(30, 3)), 3, passes=1, seed=2)
    np.testing.assert_allclose(res.s, np.linalg.svd(A, compute_uv=False), rtol=1e-12)


def test_qr_pivoted_of_a_zero_array_returns_a_dask_q():
    # rank 0 returned a NumPy Q of no column where every other rank returns a Dask one
    with dask.config.set(scheduler="threads"):
        res = rsketch.qr_pivoted(da.zeros((100, 5), chunks=(30, 5)), seed=0)
        assert res.rank == 0 and isinstance(res.Q, da.Array) and res.Q.shape == (100, 0)
        assert res.Q.compute().shape == (100, 0) and res.R.shape == (0, 5)
