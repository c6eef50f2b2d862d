"""CPU kernels (numba) for the engine's few-row matrix products and packed attention, and the dispatch.

A decode or verification step multiplies a handful of rows (one per new token) by every weight
matrix. OpenBLAS's GEMM packs the whole weight matrix into its own panel layout for each call,
so from two rows up it reads and writes each weight several times. :func:`rows_times_weights`
reads every weight once, straight from the model's ``[out, in]`` layout, and uses it for up to
four tokens while it is in registers: two weight rows times four tokens per inner loop (eight
independent dot products, six loads per eight multiply-adds; four weight rows for long rows and
from eight tokens on, see :data:`_LONG_ROW_BYTES` and :data:`_FOUR_ROW_TOKENS`), weight rows
split across threads. Longer prefills run through the kernel in blocks of :data:`FEW_ROWS` rows,
so that a block's activations stay in L2 while the weights stream past.

Software prefetch: the weights stream from memory once per step, and two cores alone do not
keep enough cache misses in flight for the hardware prefetchers to hide the latency; where the
arithmetic takes as long as the reads, the two do not overlap either. The kernel therefore asks
for the weight rows :data:`_PREFETCH_ROWS` ahead (into L2), one row per pass over the tokens:
asking for a block's rows all at once fills the core's queue of outstanding misses and stalls
the arithmetic behind it.

The measurements behind each of these choices are in ``docs/decoding.md`` (section
"Measurements"); the comments here say why, the docs carry the figures.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from ._simd import as_float, as_stored, exp, prefetch_next_row
from ._xp import namespace
from .quantized import QuantizedMatrix, quantized_linear

__all__ = [
    "FEW_ROWS",
    "linear",
    "rms_norm",
    "rope_and_store",
    "rows_times_weights",
    "swiglu",
    "varlen_attention",
    "varlen_attention_args",
    "varlen_attention_run",
]

# Reassociation (for SIMD sums) and FMA contraction only: no flag that assumes finite values (a
# hidden key's score is -1e30, and a row with no visible key gives zeros, finite).
_FM = {"reassoc", "contract"}

#: Most rows per :func:`rows_times_weights` call (longer inputs go in blocks of this many). Set it
#: to 0 to run every product through BLAS (the benchmark does, for comparison).
FEW_ROWS = 256

#: How many weight rows ahead :func:`rows_times_weights` asks for the weights it will need next
#: (37 KB ahead for 576 float32 columns): far enough to cover the memory latency, near enough to
#: stay in L2.
_PREFETCH_ROWS = 16

#: Rows longer than this (bytes) take the four-weight-row kernel (the MLP's down projection,
#: 6 KB rows, whose few rows leave the two-row kernel's threads short of work); shorter rows keep
#: two weight rows per pass below :data:`_FOUR_ROW_TOKENS` tokens.
_LONG_ROW_BYTES = 4096

#: From this many tokens on, every product takes the four-weight-row kernel: there the arithmetic,
#: not the weight reads, sets the pace, and four weight rows per pass do eight loads per sixteen
#: multiply-adds where two do six per eight. Below it the weight reads set the pace and two rows
#: per pass are faster.
_FOUR_ROW_TOKENS = 8


@njit(parallel=True, fastmath=_FM, cache=True)
def _rows_times_weights(x, w, out, zero):  # pragma: no cover - compiled
    T, K = x.shape
    N = w.shape[0]
    T4 = T - T % 4
    line = max(1, 64 // w.itemsize)  # elements per 64-byte cache line
    for pair in prange((N + 1) // 2):
        n0 = 2 * pair
        n1 = min(n0 + 1, N - 1)  # an odd last row is computed twice (same value, same slot)
        # Ask for the pair _PREFETCH_ROWS rows ahead, a row per pass over the tokens, so that it
        # is in L2 when we get there (see the module docstring: the hardware prefetcher alone
        # leaves the loads waiting).
        pf = n0 + _PREFETCH_ROWS
        pf_end = min(pf + 2, N)
        w0 = w[n0]
        w1 = w[n1]
        for t in range(0, T4, 4):
            pf = prefetch_next_row(w, pf, pf_end, line)
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
            pf = prefetch_next_row(w, pf, pf_end, line)
            xt = x[t]
            a0 = zero
            a1 = zero
            for k in range(K):
                a0 += xt[k] * w0[k]
                a1 += xt[k] * w1[k]
            out[t, n0] = a0
            out[t, n1] = a1
        while pf < pf_end:  # fewer passes than rows to ask for
            pf = prefetch_next_row(w, pf, pf_end, line)


@njit(parallel=True, fastmath=_FM, cache=True)
def _rows_times_weights_long(x, w, out, zero):  # pragma: no cover - compiled
    # The same product for long rows (K * itemsize > _LONG_ROW_BYTES) and for eight tokens or more
    # (_FOUR_ROW_TOKENS): four weight rows times four tokens per inner loop. For long rows, four
    # tokens' rows and two weight rows no longer fit in L1, so the loads come from L2; four weight
    # rows per pass halve the times x is streamed from it.
    T, K = x.shape
    N = w.shape[0]
    T4 = T - T % 4
    line = max(1, 64 // w.itemsize)
    for quad in prange((N + 3) // 4):
        n0 = 4 * quad
        n1 = min(n0 + 1, N - 1)  # missing last rows repeat row N - 1 (same value, same slot)
        n2 = min(n0 + 2, N - 1)
        n3 = min(n0 + 3, N - 1)
        pf = n0 + _PREFETCH_ROWS
        pf_end = min(pf + 4, N)
        w0 = w[n0]
        w1 = w[n1]
        w2 = w[n2]
        w3 = w[n3]
        for t in range(0, T4, 4):
            pf = prefetch_next_row(w, pf, pf_end, line)
            x0 = x[t]
            x1 = x[t + 1]
            x2 = x[t + 2]
            x3 = x[t + 3]
            a00 = a01 = a02 = a03 = zero
            a10 = a11 = a12 = a13 = zero
            a20 = a21 = a22 = a23 = zero
            a30 = a31 = a32 = a33 = zero
            for k in range(K):
                p = x0[k]
                q = x1[k]
                r = x2[k]
                s = x3[k]
                u = w0[k]
                a00 += p * u
                a01 += q * u
                a02 += r * u
                a03 += s * u
                u = w1[k]
                a10 += p * u
                a11 += q * u
                a12 += r * u
                a13 += s * u
                u = w2[k]
                a20 += p * u
                a21 += q * u
                a22 += r * u
                a23 += s * u
                u = w3[k]
                a30 += p * u
                a31 += q * u
                a32 += r * u
                a33 += s * u
            out[t, n0], out[t + 1, n0], out[t + 2, n0], out[t + 3, n0] = a00, a01, a02, a03
            out[t, n1], out[t + 1, n1], out[t + 2, n1], out[t + 3, n1] = a10, a11, a12, a13
            out[t, n2], out[t + 1, n2], out[t + 2, n2], out[t + 3, n2] = a20, a21, a22, a23
            out[t, n3], out[t + 1, n3], out[t + 2, n3], out[t + 3, n3] = a30, a31, a32, a33
        for t in range(T4, T):
            pf = prefetch_next_row(w, pf, pf_end, line)
            xt = x[t]
            a0 = a1 = a2 = a3 = zero
            for k in range(K):
                p = xt[k]
                a0 += p * w0[k]
                a1 += p * w1[k]
                a2 += p * w2[k]
                a3 += p * w3[k]
            out[t, n0], out[t, n1], out[t, n2], out[t, n3] = a0, a1, a2, a3
        while pf < pf_end:
            pf = prefetch_next_row(w, pf, pf_end, line)


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
    four_rows = x.shape[1] * dtype.itemsize > _LONG_ROW_BYTES or x.shape[0] >= _FOUR_ROW_TOKENS
    kernel = _rows_times_weights_long if four_rows else _rows_times_weights
    kernel(x, w, out, dtype.type(0))
    return out


def linear(x, w):
    """``x @ w.T`` for activations ``x`` ``[T, K]`` and a weight ``w`` ``[N, K]``.

    A :class:`~decoding.quantized.QuantizedMatrix` goes through
    :func:`~decoding.quantized.quantized_linear`. NumPy float arrays go through
    :func:`rows_times_weights`, in blocks of at most :data:`FEW_ROWS` rows (a long prefill);
    other array namespaces (CuPy), or ``FEW_ROWS = 0``, through the namespace's matmul.

    Examples
    --------
    >>> linear(np.ones((1, 2)), np.array([[1.0, 2.0], [3.0, 4.0]])).tolist()
    [[3.0, 7.0]]
    """
    T = x.shape[0]
    if isinstance(w, QuantizedMatrix):
        return quantized_linear(x, w, max_rows=max(FEW_ROWS, 1))
    if namespace(x) is not np:  # another library (a GPU's): its GEMM
        return x @ namespace(x).matrix_transpose(w)
    if FEW_ROWS <= 0 or T == 0 or x.dtype not in (np.float32, np.float64):
        return x @ w.T
    if T <= FEW_ROWS:
        return rows_times_weights(x, w)
    out = np.empty((T, w.shape[0]), dtype=np.result_type(x, w))
    for a in range(0, T, FEW_ROWS):  # each block's rows stay in L2 while the weights stream past
        out[a : a + FEW_ROWS] = rows_times_weights(x[a : a + FEW_ROWS], w)
    return out


def _swiglu_rows(gu, one, out):  # pragma: no cover - compiled (serial and parallel below)
    T, F = out.shape
    for t in prange(T):
        o = out[t]
        g = gu[t, :F]
        u = gu[t, F:]
        for i in range(F):
            o[i] = g[i] / (one + exp(-g[i])) * u[i]


# No reassociation here (no sum to vectorize): it would compute (g u) / (1 + e), which overflows
# where g / (1 + e) * u does not.
_swiglu_serial = njit(fastmath={"contract"}, error_model="numpy", cache=True)(_swiglu_rows)
_swiglu_parallel = njit(parallel=True, fastmath={"contract"}, error_model="numpy", cache=True)(_swiglu_rows)
#: From this many outputs on, SwiGLU splits its rows across threads (a decode step's few rows
#: take less time than waking the threads).
_SWIGLU_PARALLEL = 1 << 16


def swiglu(gate_up):
    """``silu(gate) * up`` of fused ``gate_up`` rows ``[T, 2F]`` (gate first): ``[T, F]``.

    ``silu(g) = g / (1 + exp(-g))``. NumPy float32 and float64 take one compiled pass (float32
    with the vectorized :func:`decoding._simd.exp`, within 2 ulp of ``np.exp``); any other input
    the array API's ``exp`` in three steps.

    Examples
    --------
    >>> gu = np.array([[0.0, 2.0, 5.0, 1.0]])  # gate (0, 2), up (5, 1)
    >>> np.round(swiglu(gu), 6).tolist()
    [[0.0, 1.761594]]
    """
    if gate_up.ndim != 2 or gate_up.shape[1] % 2:
        raise ValueError(f"gate_up must have shape (T, 2F), got {tuple(gate_up.shape)}")
    xp = namespace(gate_up)
    F = gate_up.shape[1] // 2
    if xp is not np or gate_up.dtype not in (np.float32, np.float64):
        gate, up = gate_up[:, :F], gate_up[:, F:]
        return gate / (1.0 + xp.exp(-gate)) * up
    gate_up = np.ascontiguousarray(gate_up)
    out = np.empty((gate_up.shape[0], F), dtype=gate_up.dtype)
    kernel = _swiglu_parallel if out.size >= _SWIGLU_PARALLEL else _swiglu_serial
    kernel(gate_up, gate_up.dtype.type(1.0), out)
    return out


@njit(fastmath=_FM, error_model="numpy", cache=True)
def _rms_norm(x, w, eps, out):  # pragma: no cover - compiled
    T, d = x.shape
    zero = eps - eps  # zero in the data's dtype (a Python 0 would promote float32 to float64)
    for t in range(T):
        xt = x[t]
        ss = zero
        for i in range(d):
            ss += xt[i] * xt[i]
        if math.isfinite(ss):
            s = np.sqrt(ss / d + eps)
        else:
            # The squares overflowed: float32 activations of 1e20 (finite weights can give them)
            # had summed to inf, w / s to 0 and every logit to 0, and greedy decoding had emitted
            # token 0. The same sum over x / max|x|, then scaled back: s = m sqrt(mean((x/m)^2) +
            # eps/m^2). A row holding inf or NaN gives NaN here, which the logits' check reports.
            # Only the overflowed rows take this branch: the usual rows keep their bits and speed.
            m = zero
            for i in range(d):
                m = max(m, abs(xt[i]))
            ss = zero
            for i in range(d):
                ss += (xt[i] / m) * (xt[i] / m)
            s = m * np.sqrt(ss / d + eps / m / m)
        for i in range(d):
            out[t, i] = xt[i] * (w[i] / s)


def rms_norm(x, w, eps):
    """RMS norm of the rows of ``x`` ``[T, d]`` times ``w`` ``[d]``: ``x * (w / sqrt(mean(x**2) + eps))``.

    NumPy float arrays take one compiled pass per row (five NumPy calls cost 10-35 us a norm, 60 of
    them per decode step), and a row whose squares overflow (float32 values from about 1e19) is
    summed again over ``x / max|x|``: it is normalized, not zeroed. Other namespaces (CuPy) use the
    same formula in array operations, where an overflowed row gives NaN (the logits' check then
    raises) rather than zeros.

    Examples
    --------
    >>> rms_norm(np.array([[3.0, 4.0]]), np.array([1.0, 2.0]), 0.0).round(4).tolist()
    [[0.8485, 2.2627]]
    >>> rms_norm(np.array([[3e20, 4e20]], np.float32), np.array([1.0, 2.0], np.float32), 1e-5).round(4)
    array([[0.8485, 2.2627]], dtype=float32)
    """
    xp = namespace(x)
    if xp is np and x.ndim == 2 and x.dtype in (np.float32, np.float64) and w.dtype == x.dtype:
        out = np.empty_like(x)
        _rms_norm(np.ascontiguousarray(x), w, x.dtype.type(eps), out)
        return out
    ms = xp.sum(x * x, axis=-1, keepdims=True) / x.shape[-1]  # [T, 1]
    s = xp.sqrt(ms + eps)
    # an overflowed sum (inf) would give w / s = 0, rows of zeros; inf - inf makes them NaN (two
    # operations on [T, 1], where rescaling like the compiled kernel would take four on [T, d])
    return x * (w / (s + (s - s)))


@njit(fastmath=_FM, inline="always")
def _rotate(src, c, s, dst):  # pragma: no cover - compiled
    for i in range(src.size // 2):
        x0 = src[2 * i]
        x1 = src[2 * i + 1]
        dst[2 * i] = as_stored(dst, x0 * c[i] - x1 * s[i])
        dst[2 * i + 1] = as_stored(dst, x0 * s[i] + x1 * c[i])


def _kernel_view(a: np.ndarray) -> np.ndarray:
    """``a`` as the kernels take it: a float16 array as its ``uint16`` view (numba has no float16
    on the CPU; :func:`decoding._simd.as_float` and :func:`~decoding._simd.as_stored` convert)."""
    return a.view(np.uint16) if a.dtype == np.float16 else a


@njit(fastmath=_FM, cache=True)
def _rope_and_store(qkv, cos, sin, n_q, n_kv, slots, q, kbuf, vbuf):  # pragma: no cover - compiled
    # kbuf and vbuf are float arrays, or uint16 views of float16 ones (as_stored rounds to them)
    T = qkv.shape[0]
    D = q.shape[2]
    for t in range(T):
        c = cos[t]
        s = sin[t]
        for h in range(n_q):
            _rotate(qkv[t, h * D : (h + 1) * D], c, s, q[t, h])
        for h in range(n_kv):
            _rotate(qkv[t, (n_q + h) * D : (n_q + h + 1) * D], c, s, kbuf[h, slots[t]])
            src = qkv[t, (n_q + n_kv + h) * D : (n_q + n_kv + h + 1) * D]
            dst = vbuf[h, slots[t]]
            for d in range(D):
                dst[d] = as_stored(dst, src[d])


def rope_and_store(qkv, cos, sin, n_q, n_kv, slots, kbuf, vbuf):
    """Rotate the queries and keys of fused ``qkv`` rows, store keys and values in a cache layer.

    ``qkv`` ``[T, (n_q + 2 n_kv) D]`` holds each token's query heads, key heads and value heads;
    ``cos``, ``sin`` ``[T, D/2]`` are each token's RoPE angles, adjacent pairs ``(x[2i], x[2i+1])``
    rotating together (llama.cpp's "normal" RoPE); ``kbuf``, ``vbuf`` ``[n_kv, slots, D]`` are one
    layer of the cache (float16 for the quantized engine: each key and value rounded to nearest)
    and ``slots`` ``[T]`` where each token goes. Returns the rotated queries ``[T, n_q, D]``
    (``qkv``'s dtype). NumPy only: one compiled pass in place of some fifteen small NumPy calls a
    layer (rotation, slicing, copies, the cache's scatter), which cost more than the arithmetic.

    Examples
    --------
    >>> qkv = np.array([[1.0, 0.0, 0.0, 1.0, 5.0, 6.0]])  # one query, one key, one value head, D=2
    >>> k = np.zeros((1, 3, 2)); v = np.zeros((1, 3, 2))
    >>> q = rope_and_store(qkv, np.zeros((1, 1)), np.ones((1, 1)), 1, 1, np.array([2]), k, v)
    >>> q.tolist(), k[0, 2].tolist(), v[0, 2].tolist()
    ([[[0.0, 1.0]]], [-1.0, 0.0], [5.0, 6.0])
    """
    T = qkv.shape[0]
    D = kbuf.shape[-1]
    if kbuf.dtype == np.float16 and qkv.dtype != np.float32:  # float64 would be rounded twice
        raise TypeError(f"a float16 cache takes float32 activations, got qkv of {qkv.dtype}")
    q = np.empty((T, n_q, D), dtype=qkv.dtype)
    if T:
        cos = np.ascontiguousarray(cos, dtype=qkv.dtype)
        sin = np.ascontiguousarray(sin, dtype=qkv.dtype)
        slots = np.asarray(slots, dtype=np.int64)
        kbuf, vbuf = _kernel_view(kbuf), _kernel_view(vbuf)
        _rope_and_store(np.ascontiguousarray(qkv), cos, sin, n_q, n_kv, slots, q, kbuf, vbuf)
    return q


# The score of a hidden key in decoding.attention's array paths, and where the varlen kernel's
# running maximum starts: finite, so that a row with every key hidden stays finite (its output is
# then ignored).
_MASKED = -1e30


@njit(parallel=True, fastmath=_FM, error_model="numpy", cache=True)
def _varlen_attention(
    q, k, v, start, length, seq, valid, use_valid, scale, masked, scratch, visible, spare, out
):  # pragma: no cover
    # One row per (token, key head): its G query heads (3 for SmolLM2) go three at a time through
    # one pass over the keys and one over the values (_attend_heads), and the values are summed
    # four keys per pass over the output rows (a quarter of their loads and stores). A hidden
    # key's score is computed, then dropped (what a padded layout pays); the softmax and the
    # values' sum run over the visible keys alone, in their order, packed to the front: the same
    # operations on the same values as a layout without the hidden keys, so a token's output is
    # bit for bit the same in a padded and an unpadded batch (the quantized engine rounds
    # activations to int8, and a last-bit difference here could move one of them a whole step).
    T, H, D = q.shape
    Hkv = k.shape[0]
    G = H // Hkv
    for r in prange(T * Hkv):
        i = r // Hkv
        hk = r - i * Hkv
        s0 = start[i]
        n_keys = length[i]
        sc = scratch[r]  # G runs of n_keys scores, then probabilities
        keys = visible[r]  # the visible keys' offsets in the run
        n_visible = 0
        for j in range(n_keys):
            if not use_valid or valid[seq[i], j]:
                keys[n_visible] = j
                n_visible += 1
        for g0 in range(0, G, 3):  # query heads three at a time: each key and value row read once
            _attend_heads(
                q,
                k,
                v,
                out,
                i,
                hk,
                G,
                g0,
                min(3, G - g0),
                s0,
                n_keys,
                keys,
                n_visible,
                scale,
                masked,
                sc,
                spare[r],
            )


@njit(fastmath=_FM, error_model="numpy", inline="always")
def _attend_heads(
    q, k, v, out, i, hk, G, g0, count, s0, n_keys, keys, n_visible, scale, masked, sc, spare
):  # pragma: no cover
    # Query heads g0 .. g0 + count - 1 (count <= 3) of token i against key head hk: one pass over
    # the keys computes the three scores of each key, one over the values adds each value row to
    # the three outputs. With fewer than three heads the last one is repeated: its scores are
    # written twice (the same values), its extra outputs go to the spare rows. Sums in the data's
    # own dtype: a Python ``0`` (``scale * 0``) would make numba promote float32 to float64 and
    # call the scalar float64 exp.
    zero = scale - scale
    D = q.shape[2]
    h0 = hk * G + g0
    h1, h2 = h0 + min(1, count - 1), h0 + min(2, count - 1)
    q0, q1, q2 = q[i, h0], q[i, h1], q[i, h2]
    b0 = g0 * n_keys
    b1, b2 = b0 + min(1, count - 1) * n_keys, b0 + min(2, count - 1) * n_keys
    m0, m1, m2 = masked, masked, masked
    n = 0
    for j in range(n_keys):
        kj = k[hk, s0 + j]
        a0, a1, a2 = zero, zero, zero
        for d in range(D):
            kd = as_float(kj[d])  # a float16 cache's key converted (vcvtph2ps), else itself
            a0 += q0[d] * kd
            a1 += q1[d] * kd
            a2 += q2[d] * kd
        if n < n_visible and keys[n] == j:  # a hidden key's scores were computed, then dropped
            a0, a1, a2 = a0 * scale, a1 * scale, a2 * scale
            sc[b0 + n], sc[b1 + n], sc[b2 + n] = a0, a1, a2
            m0, m1, m2 = max(m0, a0), max(m1, a1), max(m2, a2)
            n += 1
    for g in range(count):
        base = b0 + g * n_keys
        m = m0 if g == 0 else (m1 if g == 1 else m2)
        # through a slice: indexed as sc[base + j], whose sign numba cannot prove, these loops
        # stayed scalar (the attention took 98 against 66 us a layer on one thread at batch 8)
        probs = sc[base : base + n_visible]
        total = zero
        for j in range(n_visible):
            e = exp(probs[j] - m)  # vectorized in float32 (decoding._simd.exp)
            probs[j] = e
            total += e
        inv = 1 / total
        for j in range(n_visible):
            probs[j] *= inv
    o0 = out[i, h0]
    o1 = out[i, h1] if count > 1 else spare[0]
    o2 = out[i, h2] if count > 2 else spare[1]
    o0[:] = 0
    o1[:] = 0
    o2[:] = 0
    n4 = n_visible - n_visible % 4
    for j in range(0, n4, 4):
        v0, v1 = v[hk, s0 + keys[j]], v[hk, s0 + keys[j + 1]]
        v2, v3 = v[hk, s0 + keys[j + 2]], v[hk, s0 + keys[j + 3]]
        p00, p01, p02, p03 = sc[b0 + j], sc[b0 + j + 1], sc[b0 + j + 2], sc[b0 + j + 3]
        p10, p11, p12, p13 = sc[b1 + j], sc[b1 + j + 1], sc[b1 + j + 2], sc[b1 + j + 3]
        p20, p21, p22, p23 = sc[b2 + j], sc[b2 + j + 1], sc[b2 + j + 2], sc[b2 + j + 3]
        for d in range(D):
            w0, w1, w2, w3 = as_float(v0[d]), as_float(v1[d]), as_float(v2[d]), as_float(v3[d])
            o0[d] += p00 * w0 + p01 * w1 + p02 * w2 + p03 * w3
            o1[d] += p10 * w0 + p11 * w1 + p12 * w2 + p13 * w3
            o2[d] += p20 * w0 + p21 * w1 + p22 * w2 + p23 * w3
    for j in range(n4, n_visible):
        v0 = v[hk, s0 + keys[j]]
        p0, p1, p2 = sc[b0 + j], sc[b1 + j], sc[b2 + j]
        for d in range(D):
            w0 = as_float(v0[d])
            o0[d] += p0 * w0
            o1[d] += p1 * w0
            o2[d] += p2 * w0


def varlen_attention(q, k, v, start, length, seq=None, key_valid=None):
    """Packed grouped-query attention, every token against its own run of cached keys.

    Token ``i`` (query ``q[i]``, ``[H, D]``) attends to the ``length[i]`` cache slots
    ``start[i] .. start[i] + length[i] - 1`` of ``k``/``v`` ``[Hkv, slots, D]``, query head ``h``
    to key head ``h // (H // Hkv)``; with ``key_valid`` ``[max_seqs, capacity]``, slot ``j`` of the
    run is hidden unless ``key_valid[seq[i], j]`` (its score is computed, then dropped, as a padded
    layout pays for it). One call covers a whole ragged batch: (token, key head) rows are split across
    threads, with no loop over sequences in Python. ``k`` and ``v`` may be float16 (a quantized
    engine's cache: read as float32) beside float32 queries; the result has ``q``'s and ``k``'s
    common dtype (float32 then).

    Examples
    --------
    >>> k = np.array([[[1.0, 0.0], [0.0, 1.0]]]); v = k.copy()
    >>> out = varlen_attention(np.ones((2, 1, 2)), k, v, start=[0, 0], length=[1, 2])
    >>> out[0, 0].tolist(), out[1, 0].tolist()
    ([1.0, 0.0], [0.5, 0.5])
    """
    q = np.ascontiguousarray(q)
    args = varlen_attention_args(q.shape, k.shape[0], np.result_type(q, k), start, length, seq, key_valid)
    return varlen_attention_run(q, k, v, args)


def varlen_attention_args(q_shape, n_kv_heads, dtype, start, length, seq=None, key_valid=None) -> tuple:
    """The arguments of one :func:`varlen_attention` call that do not depend on the layer.

    A forward attends 30 times (once a layer) with the same runs of keys: building these once
    (the runs, the mask, the scale, a scratch buffer) takes about 15 us a call off a decode step.
    Pass the result to :func:`varlen_attention_run`.

    Examples
    --------
    >>> k = np.array([[[1.0, 0.0], [0.0, 1.0]]]); v = k.copy()
    >>> args = varlen_attention_args((2, 1, 2), 1, np.float64, start=[0, 0], length=[1, 2])
    >>> varlen_attention_run(np.ones((2, 1, 2)), k, v, args)[1, 0].tolist()
    [0.5, 0.5]
    """
    T, H, D = q_shape
    start = np.asarray(start, dtype=np.int64)
    length = np.asarray(length, dtype=np.int64)
    dtype = np.dtype(dtype)
    # (float16 keys and values, a quantized engine's cache, come with float32 queries: float32)
    if dtype not in (np.float32, np.float64):
        raise TypeError(f"varlen_attention computes in float32 or float64, got {dtype}")
    scale = dtype.type(1.0 / np.sqrt(D))
    if key_valid is None:
        valid, seq, use_valid = np.ones((1, 1), dtype=np.bool_), np.zeros(T, dtype=np.int64), False
    elif seq is None:
        raise ValueError("varlen_attention needs seq (each token's cache sequence) with key_valid")
    else:
        valid, seq, use_valid = np.asarray(key_valid, dtype=np.bool_), np.asarray(seq, dtype=np.int64), True
    G = H // n_kv_heads
    longest = int(length.max()) if T else 0
    scratch = np.empty((T * n_kv_heads, G * longest), dtype=dtype)
    visible = np.empty((T * n_kv_heads, longest), dtype=np.int64)
    spare = np.empty((T * n_kv_heads, 2, D), dtype=dtype)  # outputs of repeated heads (G % 3 != 0)
    # The running maximum's start, in the data's own precision (the kernel drops hidden keys'
    # scores; every visible score is above it).
    masked = dtype.type(_MASKED)
    return (T, H, D, dtype, start, length, seq, valid, use_valid, scale, masked, scratch, visible, spare)


def varlen_attention_run(q, k, v, args) -> np.ndarray:
    """:func:`varlen_attention` with the arguments of :func:`varlen_attention_args` (``q`` contiguous)."""
    T, H, D, dtype, start, length, seq, valid, use_valid, scale, masked, scratch, visible, spare = args
    out = np.empty((T, H, D), dtype=dtype)
    if T:
        _varlen_attention(
            q,
            _kernel_view(k),
            _kernel_view(v),
            start,
            length,
            seq,
            valid,
            use_valid,
            scale,
            masked,
            scratch,
            visible,
            spare,
            out,
        )
    return out
