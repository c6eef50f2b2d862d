"""Weights kept as the GGUF file's Q4_1 and Q8_0 blocks and their products with activations.

A decode step reads every weight once, so its time is set by the bytes it reads: 538 MB a token
for SmolLM2-135M dequantized to float32, 111 MB as the file's Q4_1 layers and Q8_0 embedding.
:class:`QuantizedMatrix` holds a matrix as those blocks (one row of blocks per output row), and
:func:`quantized_linear` multiplies float32 activations by it. Each thread takes fixed chunks of
four-row groups; for each group an LLVM loop over the blocks (:data:`decoding._simd.ROWS_DOT`)
converts and scales every block in registers and multiplies it into accumulators for up to eight
tokens at once. The weights stream from memory once per call, as blocks, and no dequantized
weight is ever stored.

The held layout is the file's with each block's float16 scales widened to float32, first
(Q4_1: ``d, m`` float32 then the 16 bytes of codes, 24 bytes a block; Q8_0: ``d`` float32 then
32 int8, 36 bytes): the kernels then load a scale into every lane of a vector in one broadcast,
where a float16 scale costs two shuffles, on the port that limits the product (decode at batch
1: the layers' products 5.2 in place of 6.0 ms, for 15% more bytes). The widening is exact, and
:meth:`QuantizedMatrix.file_blocks` gives the file's bytes back.

Exactness: a dequantized Q4_1 weight is ``float32(d * q + m)`` rounded once (a fused
multiply-add), a Q8_0 weight ``d * q`` (exact in float32); :meth:`QuantizedMatrix.dequantize` is
the NumPy reference of the same values, the GGUF reader's dequantization of the file's bytes
(computed in float64 and rounded), and equals the kernel's weights bit for bit. The products
differ from a float64 product of those weights by float32 rounding of the sums only.

Layout of a block in the file (32 weights of one row; ``d``, ``m`` little-endian float16):
Q4_1 is ``d, m, 16 bytes`` (low nibble of byte ``j``: weight ``j``; high nibble: weight
``j + 16``; ``w = d q + m``), Q8_0 is ``d, 32 int8`` (``w = d q``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType
from numba import njit, prange

from ._simd import ROWS_DOT, prefetch_next_row
from .gguf_reader import dequantize as dequantize_blocks

# numba calls an intrinsic through a global name: one per kind and shape
_Q4_1_4x1, _Q4_1_4x2, _Q4_1_4x3, _Q4_1_4x4 = (ROWS_DOT["q4_1", 4, u] for u in (1, 2, 3, 4))
_Q4_1_2x5, _Q4_1_2x6, _Q4_1_2x7, _Q4_1_2x8 = (ROWS_DOT["q4_1", 2, u] for u in (5, 6, 7, 8))
_Q8_0_4x1, _Q8_0_4x2, _Q8_0_4x3, _Q8_0_4x4 = (ROWS_DOT["q8_0", 4, u] for u in (1, 2, 3, 4))
_Q8_0_2x5, _Q8_0_2x6, _Q8_0_2x7, _Q8_0_2x8 = (ROWS_DOT["q8_0", 2, u] for u in (5, 6, 7, 8))

__all__ = ["QuantizedMatrix", "QUANTIZED_TYPES", "quantized_linear"]

_Q4_1, _Q8_0 = GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0
#: The block types kept quantized in memory: type -> (kernel code, bytes per 32-weight block in
#: the file, bytes per block held, number of float16 scales a block starts with).
QUANTIZED_TYPES = {_Q4_1: (0, 20, 24, 2), _Q8_0: (1, 34, 36, 1)}
_BLOCK = 32
#: float16 bit pattern -> float32 value (256 KB): the blocks' scales, exactly, with no float16 in numba.
_F16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
#: Row chunks per call: more chunks than threads, so that a thread held up by another process
#: does not leave half the matrix to one core.
_CHUNKS = 16
#: Weight rows asked for ahead of the ones being dequantized (about 6 KB of Q4_1 at 576 columns).
_PREFETCH_ROWS = 16


@dataclass(frozen=True, eq=False)
class QuantizedMatrix:
    """A ``[N, K]`` weight matrix held as GGUF blocks: ``blocks`` is uint8 ``[N, K / 32 * block_bytes]``.

    Build it with :meth:`from_raw` (the bytes of a GGUF tensor) or :meth:`concatenate` (fused
    matrices). ``blocks`` holds the file's blocks with their float16 scales widened to float32
    (24 bytes a Q4_1 block, 36 a Q8_0 one; see the module's docstring), which
    :meth:`file_blocks` converts back. ``dtype`` is the dtype of the products, float32.

    Examples
    --------
    >>> import gguf
    >>> w = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
    >>> raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)
    >>> qm = QuantizedMatrix.from_raw(raw, gguf.GGMLQuantizationType.Q8_0, (2, 32))
    >>> qm.shape, qm.nbytes, float(np.abs(qm.dequantize() - w).max()) < 0.01
    ((2, 32), 72, True)
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
        return cls(held.reshape(N, K // _BLOCK * held_bytes), ggml_type, (N, K))

    @classmethod
    def concatenate(cls, parts) -> QuantizedMatrix:
        """The row-wise concatenation of matrices of one type and width (fused Q/K/V or gate/up)."""
        parts = list(parts)
        kinds = {(p.ggml_type, p.shape[1]) for p in parts}
        if len(kinds) != 1:
            raise ValueError(f"can only concatenate matrices of one type and width, got {sorted(kinds)}")
        blocks = np.concatenate([p.blocks for p in parts], axis=0)
        return cls(blocks, parts[0].ggml_type, (blocks.shape[0], parts[0].shape[1]))

    @property
    def nbytes(self) -> int:
        """Bytes held (and read by one product)."""
        return self.blocks.nbytes

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
        blocks = self.blocks if rows is None else self.blocks[np.asarray(rows, dtype=np.int64)]
        _, file_bytes, held_bytes, n_scales = QUANTIZED_TYPES[self.ggml_type]
        held = blocks.reshape(-1, held_bytes)
        out = np.empty((held.shape[0], file_bytes), dtype=np.uint8)
        out[:, : 2 * n_scales] = held[:, : 4 * n_scales].copy().view("<f4").astype("<f2").view(np.uint8)
        out[:, 2 * n_scales :] = held[:, 4 * n_scales :]
        return out.reshape(blocks.shape[0], -1)

    def dequantize(self, rows=None) -> np.ndarray:
        """The weights as float32, ``[N, K]`` (or ``[len(rows), K]``): the reference for the kernels.

        The GGUF reader's dequantization of the file's blocks (:func:`decoding.gguf_reader.dequantize`,
        which the float32 engine uses too): Q4_1 computed in float64 and rounded once, as the
        kernels' fused multiply-add does, so the two agree bit for bit.
        """
        blocks = self.file_blocks(rows)
        return dequantize_blocks(blocks, self.ggml_type, (blocks.shape[0], self.shape[1]), dtype=np.float32)


@njit(cache=True)
def _put(out, t, rows, sums, U):  # pragma: no cover - compiled
    # sums is row-major: sums[i * U + j] belongs to token t + j and row rows[i]
    for i in range(len(rows)):
        for j in range(U):
            out[t + j, rows[i]] = sums[i * U + j]


@njit(cache=True)
def _four_rows(x, blocks, kind, rows, t, U, out):  # pragma: no cover - compiled
    # rows (four) times tokens t .. t + U - 1, U in 1..4
    n0, n1, n2, n3 = rows
    q4 = kind == 0
    if U == 1:
        _put(
            out,
            t,
            rows,
            _Q4_1_4x1(blocks, n0, n1, n2, n3, x, t) if q4 else _Q8_0_4x1(blocks, n0, n1, n2, n3, x, t),
            1,
        )
    elif U == 2:
        _put(
            out,
            t,
            rows,
            _Q4_1_4x2(blocks, n0, n1, n2, n3, x, t) if q4 else _Q8_0_4x2(blocks, n0, n1, n2, n3, x, t),
            2,
        )
    elif U == 3:
        _put(
            out,
            t,
            rows,
            _Q4_1_4x3(blocks, n0, n1, n2, n3, x, t) if q4 else _Q8_0_4x3(blocks, n0, n1, n2, n3, x, t),
            3,
        )
    else:
        _put(
            out,
            t,
            rows,
            _Q4_1_4x4(blocks, n0, n1, n2, n3, x, t) if q4 else _Q8_0_4x4(blocks, n0, n1, n2, n3, x, t),
            4,
        )


@njit(cache=True)
def _two_rows(x, blocks, kind, rows, t, U, out):  # pragma: no cover - compiled
    # rows (two) times tokens t .. t + U - 1, U in 5..8
    a, b = rows
    q4 = kind == 0
    if U == 5:
        _put(out, t, rows, _Q4_1_2x5(blocks, a, b, x, t) if q4 else _Q8_0_2x5(blocks, a, b, x, t), 5)
    elif U == 6:
        _put(out, t, rows, _Q4_1_2x6(blocks, a, b, x, t) if q4 else _Q8_0_2x6(blocks, a, b, x, t), 6)
    elif U == 7:
        _put(out, t, rows, _Q4_1_2x7(blocks, a, b, x, t) if q4 else _Q8_0_2x7(blocks, a, b, x, t), 7)
    else:
        _put(out, t, rows, _Q4_1_2x8(blocks, a, b, x, t) if q4 else _Q8_0_2x8(blocks, a, b, x, t), 8)


@njit(cache=True)
def _register_quad(x, blocks, kind, n0, n1, n2, n3, out):  # pragma: no cover - compiled
    # rows n0..n3 times every row of x: passes of eight tokens (two rows at once), then one pass
    # of the rest (four rows at once up to four tokens, two rows from five), so that the cost
    # grows with the token count in steps of one pass, not of one pass per power of two
    T = x.shape[0]
    t = 0
    while T - t > 0:
        U = min(8, T - t)
        if U > 4:
            _two_rows(x, blocks, kind, (n0, n1), t, U, out)
            _two_rows(x, blocks, kind, (n2, n3), t, U, out)
        else:
            _four_rows(x, blocks, kind, (n0, n1, n2, n3), t, U, out)
        t += U


@njit(parallel=True, cache=True)
def _quantized_rows(x, blocks, kind, out, n_chunks):  # pragma: no cover - compiled
    # Fixed chunks of four-row groups (so the result does not depend on the thread count); per
    # group: ask for the rows _PREFETCH_ROWS ahead, then the group times every token.
    N = blocks.shape[0]
    n_quads = (N + 3) // 4
    for c in prange(n_chunks):
        for quad in range(c * n_quads // n_chunks, (c + 1) * n_quads // n_chunks):
            n0 = 4 * quad
            pf = n0 + _PREFETCH_ROWS
            pf_end = min(pf + 4, N)
            while pf < pf_end:
                pf = prefetch_next_row(blocks, pf, pf_end, 64)
            # a missing last row repeats row N - 1 (the same value into the same slot)
            _register_quad(
                x, blocks, kind, n0, min(n0 + 1, N - 1), min(n0 + 2, N - 1), min(n0 + 3, N - 1), out
            )


def quantized_linear(x: np.ndarray, w: QuantizedMatrix, *, max_rows: int = 256) -> np.ndarray:
    """``x @ W.T`` for float32 activations ``x`` ``[T, K]`` and a quantized weight ``W`` ``[N, K]``.

    Every weight is read once per ``max_rows`` activation rows (longer inputs go in blocks of
    that many, whose activations stay in L2). The result is float32 ``[T, N]``. It does not
    depend on the thread count (the row chunks are fixed). Tokens go in passes of up to eight,
    each token's sums in the same order, except a token that makes a pass alone (one token, or a
    remainder of one): it sums in two accumulators, so its last bits can differ.

    Examples
    --------
    >>> import gguf
    >>> rng = np.random.default_rng(0)
    >>> w = rng.normal(size=(8, 64)).astype(np.float32)
    >>> qm = QuantizedMatrix.from_raw(gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_1),
    ...                               gguf.GGMLQuantizationType.Q4_1, (8, 64))
    >>> x = rng.normal(size=(3, 64)).astype(np.float32)
    >>> bool(np.allclose(quantized_linear(x, qm), x @ qm.dequantize().T, rtol=1e-5, atol=1e-5))
    True
    """
    if not isinstance(w, QuantizedMatrix):
        raise TypeError(f"w must be a QuantizedMatrix, got {type(w).__name__}")
    N, K = w.shape
    if x.ndim != 2 or x.shape[1] != K:
        raise ValueError(f"x must have shape (T, {K}), got {x.shape}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    T = x.shape[0]
    out = np.empty((T, N), dtype=np.float32)
    if T == 0 or N == 0:
        return out
    kind = QUANTIZED_TYPES[w.ggml_type][0]
    n_chunks = min(_CHUNKS, (N + 3) // 4)
    step = max(1, int(max_rows))
    if T <= step:  # a decode step: no slices (this wrapper runs 121 times a step)
        _quantized_rows(x, w.blocks, kind, out, n_chunks)
        return out
    for a in range(0, T, step):
        _quantized_rows(x[a : a + step], w.blocks, kind, out[a : a + step], n_chunks)
    return out
