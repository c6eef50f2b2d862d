"""Sparse sign embeddings: SparseSign (s nonzeros per column, OSNAP) and CountSketch (s = 1)."""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp

from rsketch._random import STREAM_ROW, bounded_from_words, random_words, signs_from_words
from rsketch._validation import check_allocation, check_float_dtype, check_int
from rsketch.kernels import cpu
from rsketch.operators.base import ACCUMULATOR_BYTES, SketchOperator, canonical_csr


def sparse_chunks(n: int, r: int, k: int, itemsize: int = 8) -> int:
    """Row ranges of ``A`` with private ``r x k`` accumulators in ``S @ A``: a function of the shape only.

    One range per 16384 rows, at most 8, and together at most :data:`ACCUMULATOR_BYTES`; never a
    function of the thread count, so ``S @ A`` is bitwise the same for any number of threads. With
    one range the output itself is the accumulator.

    Examples
    --------
    >>> sparse_chunks(500_000, 2000, 100), sparse_chunks(300, 10**9, 2)
    (8, 1)
    """
    by_n = min(8, max(1, n // 16384))
    return max(1, min(by_n, ACCUMULATOR_BYTES // (itemsize * r * k)))


#: Most rows a row block may hold: a row within a block is drawn from one 32-bit word
#: (``(w * size) >> 32``), which reaches only the first 2**32 rows of a larger block.
MAX_BLOCK_ROWS = 2**32


def _check_blocks(sketch_size: int, nnz: int, name: str) -> None:
    """Refuse sizes the hashing cannot draw uniformly: row blocks of ``sketch_size / nnz`` rows
    above :data:`MAX_BLOCK_ROWS`, or block bounds ``t * sketch_size`` (``t < nnz``) beyond int64.

    Examples
    --------
    >>> _check_blocks(2**33, 1, "CountSketch")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: CountSketch draws each nonzero's row within a block of ... = 8589934592 rows from 32 ...
    """
    block = -(-sketch_size // nnz)  # the largest block's rows
    if block > MAX_BLOCK_ROWS:
        raise ValueError(
            f"{name} draws each nonzero's row within a block of sketch_size / nnz_per_column = "
            f"{block} rows from 32 random bits, so a block may hold at most 2**32 rows; "
            "use a smaller sketch_size or more nonzeros per column"
        )
    if sketch_size * nnz >= 2**63:
        raise ValueError(
            f"{name}'s block bounds need sketch_size * nnz_per_column < 2**63, got "
            f"{sketch_size} * {nnz}; use fewer nonzeros per column"
        )


class SparseSign(SketchOperator):
    """Sparse sign embedding: each column of ``S`` has ``s`` nonzeros ``+-1/sqrt(s)``.

    The rows are split into ``s`` contiguous blocks (block ``t`` is rows
    ``floor(t r / s) .. floor((t+1) r / s) - 1``) and column ``j`` has exactly one nonzero in each
    block, at a uniformly chosen row with a random sign (the block construction of OSNAP, Nelson &
    Nguyen 2013; Kane & Nelson 2014). Nonzero ``t`` of column ``j`` comes from counter
    ``(j, t // 2, STREAM_ROW)``: word ``2 (t % 2)`` picks the row, bit 0 of the next word the sign.
    Each column has unit norm and distinct rows, so ``E[S.T S] = I``.

    ``S @ A`` is one streaming pass over ``A``: a compiled kernel hashes row ``j`` on the fly and
    adds it, signed, into ``s`` rows of a per-thread ``r x k`` accumulator (scatter-add), not a
    sort of the rows of ``A`` by bucket: the sort moves all of ``A`` once more, while the
    accumulators (``r k`` values per thread) stay in cache (``docs/operators.md``).
    Cost ``O(s nnz(A))``; extra memory ``threads * r * k``.

    Parameters
    ----------
    input_dim, sketch_size, seed, dtype
        See :class:`rsketch.SketchOperator`.
    nnz_per_column : int, default min(8, sketch_size)
        ``s``: nonzeros per column. ``s = 8`` is the common practical choice (Tropp et al.;
        RandBLAS); larger ``s`` gives distortion closer to Gaussian at ``s`` times the cost.

    Examples
    --------
    >>> import numpy as np, rsketch
    >>> S = rsketch.SparseSign(1000, 100, seed=0, nnz_per_column=4)
    >>> bool((np.count_nonzero(S.to_dense(), axis=0) == 4).all())
    True
    """

    kind = "sparse_sign"

    def __init__(self, input_dim, sketch_size, *, seed=None, dtype=np.float64, nnz_per_column=None):
        super().__init__(input_dim, sketch_size, seed=seed, dtype=dtype)
        if nnz_per_column is None:
            nnz_per_column = min(8, self.sketch_size)
        self.nnz_per_column = check_int(nnz_per_column, "nnz_per_column", minimum=1, maximum=self.sketch_size)
        _check_blocks(self.sketch_size, self.nnz_per_column, type(self).__name__)

    def _options(self):
        return {"nnz_per_column": self.nnz_per_column}

    @property
    def _scale(self) -> float:
        return 1.0 / math.sqrt(self.nnz_per_column)

    def pattern(self, start=0, stop=None):
        """Rows and signs of the nonzeros of columns ``start:stop``: two ``(m, s)`` arrays."""
        stop = self.input_dim if stop is None else stop
        start, stop = self._check_range(start, stop)
        s, r = self.nnz_per_column, self.sketch_size
        what = f"the pattern of columns {start}:{stop}"
        check_allocation(16 * s * (stop - start), what, "ask for fewer columns at a time")
        return cpu.sparse_pattern(self.key[0], self.key[1], start, stop, s, r, STREAM_ROW)

    def sparse_columns(self, start=0, stop=None, dtype=np.float64):
        """Columns ``start:stop`` of ``S`` as a SciPy CSC matrix (``(sketch_size, stop - start)``,
        ``s`` nonzeros a column) built from :meth:`pattern`: the entries of :meth:`columns`, bit for
        bit, in ``O(s (stop - start))`` memory. Its transpose is a CSR matrix with the same arrays.

        Examples
        --------
        >>> import numpy as np, rsketch
        >>> S = rsketch.SparseSign(50, 8, seed=0, nnz_per_column=2)
        >>> M = S.sparse_columns(10, 20)
        >>> M.shape, M.nnz, bool((M.toarray() == S.columns(10, 20)).all())
        ((8, 10), 20, True)
        """
        stop = self.input_dim if stop is None else stop
        dtype = check_float_dtype(dtype)
        rows, signs = self.pattern(start, stop)
        s = rows.shape[1]
        data = (signs * self._scale).astype(dtype).reshape(-1)
        indptr = np.arange(0, rows.shape[0] * s + 1, s)
        return sp.csc_matrix((data, rows.reshape(-1), indptr), shape=(self.sketch_size, rows.shape[0]))

    def reference_pattern(self, start=0, stop=None, xp=np):
        """The same pattern from the portable Philox path."""
        stop = self.input_dim if stop is None else stop
        start, stop = self._check_range(start, stop)
        s, r = self.nnz_per_column, self.sketch_size
        # its Philox words and bounds: about eight (m, s) int64 arrays at once (2**62 columns had met
        # numpy's own "array is too big")
        what = f"the portable pattern of columns {start}:{stop}"
        check_allocation(64 * s * (stop - start), what, "ask for fewer columns at a time")
        j = xp.arange(start, stop, dtype=xp.int64)[:, None]
        t = xp.arange(s, dtype=xp.int64)[None, :]
        w = random_words(xp, self.key, j, t // 2, STREAM_ROW)
        odd = (t % 2) == 1
        w_row = xp.where(odd, w[2], w[0])
        w_sign = xp.where(odd, w[3], w[1])
        lo = (t * r) // s
        hi = ((t + 1) * r) // s
        rows = lo + bounded_from_words(xp, w_row, hi - lo)  # one bound per row block t
        return rows, signs_from_words(xp, w_sign, xp.float64)

    def _dense_from_pattern(self, rows, signs, start, stop, xp):
        m = stop - start
        if not m:
            return xp.zeros((self.sketch_size, 0), dtype=xp.float64)
        # one (m, r) one-hot per nonzero of a column, not an (m, s, r) one (9.7 GiB for 100 columns of
        # 10**4 nonzeros, past the columns' memory check): the nonzeros of a column lie in distinct row
        # blocks, so each entry gets at most one term and the sum is exact in any order
        every_row = xp.arange(self.sketch_size)[None, :]
        cols = xp.zeros((m, self.sketch_size), dtype=xp.float64)
        for t in range(rows.shape[1]):
            cols = cols + xp.astype(rows[:, t : t + 1] == every_row, xp.float64) * signs[:, t : t + 1]
        return cols.T * self._scale

    def _fast_columns(self, start, stop):
        rows, signs = self.pattern(start, stop)
        out = np.zeros((self.sketch_size, stop - start))
        cols = np.arange(stop - start)
        for t in range(self.nnz_per_column):
            out[rows[:, t], cols] += signs[:, t] * self._scale
        return out

    def _reference_columns(self, start, stop, xp):
        rows, signs = self.reference_pattern(start, stop, xp)
        return self._dense_from_pattern(rows, signs, start, stop, xp)

    def _block_size(self) -> int:
        return max(1, (1 << 20) // self.sketch_size)

    def _apply_bytes(self, k: int, itemsize: int) -> int:
        r, s = self.sketch_size, self.nnz_per_column
        chunks = sparse_chunks(self.input_dim, r, k, itemsize)
        # each chunk also hashes HASH_BLOCK rows ahead: s rows (int64) and signs each (a million
        # nonzeros a column made 7.8 GB of these buffers that the estimate left out)
        hashed = chunks * cpu.HASH_BLOCK * s * (8 + itemsize)
        return itemsize * r * k * (chunks + (chunks > 1)) + hashed

    def _adjoint_bytes(self, k: int, itemsize: int) -> int:
        return itemsize * (self.input_dim + self.sketch_size) * k

    def _operand_copy_bytes(self, A) -> int:
        # the kernels read a C- or Fortran-ordered A; any other (a strided view, a broadcast) is
        # copied whole first, which the estimate had left out (a broadcast of 8 MB met NumPy's
        # "Unable to allocate 7.45 GiB" past the check)
        contiguous = not isinstance(A, np.ndarray) or A.flags.c_contiguous or A.flags.f_contiguous
        return 0 if contiguous else A.nbytes

    def _finish(self, acc, transposed):
        # One chunk: the accumulator is the output; otherwise the chunks are added in order.
        if acc.shape[0] == 1 and not transposed:
            return _scaled(acc[0], self._scale)
        k = acc.shape[1 if transposed else 2]
        out = np.empty((self.sketch_size, k), dtype=acc.dtype)
        (cpu.reduce_chunks_t if transposed else cpu.reduce_chunks)(acc, self._scale, out)
        return out

    def _apply_numpy(self, A):
        n, k = A.shape
        r = self.sketch_size
        chunks = sparse_chunks(n, r, k, A.dtype.itemsize)
        args = (self.key[0], self.key[1], self.nnz_per_column, r, STREAM_ROW)
        if A.flags.f_contiguous and not A.flags.c_contiguous:
            acc = np.zeros((chunks, k, r), dtype=A.dtype)
            cpu.sparse_apply_dense_fortran(*args, A, acc)
            if chunks == 1 and (k == 1 or A.dtype.itemsize * r * k > ACCUMULATOR_BYTES):
                return _scaled_t(acc, self._scale)
            return self._finish(acc, True)
        acc = np.zeros((chunks, r, k), dtype=A.dtype)
        cpu.sparse_apply_dense(*args, np.ascontiguousarray(A), acc)
        return self._finish(acc, False)

    def _apply_sparse(self, A):
        A = canonical_csr(A)
        n, k = A.shape
        r = self.sketch_size
        acc = np.zeros((sparse_chunks(n, r, k, A.dtype.itemsize), r, k), dtype=A.dtype)
        args = (self.key[0], self.key[1], self.nnz_per_column, r, STREAM_ROW)
        cpu.sparse_apply_csr(*args, A.indptr, A.indices, A.data, n, k, acc)
        return self._finish(acc, False)

    def _adjoint_numpy(self, Z):
        out = np.empty((self.input_dim, Z.shape[1]), dtype=Z.dtype)
        args = (self.key[0], self.key[1], self.nnz_per_column, self.sketch_size, STREAM_ROW, self._scale)
        cpu.sparse_adjoint(*args, np.ascontiguousarray(Z), out)
        return out


def _scaled(out, scale):
    # In place, rounded as the chunk reduction rounds (a float64 product, then the output's dtype),
    # so one chunk gives the bits that several chunks' kernels would.
    return np.multiply(out, np.float64(scale), out=out, casting="unsafe")


def _scaled_t(acc, scale):
    # The one (k, r) accumulator of a column-major product too large for a second copy: the output
    # is its transpose (column-major), scaled in place.
    return _scaled(acc[0].T, scale)


class CountSketch(SparseSign):
    """CountSketch (Clarkson & Woodruff 2013): one ``+-1`` per column, at a hashed row.

    The ``s = 1`` case of :class:`SparseSign` (same kernels, same counters). The cheapest
    embedding to apply (one pass over ``A``, ``O(nnz(A))``) but it needs ``r`` of order ``p**2``
    rather than ``p`` for a subspace embedding of a ``p``-dimensional space, so it is usually
    the first stage of a two-stage sketch or used with generous ``r``.

    Parameters
    ----------
    input_dim, sketch_size, seed, dtype
        See :class:`rsketch.SketchOperator`.

    Examples
    --------
    >>> import numpy as np, rsketch
    >>> S = rsketch.CountSketch(10, 4, seed=0)
    >>> np.abs(S.to_dense()).sum(axis=0)
    array([1., 1., 1., 1., 1., 1., 1., 1., 1., 1.])
    """

    kind = "countsketch"

    def __init__(self, input_dim, sketch_size, *, seed=None, dtype=np.float64):
        super().__init__(input_dim, sketch_size, seed=seed, dtype=dtype, nnz_per_column=1)

    def _options(self):
        return {}
