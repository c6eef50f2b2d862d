"""Weights kept as the GGUF file's Q4_1 and Q8_0 blocks, and their products with activations.

A decode step reads every weight once, so its time is set by the bytes it reads: 538 MB a token
for SmolLM2-135M dequantized to float32, 111 MB as the file's Q4_1 layers and Q8_0 embedding.
:class:`QuantizedMatrix` holds a matrix as those blocks, and :func:`quantized_linear` multiplies
activations by it the way llama.cpp does: each activation row is quantized per 32 values to int8
(``x ~ dx * qx``, ``dx = max|x| / 127``, as llama.cpp's Q8_1), each block's 32 products are summed
as integers (exact), and the sums are scaled in float32: ``d_w dx sum(q qx) + m_w dx sum(qx)`` for
Q4_1 (``w = d q + m``, ``q`` in 0..15), ``d_w dx sum(q qx)`` for Q8_0 (``w = d q``). On a CPU with
AVX-512 VNNI one instruction (``vpdpbusd``) does 64 of the byte products, where a float32
fused multiply-add does 16: the product at eight tokens went from 331 to 60 us for the
3,072 x 576 gate/up weight (docs/decoding.md).

The held layout interleaves rows by sixteen: for each group of 16 rows and each block column,
the 16 rows' float32 scales ``d`` (Q4_1: then the 16 ``m``), then their codes four bytes at a
time, the 16 rows' first four bytes, then their next four, and so on (Q4_1: 64 + 64 + 256 bytes,
24 a row-block; Q8_0: 64 + 512, 36). Four code bytes of one row fill one 32-bit lane, so one
vector of codes times one activation group of four bytes broadcast to every lane gives 16 rows'
partial sums. A Q4_1 code byte ``j`` holds weight ``j`` in its low nibble and ``j + 16`` in its
high one (the file's layout), so a vector's low nibbles pair with activations ``4c..4c+3`` and its
high nibbles with ``16+4c..``. Rows past ``N`` (to a multiple of 16) are zero. The float16
scales are widened to float32, exactly: :meth:`QuantizedMatrix.file_blocks` gives the file's
bytes back, and :meth:`QuantizedMatrix.dequantize` the weights, ``float32(d * q + m)`` (Q4_1,
rounded once) and ``d * q`` (Q8_0), which the float32 engine uses too.

Exactness: the products equal :func:`reference_product`, NumPy's computation of the same
quantization, integer sums and float32 operations, to float32 rounding; a token's products do not
depend on the other tokens of the call, the thread count or the CPU's instruction set.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType
from numba import njit, prange

from ._simd import PASS_TOKENS, block_dot
from .gguf_reader import dequantize as dequantize_blocks

__all__ = [
    "QuantizedMatrix",
    "QUANTIZED_TYPES",
    "quantize_activations",
    "quantized_linear",
    "reference_product",
]

_Q4_1, _Q8_0 = GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0
#: The block types kept quantized in memory: type -> (kernel code, bytes per 32-weight block in
#: the file, bytes per block held, number of float16 scales a block starts with).
QUANTIZED_TYPES = {_Q4_1: (0, 20, 24, 2), _Q8_0: (1, 34, 36, 1)}
_BLOCK = 32
#: Rows interleaved in a group (one 16-lane vector of sums).
_GROUP = 16
#: float16 bit pattern -> float32 value (256 KB): the blocks' scales, exactly, with no float16 in numba.
_F16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
#: Group chunks per call: more chunks than threads, so that a thread held up by another process
#: does not leave half the matrix to one core.
_CHUNKS = 16
#: The largest finite float32 (a larger absolute value, or NaN, makes a block's scale NaN).
_FLOAT32_MAX = np.float32(np.finfo(np.float32).max)
#: Activation rows from which their quantization runs on the threads.
_PARALLEL_QUANTIZE_ROWS = 32


@dataclass(frozen=True, eq=False)
class QuantizedMatrix:
    """A ``[N, K]`` weight matrix held as GGUF blocks, interleaved by 16 rows.

    Build it with :meth:`from_raw` (the bytes of a GGUF tensor) or :meth:`concatenate` (fused
    matrices). ``blocks`` is uint8 ``[ceil(N / 16), K / 32 * group_bytes]``: the file's blocks with
    their float16 scales widened to float32, 16 rows interleaved (see the module's docstring);
    :meth:`file_blocks` converts back. ``dtype`` is the dtype of the products, float32.

    Examples
    --------
    >>> import gguf
    >>> w = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
    >>> raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
    >>> qm = QuantizedMatrix.from_raw(raw, gguf.GGMLQuantizationType.Q8_0, (2, 32))
    >>> qm.shape, qm.blocks.shape, float(np.abs(qm.dequantize() - w).max()) < 0.01
    ((2, 32), (1, 576), True)
    """

    blocks: np.ndarray
    ggml_type: GGMLQuantizationType
    shape: tuple[int, int]

    dtype = np.dtype(np.float32)

    @classmethod
    def from_raw(cls, raw, ggml_type, shape) -> QuantizedMatrix:
        """Copy the bytes ``raw`` of a Q4_1 or Q8_0 tensor of NumPy shape ``shape`` ``(N, K)``.

        ``ValueError`` for another type, a ``K`` that is not a multiple of 32, a byte count that
        does not match, or a scale that is not finite (a corrupt file).
        """
        ggml_type = GGMLQuantizationType(ggml_type)
        if ggml_type not in QUANTIZED_TYPES:
            raise ValueError(
                f"ggml_type must be one of {[t.name for t in QUANTIZED_TYPES]}, got {ggml_type.name}"
            )
        if len(shape) != 2 or shape[1] % _BLOCK:
            raise ValueError(f"shape must be (N, K) with K a multiple of {_BLOCK}, got {tuple(shape)}")
        N, K = (int(s) for s in shape)
        _, file_bytes, held_bytes, n_scales = QUANTIZED_TYPES[ggml_type]
        raw = np.asarray(raw, dtype=np.uint8).reshape(-1)
        n_blocks = N * K // _BLOCK
        if raw.size != n_blocks * file_bytes:
            raise ValueError(
                f"{ggml_type.name} data of shape {(N, K)} needs {n_blocks * file_bytes} bytes, got {raw.size}"
            )
        file_blocks = raw.reshape(n_blocks, file_bytes)
        scales = _F16[file_blocks[:, : 2 * n_scales].copy().view("<u2")]  # exact: float16 in float32
        if not np.isfinite(scales).all():
            raise ValueError(f"{ggml_type.name} data has non-finite block scales (corrupt data?)")
        held = np.empty((n_blocks, held_bytes), dtype=np.uint8)
        held[:, : 4 * n_scales] = scales.astype("<f4").view(np.uint8)
        held[:, 4 * n_scales :] = file_blocks[:, 2 * n_scales :]
        return cls(_interleave(held.reshape(N, K // _BLOCK, held_bytes)), ggml_type, (N, K))

    @classmethod
    def concatenate(cls, parts) -> QuantizedMatrix:
        """The row-wise concatenation of matrices of one type and width (fused Q/K/V or gate/up)."""
        parts = list(parts)
        kinds = {(p.ggml_type, p.shape[1]) for p in parts}
        if len(kinds) != 1:
            raise ValueError(f"can only concatenate matrices of one type and width, got {sorted(kinds)}")
        held = np.concatenate([p._held_rows() for p in parts], axis=0)
        return cls(_interleave(held), parts[0].ggml_type, (held.shape[0], parts[0].shape[1]))

    @property
    def nbytes(self) -> int:
        """Bytes held (and read by one product)."""
        return self.blocks.nbytes

    def _held_rows(self, rows=None) -> np.ndarray:
        """Rows ``rows`` (default all) in the row-major held layout: uint8 ``[rows, K / 32, held_bytes]``
        (each block: its float32 scales, then the file's code bytes)."""
        N, K = self.shape
        rows = np.arange(N) if rows is None else np.asarray(rows, dtype=np.int64).reshape(-1)
        if rows.size and (rows.min() < 0 or rows.max() >= N):
            raise IndexError(f"rows must lie in [0, {N}), got {rows.min()}..{rows.max()}")
        _, _, held_bytes, n_scales = QUANTIZED_TYPES[self.ggml_type]
        nb = K // _BLOCK
        groups = self.blocks.reshape(self.blocks.shape[0], nb, -1, _GROUP, 4)  # [G, nb, words, lane, 4]
        g, lane = rows // _GROUP, rows % _GROUP
        return groups[g, :, :, lane, :].reshape(rows.size, nb, held_bytes)

    def file_blocks(self, rows=None) -> np.ndarray:
        """The GGUF file's bytes of these blocks (or of rows ``rows``): uint8 ``[rows, K / 32 * file_bytes]``.

        Examples
        --------
        >>> import gguf
        >>> w = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
        >>> raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_1)
        >>> qm = QuantizedMatrix.from_raw(raw, gguf.GGMLQuantizationType.Q4_1, (2, 32))
        >>> bool(np.array_equal(qm.file_blocks(), raw.reshape(2, -1)))
        True
        """
        held = self._held_rows(rows)
        _, file_bytes, held_bytes, n_scales = QUANTIZED_TYPES[self.ggml_type]
        held = held.reshape(-1, held_bytes)
        out = np.empty((held.shape[0], file_bytes), dtype=np.uint8)
        out[:, : 2 * n_scales] = held[:, : 4 * n_scales].copy().view("<f4").astype("<f2").view(np.uint8)
        out[:, 2 * n_scales :] = held[:, 4 * n_scales :]
        return out.reshape(-1, self.shape[1] // _BLOCK * file_bytes)

    def dequantize(self, rows=None) -> np.ndarray:
        """The weights as float32, ``[N, K]`` (or ``[len(rows), K]``): the reference for the kernels.

        The GGUF reader's dequantization of the file's blocks (:func:`decoding.gguf_reader.dequantize`,
        which the float32 engine uses too): Q4_1 computed in float64 and rounded once, as the
        kernels' fused multiply-add does, so the two agree bit for bit.
        """
        blocks = self.file_blocks(rows)
        return dequantize_blocks(blocks, self.ggml_type, (blocks.shape[0], self.shape[1]), dtype=np.float32)


def _interleave(held: np.ndarray) -> np.ndarray:
    """Row-major held blocks ``[N, nb, held_bytes]`` as groups ``[ceil(N / 16), nb * group_bytes]``.

    A held block is 4-byte words (its float32 scales, then its codes four bytes at a time); a
    group's block column is each word for its 16 rows in turn. Rows past ``N`` are zero.
    """
    N, nb, held_bytes = held.shape
    G = -(-N // _GROUP)
    padded = np.zeros((G * _GROUP, nb, held_bytes), dtype=np.uint8)
    padded[:N] = held
    words = padded.reshape(G, _GROUP, nb, held_bytes // 4, 4)
    return np.ascontiguousarray(words.transpose(0, 2, 3, 1, 4)).reshape(G, -1)


@njit(cache=True)
def _quantize_row(x, t, qx, dx, sx, sq):  # pragma: no cover - compiled
    # llama.cpp's Q8_1: per 32 values d = max|x| / 127, q = round(x / d) (x times 1 / d, rounded
    # half to even), and the block's sum of q, as an integer and as d * sum in float32. A block
    # holding NaN or infinity gets d = NaN and q = 0, so the token's products are NaN, never a
    # finite number made without it.
    for b in range(x.shape[1] // 32):
        amax = np.float32(0.0)
        finite = True
        for j in range(32):
            a = abs(x[t, 32 * b + j])
            finite &= a <= _FLOAT32_MAX
            amax = max(amax, a)
        d = amax / np.float32(127.0) if finite else np.float32(np.nan)
        inv = np.float32(1.0) / d if finite and d > 0 else np.float32(0.0)
        total = 0
        for j in range(32):
            q = np.int32(np.rint(x[t, 32 * b + j] * inv))
            qx[t, 32 * b + j] = q
            total += q
        dx[t, b] = d
        sx[t, b] = d * np.float32(total)
        sq[t, b] = total


@njit(cache=True)
def _quantize_serial(x, qx, dx, sx, sq):  # pragma: no cover - compiled
    for t in range(x.shape[0]):
        _quantize_row(x, t, qx, dx, sx, sq)


@njit(parallel=True, cache=True)
def _quantize_parallel(x, qx, dx, sx, sq):  # pragma: no cover - compiled
    for t in prange(x.shape[0]):
        _quantize_row(x, t, qx, dx, sx, sq)


@njit(parallel=True, cache=True)
def _group_products(
    blocks, kind, qx, dx, sx, sq, out, t_begin, t_end, n_chunks
):  # pragma: no cover - compiled
    # Fixed chunks of 16-row groups (so the result does not depend on the thread count); each
    # group times tokens t_begin..t_end - 1 in passes of up to PASS_TOKENS.
    G = blocks.shape[0]
    for c in prange(n_chunks):
        for g in range(c * G // n_chunks, (c + 1) * G // n_chunks):
            t = t_begin
            while t < t_end:
                U = min(PASS_TOKENS, t_end - t)
                if kind == 0:
                    block_dot(blocks, g, qx, dx, sx, out, t, U)  # Q4_1: float32 dx * sum(qx)
                else:
                    block_dot(blocks, g, qx, dx, sq, out, t, U)  # Q8_0: int32 sum(qx)
                t += U


@njit(cache=True)
def _product(x, blocks, kind, out, n_chunks, step):  # pragma: no cover - compiled
    T, K = x.shape
    nb = K // 32
    qx = np.empty((T, K), dtype=np.int8)
    dx = np.empty((T, nb), dtype=np.float32)
    sx = np.empty((T, nb), dtype=np.float32)
    sq = np.empty((T, nb), dtype=np.int32)
    if T >= _PARALLEL_QUANTIZE_ROWS:
        _quantize_parallel(x, qx, dx, sx, sq)
    else:
        _quantize_serial(x, qx, dx, sx, sq)
    for a in range(0, T, step):  # blocks of tokens whose activations stay in L2
        _group_products(blocks, kind, qx, dx, sx, sq, out, a, min(T, a + step), n_chunks)


def quantized_linear(x: np.ndarray, w: QuantizedMatrix, *, max_rows: int = 256) -> np.ndarray:
    """``x @ W.T`` for float32 activations ``x`` ``[T, K]`` and a quantized weight ``W`` ``[N, K]``.

    Each row of ``x`` is quantized per 32 values to int8, as llama.cpp does, and each block's
    products are summed as integers (the module's docstring; :func:`reference_product` is the
    same computation in NumPy). Every weight is read once per ``max_rows`` activation rows
    (longer inputs go in blocks of that many, whose activations stay in L2). The result is
    float32 ``[T, N]``; each token's row is computed alone, in a fixed order, so it does not
    depend on the other rows of ``x``, on ``max_rows``, on the thread count or on the CPU's
    instruction set.

    Examples
    --------
    >>> import gguf
    >>> rng = np.random.default_rng(0)
    >>> w = rng.normal(size=(8, 64)).astype(np.float32)
    >>> qm = QuantizedMatrix.from_raw(gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_1),
    ...                               gguf.GGMLQuantizationType.Q4_1, (8, 64))
    >>> x = rng.normal(size=(3, 64)).astype(np.float32)
    >>> y = quantized_linear(x, qm)
    >>> bool(np.allclose(y, reference_product(x, qm), rtol=1e-5, atol=1e-5))
    True
    >>> float(np.abs(y - x @ qm.dequantize().T).max()) < 0.1  # the activations' int8 rounding
    True
    """
    if not isinstance(w, QuantizedMatrix):
        raise TypeError(f"w must be a QuantizedMatrix, got {type(w).__name__}")
    N, K = w.shape
    if x.ndim != 2 or x.shape[1] != K:
        raise ValueError(f"x must have shape (T, {K}), got {x.shape}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    T = x.shape[0]
    G = w.blocks.shape[0]
    if T == 0 or N == 0:
        return np.empty((T, N), dtype=np.float32)
    out = np.empty((T, G * _GROUP), dtype=np.float32)  # the kernels write whole groups
    _product(x, w.blocks, QUANTIZED_TYPES[w.ggml_type][0], out, min(_CHUNKS, G), max(1, int(max_rows)))
    return out if G * _GROUP == N else np.ascontiguousarray(out[:, :N])


def quantize_activations(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """NumPy's quantization of float32 activations ``x`` ``[T, K]`` per 32 values: ``(qx, dx)``.

    ``dx = max|x| / 127`` per block (float32) and ``qx = rint(x * (1 / dx))`` (int8; 0 where
    ``dx`` is 0), the arithmetic of :func:`quantized_linear`'s kernels (llama.cpp's Q8_1). A block
    holding NaN or infinity gets ``dx = NaN`` and ``qx = 0``.

    Examples
    --------
    >>> qx, dx = quantize_activations(np.linspace(-1, 1, 32, dtype=np.float32)[None])
    >>> int(qx.min()), int(qx.max()), bool(np.isclose(dx[0, 0], 1 / 127))
    (-127, 127, True)
    """
    x = np.asarray(x, dtype=np.float32)
    blocks = x.reshape(x.shape[0], -1, _BLOCK)
    finite = np.isfinite(blocks).all(axis=2)
    with np.errstate(invalid="ignore", divide="ignore"):
        dx = np.where(finite, np.abs(blocks).max(axis=2) / np.float32(127.0), np.float32(np.nan))
        inv = np.where(finite & (dx > 0), np.float32(1.0) / dx, np.float32(0.0)).astype(np.float32)
        qx = np.where(finite[:, :, None], np.rint(blocks * inv[:, :, None]), 0).astype(np.int8)
    return qx.reshape(x.shape), dx


def reference_product(x: np.ndarray, w: QuantizedMatrix) -> np.ndarray:
    """NumPy's computation of :func:`quantized_linear`: the reference its kernels are tested against.

    The activations quantized by :func:`quantize_activations`, each block's integer sums
    ``sum(q qx)`` (int64), and per block in order ``acc = d * dx * sum(q qx) + acc`` (a fused
    multiply-add in the kernels: here the float32 product and the sum in float64, rounded once),
    then for Q4_1 ``acc = m * (dx * sum(qx)) + acc``. float32 ``[T, N]``.

    Examples
    --------
    >>> import gguf
    >>> w = np.ones((2, 32), dtype=np.float32)
    >>> qm = QuantizedMatrix.from_raw(gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0),
    ...                               gguf.GGMLQuantizationType.Q8_0, (2, 32))
    >>> x = np.ones((1, 32), dtype=np.float32)
    >>> np.round(reference_product(x, qm), 2).tolist()  # weights and activations 127 * (1 / 127)
    [[32.0, 32.0]]
    >>> bool(np.array_equal(reference_product(x, qm), quantized_linear(x, qm)))
    True
    """
    N, K = w.shape
    qx, dx = quantize_activations(x)
    T, nb = dx.shape
    held = w._held_rows()  # [N, nb, held_bytes]
    d = held[:, :, 0:4].copy().view("<f4")[..., 0]
    if w.ggml_type == _Q4_1:
        m = held[:, :, 4:8].copy().view("<f4")[..., 0]
        codes = held[:, :, 8:24]
        q = np.concatenate([codes & 15, codes >> 4], axis=2).astype(np.int64)
    else:
        q = held[:, :, 4:36].view(np.int8).astype(np.int64)
    qxb = qx.reshape(T, nb, _BLOCK).astype(np.int64)
    isum = np.einsum("nbk,tbk->tbn", q, qxb)  # exact
    sx = dx * qxb.sum(axis=2).astype(np.float32)  # float32, as the kernels round it
    acc = np.zeros((T, N), dtype=np.float32)
    for b in range(nb):
        scale = (d[None, :, b] * dx[:, b, None]).astype(np.float32)
        acc = (isum[:, b, :].astype(np.float64) * scale + acc).astype(np.float32)
        if w.ggml_type == _Q4_1:
            acc = (m[None, :, b].astype(np.float64) * sx[:, b, None] + acc).astype(np.float32)
    return acc
