"""CPU kernel for the engine's few-row matrix products (numba), and the dispatch to it.

A decode or verification step multiplies a handful of rows (one per new token) by every weight
matrix. OpenBLAS's GEMM packs the whole weight matrix into its own panel layout for each call,
so from two rows up it reads and writes each weight several times: on our machine a layer set
of products took 20 ms for one row (GEMV) but 42 ms for two or four rows, with one thread.
:func:`rows_times_weights` reads every weight once, straight from the model's ``[out, in]``
layout, and uses it for up to four tokens while it is in registers: two weight rows times four
tokens per inner loop (eight independent dot products, six loads per eight multiply-adds),
weight rows split across threads. Measured for the 30 layers of SmolLM2-135M (float32): 22 ms at
one token, 31 ms at four, 34 ms at eight, 59 ms at sixteen, where GEMM with two threads took
20, 42, 35 and 59 ms; beyond :data:`FEW_ROWS` rows GEMM wins and is used.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ._xp import namespace

__all__ = ["FEW_ROWS", "linear", "rows_times_weights"]

#: Largest row count sent to :func:`rows_times_weights`; above it, BLAS GEMM. Set it to 0 to
#: run every product through BLAS (the benchmark does, for comparison).
FEW_ROWS = 16


@njit(parallel=True, fastmath=True, cache=True)
def _rows_times_weights(x, w, out, zero):  # pragma: no cover - compiled
    T, K = x.shape
    N = w.shape[0]
    T4 = T - T % 4
    for pair in prange((N + 1) // 2):
        n0 = 2 * pair
        n1 = min(n0 + 1, N - 1)  # an odd last row is computed twice (same value, same slot)
        w0 = w[n0]
        w1 = w[n1]
        for t in range(0, T4, 4):
            x0 = x[t]
            x1 = x[t + 1]
            x2 = x[t + 2]
            x3 = x[t + 3]
            a00 = zero
            a01 = zero
            a02 = zero
            a03 = zero
            a10 = zero
            a11 = zero
            a12 = zero
            a13 = zero
            for k in range(K):
                u = w0[k]
                v = w1[k]
                a00 += x0[k] * u
                a01 += x1[k] * u
                a02 += x2[k] * u
                a03 += x3[k] * u
                a10 += x0[k] * v
                a11 += x1[k] * v
                a12 += x2[k] * v
                a13 += x3[k] * v
            out[t, n0] = a00
            out[t + 1, n0] = a01
            out[t + 2, n0] = a02
            out[t + 3, n0] = a03
            out[t, n1] = a10
            out[t + 1, n1] = a11
            out[t + 2, n1] = a12
            out[t + 3, n1] = a13
        for t in range(T4, T):
            xt = x[t]
            a0 = zero
            a1 = zero
            for k in range(K):
                a0 += xt[k] * w0[k]
                a1 += xt[k] * w1[k]
            out[t, n0] = a0
            out[t, n1] = a1


def rows_times_weights(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``x @ w.T`` for a few rows ``x`` ``[T, K]`` and a weight ``w`` ``[N, K]`` (C-contiguous).

    Sums are in the inputs' dtype, reassociated for SIMD (as BLAS does); the result can differ
    from ``x @ w.T`` in the last bits.

    Examples
    --------
    >>> x = np.arange(6.0).reshape(2, 3); w = np.ones((5, 3))
    >>> rows_times_weights(x, w)[:, 0].tolist()
    [3.0, 12.0]
    """
    dtype = np.result_type(x, w)
    x = np.ascontiguousarray(x, dtype=dtype)
    w = np.ascontiguousarray(w, dtype=dtype)
    out = np.empty((x.shape[0], w.shape[0]), dtype=dtype)
    _rows_times_weights(x, w, out, dtype.type(0))
    return out


def linear(x, w):
    """``x @ w.T`` for activations ``x`` ``[T, K]`` and a weight ``w`` ``[N, K]``.

    NumPy arrays with at most :data:`FEW_ROWS` rows go through :func:`rows_times_weights`; more
    rows (prefill) and other array namespaces (CuPy) through the namespace's matmul.

    Examples
    --------
    >>> linear(np.ones((1, 2)), np.array([[1.0, 2.0], [3.0, 4.0]])).tolist()
    [[3.0, 7.0]]
    """
    if 0 < x.shape[0] <= FEW_ROWS and namespace(x) is np and x.dtype in (np.float32, np.float64):
        return rows_times_weights(x, w)
    return x @ w.T
