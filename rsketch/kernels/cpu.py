"""CPU kernels (numba): Philox words, Gaussian blocks, FWHT, sparse scatter/gather, normal-equation passes.

Each kernel implements exactly the arithmetic of the array-namespace reference in
:mod:`rsketch._random` and :mod:`rsketch.operators`; the tests compare them bit for bit
(integers, signs) or to a few ulp (Gaussian entries, whose log/sin/cos come from LLVM's libm
here and from NumPy's there). Kernels never validate: callers pass checked, contiguous data.
"""

from __future__ import annotations

import functools
import math
import types

import numpy as np
from llvmlite import ir
from numba import njit, prange
from numba import types as nbtypes
from numba.extending import intrinsic

from rsketch._parallel import parallel_launch
from rsketch._random import PHILOX_M0, PHILOX_M1, PHILOX_W0, PHILOX_W1, STREAM_TAIL, STREAM_WEDGE, ZIG_R

_M0 = np.uint64(PHILOX_M0)
_M1 = np.uint64(PHILOX_M1)
_W0 = np.uint64(PHILOX_W0)
_W1 = np.uint64(PHILOX_W1)
_MASK = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)
_INV_2_32 = 1.0 / 4294967296.0
_STREAM_WEDGE = STREAM_WEDGE
_STREAM_TAIL = STREAM_TAIL
_ZIG_R = ZIG_R


@njit(inline="always")
def philox(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 on uint64 words holding 32-bit values (see rsketch._random.philox4x32)."""
    for _ in range(10):
        p0 = _M0 * c0
        p1 = _M1 * c2
        n0 = ((p1 >> _S32) ^ c1 ^ k0) & _MASK
        n2 = ((p0 >> _S32) ^ c3 ^ k1) & _MASK
        c1 = p1 & _MASK
        c3 = p0 & _MASK
        c0 = n0
        c2 = n2
        k0 = (k0 + _W0) & _MASK
        k1 = (k1 + _W1) & _MASK
    return c0, c1, c2, c3


@njit(inline="always")
def _words(k0, k1, index, block, stream):
    idx = np.uint64(index)
    return philox(idx & _MASK, idx >> _S32, np.uint64(block), np.uint64(stream), k0, k1)


@njit(inline="always")
def _uniform(w):
    return (np.float64(w) + 0.5) * _INV_2_32


@njit(inline="always")
def _bounded(w, bound):
    return np.int64((w * np.uint64(bound)) >> _S32)


@intrinsic
def _fma(typingctx, a, b, c):
    """``a * b + c`` with one rounding (LLVM's fma; a hardware instruction on AVX2 and AVX-512 CPUs)."""
    sig = nbtypes.float64(nbtypes.float64, nbtypes.float64, nbtypes.float64)

    def codegen(context, builder, signature, args):
        d = ir.DoubleType()
        fn = builder.module.declare_intrinsic("llvm.fma", [d], ir.FunctionType(d, [d, d, d]))
        return builder.call(fn, args)

    return sig, codegen


def _serial_twin(parallel_kernel, **options):
    """A one-thread compilation of a parallel kernel's Python source.

    The copy gets its own ``__qualname__``: numba names its on-disk cache after the function, and
    twins sharing one name would share (and overwrite) one cache entry, so a process could load
    the serial machine code for the parallel kernel or the reverse.
    """
    f = parallel_kernel.py_func
    twin = types.FunctionType(
        f.__code__, f.__globals__, f.__name__ + "_serial", f.__defaults__, f.__closure__
    )
    twin.__qualname__ = f.__qualname__ + "_serial"
    twin.__doc__ = f.__doc__
    return njit(cache=True, **options)(twin)


# Below this many units of work a kernel runs on one thread: waking a thread pool costs more than
# the work itself (and, on a loaded machine, up to milliseconds per call).
_PARALLEL_MIN_WORK = 1 << 14


def _launch(kernel, *args):
    """A parallel kernel's call, one at a time under numba's workqueue layer (:mod:`rsketch._parallel`)."""
    with parallel_launch():
        return kernel(*args)


def philox_words(k0, k1, start, count, n_blocks, stream):
    """Words ``out[i, b, :]`` of counter ``(start + i, block b, stream)``; shape (count, n_blocks, 4)."""
    if count * n_blocks >= _PARALLEL_MIN_WORK:
        return _launch(_philox_words_par, k0, k1, start, count, n_blocks, stream)
    return _philox_words_ser(k0, k1, start, count, n_blocks, stream)


@njit(parallel=True, cache=True)
def _philox_words_par(k0, k1, start, count, n_blocks, stream):
    out = np.empty((count, n_blocks, 4), dtype=np.uint32)
    key0 = np.uint64(k0)
    key1 = np.uint64(k1)
    for i in prange(count):
        for b in range(n_blocks):
            w0, w1, w2, w3 = _words(key0, key1, start + i, b, stream)
            out[i, b, 0] = w0
            out[i, b, 1] = w1
            out[i, b, 2] = w2
            out[i, b, 3] = w3
    return out


_philox_words_ser = _serial_twin(_philox_words_par)


@njit(inline="always")
def _zig_attempt(wa, wb, key0, key1, j, attempt, X):
    # One ziggurat attempt (see rsketch._random): returns (accepted, value).
    layer = np.int64(wa & np.uint64(0x7F))
    u53 = np.float64(wa >> np.uint64(7)) * 268435456.0 + np.float64(wb >> np.uint64(4))
    u = (u53 + 0.5) * (2.0**-52) - 1.0
    xi = X[layer]
    xi1 = X[layer + 1]
    z = u * xi
    if abs(u) * xi < xi1:
        return True, z
    if layer > 0:
        f0 = math.exp(-0.5 * (xi * xi - z * z))
        f1 = math.exp(-0.5 * (xi1 * xi1 - z * z))
        u2 = _uniform(_words(key0, key1, j, attempt, _STREAM_WEDGE)[0])
        return f1 + u2 * (f0 - f1) < 1.0, z
    t = 0
    while True:
        w0, w1, _, _ = _words(key0, key1, j, attempt, _STREAM_TAIL + t)
        tx = math.log(_uniform(w0)) / _ZIG_R
        ty = math.log(_uniform(w1))
        if -2.0 * ty >= tx * tx:
            return True, (tx - _ZIG_R) if u < 0 else (_ZIG_R - tx)
        t += 1


# ---------------------------------------------------------------------------------------------
# Gaussian columns, generated in chunks of 128 attempts: the Philox words of a chunk are computed
# first, in one loop that LLVM vectorises (4-8 counters per instruction), then the attempts are
# taken in order, the rare wedge and tail attempts (about 1%) through _zig_attempt. Column j is
# the same as one attempt at a time (the tests compare with the portable path), 1.7x faster.
# A column can be produced in segments: _zig_fill returns the next attempt, so a caller holding
# that number per column generates rows i0..i1 of many columns at a time (a cache tile) and never
# holds a whole column of a tall sketch.
# ---------------------------------------------------------------------------------------------
_ZIG_Q = 64  # counters per chunk (two attempts each)


@njit(inline="always")
def _zig_words(key0, key1, lo, hi, q0, stream, W):
    for t in range(_ZIG_Q):
        w0, w1, w2, w3 = philox(lo, hi, q0 + np.uint64(t), stream, key0, key1)
        W[0, t] = w0
        W[1, t] = w1
        W[2, t] = w2
        W[3, t] = w3


@njit(inline="always")
def _zig_take(W, h, tq, X, out, base, stride, pos, key0, key1, j, q0):
    # Attempt 2 (q0 + tq) + h: written at out[base + pos * stride] (even when rejected: the slot
    # is overwritten by the next accepted one); returns the next position.
    wa = W[2 * h, tq]
    wb = W[2 * h + 1, tq]
    layer = wa & np.uint32(0x7F)
    u = (
        np.float64(np.int32(wa >> np.uint32(7))) * 268435456.0
        + np.float64(np.int32(wb >> np.uint32(4)))
        + 0.5
    ) * (2.0**-52) - 1.0
    xi = X[layer]
    z = u * xi
    if abs(u) * xi < X[layer + np.uint32(1)]:
        out[base + np.uint64(pos) * stride] = z
        return pos + 1
    ok, z = _zig_attempt(np.uint64(wa), np.uint64(wb), key0, key1, j, 2 * (q0 + tq) + h, X)
    out[base + np.uint64(pos) * stride] = z
    return pos + np.int64(ok)


@njit(cache=True, nogil=True)
def _zig_fill(key0, key1, j, attempt, stream, out, base, stride, pos, stop, X, W):
    """Accepted normals ``pos .. stop - 1`` of column ``j``, from ``attempt`` on; returns the next attempt.

    Value ``p`` goes to ``out[base + p * stride]`` (flat ``out``; ``base``, ``stride`` uint64).
    ``W`` is a (4, _ZIG_Q) uint32 work array.
    """
    jw = np.uint64(j)
    lo = jw & _MASK
    hi = jw >> _S32
    while pos < stop:
        q0 = attempt >> 1
        _zig_words(key0, key1, lo, hi, np.uint64(q0), stream, W)
        t0 = attempt - 2 * q0
        if t0 == 0 and stop - pos > 2 * _ZIG_Q:  # room for the whole chunk: no end test per attempt
            for tq in range(_ZIG_Q):
                pos = _zig_take(W, 0, tq, X, out, base, stride, pos, key0, key1, j, q0)
                pos = _zig_take(W, 1, tq, X, out, base, stride, pos, key0, key1, j, q0)
        else:
            for t in range(t0, 2 * _ZIG_Q):
                pos = _zig_take(W, t & 1, t >> 1, X, out, base, stride, pos, key0, key1, j, q0)
                if pos == stop:
                    return 2 * q0 + t + 1
        attempt = 2 * q0 + 2 * _ZIG_Q
    return attempt


def gaussian_columns(k0, k1, start, stop, r, stream, out, X):
    """Standard normals of columns ``start:stop`` (``r`` each) into ``out[j - start, i]``.

    The counter-driven ziggurat of :func:`rsketch._random.ziggurat_columns`, one column at a
    time (parallel over columns when there is enough work): column j takes its first r
    accepted attempts, two attempts per Philox call. ``X`` is ``rsketch._random.ZIG_X``;
    ``out`` is C-contiguous float64.
    """
    if (stop - start) * r < _PARALLEL_MIN_WORK:
        _gaussian_columns_ser(k0, k1, start, stop, r, stream, out, X)
    else:
        _launch(_gaussian_columns_par, k0, k1, start, stop, r, stream, out, X)


@njit(parallel=True, cache=True)
def _gaussian_columns_par(k0, k1, start, stop, r, stream, out, X):
    key0 = np.uint64(k0)
    key1 = np.uint64(k1)
    st = np.uint64(stream)
    flat = out.reshape(-1)
    for jj in prange(stop - start):
        W = np.empty((4, _ZIG_Q), dtype=np.uint32)
        _zig_fill(key0, key1, start + jj, 0, st, flat, np.uint64(jj * r), np.uint64(1), 0, r, X, W)


_gaussian_columns_ser = _serial_twin(_gaussian_columns_par)


# ---------------------------------------------------------------------------------------------
# Gaussian products without BLAS. S @ A sums, for each output entry, the terms of columns j in
# ascending order within each of n_lanes contiguous ranges of j (a number fixed by the shape, see
# rsketch.operators.gaussian), then the lanes in order: the same bits for every thread count.
# S.T @ Z: each output entry is one sum over i ascending. Every product-add is a fused
# multiply-add (llvm.fma, one rounding, the same on every IEEE machine), never reassociated, so
# the vector width (AVX2 or AVX-512) does not change a bit either.
# ---------------------------------------------------------------------------------------------
_GAUSS_COLS = 64  # columns generated together (a tile of the sketch)
_GAUSS_ROWS = 1024  # rows per tile: a 64 x 1024 float64 tile is 512 KiB (L2)


@njit(inline="always")
def _rank_update(acc, acc_ld, acc_off, coef, coef_ld, coef_off, k, M, m_ld, ny, nx):
    """``acc[c, x] += sum_y coef[c, y] * M[y, x]`` for ``c < k``, ``x < nx``, ``y < ny``, on flat arrays.

    Entry ``(c, x)`` is updated by one chain of fused multiply-adds over ``y`` ascending, whatever
    the unrolling (four ``y`` and two ``c`` per pass keep two accumulators per load of ``M``);
    ``acc[c, x]`` is ``acc[c * acc_ld + acc_off + x]``, ``coef[c, y]`` is
    ``coef[c * coef_ld + coef_off + y]`` and ``M[y, x]`` is ``M[y * m_ld + x]``.
    """
    u = np.uint64
    ld = u(m_ld)
    ny4 = ny - ny % 4
    k2 = k - k % 2
    for c in range(0, k, 2):
        b0 = u(c * acc_ld + acc_off)
        a_ = u(c * coef_ld + coef_off)
        if c < k2:
            b1 = b0 + u(acc_ld)
            e_ = a_ + u(coef_ld)
            for y in range(0, ny4, 4):
                a0 = coef[a_ + u(y)]
                a1 = coef[a_ + u(y + 1)]
                a2 = coef[a_ + u(y + 2)]
                a3 = coef[a_ + u(y + 3)]
                e0 = coef[e_ + u(y)]
                e1 = coef[e_ + u(y + 1)]
                e2 = coef[e_ + u(y + 2)]
                e3 = coef[e_ + u(y + 3)]
                g0 = u(y) * ld
                g1 = g0 + ld
                g2 = g1 + ld
                g3 = g2 + ld
                for x in range(u(nx)):
                    x0 = M[g0 + x]
                    x1 = M[g1 + x]
                    x2 = M[g2 + x]
                    x3 = M[g3 + x]
                    acc[b0 + x] = _fma(a3, x3, _fma(a2, x2, _fma(a1, x1, _fma(a0, x0, acc[b0 + x]))))
                    acc[b1 + x] = _fma(e3, x3, _fma(e2, x2, _fma(e1, x1, _fma(e0, x0, acc[b1 + x]))))
            for y in range(ny4, ny):
                a0 = coef[a_ + u(y)]
                e0 = coef[e_ + u(y)]
                g0 = u(y) * ld
                for x in range(u(nx)):
                    x0 = M[g0 + x]
                    acc[b0 + x] = _fma(a0, x0, acc[b0 + x])
                    acc[b1 + x] = _fma(e0, x0, acc[b1 + x])
        else:  # the last c of an odd k
            for y in range(0, ny4, 4):
                a0 = coef[a_ + u(y)]
                a1 = coef[a_ + u(y + 1)]
                a2 = coef[a_ + u(y + 2)]
                a3 = coef[a_ + u(y + 3)]
                g0 = u(y) * ld
                g1 = g0 + ld
                g2 = g1 + ld
                g3 = g2 + ld
                for x in range(u(nx)):
                    acc[b0 + x] = _fma(
                        a3,
                        M[g3 + x],
                        _fma(a2, M[g2 + x], _fma(a1, M[g1 + x], _fma(a0, M[g0 + x], acc[b0 + x]))),
                    )
            for y in range(ny4, ny):
                a0 = coef[a_ + u(y)]
                g0 = u(y) * ld
                for x in range(u(nx)):
                    acc[b0 + x] = _fma(a0, M[g0 + x], acc[b0 + x])


@njit(parallel=True, cache=True)
def _gaussian_apply_dense_par(k0, k1, r, stream, A, acc, n_lanes, X):
    """``acc[l] += G[lane l].T @ A[lane l]`` (unscaled) for a dense (n, k) ``A`` in either order.

    ``acc`` is flat, ``n_lanes`` blocks of (k, r) float64, zeroed by the caller. Lane ``l`` takes
    columns ``l n / n_lanes .. (l + 1) n / n_lanes - 1`` of ``S`` in tiles of 64 columns x 1024 rows.
    """
    n, k = A.shape
    key0 = np.uint64(k0)
    key1 = np.uint64(k1)
    st = np.uint64(stream)
    rt = min(r, _GAUSS_ROWS)
    cb = _GAUSS_COLS
    for lane in prange(n_lanes):
        lo = lane * n // n_lanes
        hi = (lane + 1) * n // n_lanes
        G = np.empty(cb * rt)
        coef = np.empty(k * cb)
        attempt = np.empty(cb, dtype=np.int64)
        W = np.empty((4, _ZIG_Q), dtype=np.uint32)
        off = lane * k * r
        for j0 in range(lo, hi, cb):
            m = min(hi, j0 + cb) - j0
            for jj in range(m):
                attempt[jj] = 0
                for c in range(k):
                    coef[c * cb + jj] = np.float64(A[j0 + jj, c])
            for i0 in range(0, r, rt):
                t = min(r, i0 + rt) - i0
                for jj in range(m):
                    attempt[jj] = _zig_fill(
                        key0, key1, j0 + jj, attempt[jj], st, G, np.uint64(jj * rt), np.uint64(1), 0, t, X, W
                    )
                _rank_update(acc, r, off + i0, coef, cb, 0, k, G, rt, m, t)


@njit(parallel=True, cache=True)
def _gaussian_apply_csr_par(k0, k1, r, stream, indptr, indices, data, n, k, acc, n_lanes, X):
    """As :func:`_gaussian_apply_dense_par` for a CSR (n, k) matrix with sorted, unique indices.

    Each stored entry adds its multiple of a column tile: the chain of each output entry is the
    dense kernel's chain without its zero terms, so CSR and dense input give the same result.
    """
    key0 = np.uint64(k0)
    key1 = np.uint64(k1)
    st = np.uint64(stream)
    rt = min(r, _GAUSS_ROWS)
    cb = _GAUSS_COLS
    for lane in prange(n_lanes):
        lo = lane * n // n_lanes
        hi = (lane + 1) * n // n_lanes
        G = np.empty(cb * rt)
        attempt = np.empty(cb, dtype=np.int64)
        W = np.empty((4, _ZIG_Q), dtype=np.uint32)
        off = lane * k * r
        for j0 in range(lo, hi, cb):
            m = min(hi, j0 + cb) - j0
            for jj in range(m):
                attempt[jj] = 0
            for i0 in range(0, r, rt):
                t = min(r, i0 + rt) - i0
                for jj in range(m):
                    if indptr[j0 + jj + 1] > indptr[j0 + jj]:  # an empty row of A needs no column of S
                        attempt[jj] = _zig_fill(
                            key0,
                            key1,
                            j0 + jj,
                            attempt[jj],
                            st,
                            G,
                            np.uint64(jj * rt),
                            np.uint64(1),
                            0,
                            t,
                            X,
                            W,
                        )
                for jj in range(m):
                    g = np.uint64(jj * rt)
                    for p in range(indptr[j0 + jj], indptr[j0 + jj + 1]):
                        v = np.float64(data[p])
                        b = np.uint64(off + indices[p] * r + i0)
                        for x in range(np.uint64(t)):
                            acc[b + x] = _fma(v, G[g + x], acc[b + x])


@njit(parallel=True, cache=True)
def _reduce_lanes(acc, n_lanes, k, r, scale, out):
    """``out[i, c] = scale * (acc[0, c, i] + acc[1, c, i] + ...)``, lanes in order."""
    for i in prange(r):
        for c in range(k):
            s = acc[c * r + i]
            for lane in range(1, n_lanes):
                s += acc[(lane * k + c) * r + i]
            out[i, c] = scale * s


@njit(parallel=True, cache=True)
def _gaussian_adjoint_par(k0, k1, r, stream, Zt, out, scale, X):
    """``out = scale * G @ Z`` (G: the unscaled (n, r) transpose of S), ``Zt`` = Z.T as flat (k, r) float64.

    Parallel over blocks of 64 rows of ``out``; each block generates its columns of ``S`` in
    tiles of 1024 rows, stored transposed so that the sum over ``i`` runs across the block.
    """
    n, k = out.shape
    key0 = np.uint64(k0)
    key1 = np.uint64(k1)
    st = np.uint64(stream)
    rt = min(r, _GAUSS_ROWS)
    cb = _GAUSS_COLS
    for blk in prange((n + cb - 1) // cb):
        j0 = blk * cb
        m = min(n, j0 + cb) - j0
        GT = np.empty(rt * cb)
        acc = np.zeros(k * cb)
        attempt = np.zeros(cb, dtype=np.int64)
        W = np.empty((4, _ZIG_Q), dtype=np.uint32)
        for i0 in range(0, r, rt):
            t = min(r, i0 + rt) - i0
            for jj in range(m):
                attempt[jj] = _zig_fill(
                    key0, key1, j0 + jj, attempt[jj], st, GT, np.uint64(jj), np.uint64(cb), 0, t, X, W
                )
            _rank_update(acc, cb, 0, Zt, r, i0, k, GT, cb, t, m)
        for jj in range(m):
            for c in range(k):
                out[j0 + jj, c] = scale * acc[c * cb + jj]


# ---------------------------------------------------------------------------------------------
# Sparse sign / CountSketch: column j of S has s nonzeros, one in each of s row blocks
# (the block construction of OSNAP). Nonzero t of column j draws from counter (j, t // 2, stream):
# words 0/2 pick the row within block t, bit 0 of words 1/3 the sign.
# ---------------------------------------------------------------------------------------------


@njit(inline="always")
def _sparse_entry(key0, key1, j, t, s, r, stream):
    w0, w1, w2, w3 = _words(key0, key1, j, t // 2, stream)
    if t % 2 == 0:
        wr, ws = w0, w1
    else:
        wr, ws = w2, w3
    lo = (t * r) // s
    hi = ((t + 1) * r) // s
    row = lo + _bounded(wr, hi - lo)
    sign = 1.0 - 2.0 * np.float64(ws & np.uint64(1))
    return row, sign


def sparse_pattern(k0, k1, start, stop, s, r, stream):
    """Rows (int64) and signs (+-1.0) of columns ``start:stop``: arrays of shape (stop - start, s)."""
    if (stop - start) * s >= _PARALLEL_MIN_WORK:
        return _launch(_sparse_pattern_par, k0, k1, start, stop, s, r, stream)
    return _sparse_pattern_ser(k0, k1, start, stop, s, r, stream)


@njit(parallel=True, cache=True)
def _sparse_pattern_par(k0, k1, start, stop, s, r, stream):
    m = stop - start
    rows = np.empty((m, s), dtype=np.int64)
    signs = np.empty((m, s), dtype=np.float64)
    key0 = np.uint64(k0)
    key1 = np.uint64(k1)
    for jj in prange(m):
        for t in range(s):
            row, sign = _sparse_entry(key0, key1, start + jj, t, s, r, stream)
            rows[jj, t] = row
            signs[jj, t] = sign
    return rows, signs


HASH_BLOCK = 256  # rows hashed ahead of each scatter loop, so the add loop stays simple (SIMD)


@njit(inline="always")
def _hash_block(key0, key1, b0, b1, s, r, stream, rows, signs):
    for j in range(b0, b1):
        for t in range(s):
            row, sign = _sparse_entry(key0, key1, j, t, s, r, stream)
            rows[(j - b0) * s + t] = row
            signs[(j - b0) * s + t] = sign


@njit(parallel=True, cache=True)
def _reduce_chunks(acc, scale, out):
    """``out[i, col] = scale * (acc[0, i, col] + acc[1, i, col] + ...)``, chunks in order."""
    n_chunks, r, k = acc.shape
    for i in prange(r):
        for col in range(k):
            total = 0.0
            for c in range(n_chunks):
                total += acc[c, i, col]
            out[i, col] = scale * total


@njit(parallel=True, cache=True)
def _reduce_chunks_t(acc, scale, out):
    """As :func:`_reduce_chunks` for accumulators stored transposed, ``acc[c, col, i]``."""
    n_chunks, k, r = acc.shape
    for i in prange(r):
        for col in range(k):
            total = 0.0
            for c in range(n_chunks):
                total += acc[c, col, i]
            out[i, col] = scale * total


_sparse_pattern_ser = _serial_twin(_sparse_pattern_par)


@njit(parallel=True, cache=True)
def _sparse_apply_dense_par(k0, k1, s, r, stream, A, acc):
    """``acc[c] += (unscaled S @ A)`` over chunk ``c`` of the rows of a row-major (n, k) A.

    The rows of A are split into ``n_chunks = acc.shape[0]`` contiguous ranges (chosen from the
    shape only, so the result does not depend on the thread count), each with a private, zeroed
    (r, k) accumulator; a chunk hashes 256 rows ahead, then adds each row, signed, into its s
    accumulator rows. A is read once, as a stream.
    """
    n, k = A.shape
    n_chunks = acc.shape[0]
    key0 = np.uint64(k0)
    key1 = np.uint64(k1)
    for c in prange(n_chunks):
        lo = (c * n) // n_chunks
        hi = ((c + 1) * n) // n_chunks
        a = acc[c]
        rows = np.empty(HASH_BLOCK * s, dtype=np.int64)
        signs = np.empty(HASH_BLOCK * s, dtype=acc.dtype)
        for b0 in range(lo, hi, HASH_BLOCK):
            b1 = min(hi, b0 + HASH_BLOCK)
            _hash_block(key0, key1, b0, b1, s, r, stream, rows, signs)
            for j in range(b0, b1):
                x = A[j]
                for t in range(s):
                    dst = a[rows[(j - b0) * s + t]]
                    sg = signs[(j - b0) * s + t]
                    for col in range(k):
                        dst[col] += sg * x[col]


@njit(parallel=True, cache=True)
def _sparse_apply_dense_fortran_par(k0, k1, s, r, stream, A, acc):
    """``acc[c] += (unscaled S @ A).T`` over chunk ``c`` of a column-major (n, k) A, without a copy.

    As :func:`sparse_apply_dense` (row ranges with private accumulators, hashes computed once per
    block of 256 rows), but each block is consumed column by column: 256 contiguous values of a
    column scatter into that column's accumulator, stored transposed as (k, r) so the scatter
    stays within r contiguous values.
    """
    n, k = A.shape
    n_chunks = acc.shape[0]
    key0 = np.uint64(k0)
    key1 = np.uint64(k1)
    for c in prange(n_chunks):
        lo = (c * n) // n_chunks
        hi = ((c + 1) * n) // n_chunks
        rows = np.empty(HASH_BLOCK * s, dtype=np.int64)
        signs = np.empty(HASH_BLOCK * s, dtype=acc.dtype)
        for b0 in range(lo, hi, HASH_BLOCK):
            b1 = min(hi, b0 + HASH_BLOCK)
            _hash_block(key0, key1, b0, b1, s, r, stream, rows, signs)
            for col in range(k):
                dst = acc[c, col]
                for j in range(b0, b1):
                    x = A[j, col]
                    for t in range(s):
                        dst[rows[(j - b0) * s + t]] += signs[(j - b0) * s + t] * x


@njit(parallel=True, cache=True)
def _sparse_apply_csr_par(k0, k1, s, r, stream, indptr, indices, data, n, k, acc):
    """``acc[c] += (unscaled S @ A)`` over chunk ``c`` of a CSR matrix A (n, k), row by stored row."""
    n_chunks = acc.shape[0]
    key0 = np.uint64(k0)
    key1 = np.uint64(k1)
    for c in prange(n_chunks):
        lo = (c * n) // n_chunks
        hi = ((c + 1) * n) // n_chunks
        a = acc[c]
        rows = np.empty(HASH_BLOCK * s, dtype=np.int64)
        signs = np.empty(HASH_BLOCK * s, dtype=acc.dtype)
        for b0 in range(lo, hi, HASH_BLOCK):
            b1 = min(hi, b0 + HASH_BLOCK)
            _hash_block(key0, key1, b0, b1, s, r, stream, rows, signs)
            for j in range(b0, b1):
                for t in range(s):
                    dst = a[rows[(j - b0) * s + t]]
                    sg = signs[(j - b0) * s + t]
                    for p in range(indptr[j], indptr[j + 1]):
                        dst[indices[p]] += sg * data[p]


@njit(parallel=True, cache=True)
def _sparse_adjoint_par(k0, k1, s, r, stream, scale, Z, out):
    """``out = S.T @ Z`` for a dense (r, k) Z: row j of out gathers its s hashed rows of Z."""
    n, k = out.shape
    key0 = np.uint64(k0)
    key1 = np.uint64(k1)
    for j in prange(n):
        for col in range(k):
            out[j, col] = 0.0
        for t in range(s):
            row, sign = _sparse_entry(key0, key1, j, t, s, r, stream)
            for col in range(k):
                out[j, col] += scale * sign * Z[row, col]


# ---------------------------------------------------------------------------------------------
# Fast Walsh-Hadamard transform (unnormalised, natural/Hadamard order), in place on a
# contiguous vector whose length is a power of two. Radix-4 butterflies halve the passes over
# memory; the first levels run inside cache-sized blocks.
# ---------------------------------------------------------------------------------------------

_FWHT_BLOCK = 1 << 12  # 4096 doubles = 32 KiB: the inner levels stay in L1/L2


@njit(inline="always")
def _radix4_pass(x, lo, hi, h):
    # Two levels (h and 2h) at once over x[lo:hi].
    for i in range(lo, hi, 4 * h):
        for j in range(i, i + h):
            a = x[j]
            b = x[j + h]
            c = x[j + 2 * h]
            d = x[j + 3 * h]
            ab0 = a + b
            ab1 = a - b
            cd0 = c + d
            cd1 = c - d
            x[j] = ab0 + cd0
            x[j + h] = ab1 + cd1
            x[j + 2 * h] = ab0 - cd0
            x[j + 3 * h] = ab1 - cd1


@njit(inline="always")
def _radix2_pass(x, lo, hi, h):
    for i in range(lo, hi, 2 * h):
        for j in range(i, i + h):
            a = x[j]
            b = x[j + h]
            x[j] = a + b
            x[j + h] = a - b


@njit(inline="always")
def _levels(x, lo, hi, h_start, h_stop):
    # Levels h_start, 2 h_start, ... < h_stop over x[lo:hi], two at a time where possible.
    h = h_start
    while 4 * h <= h_stop:
        _radix4_pass(x, lo, hi, h)
        h *= 4
    if h < h_stop:
        _radix2_pass(x, lo, hi, h)


@njit(cache=True)
def fwht_vector(x):
    """In-place unnormalised FWHT of a contiguous 1-D array of power-of-two length."""
    n = x.shape[0]
    block = min(n, _FWHT_BLOCK)
    for lo in range(0, n, block):
        _levels(x, lo, lo + block, 1, block)
    if block < n:
        _levels(x, 0, n, block, n)


def fwht_columns(X):
    """In-place FWHT of every row of ``X`` (shape (k, N), C-contiguous), parallel over rows."""
    _launch(_fwht_columns_par, X)


@njit(parallel=True, cache=True)
def _fwht_columns_par(X):
    for c in prange(X.shape[0]):
        fwht_vector(X[c])


_SRHT_GROUP = 8  # columns per work item: one 64-byte cache line of a row-major float64 A


@njit(parallel=True, cache=True)
def _srht_apply_par(k0, k1, stream, n_pad, rows, scale, A, out):
    """``out = scale * (H D A_pad)[rows]`` with D the Philox signs, H the n_pad-point FWHT.

    Work items are groups of 8 columns: each gathers its columns (times the signs) into a
    private (8, n_pad) buffer, so A is read once whatever its memory order, transforms each
    column in cache-blocked passes, and keeps only the sampled rows. Extra memory:
    threads * 8 * n_pad.
    """
    n, k = A.shape
    r = rows.shape[0]
    key0 = np.uint64(k0)
    key1 = np.uint64(k1)
    n_groups = (k + _SRHT_GROUP - 1) // _SRHT_GROUP
    signs = np.empty(n, dtype=A.dtype)
    for jb in prange((n + 3) // 4):
        w0, w1, w2, w3 = _words(key0, key1, jb, 0, stream)
        j = 4 * jb
        signs[j] = 1.0 - 2.0 * np.float64(w0 & np.uint64(1))
        if j + 1 < n:
            signs[j + 1] = 1.0 - 2.0 * np.float64(w1 & np.uint64(1))
        if j + 2 < n:
            signs[j + 2] = 1.0 - 2.0 * np.float64(w2 & np.uint64(1))
        if j + 3 < n:
            signs[j + 3] = 1.0 - 2.0 * np.float64(w3 & np.uint64(1))
    for g in prange(n_groups):
        c0 = g * _SRHT_GROUP
        m = min(_SRHT_GROUP, k - c0)
        buf = np.zeros((m, n_pad), dtype=A.dtype)
        for j in range(n):
            sj = signs[j]
            for c in range(m):
                buf[c, j] = sj * A[j, c0 + c]
        for c in range(m):
            fwht_vector(buf[c])
            for i in range(r):
                out[i, c0 + c] = scale * buf[c, rows[i]]


@njit(parallel=True, cache=True)
def _srht_adjoint_par(k0, k1, stream, n_pad, rows, scale, Z, out):
    """``out = scale * D H^T P^T Z`` truncated to the first n rows (H is symmetric)."""
    n, k = out.shape
    r = rows.shape[0]
    key0 = np.uint64(k0)
    key1 = np.uint64(k1)
    for c in prange(k):
        buf = np.zeros(n_pad, dtype=out.dtype)
        for i in range(r):
            buf[rows[i]] += Z[i, c]
        fwht_vector(buf)
        for jb in range((n + 3) // 4):
            w0, w1, w2, w3 = _words(key0, key1, jb, 0, stream)
            j = 4 * jb
            out[j, c] = scale * (1.0 - 2.0 * np.float64(w0 & np.uint64(1))) * buf[j]
            if j + 1 < n:
                out[j + 1, c] = scale * (1.0 - 2.0 * np.float64(w1 & np.uint64(1))) * buf[j + 1]
            if j + 2 < n:
                out[j + 2, c] = scale * (1.0 - 2.0 * np.float64(w2 & np.uint64(1))) * buf[j + 2]
            if j + 3 < n:
                out[j + 3, c] = scale * (1.0 - 2.0 * np.float64(w3 & np.uint64(1))) * buf[j + 3]


# ---------------------------------------------------------------------------------------------
# Sampled indices in O(r): exactly uniform integers by mask-and-reject on 64-bit Philox words, and
# Floyd's algorithm for an r-subset of [0, m) (the arithmetic of rsketch._random.bounded_exact and
# rsketch._random.sample_without_replacement, which the tests compare with these bit for bit).
# ---------------------------------------------------------------------------------------------
_GOLDEN64 = np.uint64(0x9E3779B97F4A7C15)


@njit(inline="always")
def _bounded_exact(key0, key1, index, bound, stream):
    # Attempt a reads words 2 (a % 2), 2 (a % 2) + 1 of counter (index, a // 2, stream) as one
    # 64-bit value, keeps its low bits up to bound's bit length, and is accepted below bound.
    b = np.uint64(bound)
    mask = b - np.uint64(1)
    for sh in (1, 2, 4, 8, 16, 32):
        mask |= mask >> np.uint64(sh)
    a = 0
    while True:
        w0, w1, w2, w3 = _words(key0, key1, index, a >> 1, stream)
        if a & 1:
            v = ((w3 << _S32) | w2) & mask
        else:
            v = ((w1 << _S32) | w0) & mask
        if v < b:
            return np.int64(v)
        a += 1


@njit(parallel=True, cache=True)
def _uniform_indices_par(k0, k1, count, bound, stream):
    """``out[i]`` uniform in ``[0, bound)`` from counters ``(i, ., stream)``, ``i < count``."""
    out = np.empty(count, dtype=np.int64)
    key0 = np.uint64(k0)
    key1 = np.uint64(k1)
    for i in prange(count):
        out[i] = _bounded_exact(key0, key1, i, bound, stream)
    return out


_uniform_indices_ser = _serial_twin(_uniform_indices_par)


def uniform_indices(k0, k1, count, bound, stream):
    """``count`` independent, exactly uniform integers in ``[0, bound)`` (int64), ``bound <= 2**63 - 1``."""
    if count >= _PARALLEL_MIN_WORK:
        return _launch(_uniform_indices_par, k0, k1, count, bound, stream)
    return _uniform_indices_ser(k0, k1, count, bound, stream)


@njit(cache=True)
def floyd_sample(k0, k1, m, r, stream):
    """A uniformly random ``r``-subset of ``[0, m)``, sorted: Floyd's algorithm in O(r) memory.

    Iteration ``i`` (``t = m - r + i``) draws ``v`` uniform in ``[0, t]`` from counters
    ``(i, ., stream)`` and adds ``v``, or ``t`` if ``v`` is already chosen; every subset has
    probability ``1 / C(m, r)`` (Bentley & Floyd, CACM 1987). The chosen set lives in an
    open-addressing table of ``2 ** ceil(log2(2 r))`` slots.
    """
    key0 = np.uint64(k0)
    key1 = np.uint64(k1)
    size = 2
    bits = 1
    while size < 2 * r:
        size *= 2
        bits += 1
    shift = np.uint64(64 - bits)
    slot_mask = np.uint64(size - 1)
    table = np.full(size, -1, dtype=np.int64)
    out = np.empty(r, dtype=np.int64)
    for i in range(r):
        t = m - r + i
        v = _bounded_exact(key0, key1, i, t + 1, stream)
        h = (np.uint64(v) * _GOLDEN64) >> shift
        while table[h] != -1 and table[h] != v:
            h = (h + np.uint64(1)) & slot_mask
        if table[h] == v:  # taken: t itself cannot be (every earlier pick is below t)
            v = t
            h = (np.uint64(v) * _GOLDEN64) >> shift
            while table[h] != -1:
                h = (h + np.uint64(1)) & slot_mask
        table[h] = v
        out[i] = v
    out.sort()
    return out


# ---------------------------------------------------------------------------------------------
# Public entry points of the apply kernels: one thread below _PARALLEL_MIN_ENTRIES values touched,
# the thread pool above (waking it costs more than a small product, and up to milliseconds per
# call on a loaded machine).
# ---------------------------------------------------------------------------------------------
_PARALLEL_MIN_ENTRIES = 1 << 18


def _with_serial_twin(parallel_kernel, work):
    serial_kernel = _serial_twin(parallel_kernel)

    def kernel(*args):
        if work(*args) >= _PARALLEL_MIN_ENTRIES:
            return _launch(parallel_kernel, *args)
        return serial_kernel(*args)

    kernel.__name__ = parallel_kernel.py_func.__name__.removeprefix("_").removesuffix("_par")
    kernel.__doc__ = parallel_kernel.py_func.__doc__
    return kernel


sparse_apply_dense = _with_serial_twin(
    _sparse_apply_dense_par, lambda k0, k1, s, r, stream, A, acc: A.size * s
)
sparse_apply_dense_fortran = _with_serial_twin(
    _sparse_apply_dense_fortran_par, lambda k0, k1, s, r, stream, A, acc: A.size * s
)
sparse_apply_csr = _with_serial_twin(
    _sparse_apply_csr_par,
    lambda k0, k1, s, r, stream, indptr, indices, data, n, k, acc: (data.size + n) * s,
)
reduce_chunks = _with_serial_twin(_reduce_chunks, lambda acc, scale, out: acc.size)
reduce_chunks_t = _with_serial_twin(_reduce_chunks_t, lambda acc, scale, out: acc.size)
sparse_adjoint = _with_serial_twin(
    _sparse_adjoint_par, lambda k0, k1, s, r, stream, scale, Z, out: out.size * s
)
gaussian_apply_dense = _with_serial_twin(
    _gaussian_apply_dense_par, lambda k0, k1, r, stream, A, acc, n_lanes, X: A.shape[0] * r
)
gaussian_apply_csr = _with_serial_twin(
    _gaussian_apply_csr_par,
    lambda k0, k1, r, stream, indptr, indices, data, n, k, acc, n_lanes, X: n * r,
)
reduce_lanes = _with_serial_twin(_reduce_lanes, lambda acc, n_lanes, k, r, scale, out: acc.size)
gaussian_adjoint = _with_serial_twin(
    _gaussian_adjoint_par, lambda k0, k1, r, stream, Zt, out, scale, X: out.shape[0] * r
)
srht_apply = _with_serial_twin(
    _srht_apply_par, lambda k0, k1, stream, n_pad, rows, scale, A, out: n_pad * A.shape[1]
)
srht_adjoint = _with_serial_twin(
    _srht_adjoint_par, lambda k0, k1, stream, n_pad, rows, scale, Z, out: n_pad * out.shape[1]
)


# ============================================================================ sparse times dense
@njit(parallel=True, cache=True)
def _csr_times_dense_par(indptr, indices, data, Z, out):
    """``out = A @ Z`` for a CSR ``A`` (``indptr``, ``indices``, ``data``) and a C-ordered ``Z``.

    Rows are independent (each output row sums its own nonzeros in stored order), so the result is
    bitwise the same on any thread count; ``out`` may be C- or Fortran-ordered.
    """
    m, k = out.shape
    for b in prange((m + 1023) // 1024):  # blocks of rows: one accumulator each
        acc = np.empty(k, dtype=out.dtype)
        for i in range(b * 1024, min(m, b * 1024 + 1024)):
            acc[:] = 0
            for t in range(indptr[i], indptr[i + 1]):
                v = data[t]
                row = indices[t]
                for c in range(k):
                    acc[c] += v * Z[row, c]
            for c in range(k):
                out[i, c] = acc[c]


csr_times_dense = _with_serial_twin(
    _csr_times_dense_par, lambda indptr, indices, data, Z, out: data.size * out.shape[1]
)


@njit(parallel=True, cache=True)
def _csr_transpose_times_dense_par(indptr, indices, data, Q, acc):
    """``acc[c] = A[rows of chunk c].T @ Q[rows of chunk c]`` for a CSR ``A`` (scatter by rows).

    Reads ``Q`` in row order (where the gather form ``A.T`` as CSR times ``Q`` would fetch a random
    row of ``Q`` per nonzero); the chunks, fixed by the caller, each add into their own ``(n, k)``.
    """
    nchunks, _, k = acc.shape
    m = indptr.size - 1
    for c in prange(nchunks):
        out = acc[c]
        for i in range(c * m // nchunks, (c + 1) * m // nchunks):
            for t in range(indptr[i], indptr[i + 1]):
                v = data[t]
                j = indices[t]
                for col in range(k):
                    out[j, col] += v * Q[i, col]


csr_transpose_times_dense = _with_serial_twin(
    _csr_transpose_times_dense_par, lambda indptr, indices, data, Q, acc: data.size * acc.shape[2]
)


@njit(cache=True)
def _scatter_plan(indptr, indices, data, width, starts, rows, cols, vals):  # pragma: no cover - compiled
    # A stable counting sort of the nonzeros by panel (column // width): within a panel they stay
    # in row order, so each output entry is summed in the order of the rows. Only the entries that
    # indptr spans are counted: SciPy allows spare storage past them (counted, it had left
    # unwritten slots that the product read as indices).
    for i in range(indptr.size - 1):
        for t in range(indptr[i], indptr[i + 1]):
            starts[indices[t] // width + 1] += 1
    for p in range(starts.size - 1):
        starts[p + 1] += starts[p]
    fill = starts[:-1].copy()
    for i in range(indptr.size - 1):
        for t in range(indptr[i], indptr[i + 1]):
            j = indices[t]
            d = fill[j // width]
            rows[d], cols[d], vals[d] = i, j, data[t]
            fill[j // width] = d + 1


def scatter_plan_index(m, n):
    """The integer type of :func:`scatter_plan`'s rows and columns for an ``m x n`` matrix."""
    return np.int32 if max(m, n) < 2**31 else np.int64


def scatter_plan(indptr, indices, data, n, width):
    """The nonzeros of a CSR ``A`` (``m x n``) sorted by panels of ``width`` columns, then by row.

    Returns ``(starts, rows, cols, vals)``: panel ``p``'s nonzeros are ``starts[p]:starts[p + 1]``
    (``int64``), ``rows``/``cols`` in ``int32`` where ``m`` and ``n`` fit it, else ``int64``, and
    ``vals`` in ``data``'s dtype. :func:`planned_scatter` computes ``A.T @ Z`` from it.
    """
    m, nnz = indptr.size - 1, int(indptr[-1] - indptr[0])
    index = scatter_plan_index(m, n)
    starts = np.zeros(-(-n // width) + 1, dtype=np.int64)
    rows, cols = np.empty(nnz, dtype=index), np.empty(nnz, dtype=index)
    vals = np.empty(nnz, dtype=data.dtype)
    _scatter_plan(indptr, indices, data, width, starts, rows, cols, vals)
    return starts, rows, cols, vals


@njit(parallel=True, cache=True)
def _planned_scatter_par(starts, rows, cols, vals, width, Z, out):
    """``out = A.T @ Z`` from :func:`scatter_plan`'s panels, one panel a task.

    A panel's rows of ``out`` are its own: they are summed in a zeroed C-ordered block (a cache's
    worth, where the unplanned scatter adds into private ``n x k`` sums at random) and then
    written, whatever ``out``'s order. Each entry is summed in the order of ``A``'s rows, so the
    result does not depend on the panels or the thread count.
    """
    n, k = out.shape
    for p in prange(starts.size - 1):
        base = p * width
        w = min(width, n - base)
        block = np.zeros((w, k), dtype=out.dtype)
        for t in range(starts[p], starts[p + 1]):
            v, i, j = vals[t], rows[t], cols[t] - base
            for c in range(k):
                block[j, c] += v * Z[i, c]
        for j in range(w):
            for c in range(k):
                out[base + j, c] = block[j, c]


planned_scatter = _with_serial_twin(
    _planned_scatter_par, lambda starts, rows, cols, vals, width, Z, out: vals.size * out.shape[1]
)


# ============================================================================ normal-equation passes
# One-pass kernels for the iterative finish of the least-squares solvers. Both read each row of a
# C-contiguous X once and use it twice while it is in cache, so one call costs one streaming pass
# over X (memory-bound), where the two BLAS calls X.T @ (X @ V) cost two. Rows are split into a
# number of chunks that depends on n only (never on the thread count), each with a private
# accumulator, so results do not depend on the thread count.
# Reassociation lets LLVM vectorise the dot products (so the rounding can differ between CPUs of
# different vector widths); no flag that assumes finite values.
_FM = {"reassoc", "contract"}


def n_chunks(n: int) -> int:
    """Row chunks with private accumulators: a function of ``n`` only (at most 16)."""
    return min(16, max(1, n // 8192))


@njit(inline="always")
def _two_sum(a, b):
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


@njit(inline="always")
def _dot2_step(s, comp, x, b):
    """One term of Dot2 for ``s - x b``: returns the new sum and compensation."""
    prod = x * b
    err = _fma(x, b, -prod)  # x b = prod + err exactly
    s_new, e = _two_sum(s, -prod)
    return s_new, comp + (e - err)


def _gram_apply_block_py(X, V, nchunks):  # pragma: no cover - compiled
    n, p = X.shape
    k = V.shape[1]
    acc = np.zeros((nchunks, k, p))
    nrm = np.zeros((nchunks, k))
    Vt = np.ascontiguousarray(V.T)
    for c in prange(nchunks):
        a = c * n // nchunks
        b = (c + 1) * n // nchunks
        for i in range(a, b):
            for m in range(k):
                t = 0.0
                for j in range(p):
                    t += X[i, j] * Vt[m, j]
                nrm[c, m] += t * t
                for j in range(p):
                    acc[c, m, j] += t * X[i, j]
    out = np.zeros((p, k))
    norms = np.zeros(k)
    for c in range(nchunks):
        for m in range(k):
            norms[m] += nrm[c, m]
            for j in range(p):
                out[j, m] += acc[c, m, j]
    return out, norms


def _residual_gradient_fast_py(X, Y, B, nchunks):  # pragma: no cover - compiled
    n, p = X.shape
    k = B.shape[1]
    acc = np.zeros((nchunks, k, p))
    nrm = np.zeros((nchunks, k))
    Bt = np.ascontiguousarray(B.T)
    for c in prange(nchunks):
        a = c * n // nchunks
        b = (c + 1) * n // nchunks
        for i in range(a, b):
            for m in range(k):
                t = 0.0
                for j in range(p):
                    t += X[i, j] * Bt[m, j]
                t = Y[i, m] - t
                nrm[c, m] += t * t
                for j in range(p):
                    acc[c, m, j] += t * X[i, j]
    out = np.zeros((p, k))
    norms = np.zeros(k)
    for c in range(nchunks):
        for m in range(k):
            norms[m] += nrm[c, m]
            for j in range(p):
                out[j, m] += acc[c, m, j]
    return out, norms


def _residual_gradient_py(X, Y, B, nchunks):  # pragma: no cover - compiled
    """``(X.T @ (Y - X @ B), colwise ||Y - X @ B||**2)`` in one pass over ``X`` and ``Y``, error-free.

    This product decides the accuracy the refinement can reach (its rounding is what the fixed
    point sees, and the backward-error estimate is computed from it), so both halves are compensated:
    the residual of each row by Dot2 (Ogita, Rump & Oishi 2005: each product split exactly with
    an FMA, each sum by TwoSum, in four interleaved chains), kept as ``r_hi + r_lo``; the sum over rows
    of ``X.T r`` in double-double (TwoSum per term, a compensation accumulator per entry). The
    residual is then accurate to about ``u^2 (|y| + |X| |B|)`` and the gradient to ``u`` of itself,
    however small the residual. No reassociation: every operation is rounded as written.
    """
    n, p = X.shape
    k = B.shape[1]
    hi = np.zeros((nchunks, k, p))
    lo = np.zeros((nchunks, k, p))
    nrm = np.zeros((nchunks, k))
    Bt = np.ascontiguousarray(B.T)
    p4 = p - p % 4
    for c in prange(nchunks):
        a = c * n // nchunks
        b = (c + 1) * n // nchunks
        for i in range(a, b):
            for m in range(k):
                s0, s1, s2, s3 = Y[i, m], 0.0, 0.0, 0.0
                c0, c1, c2, c3 = 0.0, 0.0, 0.0, 0.0
                for j in range(0, p4, 4):
                    s0, c0 = _dot2_step(s0, c0, X[i, j], Bt[m, j])
                    s1, c1 = _dot2_step(s1, c1, X[i, j + 1], Bt[m, j + 1])
                    s2, c2 = _dot2_step(s2, c2, X[i, j + 2], Bt[m, j + 2])
                    s3, c3 = _dot2_step(s3, c3, X[i, j + 3], Bt[m, j + 3])
                for j in range(p4, p):
                    s0, c0 = _dot2_step(s0, c0, X[i, j], Bt[m, j])
                t, e = _two_sum(s0, s1)
                comp = c0 + c1 + c2 + c3 + e
                t, e = _two_sum(t, s2)
                comp += e
                t, e = _two_sum(t, s3)
                r_hi, r_lo = _two_sum(t, comp + e)
                nrm[c, m] += r_hi * r_hi
                for j in range(p):
                    x = X[i, j]
                    v = r_hi * x
                    h = hi[c, m, j]
                    s = h + v
                    bp = s - h
                    lo[c, m, j] += (h - (s - bp)) + (v - bp) + (_fma(r_hi, x, -v) + r_lo * x)
                    hi[c, m, j] = s
    out = np.zeros((p, k))
    norms = np.zeros(k)
    for m in range(k):
        for c in range(nchunks):
            norms[m] += nrm[c, m]
        for j in range(p):
            sh = 0.0
            sl = 0.0
            for c in range(nchunks):
                v = hi[c, m, j]
                s = sh + v
                bp = s - sh
                sl += (sh - (s - bp)) + (v - bp) + lo[c, m, j]
                sh = s
            out[j, m] = sh + sl
    return out, norms


def _residual_gradient_compensated_py(X, Y, B, nchunks):  # pragma: no cover - compiled
    """``(X.T @ (Y - X @ B), colwise ||Y - X @ B||**2)`` in one pass over ``X`` and ``Y``.

    The residual in plain arithmetic (four interleaved partial sums, no reassociation), the sum over
    rows of ``X.T r`` in double-double (TwoSum per term, a compensation accumulator per entry; each
    lane ``j`` is independent, so it vectorises). Enough where the residual is not small: its rounding
    errors, about ``u (|y| + |X| |B|)`` per row and unrelated to ``range(X)``, reach ``X.T r`` only
    through their projection, ``sqrt(p / n)`` of their size. About twice a plain pass.
    """
    n, p = X.shape
    k = B.shape[1]
    hi = np.zeros((nchunks, k, p))
    lo = np.zeros((nchunks, k, p))
    nrm = np.zeros((nchunks, k))
    Bt = np.ascontiguousarray(B.T)
    p4 = p - p % 4
    for c in prange(nchunks):
        a = c * n // nchunks
        b = (c + 1) * n // nchunks
        for i in range(a, b):
            for m in range(k):
                s0 = 0.0
                s1 = 0.0
                s2 = 0.0
                s3 = 0.0
                for j in range(0, p4, 4):
                    s0 += X[i, j] * Bt[m, j]
                    s1 += X[i, j + 1] * Bt[m, j + 1]
                    s2 += X[i, j + 2] * Bt[m, j + 2]
                    s3 += X[i, j + 3] * Bt[m, j + 3]
                for j in range(p4, p):
                    s0 += X[i, j] * Bt[m, j]
                t = Y[i, m] - ((s0 + s1) + (s2 + s3))
                nrm[c, m] += t * t
                for j in range(p):
                    v = t * X[i, j]
                    h = hi[c, m, j]
                    s = h + v
                    bp = s - h
                    lo[c, m, j] += (h - (s - bp)) + (v - bp)
                    hi[c, m, j] = s
    out = np.zeros((p, k))
    norms = np.zeros(k)
    for m in range(k):
        for c in range(nchunks):
            norms[m] += nrm[c, m]
        for j in range(p):
            sh = 0.0
            sl = 0.0
            for c in range(nchunks):
                v = hi[c, m, j]
                s = sh + v
                bp = s - sh
                sl += (sh - (s - bp)) + (v - bp) + lo[c, m, j]
                sh = s
            out[j, m] = sh + sl
    return out, norms


_GRAM_ROWS = 256  # rows packed per step: a tile's 6 packed rows (12 KiB) stay in L1


@njit(inline="always")
def _gram_tile(bt, m, i, j, G):
    """``G[i:i+4, j:j+2] += bt[i:i+4, :m] @ bt[j:j+2, :m].T``: 8 sums the compiler vectorises over ``m``."""
    s00 = s01 = s10 = s11 = s20 = s21 = s30 = s31 = 0.0
    for r in range(m):
        b0 = bt[j, r]
        b1 = bt[j + 1, r]
        a = bt[i, r]
        s00 += a * b0
        s01 += a * b1
        a = bt[i + 1, r]
        s10 += a * b0
        s11 += a * b1
        a = bt[i + 2, r]
        s20 += a * b0
        s21 += a * b1
        a = bt[i + 3, r]
        s30 += a * b0
        s31 += a * b1
    G[i, j] += s00
    G[i, j + 1] += s01
    G[i + 1, j] += s10
    G[i + 1, j + 1] += s11
    G[i + 2, j] += s20
    G[i + 2, j + 1] += s21
    G[i + 3, j] += s30
    G[i + 3, j + 1] += s31


def _gram_matrix_py(X, Y, Bt, nchunks, out, nrm):  # pragma: no cover - compiled
    n, p = X.shape
    k = Y.shape[1]
    q = out.shape[1]
    per = (n + nchunks - 1) // nchunks
    for c in prange(nchunks):
        G = out[c]
        bt = np.zeros((q, _GRAM_ROWS))  # rows p + k..q stay zero: the tiles need no edge cases
        hi = min(n, c * per + per)
        for a in range(c * per, hi, _GRAM_ROWS):
            m = min(_GRAM_ROWS, hi - a)
            for r in range(m):
                for j in range(p):
                    bt[j, r] = X[a + r, j]
                for col in range(k):  # the residual's row rides along as column p + col of [X, R]
                    s = 0.0
                    for j in range(p):
                        s += X[a + r, j] * Bt[col, j]
                    t = Y[a + r, col] - s
                    bt[p + col, r] = t
                    nrm[c, col] += t * t
            for i in range(0, p, 4):
                for j in range(i, q, 2):
                    _gram_tile(bt, m, i, j, G)


# Each kernel is compiled twice, with threads (prange) for large inputs and serial for small ones,
# where waking a thread pool costs more than the work (the same _PARALLEL_MIN_ENTRIES line).
_gram_block = (
    njit(fastmath=_FM, cache=True)(_gram_apply_block_py),
    njit(parallel=True, fastmath=_FM, cache=True)(_gram_apply_block_py),
)
_gram_matrix_pair = (
    njit(fastmath=_FM, cache=True)(_gram_matrix_py),
    njit(parallel=True, fastmath=_FM, cache=True)(_gram_matrix_py),
)
_resgrad = (njit(cache=True)(_residual_gradient_py), njit(parallel=True, cache=True)(_residual_gradient_py))
_resgrad_compensated = (
    njit(cache=True)(_residual_gradient_compensated_py),
    njit(parallel=True, cache=True)(_residual_gradient_compensated_py),
)
_resgrad_fast = (
    njit(fastmath=_FM, cache=True)(_residual_gradient_fast_py),
    njit(parallel=True, fastmath=_FM, cache=True)(_residual_gradient_fast_py),
)


def _pick(pair, X):
    return functools.partial(_launch, pair[1]) if X.size >= _PARALLEL_MIN_ENTRIES else pair[0]


def gram_apply(X, V, nchunks):
    """``(X.T @ (X @ V), colwise ||X @ V||**2)`` in one pass over ``X`` (``V``: ``(p, k)``)."""
    # One kernel for every k: for k = 1 it is faster than a kernel specialised to a vector
    # (docs/solvers.md has the timings).
    return _pick(_gram_block, X)(X, np.ascontiguousarray(V), nchunks)


def residual_gradient(X, Y, B, nchunks, accuracy="exact"):
    """``(X.T @ (Y - X @ B), colwise ||Y - X @ B||**2)`` in one pass.

    ``accuracy``: ``"exact"``, the error-free kernel (:func:`_residual_gradient_py`, Dot2 residual
    and double-double sum, about four plain passes of time); ``"compensated"``, a plain residual
    and a double-double sum (about two), enough where the residual is not small; ``"fast"``, plain
    sums with reassociation, for a gradient whose rounding does not matter (the first one from a
    warm start, which later steps correct).
    """
    pair = {"exact": _resgrad, "compensated": _resgrad_compensated, "fast": _resgrad_fast}[accuracy]
    return _pick(pair, X)(X, Y, np.ascontiguousarray(B), nchunks)


def gram_matrix(X, nchunks, Y=None, B=None):
    """``X.T @ X`` of a C-ordered ``X`` in one pass, summed in float64 whatever its precision.

    Each of ``nchunks`` row chunks (a function of ``n`` only, so the result does not depend on the
    thread count) packs blocks of rows transposed and sums 4 x 2 tiles of the upper triangle; the
    chunks' partial matrices are added in order. For the tall, narrow matrices of least squares it
    runs about twice as fast as LAPACK's ``syrk`` (docs/solvers.md).

    Given ``Y`` ``(n, k)`` and ``B`` ``(p, k)``, the same pass also returns the plain-sum gradient
    of :func:`residual_gradient` with ``accuracy="fast"``: ``(G, (X.T (Y - X B), ||Y - X B||**2))``.
    """
    p = X.shape[1]
    k = 0 if Y is None else Y.shape[1]
    q = -(-(p + k) // 4) * 4
    out = np.zeros((nchunks, q, q))
    nrm = np.zeros((nchunks, k))
    Y = np.empty((X.shape[0], 0)) if Y is None else np.ascontiguousarray(Y)
    Bt = np.empty((0, p)) if B is None else np.ascontiguousarray(B.T)
    _pick(_gram_matrix_pair, X)(X, Y, Bt, nchunks, out, nrm)
    full = out.sum(axis=0)
    G = np.triu(full[:p, :p]) + np.triu(full[:p, :p], 1).T
    if k == 0:
        return G
    return G, (full[:p, p : p + k].copy(), nrm.sum(axis=0))
