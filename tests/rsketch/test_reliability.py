"""Reliability (issue #17): threads, bit-for-bit results, sizes that cannot fit, O(r) column blocks, and
clear errors for bad arguments."""

import json
import math
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from itertools import combinations

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.stats

import rsketch
import rsketch._validation as validation
from rsketch._random import sample_without_replacement
from rsketch.kernels import cpu
from tests.blas_watch import blas_thread_counts, watching_blas_threads

KINDS = ["gaussian", "srht", "srdct", "countsketch", "sparse_sign", "leverage", "uniform", "uniform_norep"]


def build(kind, n, r, seed=0):
    if kind == "uniform_norep":
        return rsketch.UniformSampling(n, r, seed=seed, replace=False)
    if kind == "leverage":
        scores = np.random.default_rng(1).random(n) ** 3
        return rsketch.LeverageSampling(n, r, scores=scores, seed=seed)
    return rsketch.make_sketch(kind, n, r, seed=seed)


blas_threads = blas_thread_counts


# --------------------------------------------------------------------------------------------- 1. threads
def test_concurrent_gaussian_products_equal_sequential_ones_and_leave_blas_as_found():
    # The case: two Python threads sketching at once used to leave OpenBLAS at one thread,
    # and S.T @ Z in one thread differed (2e-14) while the other held a one-thread BLAS limit.
    S = rsketch.make_sketch("gaussian", 50_000, 100, seed=0)
    A = np.random.default_rng(0).standard_normal((50_000, 4))
    Z = np.random.default_rng(1).standard_normal((100, 4))
    SA, StZ = S @ A, S.T @ Z
    before = blas_threads()
    results = {"apply": [], "adjoint": []}

    def apply():
        results["apply"].extend(S @ A for _ in range(4))

    def adjoint():
        results["adjoint"].extend(S.T @ Z for _ in range(4))

    threads = [threading.Thread(target=apply), threading.Thread(target=adjoint)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results["apply"]) == len(results["adjoint"]) == 4
    for out in results["apply"]:
        np.testing.assert_array_equal(out, SA)
    for out in results["adjoint"]:
        np.testing.assert_array_equal(out, StZ)
    assert blas_threads() == before


def test_no_library_call_changes_the_blas_thread_count_while_it_runs():
    # efficiency() and the leverage scores run small dense factorisations; they used to limit BLAS to
    # one thread for the whole process while they ran. Another thread watches the count meanwhile.
    X = np.random.default_rng(0).standard_normal((3000, 20))
    before = blas_threads()
    with watching_blas_threads() as seen:
        rsketch.efficiency(X, sketch="gaussian", sketch_size=200, n_sketches=6, seed=0)
        rsketch.LeverageSampling.from_matrix(X, 100, method="approx", seed=0)
    assert seen and all(s == before for s in seen)
    assert blas_threads() == before


@pytest.mark.parametrize("kind", KINDS)
def test_products_do_not_depend_on_numba_threads(kind):
    # In one process: the same products on one and on two numba threads (sizes above the
    # kernels' parallel thresholds, several lanes and chunks).
    import numba

    n, r = 40_000, 64
    S = build(kind, n, r, seed=3)
    A = np.random.default_rng(0).standard_normal((n, 3))
    Z = np.random.default_rng(1).standard_normal((r, 3))
    outs = []
    old = numba.get_num_threads()
    try:
        for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
            numba.set_num_threads(threads)
            outs.append((S @ A, S @ np.asfortranarray(A), S.T @ Z))
    finally:
        numba.set_num_threads(old)
    for a, b in zip(outs[0], outs[1], strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind", KINDS)
def test_dense_orders_and_csr_give_the_same_bits(kind):
    # Every kernel sums each output entry in the same order whatever the memory layout of A, and a
    # CSR matrix skips only zero terms: C order, Fortran order and CSR agree exactly.
    n, r = 20_000, 48
    S = build(kind, n, r, seed=4)
    A = sp.random(n, 5, density=0.3, format="csr", random_state=5).toarray()
    ref = S @ A
    np.testing.assert_array_equal(S @ np.asfortranarray(A), ref)
    np.testing.assert_array_equal(S @ sp.csr_matrix(A), ref)
    A32 = A.astype(np.float32)
    np.testing.assert_array_equal(S @ np.asfortranarray(A32), S @ A32)
    np.testing.assert_array_equal(S @ sp.csr_matrix(A32), S @ A32)


# --------------------------------------------------------------------------------------------- 2. bits
_HASH_SCRIPT = textwrap.dedent(
    """
    import hashlib, json, sys
    import numpy as np, scipy.sparse as sp, rsketch

    def digest(x):
        return hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()[:16]

    n, r = 40_000, 64
    rng = np.random.default_rng(0)
    A = rng.standard_normal((n, 3))
    Z = rng.standard_normal((r, 3))
    C = sp.random(n, 3, density=0.2, format="csr", random_state=1)
    scores = rng.random(n) ** 3
    out = {}
    kinds = ["gaussian", "srht", "srdct", "countsketch", "sparse_sign", "leverage", "uniform"]
    kinds.append("uniform_norep")
    for kind in kinds:
        if kind == "leverage":
            S = rsketch.LeverageSampling(n, r, scores=scores, seed=7)
        elif kind == "uniform_norep":
            S = rsketch.UniformSampling(n, r, seed=7, replace=False)
        else:
            S = rsketch.make_sketch(kind, n, r, seed=7)
        for dt in (np.float64, np.float32):
            Ad, Zd = A.astype(dt), Z.astype(dt)
            out[f"{kind} {dt.__name__} C"] = digest(S @ Ad)
            out[f"{kind} {dt.__name__} F"] = digest(S @ np.asfortranarray(Ad))
            out[f"{kind} {dt.__name__} CSR"] = digest(S @ C.astype(dt))
            out[f"{kind} {dt.__name__} adjoint"] = digest(S.T @ Zd)
    json.dump(out, sys.stdout)
    """
)


def _hashes(numba_threads, blas_threads):
    env = dict(os.environ, NUMBA_NUM_THREADS=str(numba_threads), OPENBLAS_NUM_THREADS=str(blas_threads))
    env.pop("OMP_NUM_THREADS", None)
    return subprocess.Popen(
        [sys.executable, "-c", _HASH_SCRIPT],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_products_are_bitwise_the_same_for_one_and_two_threads_in_subprocesses():
    # NUMBA_NUM_THREADS 1 vs 2 and OPENBLAS_NUM_THREADS 1 vs 2, every operator, dense C and F
    # order, float32 and float64, CSR, and the adjoint. The first run also fills numba's cache.
    settings = [(1, 2), (2, 2), (2, 1)]
    procs = [_hashes(*settings[0])]
    procs[0].wait(timeout=600)
    procs += [_hashes(*s) for s in settings[1:]]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
        results.append(json.loads(out))
    assert len(results[0]) == 8 * 2 * 4
    for (s1, h1), (s2, h2) in combinations(zip(settings, results, strict=True), 2):
        differ = sorted(k for k in h1 if h1[k] != h2[k])
        assert not differ, f"threads {s1} vs {s2} (numba, openblas): {differ}"


# --------------------------------------------------------------------------------------------- 3. memory
def test_an_output_that_cannot_fit_raises_memory_error_before_allocating(monkeypatch):
    # The case ran until the kernel killed it at 23 GB. It needs a 14.9 GiB output: with
    # 24 GiB free (more than half of it) it must stop at once.
    monkeypatch.setattr(validation, "available_memory", lambda: 24 * 2**30)
    S = rsketch.make_sketch("countsketch", 300, 10**9)
    start = time.perf_counter()
    with pytest.raises(
        MemoryError,
        match=r"sketch_size=1000000000.*needs 14.9 GiB.*half of the 24 GiB available.*sketch_size",
    ):
        S @ np.ones((300, 2))
    assert time.perf_counter() - start < 1.0
    monkeypatch.setattr(validation, "available_memory", lambda: 40 * 2**30)  # twice the need: no error
    validation.check_allocation(15 * 2**30, "an array of 15 GiB")


@pytest.mark.parametrize(
    "call",
    [
        lambda: rsketch.make_sketch("countsketch", 300, 2**32) @ np.ones((300, 2)),  # the largest it draws
        lambda: rsketch.make_sketch("gaussian", 300, 10**15) @ np.ones((300, 2)),
        lambda: rsketch.make_sketch("sparse_sign", 10**15, 10).T @ np.ones((10, 1)),
        lambda: rsketch.make_sketch("srht", 10**15, 10).T @ np.ones((10, 1)),
        lambda: rsketch.make_sketch("uniform", 10**15, 10).T @ np.ones((10, 1)),
        lambda: rsketch.make_sketch("srht", 10**15, 10**14)[:, 0:1],
        lambda: rsketch.make_sketch("uniform", 10**15, 10**14, replace=False)[:, 0:1],
        lambda: rsketch.make_sketch("gaussian", 10**6, 10**6).to_dense(),
        lambda: rsketch.efficiency(
            np.random.default_rng(0).standard_normal((2000, 5)),
            sketch="gaussian",
            sketch_size=100,
            method="simulate",
            n_noise=10**7,
        ),
    ],
)
def test_impossible_sizes_raise_memory_error_naming_the_size(call):
    # MemoryError only, its message always checked (a ValueError had been accepted unread)
    with pytest.raises(MemoryError, match=r"needs .* of memory, more than half of the .* available"):
        call()


def _meminfo_available():
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/meminfo")
def test_available_memory_reads_the_machine():
    # checked against /proc/meminfo read here (a figure in KiB, not bytes, had passed "0 < avail")
    avail, meminfo = validation.available_memory(), _meminfo_available()
    assert 0 < avail <= 1.2 * meminfo
    capped = validation._cgroup_headroom() is not None or validation._address_space_headroom() is not None
    assert capped or avail >= 0.8 * meminfo
    validation.check_allocation(2**20, "a small array")  # below the checked size: no look-up at all


def test_tall_gaussian_sketch_runs_in_memory_proportional_to_its_output():
    # r = 10**7 took 3.3 GB (a 16-column block of S per worker). Now: the output (80 MB), one
    # accumulator (here the output itself) and a 512 KiB tile per thread.
    script = textwrap.dedent(
        """
        import resource, numpy as np, rsketch
        rsketch.GaussianSketch(16, 2000, seed=0) @ np.ones((16, 1))  # load the kernels
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out = rsketch.GaussianSketch(16, 10**7, seed=0) @ np.ones((16, 1))
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        assert out.shape == (10**7, 1) and np.isfinite(out).all()
        print((after - before) * 1024)
        """
    )
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    grown = int(res.stdout.split()[-1])
    assert grown < 3 * 8 * 10**7, f"peak memory grew by {grown / 2**20:.0f} MiB for an 80 MB output"


def test_accumulators_are_bounded_by_the_shape_not_the_memory():
    from rsketch.operators.base import ACCUMULATOR_BYTES
    from rsketch.operators.gaussian import gaussian_lanes
    from rsketch.operators.sparse import sparse_chunks

    assert gaussian_lanes(200_000, 1000, 10) == (64, False)
    lanes, direct = gaussian_lanes(200_000, 10**6, 100)
    assert (lanes, direct) == (1, True)  # one lane of 800 MB would exceed the bound: the output accumulates
    lanes, _ = gaussian_lanes(10**6, 20_000, 100)
    assert lanes * 8 * 20_000 * 100 <= ACCUMULATOR_BYTES
    assert sparse_chunks(10**6, 10**5, 100) * 8 * 10**5 * 100 <= ACCUMULATOR_BYTES
    assert sparse_chunks(300, 10**9, 2) == 1


# --------------------------------------------------------------------------------------------- 4. blocks
@pytest.mark.parametrize(
    "make",
    [
        lambda: rsketch.make_sketch("srht", 10**15, 10, seed=1),
        lambda: rsketch.make_sketch("uniform", 10**15, 10, seed=1, replace=False),
        lambda: rsketch.make_sketch("uniform", 10**15, 10, seed=1),
        lambda: rsketch.make_sketch("sparse_sign", 10**15, 10, seed=1),
        lambda: rsketch.make_sketch("gaussian", 10**15, 10, seed=1),
    ],
)
def test_a_column_block_of_a_huge_operator_costs_its_own_size(make):
    # SRHT and sampling without replacement used to build an O(n) permutation for a 10 x 4 block.
    make()[:, 0:4]  # compiles the kernels (a cold numba cache) outside the timing
    start = time.perf_counter()
    S = make()
    a = 10**15 - 7
    block = S[:, a : a + 4]
    assert block.shape == (10, 4) and time.perf_counter() - start < 2.0
    np.testing.assert_array_equal(block, S.reference_columns(a, a + 4))
    np.testing.assert_array_equal(S[:, 0:4], S.reference_columns(0, 4))


def test_srht_rows_are_floyd_samples_of_the_padded_size():
    S = rsketch.SRHT(10**15, 10, seed=2)
    assert S.padded_size == 2**50
    np.testing.assert_array_equal(S.rows, S.reference_rows())
    np.testing.assert_array_equal(S.rows, sample_without_replacement(np, S.key, 2**50, 10, 5))
    assert (np.diff(S.rows) > 0).all() and S.rows.max() < 2**50


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: rsketch.make_sketch("countsketch", 2**63, 10), "input_dim must be <= 9223372036854775807"),
        (lambda: rsketch.make_sketch("gaussian", 10, 2**64), "sketch_size must be <= 9223372036854775807"),
        (lambda: rsketch.make_sketch("srht", 2**62 + 1, 10), "input_dim must be <= 2\\*\\*62 for SRHT"),
        (lambda: rsketch.make_sketch("srdct", 2**31 + 1, 10), "input_dim must be <= 2\\*\\*31 for SRDCT"),
    ],
)
def test_sizes_beyond_int64_offsets_are_clear_value_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_floyd_subsets_are_exactly_uniform():
    # All C(10, 3) = 120 subsets, 24,000 keys: the chi-square statistic (119 degrees of freedom)
    # must stay below its 1 - 1e-6 quantile (about 205); a sampler that favoured any subset by 10%
    # would exceed it. The keys are fixed, so the test is deterministic.
    m, r, draws = 10, 3, 24_000
    counts = {}
    for i in range(draws):
        s = tuple(cpu.floyd_sample(i, 12345, m, r, 5).tolist())
        counts[s] = counts.get(s, 0) + 1
    assert len(counts) == math.comb(m, r)
    observed = np.array(list(counts.values()), dtype=float)
    expected = draws / math.comb(m, r)
    chi2 = float(np.sum((observed - expected) ** 2 / expected))
    assert chi2 < scipy.stats.chi2.ppf(1 - 1e-6, math.comb(m, r) - 1)


def test_sampled_rows_with_replacement_are_exactly_uniform():
    # The old 53-bit float scheme left gaps above n = 2**40; the mask-and-reject one is exact.
    counts = np.bincount(cpu.uniform_indices(3, 4, 70_000, 7, 4), minlength=7)
    chi2 = float(np.sum((counts - 10_000) ** 2 / 10_000))
    assert chi2 < scipy.stats.chi2.ppf(1 - 1e-6, 6)
    huge = rsketch.UniformSampling(2**62, 2000, seed=0).indices()
    assert huge.max() > 2**61 and (huge.astype(np.float64) % 2**20).max() > 0  # low bits are random too


# --------------------------------------------------------------------------------------------- 5. errors
def test_leverage_from_a_list_works_and_a_bad_a_names_a():
    A = np.random.default_rng(0).standard_normal((30, 2))
    S = rsketch.make_sketch("leverage", 30, 5, seed=0, A=A.tolist())
    np.testing.assert_array_equal(
        S.to_dense(), rsketch.make_sketch("leverage", 30, 5, seed=0, A=A).to_dense()
    )
    with pytest.raises(ValueError, match="A must have 30 rows"):
        rsketch.make_sketch("leverage", 30, 5, A=A[:20].tolist())
    with pytest.raises(TypeError, match="A must be"):
        rsketch.make_sketch("leverage", 30, 5, A=[["a", "b"]] * 30)


@pytest.mark.parametrize("method", ["exact", "approx"])
def test_leverage_of_a_zero_matrix_names_a(method):
    with pytest.raises(ValueError, match="A is zero"):
        rsketch.make_sketch("leverage", 100, 10, A=np.zeros((100, 3)), method=method)


def test_adjoint_with_the_wrong_row_count_says_sketch_size():
    with pytest.raises(ValueError, match=r"Z must have 3 rows \(the sketch's sketch_size\)"):
        rsketch.GaussianSketch(10, 3).T @ np.ones((4, 2))


@pytest.mark.parametrize(
    "mix, exc", [("a", TypeError), (True, TypeError), (1.0, ValueError), (-0.1, ValueError)]
)
def test_uniform_mix_is_checked_by_name(mix, exc):
    with pytest.raises(exc, match="uniform_mix"):
        rsketch.LeverageSampling(10, 3, scores=np.ones(10), uniform_mix=mix)
    with pytest.raises(exc, match="uniform_mix"):
        rsketch.bounds("leverage", n=100, p=5, r=50, uniform_mix=mix)


def test_unknown_options_raise_type_error_listing_the_allowed_ones():
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['uniform_mx'\].*allowed: \[.*'uniform_mix'"):
        rsketch.bounds("leverage", n=100, p=5, r=50, uniform_mx=0.5)
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['nnz'\].*'nnz_per_column'"):
        rsketch.bounds("sparse_sign", n=100, p=5, r=50, nnz=4)
    X = np.random.default_rng(0).standard_normal((100, 3))
    with pytest.raises(TypeError, match=r"efficiency: unknown option\(s\) \['n_nosie'\]"):
        rsketch.efficiency(X, sketch="gaussian", sketch_size=20, n_nosie=5)


@pytest.mark.parametrize("sigma", [1e300, 1e-300])
def test_simulated_efficiency_with_an_extreme_sigma_names_sigma(sigma):
    X = np.random.default_rng(0).standard_normal((500, 5))
    with pytest.raises(ValueError, match="sigma must lie in"):
        rsketch.efficiency(
            X, sketch="gaussian", sketch_size=100, n_sketches=3, method="simulate", sigma=sigma
        )


def test_simulated_efficiency_at_the_ends_of_the_sigma_range_is_finite_and_unchanged():
    X = np.random.default_rng(0).standard_normal((500, 5))
    common = dict(sketch="srht", sketch_size=100, n_sketches=3, method="simulate", seed=0)
    ref = rsketch.efficiency(X, sigma=1.0, **common)
    with pytest.raises(ValueError, match=r"sigma must lie in \[(\S+), (\S+)\]") as info:
        rsketch.efficiency(X, sigma=1e-300, **common)
    low, high = (float(v) for v in re.search(r"\[(\S+), (\S+)\]", str(info.value)).groups())
    for sigma in (low * 1.01, high * 0.99):
        res = rsketch.efficiency(X, sigma=sigma, **common)
        np.testing.assert_allclose(res.pe_draws, ref.pe_draws, rtol=1e-8)
        np.testing.assert_allclose(res.re_draws, ref.re_draws, rtol=1e-8)


@pytest.mark.parametrize("seed, exc", [("abc", TypeError), (-1, ValueError), (1.5, TypeError)])
def test_seeds_go_through_one_checker(seed, exc):
    for call in (
        lambda: rsketch.make_sketch("gaussian", 10, 3, seed=seed),
        lambda: rsketch.efficiency(np.eye(6)[:, :2] + 1, sketch="gaussian", sketch_size=4, seed=seed),
        lambda: validation.check_seed(seed),
    ):
        with pytest.raises(exc, match="seed"):
            call()


def test_available_memory_reads_an_address_space_limit():
    # under ulimit -v, a request the free memory allowed met numpy's own "Unable to allocate"
    import subprocess
    import sys

    code = (
        "import resource; from rsketch._validation import available_memory\n"
        "size = next(int(x.split()[1]) * 1024 for x in open('/proc/self/status') if x.startswith('VmSize'))\n"
        "resource.setrlimit(resource.RLIMIT_AS, (size + 2**30, resource.RLIM_INFINITY))\n"
        "print(available_memory())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert 0 < int(out.stdout) <= 2**30


def test_available_memory_reads_a_cgroup_v1_limit(monkeypatch):
    # a v1 memory controller's limit (containers on older hosts) was not read: the host's memory counted
    import io

    import rsketch._validation as validation

    files = {
        "/proc/self/cgroup": "4:memory:/box\n0::/\n",
        "/sys/fs/cgroup/memory/box/memory.limit_in_bytes": str(3 * 2**30),
        "/sys/fs/cgroup/memory/box/memory.usage_in_bytes": str(2**30),
    }

    def fake_open(path, *args, **kwargs):
        if path in files:
            return io.StringIO(files[path])
        raise FileNotFoundError(path)

    monkeypatch.setattr(validation, "open", fake_open, raising=False)
    assert validation._cgroup_headroom() == 2 * 2**30
    files["/sys/fs/cgroup/memory/box/memory.limit_in_bytes"] = "9223372036854771712"  # v1's "no limit"
    assert validation._cgroup_headroom() is None
