"""Lazy ``S @ A`` for a Dask array ``A``: one product per chunk at its row offset, then a tree sum.

Every operator generates its entries by block (``S[:, a:b]`` is a pure function of the key and
``a:b``), so the chunk of rows ``a:b`` is multiplied by exactly the columns ``a:b`` of the sketch the
in-memory product uses: the Dask result is the same sketch, whatever the chunking, and differs from
``S @ A.compute()`` only in the order of the sums.

- CountSketch and sparse sign: the chunk's hashed rows and signs (``SparseSign.pattern(a, b)``) as a
  sparse matrix, applied by SciPy's compiled sparse-dense product (one streaming scatter-add).
- Gaussian: the chunk's columns of ``S`` generated in blocks by the ziggurat kernel, times the
  chunk by BLAS.
- SRHT: exactly the in-memory operator, chunk by chunk. For an aligned block ``[c, c + B)`` with
  ``B`` a power of two dividing ``c``, ``H[i, c + j] = (-1)^popcount(i & c) H_B[i mod B, j]``, so the
  block's part of ``P H D A`` is a ``B``-point transform of the (signed, zero-padded) block, read at
  rows ``i mod B`` and signed by the parity of ``i & c``. A chunk of ``m`` rows meets at most two
  aligned blocks of ``B = 2**ceil(log2 m)``: ``O(m log m k)`` per chunk plus ``O(r k)`` per block.
- SRDCT: the chunk's columns of ``S`` generated in blocks (``O(r m k)`` per chunk, as Gaussian).
- Uniform and leverage sampling: a gather of the sampled rows; only the chunks holding them are read.
"""

from __future__ import annotations

import math

import numpy as np

from rsketch._exact_scaling import with_columns_scaled
from rsketch._validation import check_allocation, check_finite
from rsketch.kernels import cpu

# Rows of a chunk hashed at once by the sparse-sign product (bounds its pattern's memory).
_SPARSE_ROWS = 1 << 16
# Partials added per node of the tree reduction; a constant, so the sum order depends on the chunking only.
SPLIT_EVERY = 8


def is_dask_array(A) -> bool:
    """Whether ``A`` is a ``dask.array.Array`` (without importing Dask when it is not loaded).

    Examples
    --------
    >>> import numpy as np, dask.array as da
    >>> is_dask_array(da.ones(3)), is_dask_array(np.ones(3))
    (True, False)
    """
    import array_api_compat

    return array_api_compat.is_dask_array(A)


def _check_numpy_chunks(A, name: str):
    """``A`` with plain NumPy chunks: refuse a Dask array whose chunks are not NumPy arrays, judged
    lazily by its ``_meta``, and map those of an unmasked subclass (``np.matrix``) to ``ndarray``.

    The per-chunk kernels index, slice and multiply NumPy blocks: sparse chunks met them only at
    compute time, as NumPy's "setting an array element with a sequence" or "matmul: dimension
    mismatch"; masked chunks were read under their mask (in memory a masked ``A`` is refused).
    ``np.matrix`` chunks, let through as NumPy data, made ``*`` a matrix product and Dask's reductions
    fail to build their meta (``S @ A`` of a sampling sketch, ``lstsq``, ``svd``, the estimators and
    ``leverage_sampling`` raised NumPy's shape errors); in memory such an ``A`` is a plain array too.
    """
    if not is_dask_array(A):  # rsketch.dask's functions take Dask arrays; NumPy's met AttributeErrors
        raise TypeError(
            f"{name} must be a dask.array.Array, got {type(A).__name__}; for in-memory data use the "
            "functions of rsketch itself"
        )
    meta = A._meta
    if type(meta) is np.ndarray:
        return A
    if isinstance(meta, np.ndarray) and not isinstance(meta, np.ma.MaskedArray):
        return A.map_blocks(np.asarray, meta=np.empty((0,) * A.ndim, dtype=A.dtype))
    module = type(meta).__module__
    kind = f"{'scipy.sparse' if module.startswith('scipy.sparse') else module}.{type(meta).__name__}"
    if isinstance(meta, np.ma.MaskedArray):
        raise TypeError(
            f"{name} is a Dask array of masked chunks ({kind}), whose mask rsketch cannot honour: pass "
            f"da.ma.filled({name}, value) or da.ma.getdata({name})"
        )
    if kind.startswith(("scipy.sparse", "sparse.")):
        todense = "toarray" if kind.startswith("scipy.sparse") else "todense"
        fix = f"{name}.map_blocks(lambda b: b.{todense}(), dtype={name}.dtype)"
        raise TypeError(
            f"{name} is a Dask array of {kind} chunks; rsketch's Dask kernels take dense NumPy chunks: map "
            f"them to dense with {fix}, or pass a dense array (in memory, rsketch also takes a SciPy "
            f"CSR/CSC matrix)"
        )
    if kind.startswith("cupy"):
        fix = f"{name}.map_blocks(cupy.asnumpy, dtype={name}.dtype)"
    else:
        fix = f"{name}.map_blocks(np.asarray, dtype={name}.dtype)"
    raise TypeError(
        f"{name} is a Dask array of {kind} chunks; rsketch's Dask kernels take NumPy chunks: "
        f"map them to NumPy with {fix}"
    )


def check_dask_operand(A, rows, name: str = "A", rows_label: str | None = None):
    """Validate a Dask operand of ``S @ A`` (no data is read): ``(A2, is_vector)`` with ``A2`` 2-D float.

    Raises ``ValueError`` for unknown chunk sizes (call ``A.compute_chunk_sizes()``), a wrong number
    of rows, an empty array or more than two dimensions; ``TypeError`` for complex or non-numeric
    dtypes, and for chunks that are not NumPy arrays (SciPy sparse, masked, CuPy: seen in
    ``A._meta``); chunks of an ndarray subclass (``np.matrix``) become plain arrays, as in memory.
    Integer input becomes float64, float16 float32, as in memory. Chunks of length
    zero (left by a filter) are dropped; the other chunks are kept as they are.

    Examples
    --------
    >>> import dask.array as da
    >>> A, vec = check_dask_operand(da.ones(10, chunks=4, dtype=int), 10)
    >>> A.shape, A.dtype, vec
    ((10, 1), dtype('float64'), True)
    >>> x = da.arange(10, chunks=5)
    >>> check_dask_operand(x[x > 3], 6)
    Traceback (most recent call last):
    ...
    ValueError: A has unknown chunk sizes (from boolean indexing or a filter): call A.compute_chunk_sizes()...
    >>> y = x[x > 4].compute_chunk_sizes()  # its first chunk is empty: dropped
    >>> y.chunks, check_dask_operand(y, 5)[0].chunks
    (((0, 5),), ((5,), (1,)))
    """
    A = _check_numpy_chunks(A, name)
    if any(math.isnan(c) for dim in A.chunks for c in dim):
        raise ValueError(
            f"{name} has unknown chunk sizes (from boolean indexing or a filter): "
            f"call {name}.compute_chunk_sizes() first"
        )
    kind = A.dtype.kind
    if kind == "c":
        raise TypeError(f"{name} must be real-valued; got complex dtype {A.dtype}")
    if kind not in "iubf":
        raise TypeError(f"{name} must be a numeric (real) array; got dtype {A.dtype}")
    if A.ndim not in (1, 2):
        raise ValueError(f"{name} must be 1-D or 2-D, got {A.ndim} dimensions (shape {A.shape})")
    why = f" ({rows_label})" if rows_label else ""
    if rows is not None and A.shape[0] != rows:
        raise ValueError(f"{name} must have {rows} rows{why}, got shape {A.shape}")
    if 0 in A.shape:
        raise ValueError(f"{name} is empty (shape {A.shape}); expected at least one row and column")
    # Zero-length chunks (a boolean filter, then compute_chunk_sizes()) would reach the per-chunk
    # kernels and reductions as empty blocks: a lazy rechunk to the same chunks without them.
    empty = {ax: tuple(c for c in dim if c) for ax, dim in enumerate(A.chunks) if 0 in dim}
    if empty:
        A = A.rechunk(empty)
    dt = np.dtype(np.float32) if kind == "f" and A.dtype.itemsize <= 4 else np.dtype(np.float64)
    is_vector = A.ndim == 1
    A = A.astype(dt)
    return (A[:, None] if is_vector else A), is_vector


def row_offsets(chunks) -> list[tuple[int, int]]:
    """``[(a, b), ...]``: the rows of each chunk along one axis.

    Examples
    --------
    >>> row_offsets((3, 4, 1))
    [(0, 3), (3, 7), (7, 8)]
    """
    ends = np.cumsum((0,) + tuple(chunks)).tolist()
    return list(zip(ends[:-1], ends[1:], strict=True))


# ------------------------------------------------------------------------------------------ per chunk
def _sparse_sign_chunk(S, a, block):
    m, k = block.shape
    out = np.zeros((S.sketch_size, k))
    for lo in range(0, m, _SPARSE_ROWS):
        hi = min(m, lo + _SPARSE_ROWS)
        # S's columns a + lo .. a + hi as a sparse matrix: it scatters A's rows into the sketch
        out += S.sparse_columns(a + lo, a + hi) @ block[lo:hi]
    return out


def _generated_chunk(S, a, block):
    m, k = block.shape
    out = np.zeros((S.sketch_size, k))
    bs = S._block_size()
    for lo in range(0, m, bs):
        hi = min(m, lo + bs)
        out += S._fast_columns(a + lo, a + hi) @ block[lo:hi]
    return out


def _srht_chunk(S, a, block):
    m, k = block.shape
    size = min(S.padded_size, 1 << (m - 1).bit_length())
    rows = S.rows
    out = np.zeros((S.sketch_size, k))
    signed = block * S.signs(a, a + m)[:, None]
    for c in range(a - a % size, a + m, size):
        lo, hi = max(a, c), min(a + m, c + size)
        buf = np.zeros((k, size))  # the block's columns as rows, zero outside the chunk
        buf[:, lo - c : hi - c] = signed[lo - a : hi - a].T
        cpu.fwht_columns(buf)
        parity = (np.bitwise_count(rows & c) & 1).astype(np.float64)
        out += buf[:, rows % size].T * (1.0 - 2.0 * parity)[:, None]
    return out * (1.0 / math.sqrt(S.sketch_size))


CHUNK_PRODUCTS = {
    "countsketch": _sparse_sign_chunk,
    "sparse_sign": _sparse_sign_chunk,
    "gaussian": _generated_chunk,
    "srdct": _generated_chunk,
    "srht": _srht_chunk,
}


def chunk_product(block, op, block_info=None):
    """``S[:, a:b] @ block`` (float64) for the block of rows ``a:b``, as a ``(1, r, k)`` partial.

    Raises ``ValueError`` naming the rows when the block holds NaN or infinity (checked only when
    the partial is not finite, as the in-memory product does).
    """
    (a, b), _ = block_info[0]["array-location"]
    block = np.asarray(block, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        out = CHUNK_PRODUCTS[op.kind](op, a, block)
    if not np.isfinite(out).all():
        check_finite(block, f"A (rows {a}:{b})")
        # finite rows: the unscaled sums overflowed where the product may not (as in memory)
        out = with_columns_scaled(lambda B: CHUNK_PRODUCTS[op.kind](op, a, B), block)
    return out[None]


def _checked_rows(block):
    check_finite(block, "A")
    return block


def _scaled_rows(block, scales, block_info=None):
    """The sampled rows ``block`` times their scales (``scales[a:b]`` for the block's rows ``a:b``)."""
    (a, b), _ = block_info[0]["array-location"]
    with np.errstate(over="ignore"):  # finite rows near the range overflow: the caller checks, as in memory
        return block * scales[a:b, None]


def _quiet_sum(x, axis=None, keepdims=False, **kwargs):
    with np.errstate(over="ignore", invalid="ignore"):
        return np.sum(x, axis=axis, keepdims=keepdims, **kwargs)


def tree_sum(parts):
    """``parts.sum(axis=0, split_every=SPLIT_EVERY)`` (the same tree, the same sums) without NumPy's
    warnings where partials of a finite ``A`` near the float range overflow: ``S @ A`` in memory
    computes under ``np.errstate`` and checks its output, and the solvers rescale ``A`` (data of
    ``1e307`` warned at every node of the tree)."""
    import dask.array as da

    return da.reduction(parts, _quiet_sum, _quiet_sum, axis=0, dtype=parts.dtype, split_every=SPLIT_EVERY)


# ------------------------------------------------------------------------------------------ products
def sketch_dask(S, A):
    """``S @ A`` for a Dask array ``A``: a lazy Dask array of shape ``(r, k)`` (or ``(r,)``).

    Called by ``SketchOperator.__matmul__``; see the module docstring for each family's chunk
    product. Row chunks may be irregular; column chunks are kept. The result's chunks are
    ``((r,), A.chunks[1])``. The partials of the row chunks are added in a tree of fan-in
    :data:`SPLIT_EVERY`, so the order of the sums is the same on every scheduler for one chunking: the
    result is bitwise the same there, except for the Gaussian and SRDCT chunk products, which go through
    BLAS and change in the last bits with its thread count (see ``docs/dask.md``).

    Examples
    --------
    >>> import numpy as np, dask.array as da, rsketch
    >>> A = np.random.default_rng(0).standard_normal((1000, 4))
    >>> S = rsketch.SparseSign(1000, 50, seed=1)
    >>> SA = S @ da.from_array(A, chunks=(300, 2))
    >>> SA.shape, SA.chunks
    ((50, 4), ((50,), (2, 2)))
    >>> bool(np.allclose(SA.compute(), S @ A, rtol=1e-12, atol=0))
    True
    """
    A, is_vector = check_dask_operand(A, S.input_dim, "A", rows_label="the sketch's input_dim")
    r, k = S.sketch_size, A.shape[1]
    # the r x k float64 partials a node of the sum adds, its result and the product's (the sampling
    # kinds: the result and r indices and scales), checked as the graph is built: a sketch_size of
    # 2**40 had met numpy's "Unable to allocate 16 TiB" inside compute()
    sampled = S.kind in ("uniform", "leverage")
    check_allocation(
        8 * r * k * (1 if sampled else SPLIT_EVERY + 2) + (16 * r if sampled else 0),
        f"{type(S).__name__} @ A on Dask with sketch_size={r} and {k} column(s) (the {r} x {k} result "
        "and the partial sums of its tree)",
        "use a smaller sketch_size or apply the sketch to fewer columns at a time",
    )
    if sampled:
        out = _sample_dask(S, A)
    else:
        if S.kind not in CHUNK_PRODUCTS:
            raise TypeError(f"{type(S).__name__} has no Dask product (kinds: {sorted(CHUNK_PRODUCTS)})")
        n_blocks = len(A.chunks[0])
        parts = A.map_blocks(
            chunk_product,
            op=S,
            new_axis=[1],
            chunks=((1,) * n_blocks, (r,), A.chunks[1]),
            dtype=np.float64,
            meta=np.empty((0, 0, 0)),
            token=f"rsketch-{S.kind}-partial",
        )
        out = tree_sum(parts).astype(A.dtype)
    return out[:, 0] if is_vector else out


def _sample_dask(S, A):
    idx, scales = S.indices(), S.scales().astype(A.dtype)
    rows, inverse = np.unique(idx, return_inverse=True)
    picked = A[rows].map_blocks(_checked_rows, dtype=A.dtype)  # reads only the chunks holding sampled rows
    out = picked[inverse.reshape(-1)].map_blocks(_scaled_rows, scales, dtype=A.dtype)
    return out.rechunk({0: S.sketch_size})
