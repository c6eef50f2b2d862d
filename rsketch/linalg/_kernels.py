"""One-pass normal-equation kernels (numba) for the iterative finish of the least-squares solvers.

Both kernels read each row of a C-contiguous ``X`` once and use it twice while it is in cache,
so one call costs one streaming pass over ``X`` (memory-bound), where the two BLAS calls
``X.T @ (X @ V)`` cost two. Rows are split into a number of chunks that depends on ``n`` only
(never on the thread count), each with a private accumulator, so results are the same on every
machine. Callers pass checked float64 data. These are CPU kernels and belong with the others in
:mod:`rsketch.kernels.cpu` once that module takes solver kernels; they live here meanwhile.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

# Reassociation lets LLVM vectorise the dot products; no flag that assumes finite values.
_FM = {"reassoc", "contract"}


def n_chunks(n: int) -> int:
    """Row chunks with private accumulators: a function of ``n`` only (at most 16)."""
    return min(16, max(1, n // 8192))


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
    """``(X.T @ (Y - X @ B), colwise ||Y - X @ B||**2)`` in one pass over ``X`` and ``Y``.

    This product decides the accuracy the iterations can reach (its rounding error is what the
    fixed point of the refinement sees), so it is computed carefully: no reassociation, the
    residual's dot product in four interleaved partial sums, and the sum over rows of
    ``X.T r`` in double-double (Knuth's TwoSum per term, a compensation accumulator per entry).
    Each lane ``j`` is independent, so the compensated update still vectorises.
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


# Each kernel is compiled twice: with threads (prange) for large inputs, and serial for small ones,
# where waking a thread pool costs more than the work (we measured 50-80 ms per call for a
# 1000 x 10 input on a loaded machine, against microseconds serial).
_PARALLEL_MIN_ENTRIES = 1 << 18

_gram_block = (
    njit(fastmath=_FM, cache=True)(_gram_apply_block_py),
    njit(parallel=True, fastmath=_FM, cache=True)(_gram_apply_block_py),
)
_resgrad = (njit(cache=True)(_residual_gradient_py), njit(parallel=True, cache=True)(_residual_gradient_py))
_resgrad_fast = (
    njit(fastmath=_FM, cache=True)(_residual_gradient_fast_py),
    njit(parallel=True, fastmath=_FM, cache=True)(_residual_gradient_fast_py),
)


def _pick(pair, X):
    return pair[1] if X.size >= _PARALLEL_MIN_ENTRIES else pair[0]


def gram_apply(X, V, nchunks):
    """``(X.T @ (X @ V), colwise ||X @ V||**2)`` in one pass over ``X`` (``V``: ``(p, k)``)."""
    # One kernel for every k: for k = 1 it measured faster (0.020 s per pass at n = 500,000,
    # p = 100) than a kernel specialised to a vector (0.026 s); a plain read of X takes 0.019 s.
    return _pick(_gram_block, X)(X, np.ascontiguousarray(V), nchunks)


def residual_gradient(X, Y, B, nchunks, accurate=True):
    """``(X.T @ (Y - X @ B), colwise ||Y - X @ B||**2)`` in one pass.

    ``accurate=True``: the compensated kernel (:func:`_residual_gradient_py`), about twice the time
    of a plain pass; ``False``: plain sums with reassociation, for a gradient whose rounding does
    not matter (the first one from a warm start, which later rounds correct).
    """
    pair = _resgrad if accurate else _resgrad_fast
    return _pick(pair, X)(X, Y, np.ascontiguousarray(B), nchunks)
