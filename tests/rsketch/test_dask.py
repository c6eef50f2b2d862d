"""rsketch on Dask (issue 19): lazy S @ A over chunks, out-of-core inputs, distributed Monte Carlo.

One ``LocalCluster`` of two single-thread worker processes serves the whole file (a session
fixture); the tests parametrised by ``scheduler`` run on it and on Dask's threaded scheduler.
"""

import math
import multiprocessing
import os
import pickle
import signal
import threading
import time
import tracemalloc
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import dask
import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
import sklearn.base as sklearn_base
import threadpoolctl
from distributed import Client, LocalCluster

import rsketch
from rsketch.dask import from_npy, leverage_sampling
from rsketch.experiments.raskutti_mahoney import StudyConfig, run_study
from rsketch.operators.sampling import approximate_leverage as in_memory_leverage

KINDS = ["countsketch", "sparse_sign", "gaussian", "srht", "srdct", "uniform"]
CHUNKINGS = {
    "one": lambda n, k: (n, k),
    "regular": lambda n, k: (n // 4, k),
    "irregular": lambda n, k: ((1, n // 3 - 1, 7, n - n // 3 - 7), (k - k // 2, k // 2)),
    "tiny": lambda n, k: (37, 2),
}


#: The scheduler serves HTTP (health, metrics) even without its dashboard, by default on port 8787:
#: a second cluster in the session (test_lowrank_dask.py's) or the user's own took it and the
#: scheduler warned. Any free port will do.
NO_FIXED_PORT = {"dashboard_address": ":0"}


@pytest.fixture(scope="session")
def client():
    # Dask's nanny gives each worker one BLAS thread; BLAS products (a Gaussian sketch held dense, the
    # small SVDs) are bitwise only for one thread count, so the workers get this process's.
    pools = threadpoolctl.threadpool_info()
    blas = str(pools[0]["num_threads"]) if pools else "1"
    environ = {name: blas for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    with (
        dask.config.set({"distributed.nanny.pre-spawn-environ": environ}),
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            memory_limit="1GiB",
            scheduler_kwargs=NO_FIXED_PORT,
        ) as cluster,
        Client(cluster, set_as_default=False) as c,
    ):
        yield c


@pytest.fixture(params=["threads", "cluster"])
def scheduler(request):
    """What ``compute(scheduler=...)`` takes: Dask's thread pool or the LocalCluster's client."""
    return "threads" if request.param == "threads" else request.getfixturevalue("client")


def relative_error(got, ref):
    return np.linalg.norm(got - ref) / np.linalg.norm(ref)


# ------------------------------------------------------------------------------------------ S @ A
@pytest.mark.parametrize("chunking", list(CHUNKINGS))
@pytest.mark.parametrize("kind", KINDS)
def test_sketch_equals_in_memory_for_every_chunking(kind, chunking):
    n, k, r = 3000, 5, 120
    A = np.random.default_rng(1).standard_normal((n, k))
    S = rsketch.make_sketch(kind, n, r, seed=11)
    SA = S @ da.from_array(A, chunks=CHUNKINGS[chunking](n, k))
    assert isinstance(SA, da.Array) and SA.shape == (r, k) and SA.chunks[0] == (r,)
    got = SA.compute(scheduler="threads")
    assert relative_error(got, S @ A) <= 1e-12
    if kind == "uniform":
        np.testing.assert_array_equal(got, S @ A)  # a gather times a scale: the same bits


@pytest.mark.parametrize("kind", KINDS)
def test_sketch_on_the_cluster_is_bitwise_the_threaded_result(kind, client):
    # The tree of partial sums is fixed by the chunking: any scheduler gives the same bits.
    n, k = 2000, 3
    A = np.random.default_rng(2).standard_normal((n, k))
    S = rsketch.make_sketch(kind, n, 64, seed=5)
    SA = S @ da.from_array(A, chunks=(300, 2))
    on_cluster = SA.compute(scheduler=client)
    np.testing.assert_array_equal(on_cluster, SA.compute(scheduler="threads"))
    assert relative_error(on_cluster, S @ A) <= 1e-12


def test_vector_and_float32_and_integer_input():
    n = 1000
    S = rsketch.SparseSign(n, 40, seed=0)
    x = np.arange(n, dtype=np.float64)
    Sx = S @ da.from_array(x, chunks=300)
    assert Sx.shape == (40,) and relative_error(Sx.compute(), S @ x) <= 1e-12
    A32 = np.random.default_rng(0).standard_normal((n, 3)).astype(np.float32)
    SA32 = S @ da.from_array(A32, chunks=250)
    assert SA32.dtype == np.float32 and SA32.compute().dtype == np.float32
    assert relative_error(SA32.compute(), S @ A32) <= 1e-6
    Ai = np.arange(3 * n).reshape(n, 3)
    assert relative_error((S @ da.from_array(Ai, chunks=400)).compute(), S @ Ai) <= 1e-12


def test_adjoint_and_column_blocks_unchanged():
    S = rsketch.SRHT(500, 30, seed=4)
    Z = np.random.default_rng(0).standard_normal((30, 2))
    np.testing.assert_allclose(S.T @ Z, S.to_dense().T @ Z, atol=1e-12)
    np.testing.assert_array_equal(S[:, 100:140], S.to_dense()[:, 100:140])


def test_srht_on_dask_is_unbiased():
    # E[S^T S] = I for the chunk-by-chunk SRHT (n = 6 is zero-padded to 8; the chunks 2, 3, 1 meet
    # the aligned blocks at every offset): the Monte Carlo mean over 600 seeds is within 5 standard
    # errors entry by entry, and exact where the draws do not vary.
    n, r, draws = 6, 4, 600
    E = da.from_array(np.eye(n), chunks=((2, 3, 1), (n,)))
    dense = dask.compute(
        *[rsketch.SRHT(n, r, seed=s) @ E for s in np.random.SeedSequence(2024).spawn(draws)],
        scheduler="sync",
    )
    G = np.stack([D.T @ D for D in dense])
    mean, se = G.mean(axis=0), G.std(axis=0) / math.sqrt(draws)
    dev = np.abs(mean - np.eye(n))
    exact = se < 1e-12
    assert (dev[exact] < 1e-12).all() and (dev[~exact] < 5 * se[~exact]).all()


def test_srht_on_dask_is_a_subspace_embedding():
    n, p, r = 4096, 20, 400
    U = np.linalg.qr(np.random.default_rng(7).standard_normal((n, p)))[0]
    Ud = da.from_array(U, chunks=(1000, p))  # chunks not aligned to powers of two
    eps = 2 * math.sqrt(p / r)
    sketches = dask.compute(*[rsketch.SRHT(n, r, seed=s) @ Ud for s in range(50)], scheduler="threads")
    ok = sum(
        bool(((s := np.linalg.svd(SU, compute_uv=False)).min() >= 1 - eps) & (s.max() <= 1 + eps))
        for SU in sketches
    )
    assert ok >= 48


def test_sampling_reads_only_the_chunks_holding_sampled_rows():
    n, step = 1000, 100
    S = rsketch.UniformSampling(n, 3, seed=0, replace=False)
    hit = set(S.indices() // step)
    A = np.random.default_rng(0).standard_normal((n, 2))

    def chunk(i):
        if i not in hit:
            raise AssertionError(f"chunk {i} holds no sampled row and was read")
        return A[i * step : (i + 1) * step]

    parts = [da.from_delayed(dask.delayed(chunk)(i), (step, 2), np.float64) for i in range(n // step)]
    got = (S @ da.concatenate(parts)).compute(scheduler="sync")
    np.testing.assert_array_equal(got, S @ A)


def test_leverage_sampling_on_dask_matches_in_memory():
    A = np.random.default_rng(3).standard_normal((3000, 6))
    A[:5] *= 50  # a few heavy rows
    Ad = da.from_array(A, chunks=(700, 6))
    S = leverage_sampling(Ad, 200, seed=9)
    ref = rsketch.LeverageSampling.from_matrix(A, 200, method="approx", seed=9)
    np.testing.assert_allclose(S.scores, in_memory_leverage(A, rsketch.SRHT(1, 1, seed=9).key), rtol=1e-9)
    np.testing.assert_allclose(S.scores, ref.scores, rtol=1e-9)
    np.testing.assert_array_equal(S.indices(), ref.indices())
    np.testing.assert_allclose(
        (S @ Ad).compute(), ref @ A, rtol=1e-9
    )  # the scales carry the scores' rounding


def test_leverage_sampling_of_column_chunks_and_bad_sketch_size():
    A = np.random.default_rng(4).standard_normal((2000, 6))
    S = leverage_sampling(da.from_array(A, chunks=(500, 2)), 100, seed=0)
    ref = leverage_sampling(da.from_array(A, chunks=500), 100, seed=0)
    np.testing.assert_array_equal(S.probabilities, ref.probabilities)
    np.testing.assert_array_equal(S.indices(), ref.indices())

    # sketch_size is checked before the two passes: reading any chunk here fails.
    def unreadable(block):
        raise AssertionError("a chunk was read")

    Ad = da.from_array(A, chunks=500).map_blocks(unreadable, dtype=A.dtype)
    for bad, err in [
        (0, ValueError),
        (-3, ValueError),
        (2**63, ValueError),
        (10**17, MemoryError),
        (2.5, TypeError),
    ]:
        with pytest.raises(err, match="sketch_size"):
            leverage_sampling(Ad, bad, seed=0)


# ------------------------------------------------------------------------------------------ bad input
def test_dask_input_errors_name_the_argument():
    S = rsketch.CountSketch(100, 10, seed=0)
    x = da.arange(200, chunks=50).astype(float)
    with pytest.raises(ValueError, match=r"compute_chunk_sizes\(\)"):
        S @ x[x > 99]
    with pytest.raises(ValueError, match="A must have 100 rows"):
        S @ da.ones((101, 2), chunks=50)
    with pytest.raises(TypeError, match="complex"):
        S @ da.ones((100, 2), chunks=50, dtype=complex)
    with pytest.raises(ValueError, match="empty"):
        S @ da.ones((100, 0), chunks=50)


@pytest.mark.parametrize("kind", KINDS)
def test_nan_found_while_computing_raises(kind, scheduler):
    A = np.ones((400, 2))
    S = rsketch.make_sketch(kind, 400, 20, seed=0)
    A[S.indices()[0] if kind == "uniform" else 250, 1] = np.nan
    SA = S @ da.from_array(A, chunks=100)  # lazy: nothing is read yet
    with pytest.raises(ValueError, match="A.* contains NaN or infinite values"):
        SA.compute(scheduler=scheduler)


# ------------------------------------------------------------------------------------------ out of core
def test_sketch_from_zarr_and_from_npy(tmp_path):
    zarr = pytest.importorskip("zarr")  # the dask extra installs it
    n, k = 5000, 4
    A = np.random.default_rng(4).standard_normal((n, k))
    store = zarr.open_array(str(tmp_path / "X.zarr"), mode="w", shape=A.shape, chunks=(1200, k), dtype="f8")
    store[:] = A
    np.save(tmp_path / "X.npy", A)
    S = rsketch.SparseSign(n, 100, seed=3)
    ref = S @ A
    Xz = da.from_zarr(str(tmp_path / "X.zarr"))
    Xn = from_npy(tmp_path / "X.npy", chunk_rows=999)
    assert Xn.chunks[0] == (999,) * 5 + (5,)
    for X in (Xz, Xn):
        assert relative_error((S @ X).compute(scheduler="threads"), ref) <= 1e-12
    # The graph carries paths and row ranges, not the data: nothing grows with n.
    assert len(pickle.dumps(dict((S @ Xn).__dask_graph__()))) < A.nbytes / 10


# ------------------------------------------------------------------------------------------ Monte Carlo
def _efficiency_problem(n=3000, p=8):
    rng = np.random.default_rng(6)
    X = rng.standard_normal((n, p))
    return X, X @ np.ones(p) + rng.standard_normal(n)


def _same_draws(a, b):
    return all(
        np.array_equal(getattr(a, f), getattr(b, f), equal_nan=True)
        for f in ("pe_draws", "re_draws", "wc_draws")
    ) and (a.pe, a.pe_ci, a.re_ci, a.wc_ci) == (b.pe, b.pe_ci, b.re_ci, b.wc_ci)


@pytest.mark.parametrize("method", ["closed_form", "simulate"])
@pytest.mark.parametrize("kind", ["gaussian", "srht", "sparse_sign", "leverage"])
def test_efficiency_on_the_cluster_is_bitwise_serial(kind, method, client):
    X, y = _efficiency_problem()
    kw = dict(sketch=kind, sketch_size=150, y=y, n_sketches=13, seed=3, method=method, n_noise=10)
    assert _same_draws(rsketch.efficiency(X, executor=client, **kw), rsketch.efficiency(X, **kw))


def test_efficiency_on_executors_is_bitwise_serial():
    X, y = _efficiency_problem()
    kw = dict(sketch="gaussian", sketch_size=150, y=y, n_sketches=9, seed=4)
    serial = rsketch.efficiency(X, **kw)
    with ThreadPoolExecutor(3) as threads:
        assert _same_draws(rsketch.efficiency(X, executor=threads, **kw), serial)
    # fork() after numba's OpenMP threads is unsafe: process pools use the spawn context.
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as processes:
        assert _same_draws(rsketch.efficiency(X, executor=processes, **kw), serial)
    with pytest.raises(TypeError, match="executor must be"):
        rsketch.efficiency(X, executor="local", **kw)


def test_raskutti_mahoney_study_on_the_cluster_is_bitwise_serial(client):
    config = StudyConfig(n=200, p=5, sizes=(20, 60), designs=("t3",), n_sketches=6)
    serial, spread = run_study(config, progress=False), run_study(config, progress=False, executor=client)
    for a, b in zip(serial, spread, strict=True):
        a.pop("seconds"), b.pop("seconds")
        assert a.keys() == b.keys()
        assert all(a[k] == b[k] or (a[k] != a[k] and b[k] != b[k]) for k in a)  # NaN equals NaN here


def test_killing_a_worker_mid_run_gives_the_serial_result(client):
    # One worker process is killed while it holds draws: Dask recomputes its blocks elsewhere (or
    # after the nanny restarts it), and the numbers are still the serial ones.
    X, y = _efficiency_problem(n=40_000, p=10)
    kw = dict(sketch="sparse_sign", sketch_size=400, y=y, n_sketches=48, seed=8)
    serial = rsketch.efficiency(X, **kw)
    out = {}
    run = threading.Thread(target=lambda: out.update(result=rsketch.efficiency(X, executor=client, **kw)))
    run.start()
    busy, deadline = [], time.monotonic() + 60
    while not busy and time.monotonic() < deadline:
        busy = [w for w, keys in client.processing().items() if any("draw_block" in str(k) for k in keys)]
        time.sleep(0.005)
    assert busy, "no worker took a block of draws"
    victim = client.run(os.getpid, workers=busy[:1])[busy[0]]
    assert run.is_alive()  # the run is in the middle
    os.kill(victim, signal.SIGKILL)
    run.join(180)
    assert not run.is_alive() and _same_draws(out["result"], serial)
    client.wait_for_workers(2, timeout=60)  # the nanny restarts it for the tests that follow


# ------------------------------------------------------------------------------------------ lstsq
def _conditioned_problem(n, p, kappa, seed=0):
    rng = np.random.default_rng(seed)
    U = np.linalg.qr(rng.standard_normal((n, p)))[0]
    V = np.linalg.qr(rng.standard_normal((p, p)))[0]
    X = (U * np.logspace(0, -math.log10(kappa), p)) @ V.T
    return X, X @ rng.standard_normal(p) + 1e-3 * rng.standard_normal(n)


@pytest.mark.parametrize("kappa", [1.0, 1e8])
def test_lstsq_on_dask_meets_the_in_memory_contract(kappa, scheduler):
    X, y = _conditioned_problem(6000, 8, kappa)
    Xd = da.from_array(X, chunks=(1100, 5))  # irregular last chunk, column chunks merged
    with dask.config.set(scheduler=scheduler):
        res = rsketch.lstsq(Xd, y, seed=2)
    ref = np.linalg.lstsq(X, y, rcond=None)[0]
    best = np.linalg.norm(y - X @ ref)
    assert isinstance(res.coef, np.ndarray) and res.converged
    assert np.linalg.norm(y - X @ res.coef) <= (1 + 1e-12) * best
    # Forward error of a backward-stable solver: a few kappa u (Householder QR's is 0.8 - 8 kappa u).
    assert np.linalg.norm(res.coef - ref) <= 20 * kappa * 2**-53 * np.linalg.norm(ref) + 1e-15
    judged = len(res.log.backward_errors)  # refinement steps judged, each after a gradient pass
    if res.log.inner == "gram":
        # One pass gives S X, X.T X and X.T y (and so the first step's gradient); Gram solves cost none.
        assert res.log.passes == 1 + judged
    else:  # the sketch, a gradient pass per step (the first one's included), a pass per CG iteration
        assert res.log.passes == 1 + (judged + 1) + res.iterations


def test_lstsq_pass_count_and_gradients_match_the_in_memory_design():
    from rsketch.dask import DaskDesign
    from rsketch.linalg._design import Design

    X, y = _conditioned_problem(5000, 6, 1e4, seed=1)
    Y = y[:, None]
    B = np.linalg.lstsq(X, y, rcond=None)[0][:, None] * (1 + 1e-9)
    dd, d = DaskDesign(da.from_array(X, chunks=(777, 6))), Design(X)
    # Near the solution the gradient cancels: errors are measured against ||X||_F ||r||. A careful sum
    # rounds once per chunk's partial (7 chunks); a plain one once per row.
    scale = np.linalg.norm(X) * np.linalg.norm(Y - X @ B)
    for accuracy, roundings in (("fast", X.shape[0]), ("compensated", 7), ("exact", 7)):
        (g1, n1), (g2, n2) = dd.residual_gradient(Y, B, accuracy), d.residual_gradient(Y, B, accuracy)
        assert np.linalg.norm(g1 - g2) <= 2 * roundings * 2**-53 * scale
        np.testing.assert_allclose(n1, n2, rtol=1e-12)
    np.testing.assert_allclose(dd.gram_matrix(), d.gram_matrix(), rtol=1e-12, atol=1e-12)
    V = np.ones((6, 2))
    np.testing.assert_allclose(dd.gram(V)[0], d.gram(V)[0], rtol=1e-12)
    assert dd.passes == 5
    res = rsketch.lstsq(da.from_array(X, chunks=1000), y, seed=0, inner_solver="cg")
    assert res.log.passes == 1 + res.iterations + len(res.log.backward_errors) + 1


@pytest.mark.parametrize("kind", ["sparse_sign", "countsketch", "gaussian", "srht", "uniform"])
def test_fused_first_pass_is_the_sketch_and_the_normal_equations(kind):
    from rsketch.dask import DaskDesign

    X, y = _conditioned_problem(3000, 7, 1e3, seed=5)
    Y = np.stack([y, -2 * y + 1], axis=1)
    Xd = da.from_array(X, chunks=(700, 7))  # irregular last chunk
    S = rsketch.make_sketch(kind, 3000, 60, seed=6)
    dd = DaskDesign(Xd)
    SX = dd.sketch_with_normal_equations(S, Y)
    np.testing.assert_array_equal(SX, (S @ Xd).compute())  # the same values, summed in the same tree
    assert dd.passes == 1
    B = np.ones((7, 2))
    g, rn2 = dd.first_gradient(Y, B)
    gamma = 2 * 3000 * 2**-53
    R = np.abs(Y) + np.abs(X) @ np.abs(B)
    # X.T Y - (X.T X) B: each of the two sums within gamma_n of |X|.T |.|, so the difference within both
    assert np.all(np.abs(g - X.T @ (Y - X @ B)) <= 2 * gamma * (np.abs(X).T @ R))
    assert dd.first_gradient(Y.copy(), B) is None  # only for the Y the pass summed
    np.testing.assert_allclose(rn2, np.sum((Y - X @ B) ** 2, axis=0), rtol=1e-10)


@pytest.mark.parametrize("method", ["sketch_and_solve", "ihs"])
def test_lstsq_other_methods_on_dask(method):
    X, y = _conditioned_problem(4000, 5, 10.0, seed=3)
    Xd, yd = da.from_array(X, chunks=(900, 5)), da.from_array(y, chunks=1300)  # y chunked differently
    got, mem = rsketch.lstsq(Xd, yd, method=method, seed=4), rsketch.lstsq(X, y, method=method, seed=4)
    # The same sketch, summed in another order: the same estimate to rounding.
    np.testing.assert_allclose(got.coef, mem.coef, rtol=1e-10)


def test_lstsq_dask_bad_input():
    X, y = _conditioned_problem(1000, 4, 10.0)
    Xd = da.from_array(X, chunks=300)
    with pytest.raises(ValueError, match=r"compute_chunk_sizes\(\)"):
        rsketch.lstsq(Xd[Xd[:, 0] > -10], y)
    with pytest.raises(ValueError, match="sketch has input_dim=999 but X has 1000 rows"):
        rsketch.lstsq(Xd, y, sketch=rsketch.SparseSign(999, 40, seed=0))
    bad = X.copy()
    bad[517, 2] = np.inf
    with pytest.raises(ValueError, match="X contains NaN or infinite values"):
        rsketch.lstsq(da.from_array(bad, chunks=300), y)
    for method in ("sketch_and_solve", "precondition", "ihs"):  # the leverage scores' pass had named A
        with pytest.raises(ValueError, match="^X contains NaN or infinite values"):
            rsketch.lstsq(da.from_array(bad, chunks=300), y, sketch="leverage", method=method, seed=0)
    ybad = y.copy()
    ybad[3] = np.nan
    with pytest.raises(ValueError, match="y contains NaN or infinite values"):
        rsketch.lstsq(Xd, da.from_array(ybad, chunks=300))
    with pytest.raises(ValueError, match="y must have shape"):
        rsketch.lstsq(Xd, y[:-1])
    # NaN in a chunk the sampling sketch never reads: the residual's pass finds it.
    S = rsketch.UniformSampling(1000, 5, seed=0, replace=False)
    unread = sorted(set(range(10)) - set(S.indices() // 100))[0]
    bad = X.copy()
    bad[100 * unread + 1, 0] = np.nan
    with pytest.raises(ValueError, match="X contains NaN or infinite values"):
        rsketch.lstsq(da.from_array(bad, chunks=100), y, sketch=S, method="sketch_and_solve")


def test_zero_length_chunks_from_a_filter_are_dropped():
    X, y = _conditioned_problem(2000, 5, 10.0, seed=6)
    keep = np.ones(2000, bool)
    keep[500:1000] = False
    mask = da.from_array(keep, chunks=500)
    Xd, yd = da.from_array(X, chunks=500)[mask], da.from_array(y, chunks=500)[mask]
    Xd.compute_chunk_sizes()
    yd.compute_chunk_sizes()
    assert Xd.chunks[0] == (500, 0, 500, 500)
    # The same array without the empty chunk: bitwise the same results.
    plain = da.from_array(X[keep], chunks=500)
    for method in ("ihs", "sketch_and_solve", "precondition"):
        ref = rsketch.lstsq(plain, y[keep], seed=0, method=method).coef
        np.testing.assert_array_equal(rsketch.lstsq(Xd, y[keep], seed=0, method=method).coef, ref)
        np.testing.assert_array_equal(rsketch.lstsq(Xd, yd, seed=0, method=method).coef, ref)
    np.testing.assert_array_equal(rsketch.svd(Xd, 3, seed=0).s, rsketch.svd(plain, 3, seed=0).s)
    for kind in KINDS:
        S = rsketch.make_sketch(kind, 1500, 40, seed=1)
        np.testing.assert_array_equal((S @ Xd).compute(), (S @ plain).compute())


def test_lstsq_dask_several_right_hand_sides():
    X, y = _conditioned_problem(3000, 4, 100.0, seed=2)
    Y = np.column_stack([y, -2 * y + 1])
    res = rsketch.lstsq(da.from_array(X, chunks=700), da.from_array(Y, chunks=(1000, 1)), seed=0)
    ref = np.linalg.lstsq(X, Y, rcond=None)[0]
    assert res.coef.shape == (4, 2) and np.abs(res.coef - ref).max() <= 1e-13 * np.abs(ref).max()


# ------------------------------------------------------------------------------------------ estimators
@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("name", ["SketchedLinearRegression", "SketchedRidge"])
def test_estimators_fit_and_predict_dask_arrays(name, fit_intercept, scheduler):
    rng = np.random.default_rng(5)
    X = rng.standard_normal((4000, 5))
    y = X @ np.arange(5.0) + 2.0 + 0.1 * rng.standard_normal(4000)
    w = rng.uniform(0.5, 2.0, 4000)
    model = getattr(rsketch, name)(random_state=0, fit_intercept=fit_intercept)
    ref = sklearn_base.clone(model).fit(X, y, sample_weight=w)
    with dask.config.set(scheduler=scheduler):
        model.fit(da.from_array(X, chunks=(900, 3)), da.from_array(y, chunks=1000), sample_weight=w)
        pred = model.predict(da.from_array(X, chunks=1000))
        assert isinstance(pred, da.Array) and pred.shape == (4000,)
        np.testing.assert_allclose(pred.compute(), ref.predict(X), rtol=1e-10, atol=1e-10)
    assert model.n_features_in_ == 5 and model.solver_ == "precondition"
    np.testing.assert_allclose(model.coef_, ref.coef_, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(model.intercept_, ref.intercept_, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="expecting 5 features"):
        model.predict(da.ones((10, 4), chunks=5))


def test_out_of_core_lstsq_from_npy_holds_a_few_chunks(tmp_path):
    # X (64 MB) is written in slices to a .npy file and solved from memory-mapped chunks of 1.6 MB:
    # the client's peak allocation is bounded by a few chunks and the client's copies of y, not by X.
    n, p, rows = 400_000, 20, 10_000
    path = tmp_path / "X.npy"
    X = np.lib.format.open_memmap(path, mode="w+", dtype=np.float64, shape=(n, p))
    rng = np.random.default_rng(0)
    for a in range(0, n, 50_000):
        X[a : a + 50_000] = rng.standard_normal((50_000, p))
    y = np.asarray(X @ np.ones(p)) + 0.01 * rng.standard_normal(n)
    X.flush()
    del X
    Xd = from_npy(path, chunk_rows=rows)
    rsketch.lstsq(Xd[: 2 * rows], y[: 2 * rows], seed=0)  # compile and load the kernels first
    with dask.config.set(scheduler="threads"):
        tracemalloc.start()
        try:
            res = rsketch.lstsq(Xd, y, seed=0)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak <= 4 * y.nbytes + 8 * rows * p * 8 < n * p * 8 / 2
    Xm = np.load(path, mmap_mode="r")
    ref = np.linalg.lstsq(np.asarray(Xm), y, rcond=None)[0]
    assert res.converged and np.linalg.norm(res.coef - ref) <= 1e-13 * np.linalg.norm(ref)


def test_lstsq_from_zarr(tmp_path):
    zarr = pytest.importorskip("zarr")
    X, y = _conditioned_problem(20_000, 6, 1e3, seed=7)
    store = zarr.open_array(str(tmp_path / "X.zarr"), mode="w", shape=X.shape, chunks=(3000, 6), dtype="f8")
    store[:] = X
    da.from_array(y, chunks=5000).to_zarr(str(tmp_path / "y.zarr"))
    res = rsketch.lstsq(
        da.from_zarr(str(tmp_path / "X.zarr")), da.from_zarr(str(tmp_path / "y.zarr")), seed=1
    )
    ref = np.linalg.lstsq(X, y, rcond=None)[0]
    assert res.converged and np.linalg.norm(res.coef - ref) <= 20 * 1e3 * 2**-53 * np.linalg.norm(ref)


def test_a_sparse_x_with_a_dask_y_and_an_empty_y_say_so():
    # a sparse X beside a Dask y became a 0-d object array ("X must be 2-D ... got shape ()"), and a y
    # of no columns met a bare unpacking error in the Gram kernel
    X = np.random.default_rng(0).standard_normal((100, 3))
    with pytest.raises(TypeError, match="X is a SciPy sparse matrix and y a Dask array"):
        rsketch.lstsq(sp.csr_matrix(X), da.ones(100, chunks=50))
    with (
        dask.config.set(scheduler="threads"),
        pytest.raises(ValueError, match=r"y is empty: it has shape \(100, 0\)"),
    ):
        rsketch.lstsq(da.from_array(X, chunks=50), np.ones((100, 0)))
