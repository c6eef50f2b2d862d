"""Device functions shared by the CUDA kernels: Philox4x32-10, bounded integers, the ziggurat attempt.

Line for line the arithmetic of :mod:`rsketch.kernels.cpu` (and of the array-namespace reference in
:mod:`rsketch._random`), on uint64 words holding 32-bit values: every operand is kept unsigned,
because numba types a mix of int64 and uint64 as float64.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from rsketch._random import PHILOX_M0, PHILOX_M1, PHILOX_W0, PHILOX_W1, STREAM_TAIL, STREAM_WEDGE, ZIG_R

_M0 = np.uint64(PHILOX_M0)
_M1 = np.uint64(PHILOX_M1)
_W0 = np.uint64(PHILOX_W0)
_W1 = np.uint64(PHILOX_W1)
_MASK = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)
_ONE = np.uint64(1)
_INV_2_32 = 1.0 / 4294967296.0
_STREAM_WEDGE = STREAM_WEDGE
_STREAM_TAIL = STREAM_TAIL
_ZIG_R = ZIG_R


@cuda.jit(device=True)
def philox(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 on uint64 words holding 32-bit values (``rsketch._random.philox4x32``)."""
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


@cuda.jit(device=True)
def words(k0, k1, index, block, stream):
    """The four words of counter ``(index_lo, index_hi, block, stream)`` under key ``(k0, k1)`` (uint64)."""
    idx = np.uint64(index)
    return philox(idx & _MASK, idx >> _S32, np.uint64(block), np.uint64(stream), k0, k1)


@cuda.jit(device=True)
def uniform(w):
    """``(w + 0.5) / 2**32``: a uniform in the open interval (0, 1)."""
    return (np.float64(w) + 0.5) * _INV_2_32


@cuda.jit(device=True)
def bounded(w, bound):
    """Lemire's multiply-shift: a word to an integer in ``[0, bound)``."""
    return np.int64((w * np.uint64(bound)) >> _S32)


@cuda.jit(device=True)
def bounded_exact(k0, k1, index, bound, stream):
    """Exactly uniform in ``[0, bound)`` by mask-and-reject (``rsketch._random.bounded_exact``)."""
    b = np.uint64(bound)
    mask = b - _ONE
    mask |= mask >> np.uint64(1)
    mask |= mask >> np.uint64(2)
    mask |= mask >> np.uint64(4)
    mask |= mask >> np.uint64(8)
    mask |= mask >> np.uint64(16)
    mask |= mask >> np.uint64(32)
    a = 0
    while True:
        w0, w1, w2, w3 = words(k0, k1, index, a >> 1, stream)
        if a & 1:
            v = ((w3 << _S32) | w2) & mask
        else:
            v = ((w1 << _S32) | w0) & mask
        if v < b:
            return np.int64(v)
        a += 1


@cuda.jit(device=True)
def sparse_entry(k0, k1, j, t, s, r, stream):
    """Row and sign of nonzero ``t`` of column ``j`` of a sparse sign sketch (``cpu._sparse_entry``)."""
    w0, w1, w2, w3 = words(k0, k1, j, t // 2, stream)
    if t % 2 == 0:
        wr = w0
        ws = w1
    else:
        wr = w2
        ws = w3
    lo = (t * r) // s
    hi = ((t + 1) * r) // s
    row = lo + bounded(wr, hi - lo)
    sign = 1.0 - 2.0 * np.float64(ws & _ONE)
    return row, sign


@cuda.jit(device=True)
def sign_of_lane(k0, k1, j, stream):
    """+-1.0 from bit 0 of lane ``j % 4`` of counter ``(j // 4, 0, stream)`` (``_random.lane_words``)."""
    w0, w1, w2, w3 = words(k0, k1, j // 4, 0, stream)
    lane = j % 4
    w = w0
    if lane == 1:
        w = w1
    elif lane == 2:
        w = w2
    elif lane == 3:
        w = w3
    return 1.0 - 2.0 * np.float64(w & _ONE)


@cuda.jit(device=True)
def zig_attempt(wa, wb, k0, k1, j, attempt, X):
    """One ziggurat attempt of column ``j`` (``kernels.cpu._zig_attempt``): ``(accepted, value)``."""
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
        w0, _, _, _ = words(k0, k1, j, attempt, _STREAM_WEDGE)
        return f1 + uniform(w0) * (f0 - f1) < 1.0, z
    t = 0
    while True:
        w0, w1, _, _ = words(k0, k1, j, attempt, _STREAM_TAIL + t)
        tx = math.log(uniform(w0)) / _ZIG_R
        ty = math.log(uniform(w1))
        if -2.0 * ty >= tx * tx:
            if u < 0:
                return True, tx - _ZIG_R
            return True, _ZIG_R - tx
        t += 1
