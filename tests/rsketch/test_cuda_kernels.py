"""The CUDA kernels (rsketch/kernels/cuda) against their CPU twins, run in numba's CUDA simulator.

The simulator must be chosen before numba is first imported (``NUMBA_ENABLE_CUDASIM=1``), so this
file runs itself in a subprocess (``python test_cuda_kernels.py OUTDIR``): :func:`simulate` runs every
kernel there on NumPy arrays at small sizes and saves the results; the tests compare them, in this
process, with the CPU kernels (whose numba stays the compiled CPU target). Buckets, signs, indices,
Philox words, the FWHT and every product of exact terms must be bitwise equal; Gaussian entries within
2 ulp; Gaussian and DCT products within 1e-12 relative (1e-5 in float32).

A second subprocess (without the simulator) compiles every kernel to PTX for sm_80 through NVVM, the
check that the kernels also type and compile for a real GPU; it needs libnvvm and libnvrtc
(the test extra brings them on Linux) and is skipped, saying so, where they are missing.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import types

import numpy as np
import pytest

import rsketch
from rsketch._backend import array_library, check_same_library
from rsketch._random import (
    STREAM_GAUSS,
    STREAM_ROW,
    STREAM_SAMPLE,
    STREAM_SIGN,
    ZIG_RATIO,
    ZIG_X,
    ziggurat_u,
)
from rsketch.kernels import cpu
from rsketch.operators.sparse import sparse_chunks

HERE = pathlib.Path(__file__).resolve()
KEY = (0x12345678, 0x9ABCDEF0)

# (name, operator factory, n, k, dtype, memory order); n < 16384 keeps the CPU sparse kernel on one
# chunk, whose chain of sums is the device's (checked in test_sparse_products_are_bitwise).
OPERATOR_CASES = [
    ("countsketch", lambda n: rsketch.CountSketch(n, 11, seed=1), 200, 3, "float64", "C"),
    ("countsketch_f32_fortran", lambda n: rsketch.CountSketch(n, 11, seed=1), 200, 3, "float32", "F"),
    ("sparse_sign", lambda n: rsketch.SparseSign(n, 12, seed=2, nnz_per_column=3), 150, 4, "float64", "C"),
    (
        "sparse_sign_f32",
        lambda n: rsketch.SparseSign(n, 12, seed=2, nnz_per_column=4),
        150,
        2,
        "float32",
        "C",
    ),
    ("srht", lambda n: rsketch.SRHT(n, 9, seed=3), 100, 3, "float64", "C"),
    ("srht_f32_fortran", lambda n: rsketch.SRHT(n, 9, seed=3), 100, 3, "float32", "F"),
    ("srdct", lambda n: rsketch.SRDCT(n, 9, seed=4), 90, 3, "float64", "C"),
    ("srdct_f32", lambda n: rsketch.SRDCT(n, 9, seed=4), 90, 3, "float32", "C"),
    ("uniform", lambda n: rsketch.UniformSampling(n, 20, seed=5), 120, 3, "float64", "C"),
    (
        "uniform_noreplace_f32",
        lambda n: rsketch.UniformSampling(n, 20, seed=5, replace=False),
        120,
        3,
        "float32",
        "C",
    ),
    (
        "leverage",
        lambda n: rsketch.LeverageSampling(n, 15, seed=6, scores=np.linspace(0.1, 2.0, n)),
        80,
        2,
        "float64",
        "C",
    ),
    ("gaussian", lambda n: rsketch.GaussianSketch(n, 10, seed=7), 120, 3, "float64", "C"),
    ("gaussian_f32", lambda n: rsketch.GaussianSketch(n, 10, seed=7), 120, 3, "float32", "C"),
]
BITWISE = {name for name, *_ in OPERATOR_CASES if not name.startswith(("gaussian", "srdct"))}

# CSR input (cupyx.scipy.sparse on a GPU; SciPy's CSR stands in for it in the simulator).
CSR_CASES = [
    ("countsketch", lambda n: rsketch.CountSketch(n, 11, seed=1), "float64"),
    ("sparse_sign_f32", lambda n: rsketch.SparseSign(n, 12, seed=2, nnz_per_column=3), "float32"),
    ("srht", lambda n: rsketch.SRHT(n, 9, seed=3), "float64"),
    ("srdct", lambda n: rsketch.SRDCT(n, 9, seed=4), "float64"),
    ("uniform", lambda n: rsketch.UniformSampling(n, 20, seed=5), "float64"),
    (
        "leverage_f32",
        lambda n: rsketch.LeverageSampling(n, 15, seed=6, scores=np.linspace(0.1, 2.0, n)),
        "float32",
    ),
    ("gaussian", lambda n: rsketch.GaussianSketch(n, 10, seed=7), "float64"),
]
CSR_SHAPE = (90, 5)

# Finite operands whose unscaled sums overflow (1e308 entries): the products are finite on the CPU
OVERFLOW_CASES = [
    ("srht", lambda n: rsketch.SRHT(n, 8, seed=1), 256),
    ("gaussian", lambda n: rsketch.GaussianSketch(n, 8, seed=1), 256),
    ("srdct", lambda n: rsketch.SRDCT(n, 8, seed=1), 256),
    ("sparse_sign", lambda n: rsketch.SparseSign(n, 4, seed=1, nnz_per_column=4), 64),
]


def overflow_operand(n):
    """Two columns of two entries of +-1e308 (finite sketches, sums beyond the range on the way)."""
    A = np.zeros((n, 2))
    A[3], A[n - 2] = 1e308, 1e308
    A[n - 2, 1] = -1e308
    return A


def _device_matmul(S, A, apply):
    """``SketchOperator.__matmul__``'s rule for a finite device ``A``: a non-finite product is
    computed again on ``A``'s columns scaled (the CPU's operands take it through ``S @ A``)."""
    from rsketch._exact_scaling import with_columns_scaled

    out = apply(S, A)
    return out if np.isfinite(out).all() else with_columns_scaled(lambda B: apply(S, B), A)


def csr_operand(dtype):
    """A 90 x 5 CSR matrix with empty rows and, in row 0, column 2 stored twice (not canonical)."""
    import scipy.sparse as sp

    A = sp.random(*CSR_SHAPE, density=0.3, format="csr", random_state=1, dtype=np.float64)
    A = (sp.diags((np.arange(CSR_SHAPE[0]) != 5).astype(np.float64)) @ A).tocsr()  # row 5 empty
    A.eliminate_zeros()
    data = np.concatenate([[0.5, 0.25], A.data[A.indptr[1] :]]).astype(dtype)
    indices = np.concatenate([[2, 2], A.indices[A.indptr[1] :]]).astype(np.int32)
    indptr = np.concatenate([[0], A.indptr[1:] - A.indptr[1] + 2])
    return sp.csr_matrix((data, indices, indptr), shape=CSR_SHAPE)


GAUSS = {"start": 5, "stop": 21, "r": 1024}  # 16384 normals: wedges and a few tail attempts
# Shared-memory levels only; one radix-2 level above them; one radix-4 pass above them (8192 is also
# past the CPU's 4096-value blocks); and a column-major array (no shared-memory levels, rows interleaved).
FWHT_SHAPES = [(3, 64), (1, 2), (2, 4096), (1, 8192), (3, 32, "F")]


def fwht_input(shape):
    X = np.random.default_rng(shape[1]).standard_normal(shape[:2])
    return np.asfortranarray(X) if shape[2:] == ("F",) else X


def fwht_id(shape):
    return "x".join(map(str, shape))


INDEX_CASES = [(57, 1000), (40, 7), (25, 10**15)]  # (count, bound): small, tiny, beyond 32 bits


def operand(n, k, dtype, order, seed=0):
    A = np.random.default_rng(seed).standard_normal((n, k)).astype(dtype)
    return np.asfortranarray(A) if order == "F" else A


# S.T @ Z on the device (name, operator factory, n, k, dtype): the sparse sign gather kernel, and a kind
# that takes the portable path in the device's namespace.
ADJOINT_CASES = [
    ("sparse_sign", lambda n: rsketch.SparseSign(n, 12, seed=2, nnz_per_column=3), 150, 4, "float64"),
    ("countsketch_f32", lambda n: rsketch.CountSketch(n, 11, seed=1), 200, 3, "float32"),
    ("srht", lambda n: rsketch.SRHT(n, 9, seed=3), 100, 2, "float64"),
]

# The careful residual gradient (n, p, k, chunks, accuracy): p not a multiple of 4 (the chains' tails),
# several right-hand sides, chunks of unequal length, and a residual far smaller than y (where the
# exact mode's Dot2 residual differs from a plain one).
RESGRAD_CASES = {
    "exact": (61, 7, 2, 3, "exact"),
    "exact_one_chunk": (40, 8, 1, 1, "exact"),
    "compensated": (61, 7, 2, 3, "compensated"),
}


def resgrad_operands(n, p, k):
    rng = np.random.default_rng(n * 100 + p)
    X = rng.standard_normal((n, p))
    B = rng.standard_normal((p, k))
    Y = X @ B + 1e-9 * rng.standard_normal((n, k))
    return X, np.ascontiguousarray(Y), B


def lock_simulator_shared_arrays() -> None:
    """Serialise the simulator's allocation of a block's shared array.

    numba-cuda's simulator (``kernelapi.FakeCUDAShared.array``) allocates a static shared array on a
    block's first call without a lock: look it up, then store a new one if absent. Two threads of one
    block that interleave there each get an array of their own, and the block's results are then
    wrong. On a loaded machine this happened once in the FWHT kernel (all 8192 values wrong, the next
    run right). Our kernels are not at fault (a GPU has one shared array per block), so the test
    serialises the allocation, keyed as numba keys it: by the calling kernel's file and line.
    """
    import threading
    import traceback

    from numba.core import types as nbtypes
    from numba.cuda.simulator import kernelapi
    from numba.np import numpy_support

    original = kernelapi.FakeCUDAShared.array
    lock = threading.Lock()

    def array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:  # dynamic shared memory (no allocation), or refused
            return original(self, shape, dtype, alignment)
        dtype = numpy_support.as_dtype(dtype) if isinstance(dtype, nbtypes.Type) else dtype
        caller = tuple(traceback.extract_stack(sys._getframe(1), limit=1)[0])[0:2]
        with lock:
            res = self._allocations.get(caller)
            if res is None:
                res = self._allocations[caller] = np.empty(shape, dtype)
        return res

    kernelapi.FakeCUDAShared.array = array


def simulate(outdir: pathlib.Path) -> None:
    """Run every CUDA kernel in the simulator (this process has ``NUMBA_ENABLE_CUDASIM=1``)."""
    from numba.core import config

    assert config.ENABLE_CUDASIM, "simulate() must run with NUMBA_ENABLE_CUDASIM=1"
    lock_simulator_shared_arrays()
    from rsketch.kernels.cuda import apply as device_apply
    from rsketch.kernels.cuda import kernels as ck

    res = {"philox": ck.philox_words(KEY[0], KEY[1], 2**32 - 3, 9, 3, 7)}
    G = np.empty((GAUSS["stop"] - GAUSS["start"], GAUSS["r"]))
    ck.gaussian_columns(KEY[0], KEY[1], GAUSS["start"], GAUSS["stop"], GAUSS["r"], STREAM_GAUSS, G, ZIG_X)
    res["gaussian_columns"] = G
    for s in (1, 3):
        rows, signs = ck.sparse_pattern(KEY[0], KEY[1], 7, 90, s, 13, STREAM_ROW)
        res[f"pattern_rows_{s}"], res[f"pattern_signs_{s}"] = rows, signs
    for shape in FWHT_SHAPES:
        X = fwht_input(shape)
        ck.fwht_columns(X)
        res[f"fwht_{fwht_id(shape)}"] = X
    res["signs"] = ck.lane_signs(KEY[0], KEY[1], 3, 50, STREAM_SIGN)
    for count, bound in INDEX_CASES:
        res[f"indices_{count}_{bound}"] = ck.uniform_indices(KEY[0], KEY[1], count, bound, STREAM_SAMPLE)
    for name, make, n, k, dtype, order in OPERATOR_CASES:
        res[f"apply_{name}"] = device_apply.sketch_apply(make(n), operand(n, k, dtype, order))
    from rsketch.kernels.cuda import apply_checked_sparse, check_device_csr

    for name, make, dtype in CSR_CASES:
        A = check_device_csr(csr_operand(dtype), CSR_SHAPE[0])
        res[f"csr_{name}"] = apply_checked_sparse(make(CSR_SHAPE[0]), A, device_apply.sketch_apply_sparse)
    # Finite operands whose unscaled sums overflow: scaled by powers of two and applied again, as on
    # the CPU (the device paths had returned inf and NaN)
    import scipy.sparse as sp

    for name, make, n in OVERFLOW_CASES:
        A = overflow_operand(n)
        res[f"overflow_dense_{name}"] = _device_matmul(make(n), A, device_apply.sketch_apply)
        B = check_device_csr(sp.csr_matrix(A), n)
        res[f"overflow_csr_{name}"] = apply_checked_sparse(make(n), B, device_apply.sketch_apply_sparse)
    # Several passes over the rows (sparse) and several column groups (SRHT): the same bits.
    ck._SPARSE_PASS_NONZEROS = 40
    res["apply_sparse_passes"] = device_apply.sketch_apply(
        rsketch.SparseSign(150, 12, seed=2, nnz_per_column=3), operand(150, 4, "float64", "C")
    )
    ck._SRHT_BUFFER = 2 * 128
    res["apply_srht_groups"] = device_apply.sketch_apply(
        rsketch.SRHT(100, 9, seed=3), operand(100, 5, "float64", "C")
    )
    for name, make, n, k, dtype in ADJOINT_CASES:
        res[f"adjoint_{name}"] = device_apply.sketch_adjoint(
            make(n), operand(make(n).sketch_size, k, dtype, "C")
        )
    for name, (n, p, k, nchunks, accuracy) in RESGRAD_CASES.items():
        X, Y, B = resgrad_operands(n, p, k)
        g, nrm = ck.residual_gradient(X, Y, B, nchunks, accuracy)
        res[f"resgrad_{name}_g"], res[f"resgrad_{name}_nrm"] = g, nrm
    np.savez(outdir / "sim.npz", **res)


def run_child(args, env, timeout):
    proc = subprocess.run(
        [sys.executable, str(HERE), *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    return proc


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    out = tmp_path_factory.mktemp("cudasim")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = run_child(["simulate", str(out)], env, timeout=600)
    assert proc.returncode == 0, f"the simulator run failed:\n{proc.stdout}\n{proc.stderr}"
    with np.load(out / "sim.npz") as data:
        return dict(data)


def test_philox_words_are_the_cpu_words(sim):
    ref = cpu.philox_words(KEY[0], KEY[1], 2**32 - 3, 9, 3, 7)  # indices cross 2**32: both counter words
    assert sim["philox"].dtype == np.uint32
    np.testing.assert_array_equal(sim["philox"], ref)


def test_gaussian_columns_within_two_ulp(sim):
    start, stop, r = GAUSS["start"], GAUSS["stop"], GAUSS["r"]
    ref = np.empty((stop - start, r))
    cpu.gaussian_columns(KEY[0], KEY[1], start, stop, r, STREAM_GAUSS, ref, ZIG_X)
    np.testing.assert_array_max_ulp(sim["gaussian_columns"], ref, maxulp=2)
    # The case reaches the rare branches: wedge tests among the attempts, and tail values (|z| > R).
    w = cpu.philox_words(KEY[0], KEY[1], start, stop - start, r // 2, STREAM_GAUSS)
    layer, u = ziggurat_u(np, w[:, :, 0::2].reshape(-1), w[:, :, 1::2].reshape(-1))
    wedges = (np.abs(u) >= ZIG_RATIO[layer]) & (layer > 0)
    assert wedges.sum() >= 10
    assert (np.abs(ref) > ZIG_X[1]).sum() >= 1


@pytest.mark.parametrize("s", [1, 3])
def test_sparse_pattern_is_bitwise(sim, s):
    rows, signs = cpu.sparse_pattern(KEY[0], KEY[1], 7, 90, s, 13, STREAM_ROW)
    np.testing.assert_array_equal(sim[f"pattern_rows_{s}"], rows)
    np.testing.assert_array_equal(sim[f"pattern_signs_{s}"], signs)


@pytest.mark.parametrize("shape", FWHT_SHAPES, ids=fwht_id)
def test_fwht_is_bitwise(sim, shape):
    X = np.ascontiguousarray(fwht_input(shape))
    cpu.fwht_columns(X)
    np.testing.assert_array_equal(sim[f"fwht_{fwht_id(shape)}"], X)


def test_lane_signs_are_the_srht_signs(sim):
    S = rsketch.SRHT(60, 5, seed=0)
    S.key = KEY
    np.testing.assert_array_equal(sim["signs"], S.signs(3, 50))


@pytest.mark.parametrize("count, bound", INDEX_CASES)
def test_uniform_indices_are_bitwise(sim, count, bound):
    np.testing.assert_array_equal(
        sim[f"indices_{count}_{bound}"], cpu.uniform_indices(KEY[0], KEY[1], count, bound, STREAM_SAMPLE)
    )


@pytest.mark.parametrize("case", ADJOINT_CASES, ids=lambda c: c[0])
def test_device_adjoint_matches_cpu(sim, case):
    name, make, n, k, dtype = case
    S = make(n)
    ref = S.T @ operand(S.sketch_size, k, dtype, "C")
    got = sim[f"adjoint_{name}"]
    assert got.dtype == ref.dtype and got.shape == (n, k)
    if name == "srht":  # the portable path: another order of sums
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    else:
        np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("name", sorted(RESGRAD_CASES))
def test_careful_residual_gradient_is_the_cpu_kernels_bits(sim, name):
    n, p, k, nchunks, accuracy = RESGRAD_CASES[name]
    X, Y, B = resgrad_operands(n, p, k)
    g, nrm = cpu.residual_gradient(X, Y, B, nchunks, accuracy)
    np.testing.assert_array_equal(sim[f"resgrad_{name}_g"], g)
    np.testing.assert_array_equal(sim[f"resgrad_{name}_nrm"], nrm)


def test_careful_residual_gradient_modes_differ(sim):
    # The exact mode's residual is error-free; at a residual 1e-9 of y, the plain one's rounding shows.
    assert not np.array_equal(sim["resgrad_exact_g"], sim["resgrad_compensated_g"])


@pytest.mark.parametrize("case", OPERATOR_CASES, ids=lambda c: c[0])
def test_device_product_matches_cpu(sim, case):
    name, make, n, k, dtype, order = case
    S = make(n)
    A = operand(n, k, dtype, order)
    ref = S @ A
    got = sim[f"apply_{name}"]
    assert got.dtype == ref.dtype and got.shape == ref.shape
    if name in BITWISE:
        np.testing.assert_array_equal(got, ref)
    else:
        rtol = 1e-12 if dtype == "float64" else 1e-5
        assert np.linalg.norm(got - ref) <= rtol * np.linalg.norm(ref)


def test_sparse_products_are_bitwise_over_passes_and_groups(sim):
    for name, make, n, k, dtype, _ in OPERATOR_CASES:
        if name.startswith(("countsketch", "sparse_sign")):  # the CPU's chain is one chunk's chain here
            assert sparse_chunks(n, make(n).sketch_size, k, np.dtype(dtype).itemsize) == 1
    A = operand(150, 4, "float64", "C")
    np.testing.assert_array_equal(
        sim["apply_sparse_passes"], rsketch.SparseSign(150, 12, seed=2, nnz_per_column=3) @ A
    )
    np.testing.assert_array_equal(
        sim["apply_srht_groups"], rsketch.SRHT(100, 9, seed=3) @ operand(100, 5, "float64", "C")
    )


@pytest.mark.parametrize("case", OVERFLOW_CASES, ids=lambda c: c[0])
def test_device_products_whose_sums_overflow_are_finite_as_on_the_cpu(sim, case):
    name, make, n = case
    ref = make(n) @ overflow_operand(n)
    assert np.isfinite(ref).all()
    for path in ("dense", "csr"):
        got = sim[f"overflow_{path}_{name}"]
        assert np.isfinite(got).all()
        assert np.abs(got - ref).max() <= 1e-12 * np.abs(ref).max()


@pytest.mark.parametrize("case", CSR_CASES, ids=lambda c: c[0])
def test_device_csr_product_matches_cpu(sim, case):
    name, make, dtype = case
    A = csr_operand(dtype)
    assert not A.has_canonical_format  # the device path must sum the duplicates as the CPU does
    ref = make(CSR_SHAPE[0]) @ A
    got = sim[f"csr_{name}"]
    assert got.dtype == ref.dtype and got.shape == ref.shape
    if name.startswith(("gaussian", "srdct")):
        assert np.linalg.norm(got - ref) <= 1e-12 * np.linalg.norm(ref)
    else:
        np.testing.assert_array_equal(got, ref)


# --------------------------------------------------------------------------- PTX for a real GPU
def compile_all() -> None:
    """Compile every kernel to PTX for sm_80 (a process without the simulator, and without a GPU)."""
    import numba.cuda.dispatcher as dispatcher
    from numba import cuda
    from numba import types as nt
    from numba.np.numpy_support import from_dtype

    # Device functions are compiled for the current device's compute capability; there is none here.
    dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=(8, 0))
    from rsketch.kernels.cuda import kernels as ck

    i64, f32, f64 = nt.int64, nt.float32, nt.float64
    vec = lambda dt: nt.Array(dt, 1, "C")
    mat = lambda dt, layout="C": nt.Array(dt, 2, layout)
    signatures = {
        "_philox_words_kernel": (i64, i64, i64, i64, i64, nt.Array(nt.uint32, 3, "C")),
        "_gaussian_columns_kernel": (i64, i64, i64, i64, i64, mat(f64), vec(f64)),
        "_sparse_pattern_kernel": (i64, i64, i64, i64, i64, i64, vec(i64), vec(f64)),
        "_fwht_level_kernel": (mat(f64, "A"), i64, nt.boolean),
        "_fwht_radix4_kernel": (mat(f32, "A"), i64, nt.boolean),
        "_signed_transpose_kernel": (i64, i64, i64, mat(f32, "A"), i64, mat(f32)),
        "_gather_rows_t_kernel": (mat(f32), vec(i64), f64, i64, mat(f32, "A")),
        "_signs_kernel": (i64, i64, i64, i64, vec(f64)),
        "_uniform_indices_kernel": (i64, i64, i64, i64, vec(i64)),
        "_gather_kernel": (mat(f64, "A"), vec(i64), vec(f64), mat(f64)),
        "_residual_gradient_chunks_kernel": (
            mat(f64),
            mat(f64),
            mat(f64),
            nt.boolean,
            nt.Array(f64, 3, "C"),
            nt.Array(f64, 3, "C"),
            mat(f64),
        ),
        "_chunk_sum_kernel": (nt.Array(f64, 3, "C"), nt.Array(f64, 3, "C"), mat(f64), mat(f64), vec(f64)),
    }
    compiled = []
    for name, sig in signatures.items():
        ptx, _ = cuda.compile_ptx(getattr(ck, name).py_func, sig, cc=(8, 0))
        if name == "_residual_gradient_chunks_kernel":
            # The CPU's bits need every product rounded on its own: explicit fma.rn (never contracted),
            # no mul.f64 that ptxas could fuse with the add after it.
            assert "mul.f64" not in ptx and "fma.rn.f64" in ptx, "a contractible product in the kernel"
        compiled.append(name)
    for dtype, kernel in ck._bucket_sum.items():
        ft = from_dtype(dtype)
        cuda.compile_ptx(
            kernel.py_func, (i64, vec(i64), vec(i64), vec(f64), mat(ft, "A"), i64, mat(ft)), cc=(8, 0)
        )
        compiled.append(f"bucket_sum[{dtype}]")
    for dtype, kernel in ck._bucket_scatter_csr.items():
        ft = from_dtype(dtype)
        sig = (i64, vec(i64), vec(i64), vec(f64), vec(nt.int32), vec(nt.int32), vec(ft), i64, mat(ft))
        cuda.compile_ptx(kernel.py_func, sig, cc=(8, 0))
        compiled.append(f"bucket_scatter_csr[{dtype}]")
    for dtype, kernel in ck._sparse_adjoint.items():
        ft = from_dtype(dtype)
        sig = (i64, i64, i64, i64, i64, f64, mat(ft), mat(ft))
        ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(8, 0))
        # The term's product is an explicit fma.rn (never contracted into the sum); the one mul.f64 left
        # is the exact +-1 arithmetic of the sign (and scale * sign), which contraction cannot change.
        assert "fma.rn.f64" in ptx and ptx.count("mul.f64") <= 1, "a contractible product in the adjoint"
        compiled.append(f"sparse_adjoint[{dtype}]")
    for dtype, kernel in ck._fwht_shared.items():
        cuda.compile_ptx(kernel.py_func, (mat(from_dtype(dtype)), i64), cc=(8, 0))
        compiled.append(f"fwht_shared[{dtype}]")
    launched = {name for name in vars(ck) if name.endswith("_kernel")}
    assert launched <= set(compiled), f"kernels without a compile check: {launched - set(compiled)}"
    print("compiled", len(compiled))


def _nvvm_available() -> str | None:
    proc = run_child(["probe"], dict(os.environ, NUMBA_ENABLE_CUDASIM="0"), timeout=120)
    return None if proc.returncode == 0 else (proc.stdout + proc.stderr).strip().splitlines()[-1]


def probe() -> None:
    from cuda import pathfinder

    for lib in ("nvvm", "nvrtc"):
        try:
            pathfinder.load_nvidia_dynamic_lib(lib)
        except Exception as exc:
            print(
                f"lib{lib} not found ({type(exc).__name__}); pip install nvidia-cuda-nvcc-cu12 "
                "nvidia-cuda-nvrtc-cu12 (the test extra) for this check"
            )
            raise SystemExit(1) from None


@pytest.mark.slow
def test_every_kernel_compiles_to_ptx():
    missing = _nvvm_available()
    if missing is not None:
        pytest.skip(missing)
    proc = run_child(["compile"], dict(os.environ, NUMBA_ENABLE_CUDASIM="0"), timeout=600)
    assert proc.returncode == 0, f"PTX compilation failed:\n{proc.stdout}\n{proc.stderr}"


# --------------------------------------------------------------------------- errors (no simulator)
def test_missing_cupy_says_to_install_the_gpu_extra(monkeypatch):
    from rsketch.kernels.cuda import require_gpu, sketch_apply

    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(ImportError, match=r"rsketch\[gpu\]"):
        require_gpu()
    with pytest.raises(ImportError, match=r"CuPy is not installed.*rsketch\[gpu\]"):
        sketch_apply(rsketch.CountSketch(10, 2, seed=0), np.ones((10, 1)))


def _fake_cupy(count):
    def get_device_count():
        if count is None:
            raise OSError("cudaErrorNoDevice: no CUDA-capable device is detected")
        return count

    runtime = types.SimpleNamespace(getDeviceCount=get_device_count)
    return types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime))


@pytest.mark.parametrize("count", [None, 0])
def test_no_device_is_a_runtime_error(monkeypatch, count):
    from rsketch.kernels.cuda import require_gpu

    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(count))
    with pytest.raises(RuntimeError, match="no CUDA device is available"):
        require_gpu()


def test_numba_cuda_that_cannot_compile_with_this_numpy_is_an_import_error(monkeypatch, tmp_path):
    from rsketch.kernels.cuda import check_kernel_compiler, require_gpu

    # What numba-cuda 0.30.4's arrayobj does on NumPy 2.5 at its import: overload(np.row_stack).
    (tmp_path / "arrayobj_on_numpy_2_5.py").write_text("import numpy as np\nnp.row_stack_removed_in_2_5\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError, match=r"numba-cuda cannot compile kernels with NumPy .*numpy<2\.5"):
        check_kernel_compiler("arrayobj_on_numpy_2_5")
    check_kernel_compiler()  # this environment's numba-cuda and NumPy (CI pins numpy<2.5): they compile
    # require_gpu asks before it looks for a device: the fix is an install, whatever the machine.
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(1))
    monkeypatch.setattr(
        "rsketch.kernels.cuda.check_kernel_compiler",
        lambda: check_kernel_compiler("arrayobj_on_numpy_2_5"),
    )
    with pytest.raises(ImportError, match="numba-cuda cannot compile kernels"):
        require_gpu()


def _unallocated_cupy_array(cupy, shape, dtype):
    """A ``cupy.ndarray`` over memory that is never touched: CuPy's array type, no device needed."""
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    memory = cupy.cuda.memory.UnownedMemory(0x10000, max(size, 1), None, device_id=0)
    return cupy.ndarray(shape, dtype=dtype, memptr=cupy.cuda.memory.MemoryPointer(memory, 0))


def test_a_cupy_array_is_validated_as_a_device_array():
    # CuPy's arrays have no __array_namespace__; the check took them for host input and called
    # np.asarray, which CuPy refuses: every S @ A on the GPU was "A must be an array of real numbers".
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed (the gpu extra)")
    from rsketch._validation import check_operand

    A = _unallocated_cupy_array(cupy, (100, 3), np.float64)
    checked, is_vector = check_operand(A, 100, check_finite_values=False)
    assert checked is A and not is_vector  # as it is: no copy of n k values on the device


def test_mixing_device_and_host_arrays_is_a_type_error():
    device_like = type("ndarray", (), {"__module__": "cupy"})()  # what cupy.ndarray reports
    assert array_library(device_like) == "cupy"
    with pytest.raises(TypeError, match=r"X is a CuPy \(GPU\) array but y is a NumPy \(host\) array"):
        check_same_library(X=device_like, y=np.ones(3))
    with pytest.raises(TypeError, match="cupy.asarray"):
        check_same_library(A=np.ones(3), B=device_like)
    assert check_same_library(X=np.ones(2), y=None) == "numpy"


def test_device_csr_checks():
    import scipy.sparse as sp

    from rsketch.kernels.cuda import apply_checked_sparse, check_device_csr

    A = csr_operand("float64")
    with pytest.raises(ValueError, match=r"A must have 91 rows \(the sketch's input_dim\)"):
        check_device_csr(A, 91)
    with pytest.raises(TypeError, match="A must be real-valued"):
        check_device_csr(A.astype(np.complex128), 90)
    with pytest.raises(ValueError, match="A is empty"):
        check_device_csr(sp.csr_matrix((0, 3)), 0)
    with pytest.raises(ValueError, match=r"A must be a 2-D sparse matrix on the device, got shape \(3,\)"):
        check_device_csr(sp.csr_array(np.array([1.0, 0.0, 2.0])), 3)  # CuPy 14 has 1-D ones too
    before = A.data.copy()
    canonical = check_device_csr(A, 90)
    assert canonical.has_canonical_format and np.array_equal(A.data, before)  # the caller's matrix untouched
    B = A.copy()
    B.data[3] = np.nan
    for S in (rsketch.CountSketch(90, 5, seed=0), rsketch.UniformSampling(90, 90, seed=0, replace=False)):
        with pytest.raises(ValueError, match="A contains NaN"):
            apply_checked_sparse(S, check_device_csr(B, 90), lambda S, A: S @ A)


def test_unknown_kind_has_no_device_kernel():
    from rsketch.kernels.cuda import apply as device_apply

    S = rsketch.CountSketch(10, 2, seed=0)
    S.kind = "mystery"
    with pytest.raises(NotImplementedError, match="no GPU kernels"):
        device_apply.sketch_apply(S, np.ones((10, 1)))


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "simulate":
        simulate(pathlib.Path(sys.argv[2]))
    elif command == "compile":
        compile_all()
    elif command == "probe":
        probe()
