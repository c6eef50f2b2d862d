"""CUDA kernels (numba-cuda) and their launchers: the GPU twins of :mod:`rsketch.kernels.cpu`.

Every kernel takes arrays through the CUDA array interface: CuPy arrays on a GPU, NumPy arrays in
numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``), where the tests run each one against its CPU
twin. Launchers allocate their work arrays in the namespace of their input (``array_module``) and
never validate: :func:`rsketch.kernels.cuda.sketch_apply` does. Every kernel is a grid-stride loop,
so its result does not depend on the launch configuration.

What is bitwise the CPU's: Philox words, hash buckets and signs, sampled indices, the FWHT, and every
product whose terms are exact (signs times entries) summed in the CPU's order. Gaussian entries are
the same ziggurat attempts; ``exp``/``log`` come from libdevice here and from the C library there,
and NVVM may fuse a multiply-add the CPU rounds twice, so the rare wedge and tail values may differ in
the last bits (the tests allow 2 ulp).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32, float64
from numba.core import config

from rsketch.kernels.cuda._device import bounded_exact, sign_of_lane, sparse_entry, words, zig_attempt

# Threads per block: a warp multiple on a GPU; small in the simulator, which runs each thread as a
# Python thread. A launch of fewer than _THREADS * _SMALL_LAUNCH_BLOCKS items takes blocks of
# _SMALL_THREADS, four times as many blocks: 16,384 threads (the careful gradient's chunks) in blocks
# of 256 would run on 64 of an H100's 132 multiprocessors, and numba warns below 128 blocks.
_THREADS = 32 if config.ENABLE_CUDASIM else 256
_SMALL_THREADS = 32 if config.ENABLE_CUDASIM else 64
_SMALL_LAUNCH_BLOCKS = 128
_MAX_BLOCKS = 8 if config.ENABLE_CUDASIM else 65535


def array_module(a):
    """``cupy`` for a CuPy array, ``numpy`` otherwise (the simulator's arrays)."""
    if type(a).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np


def _grid(n_items, like):
    """``(blocks, threads, stream)`` of a launch over ``n_items`` on the arrays of ``like``'s library."""
    threads = _THREADS if n_items >= _THREADS * _SMALL_LAUNCH_BLOCKS else _SMALL_THREADS
    return max(1, min(_MAX_BLOCKS, -(-n_items // threads))), threads, _launch_stream(like)


def _launch_stream(like):
    """CuPy's current stream where ``like`` is a CuPy array and that stream is not the default one, so
    that a kernel runs in order with the CuPy work before and after it (numba launches on the legacy
    default stream, which a non-blocking stream does not wait for); else 0, the default stream."""
    xp = array_module(like)
    if xp is np:
        return 0  # NumPy arrays: the simulator
    current = xp.cuda.get_current_stream().ptr
    return cuda.external_stream(current) if current else 0


# ------------------------------------------------------------------------------------- Philox
@cuda.jit
def _philox_words_kernel(k0, k1, start, n_blocks, stream, out):
    key0 = np.uint64(k0)
    key1 = np.uint64(k1)
    e = cuda.grid(1)
    total = out.shape[0] * n_blocks
    while e < total:
        i = e // n_blocks
        b = e % n_blocks
        w0, w1, w2, w3 = words(key0, key1, start + i, b, stream)
        out[i, b, 0] = w0
        out[i, b, 1] = w1
        out[i, b, 2] = w2
        out[i, b, 3] = w3
        e += cuda.gridsize(1)


def philox_words(k0, k1, start, count, n_blocks, stream, xp=np):
    """Words ``out[i, b, :]`` of counter ``(start + i, block b, stream)``: (count, n_blocks, 4) uint32."""
    out = xp.empty((count, n_blocks, 4), dtype=np.uint32)
    _philox_words_kernel[_grid(count * n_blocks, out)](k0, k1, start, n_blocks, stream, out)
    return out


# ------------------------------------------------------------------------------------- Gaussian
@cuda.jit
def _gaussian_columns_kernel(k0, k1, start, r, stream, out, X):
    # One thread per column: its first r accepted attempts, two attempts per Philox call, in the
    # order of kernels.cpu._zig_fill (attempt a reads words 2 (a % 2), 2 (a % 2) + 1 of counter a // 2).
    key0 = np.uint64(k0)
    key1 = np.uint64(k1)
    jj = cuda.grid(1)
    while jj < out.shape[0]:
        j = start + jj
        pos = 0
        q = 0
        while pos < r:
            w0, w1, w2, w3 = words(key0, key1, j, q, stream)
            ok, z = zig_attempt(w0, w1, key0, key1, j, 2 * q, X)
            if ok:
                out[jj, pos] = z
                pos += 1
            if pos < r:
                ok, z = zig_attempt(w2, w3, key0, key1, j, 2 * q + 1, X)
                if ok:
                    out[jj, pos] = z
                    pos += 1
            q += 1
        jj += cuda.gridsize(1)


def gaussian_columns(k0, k1, start, stop, r, stream, out, X):
    """Standard normals of columns ``start:stop`` (``r`` each) into ``out[j - start, i]`` (as the CPU kernel).

    ``X`` is ``rsketch._random.ZIG_X`` in ``out``'s namespace; ``out`` is (stop - start, r) float64.
    """
    _gaussian_columns_kernel[_grid(stop - start, out)](k0, k1, start, r, stream, out, X)


# ------------------------------------------------------------------------------------- sparse sign
@cuda.jit
def _sparse_pattern_kernel(k0, k1, start, s, r, stream, rows, signs):
    key0 = np.uint64(k0)
    key1 = np.uint64(k1)
    e = cuda.grid(1)
    while e < rows.shape[0]:
        row, sign = sparse_entry(key0, key1, start + e // s, e % s, s, r, stream)
        rows[e] = row
        signs[e] = sign
        e += cuda.gridsize(1)


def sparse_pattern(k0, k1, start, stop, s, r, stream, xp=np):
    """Rows (int64) and signs (+-1.0) of columns ``start:stop``: arrays of shape (stop - start, s)."""
    m = stop - start
    rows = xp.empty(m * s, dtype=np.int64)
    signs = xp.empty(m * s, dtype=np.float64)
    _sparse_pattern_kernel[_grid(m * s, rows)](k0, k1, start, s, r, stream, rows, signs)
    return rows.reshape(m, s), signs.reshape(m, s)


def _make_bucket_sum(ftype):
    @cuda.jit
    def bucket_sum(s, order, starts, signs, A, j0, acc):
        # Thread (i, c) adds, in ascending j, sign * A[j, c] for every nonzero of bucket i: the
        # order of the CPU's scatter-add, without atomics (so the same bits on every run).
        k = acc.shape[1]
        e = cuda.grid(1)
        while e < acc.shape[0] * k:
            i = e // k
            c = e % k
            total = acc[i, c]
            for p in range(starts[i], starts[i + 1]):
                f = order[p]
                total += ftype(signs[f]) * A[j0 + f // s, c]
            acc[i, c] = total
            e += cuda.gridsize(1)

    return bucket_sum


_bucket_sum = {
    np.dtype(np.float32): _make_bucket_sum(np.float32),
    np.dtype(np.float64): _make_bucket_sum(np.float64),
}


def _make_sparse_adjoint(ftype):
    @cuda.jit
    def sparse_adjoint(k0, k1, s, r, stream, scale, Z, out):
        # Thread (j, c) gathers row j of S.T @ Z: its s hashed rows of Z in t order, each term a float64
        # product added in float64 and stored in Z's dtype, as kernels.cpu._sparse_adjoint_par rounds.
        key0 = np.uint64(k0)
        key1 = np.uint64(k1)
        n, k = out.shape
        e = cuda.grid(1)
        while e < n * k:
            j = e // k
            c = e % k
            total = ftype(0.0)
            for t in range(s):
                row, sign = sparse_entry(key0, key1, j, t, s, r, stream)
                total = ftype(float64(total) + _mul(scale * sign, float64(Z[row, c])))
            out[j, c] = total
            e += cuda.gridsize(1)

    return sparse_adjoint


def sparse_adjoint(k0, k1, s, r, stream, scale, Z, out):
    """``out = scale * S.T @ Z`` for the unscaled sparse sign pattern ``S`` (r, n) and a dense (r, k) ``Z``;
    ``out`` (n, k) of ``Z``'s dtype. A gather (no atomics): the CPU kernel's bits."""
    n, k = out.shape
    _sparse_adjoint[np.dtype(Z.dtype)][_grid(n * k, Z)](k0, k1, s, r, stream, scale, Z, out)


# Rows of A hashed per pass of sparse_apply_dense: the pattern, sort keys and order of one pass
# take about 40 bytes per nonzero.
_SPARSE_PASS_NONZEROS = 1 << 24


def bucket_order(rows, r, xp):
    """Nonzeros sorted by bucket, ascending nonzero number within a bucket; and each bucket's start.

    The sort keys ``row * m + f`` are distinct, so any sort gives this order (no reliance on a
    stable sort).
    """
    m = rows.shape[0]
    f = xp.arange(m, dtype=np.int64)
    if r * m < 2**63:
        order = xp.argsort(rows * m + f)
    else:  # pragma: no cover - beyond 2**63 nonzeros x buckets
        order = xp.lexsort(xp.stack([f, rows]))
    starts = xp.searchsorted(rows[order], xp.arange(r + 1, dtype=np.int64))
    return order, starts


def sparse_apply_dense(k0, k1, s, r, stream, A, acc):
    """``acc += unscaled S @ A`` for a dense (n, k) ``A`` (any memory order); ``acc`` is (r, k) of A's dtype.

    Rows of ``A`` are taken in passes; each pass hashes its rows on the device, sorts its nonzeros by
    bucket, and adds each bucket's terms in ascending row order into ``acc``. The sum of every entry
    is therefore one chain over ascending ``j``: the CPU kernel's chain when it uses one chunk.
    """
    xp = array_module(A)
    n, k = A.shape
    kernel = _bucket_sum[np.dtype(A.dtype)]
    step = max(1, _SPARSE_PASS_NONZEROS // s)
    for j0 in range(0, n, step):
        m = min(n, j0 + step) - j0
        rows, signs = sparse_pattern(k0, k1, j0, j0 + m, s, r, stream, xp)
        order, starts = bucket_order(rows.reshape(-1), r, xp)
        kernel[_grid(r * k, acc)](s, order, starts, signs.reshape(-1), A, j0, acc)


def _make_bucket_scatter_csr(ftype):
    @cuda.jit
    def bucket_scatter_csr(s, order, starts, signs, indptr, indices, data, j0, acc):
        # Thread i owns output row i: for each nonzero of bucket i, in ascending j, it adds sign * A[j]
        # (the stored entries of CSR row j) into acc[i]; the CPU's CSR kernel adds in this order.
        i = cuda.grid(1)
        while i < acc.shape[0]:
            for p in range(starts[i], starts[i + 1]):
                f = order[p]
                j = j0 + f // s
                sg = ftype(signs[f])
                for q in range(indptr[j], indptr[j + 1]):
                    acc[i, indices[q]] += sg * data[q]
            i += cuda.gridsize(1)

    return bucket_scatter_csr


_bucket_scatter_csr = {
    np.dtype(np.float32): _make_bucket_scatter_csr(np.float32),
    np.dtype(np.float64): _make_bucket_scatter_csr(np.float64),
}


def sparse_apply_csr(k0, k1, s, r, stream, indptr, indices, data, n, k, acc):
    """``acc += unscaled S @ A`` for a canonical CSR (n, k) ``A`` (sorted, unique indices), as the CPU kernel.

    The passes, hashing and sort of :func:`sparse_apply_dense`; one thread per output row adds the
    stored entries of its bucket's rows in ascending row order (the CPU kernel's order while it uses one
    chunk).
    """
    xp = array_module(data)
    kernel = _bucket_scatter_csr[np.dtype(data.dtype)]
    step = max(1, _SPARSE_PASS_NONZEROS // s)
    for j0 in range(0, n, step):
        m = min(n, j0 + step) - j0
        rows, signs = sparse_pattern(k0, k1, j0, j0 + m, s, r, stream, xp)
        order, starts = bucket_order(rows.reshape(-1), r, xp)
        kernel[_grid(r, acc)](s, order, starts, signs.reshape(-1), indptr, indices, data, j0, acc)


# ------------------------------------------------------------------------------------- FWHT / SRHT
# The transform of a row of N values makes log2(N) passes over it in global memory, level by level;
# two cuts: the first levels (blocks of up to 2048 values) run in shared memory, one read and one write
# for all of them, and the levels above go two at a time (radix 4). Every butterfly is the CPU's
# (a radix-4 pass is two radix-2 levels rounded the same way), so the result is bitwise the CPU's.
_FWHT_SHARED = 2048  # values of one row per block in shared memory (16 KiB in float64)


def _make_fwht_shared(ftype):
    @cuda.jit
    def fwht_shared(X, size):
        # Levels 1, 2, ..., size / 2 of every contiguous block of `size` values of each row.
        buf = cuda.shared.array(_FWHT_SHARED, ftype)
        tid = cuda.threadIdx.x
        nt = cuda.blockDim.x
        per_row = X.shape[1] // size
        b = cuda.blockIdx.x
        while b < X.shape[0] * per_row:  # uniform over the block: the barriers below are safe
            c = b // per_row
            base = (b % per_row) * size
            for t in range(tid, size, nt):
                buf[t] = X[c, base + t]
            cuda.syncthreads()
            h = 1
            while h < size:
                for p in range(tid, size // 2, nt):
                    i = (p // h) * 2 * h + p % h
                    u = buf[i]
                    v = buf[i + h]
                    buf[i] = u + v
                    buf[i + h] = u - v
                cuda.syncthreads()
                h *= 2
            for t in range(tid, size, nt):
                X[c, base + t] = buf[t]
            cuda.syncthreads()
            b += cuda.gridDim.x

    return fwht_shared


_fwht_shared = {
    np.dtype(np.float32): _make_fwht_shared(float32),
    np.dtype(np.float64): _make_fwht_shared(float64),
}


@cuda.jit
def _fwht_radix4_kernel(X, h, c_fast):
    # Levels h and 2h at once (the CPU's _radix4_pass); thread e takes quadruple p of row c, with c
    # varying fastest where the rows are interleaved in memory, so that a warp reads adjacent values.
    k = X.shape[0]
    quarter = X.shape[1] // 4
    e = cuda.grid(1)
    while e < k * quarter:
        if c_fast:
            c = e % k
            p = e // k
        else:
            c = e // quarter
            p = e % quarter
        i = (p // h) * 4 * h + p % h
        a = X[c, i]
        b = X[c, i + h]
        cc = X[c, i + 2 * h]
        d = X[c, i + 3 * h]
        ab0 = a + b
        ab1 = a - b
        cd0 = cc + d
        cd1 = cc - d
        X[c, i] = ab0 + cd0
        X[c, i + h] = ab1 + cd1
        X[c, i + 2 * h] = ab0 - cd0
        X[c, i + 3 * h] = ab1 - cd1
        e += cuda.gridsize(1)


@cuda.jit
def _fwht_level_kernel(X, h, c_fast):
    # One radix-2 level: pairs (i, i + h) of every row (the last level of an odd log2(N)).
    k = X.shape[0]
    half = X.shape[1] // 2
    e = cuda.grid(1)
    while e < k * half:
        if c_fast:
            c = e % k
            p = e // k
        else:
            c = e // half
            p = e % half
        i = (p // h) * 2 * h + p % h
        a = X[c, i]
        b = X[c, i + h]
        X[c, i] = a + b
        X[c, i + h] = a - b
        e += cuda.gridsize(1)


def fwht_columns(X):
    """In-place unnormalised FWHT of every row of ``X`` ((k, N), N a power of two), as the CPU kernel."""
    k, n = X.shape
    c_fast = bool(k > 1 and X.strides[0] < X.strides[1])
    h = 1
    if not c_fast and X.strides[1] == X.itemsize and np.dtype(X.dtype) in _fwht_shared:
        size = min(n, _FWHT_SHARED)
        blocks = k * (n // size)
        launch = max(1, min(_MAX_BLOCKS, blocks)), _THREADS, _launch_stream(X)
        _fwht_shared[np.dtype(X.dtype)][launch](X, size)
        h = size
    while 4 * h <= n:
        _fwht_radix4_kernel[_grid(k * n // 4, X)](X, h, c_fast)
        h *= 4
    if h < n:
        _fwht_level_kernel[_grid(k * n // 2, X)](X, h, c_fast)


@cuda.jit
def _signed_transpose_kernel(k0, k1, stream, A, c0, buf):
    # buf[c, j] = D[j] A[j, c0 + c] for j < n, zero padding above.
    n = A.shape[0]
    n_pad = buf.shape[1]
    key0 = np.uint64(k0)
    key1 = np.uint64(k1)
    e = cuda.grid(1)
    while e < buf.shape[0] * n_pad:
        c = e // n_pad
        j = e % n_pad
        if j < n:
            buf[c, j] = sign_of_lane(key0, key1, j, stream) * A[j, c0 + c]
        else:
            buf[c, j] = 0.0
        e += cuda.gridsize(1)


@cuda.jit
def _gather_rows_t_kernel(buf, rows, scale, c0, out):
    # out[i, c0 + c] = scale * buf[c, rows[i]]
    g = buf.shape[0]
    e = cuda.grid(1)
    while e < rows.shape[0] * g:
        i = e // g
        c = e % g
        out[i, c0 + c] = np.float64(scale) * np.float64(buf[c, rows[i]])  # as the CPU: a float64 product
        e += cuda.gridsize(1)


# Values of the transform buffer per group of columns (2 GiB in float64; one column if it is larger).
_SRHT_BUFFER = 1 << 28


def srht_apply(k0, k1, stream, n_pad, rows, scale, A, out):
    """``out = scale * (H D A_pad)[rows]`` (as the CPU kernel): signs, FWHT and gather on the device.

    Columns are transformed in groups whose ``(group, n_pad)`` buffer stays below 2 GiB (float64),
    or one column at a time where one column is larger (``n_pad > 2**28``: 8 GiB at ``2**30``).
    """
    xp = array_module(A)
    k = A.shape[1]
    group = max(1, min(k, _SRHT_BUFFER // n_pad))
    for c0 in range(0, k, group):
        g = min(group, k - c0)
        buf = xp.empty((g, n_pad), dtype=A.dtype)
        _signed_transpose_kernel[_grid(g * n_pad, buf)](k0, k1, stream, A, c0, buf)
        fwht_columns(buf)
        _gather_rows_t_kernel[_grid(rows.shape[0] * g, out)](buf, rows, scale, c0, out)


@cuda.jit
def _signs_kernel(k0, k1, start, stream, out):
    key0 = np.uint64(k0)
    key1 = np.uint64(k1)
    e = cuda.grid(1)
    while e < out.shape[0]:
        out[e] = sign_of_lane(key0, key1, start + e, stream)
        e += cuda.gridsize(1)


def lane_signs(k0, k1, start, stop, stream, xp=np):
    """The diagonal signs ``D[start:stop]`` (float64 +-1) of SRHT/SRDCT."""
    out = xp.empty(stop - start, dtype=np.float64)
    _signs_kernel[_grid(stop - start, out)](k0, k1, start, stream, out)
    return out


# ------------------------------------------------------------------------------------- sampling
@cuda.jit
def _uniform_indices_kernel(k0, k1, bound, stream, out):
    key0 = np.uint64(k0)
    key1 = np.uint64(k1)
    i = cuda.grid(1)
    while i < out.shape[0]:
        out[i] = bounded_exact(key0, key1, i, bound, stream)
        i += cuda.gridsize(1)


def uniform_indices(k0, k1, count, bound, stream, xp=np):
    """``count`` independent, exactly uniform integers in ``[0, bound)`` (int64), as the CPU kernel."""
    out = xp.empty(count, dtype=np.int64)
    _uniform_indices_kernel[_grid(count, out)](k0, k1, bound, stream, out)
    return out


@cuda.jit
def _gather_kernel(A, idx, scales, out):
    k = out.shape[1]
    e = cuda.grid(1)
    while e < out.shape[0] * k:
        i = e // k
        c = e % k
        out[i, c] = A[idx[i], c] * scales[i]
        e += cuda.gridsize(1)


def gather_rows(A, idx, scales, out):
    """``out[i] = A[idx[i]] * scales[i]`` (``scales`` in A's dtype): the sampling sketches' product."""
    _gather_kernel[_grid(out.size, out)](A, idx, scales, out)


# ------------------------------------------------------------------ careful residual gradient
# The twin of kernels.cpu.residual_gradient's "exact" and "compensated" modes, with the CPU's chunks
# and the CPU's operations in the CPU's order, so that the result is the CPU's bit for bit. Two
# things would break that on a GPU, and both are pinned here:
# - ptxas may contract a product and the sum that uses it into one FMA (one rounding where the CPU
#   rounds twice, which also breaks TwoSum's exactness). Every product that feeds a sum is therefore
#   an explicit fma(a, b, +0.0): exactly the rounded product, and an FMA is never contracted again.
# - The simulator's fma is `a * b + c` (two roundings), so in the simulator the exact product error
#   comes from Dekker's splitting instead (exact in plain arithmetic, which the simulator has).
if config.ENABLE_CUDASIM:

    @cuda.jit(device=True)
    def _mul(a, b):
        return a * b

    @cuda.jit(device=True)
    def _product_error(a, b, prod):
        # Dekker (1971): a and b split into 26-bit halves whose products are exact.
        t = 134217729.0 * a
        ah = t - (t - a)
        al = a - ah
        t = 134217729.0 * b
        bh = t - (t - b)
        bl = b - bh
        return ((ah * bh - prod) + ah * bl + al * bh) + al * bl

else:

    @cuda.jit(device=True)
    def _mul(a, b):
        return cuda.fma(a, b, 0.0)

    @cuda.jit(device=True)
    def _product_error(a, b, prod):
        return cuda.fma(a, b, -prod)


@cuda.jit(device=True)
def _two_sum_err(a, b, s):
    bb = s - a
    return (a - (s - bb)) + (b - bb)


@cuda.jit(device=True)
def _dot2_step(s, comp, x, b):
    """One term of Dot2 for ``s - x b``: the new sum and compensation (``kernels.cpu._dot2_step``)."""
    prod = _mul(x, b)
    s_new = s - prod
    return s_new, comp + (_two_sum_err(s, -prod, s_new) - _product_error(x, b, prod))


@cuda.jit(device=True)
def _dot2_residual(X, Y, Bt, i, m):
    """``Y[i, m] - X[i] . Bt[m]`` by Dot2 in four chains: (hi, lo), the CPU kernel's operations."""
    p = X.shape[1]
    p4 = p - p % 4
    s0 = Y[i, m]
    s1 = 0.0
    s2 = 0.0
    s3 = 0.0
    c0 = 0.0
    c1 = 0.0
    c2 = 0.0
    c3 = 0.0
    for j in range(0, p4, 4):
        s0, c0 = _dot2_step(s0, c0, X[i, j], Bt[m, j])
        s1, c1 = _dot2_step(s1, c1, X[i, j + 1], Bt[m, j + 1])
        s2, c2 = _dot2_step(s2, c2, X[i, j + 2], Bt[m, j + 2])
        s3, c3 = _dot2_step(s3, c3, X[i, j + 3], Bt[m, j + 3])
    for j in range(p4, p):
        s0, c0 = _dot2_step(s0, c0, X[i, j], Bt[m, j])
    t = s0 + s1
    comp = c0 + c1 + c2 + c3 + _two_sum_err(s0, s1, t)
    u = t + s2
    comp += _two_sum_err(t, s2, u)
    t = u + s3
    e = _two_sum_err(u, s3, t)
    hi = t + (comp + e)
    return hi, _two_sum_err(t, comp + e, hi)


@cuda.jit(device=True)
def _plain_residual(X, Y, Bt, i, m):
    """``Y[i, m] - X[i] . Bt[m]`` in four plain chains (the CPU's compensated mode), and 0."""
    p = X.shape[1]
    p4 = p - p % 4
    s0 = 0.0
    s1 = 0.0
    s2 = 0.0
    s3 = 0.0
    for j in range(0, p4, 4):
        s0 += _mul(X[i, j], Bt[m, j])
        s1 += _mul(X[i, j + 1], Bt[m, j + 1])
        s2 += _mul(X[i, j + 2], Bt[m, j + 2])
        s3 += _mul(X[i, j + 3], Bt[m, j + 3])
    for j in range(p4, p):
        s0 += _mul(X[i, j], Bt[m, j])
    return Y[i, m] - ((s0 + s1) + (s2 + s3)), 0.0


@cuda.jit
def _residual_gradient_chunks_kernel(X, Y, Bt, exact, hi, lo, nrm):
    # Thread (c, m) runs chunk c's rows for right-hand side m: the residual (Dot2 when `exact`), then
    # X[i].T r added into hi[c, m], lo[c, m] in double-double, as kernels.cpu._residual_gradient_py.
    n, p = X.shape
    nchunks, k = nrm.shape
    e = cuda.grid(1)
    while e < nchunks * k:
        c = e // k
        m = e % k
        for i in range(c * n // nchunks, (c + 1) * n // nchunks):
            if exact:
                r_hi, r_lo = _dot2_residual(X, Y, Bt, i, m)
            else:
                r_hi, r_lo = _plain_residual(X, Y, Bt, i, m)
            nrm[c, m] += _mul(r_hi, r_hi)
            for j in range(p):
                x = X[i, j]
                v = _mul(r_hi, x)
                h = hi[c, m, j]
                s = h + v
                bp = s - h
                term = (h - (s - bp)) + (v - bp)
                if exact:
                    term += _product_error(r_hi, x, v) + _mul(r_lo, x)
                lo[c, m, j] += term
                hi[c, m, j] = s
        e += cuda.gridsize(1)


@cuda.jit
def _chunk_sum_kernel(hi, lo, nrm, out, norms):
    # Thread (m, j) adds the chunks' double-double partials in chunk order (and thread (m, 0) the norms).
    nchunks, k, p = hi.shape
    e = cuda.grid(1)
    while e < k * p:
        m = e // p
        j = e % p
        sh = 0.0
        sl = 0.0
        for c in range(nchunks):
            v = hi[c, m, j]
            s = sh + v
            bp = s - sh
            sl += (sh - (s - bp)) + (v - bp) + lo[c, m, j]
            sh = s
        out[j, m] = sh + sl
        if j == 0:
            total = 0.0
            for c in range(nchunks):
                total += nrm[c, m]
            norms[m] = total
        e += cuda.gridsize(1)


def residual_gradient(X, Y, B, nchunks, accuracy):
    """``(X.T @ (Y - X @ B), colwise ||Y - X @ B||**2)`` on the device, ``accuracy`` "exact" or "compensated".

    ``X`` (n, p) and ``Y`` (n, k) float64 arrays of the device (C-ordered), ``B`` (p, k). The result is
    that of :func:`rsketch.kernels.cpu.residual_gradient` with the same ``nchunks``, bit for bit; the
    thread count is ``nchunks * k``, and the partial sums take ``16 nchunks k p`` bytes.
    """
    xp = array_module(X)
    n, p = X.shape
    k = Y.shape[1]
    Bt = xp.ascontiguousarray(xp.asarray(B, dtype=np.float64).T)
    hi = xp.zeros((nchunks, k, p))
    lo = xp.zeros((nchunks, k, p))
    nrm = xp.zeros((nchunks, k))
    exact = accuracy == "exact"
    _residual_gradient_chunks_kernel[_grid(nchunks * k, hi)](X, Y, Bt, exact, hi, lo, nrm)
    out = xp.empty((p, k))
    norms = xp.empty(k)
    _chunk_sum_kernel[_grid(k * p, out)](hi, lo, nrm, out, norms)
    return out, norms


_sparse_adjoint = {
    np.dtype(np.float32): _make_sparse_adjoint(np.float32),
    np.dtype(np.float64): _make_sparse_adjoint(np.float64),
}
