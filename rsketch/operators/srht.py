"""Subsampled randomized trigonometric transforms: Hadamard (SRHT) and DCT (SRDCT)."""

from __future__ import annotations

import math
import os

import numba
import numpy as np
import scipy.fft

from rsketch._random import (
    STREAM_SELECT,
    STREAM_SIGN,
    lane_words,
    sample_without_replacement,
    signs_from_words,
)
from rsketch._validation import check_allocation
from rsketch.kernels import cpu
from rsketch.operators.base import SketchOperator, read_only_view


def _parity(xp, x):
    """Parity of the popcount of non-negative int64 values (entries of a Hadamard matrix)."""
    for shift in (32, 16, 8, 4, 2, 1):
        x = x ^ (x >> shift)
    return x & 1


class _SubsampledTransform(SketchOperator):
    """``S = sqrt(m / r) * P F D``: random signs ``D``, an orthogonal ``m x m`` transform ``F``, and
    ``P`` selecting ``r`` of its ``m`` rows uniformly without replacement; ``E[S.T S] = I``.

    The diagonal signs of entry ``j`` are bit 0 of lane ``j % 4`` of counter ``(j // 4, 0, STREAM_SIGN)``;
    the selected rows are a uniformly random ``r``-subset of ``[0, m)`` drawn by Floyd's algorithm
    from counters ``(i, ., STREAM_SELECT)``, ``i < r`` (O(r) time and memory, whatever ``m``), kept
    in ascending order. Subclasses give ``m`` and ``F``.
    """

    _allows_oversize = False

    def __init__(self, input_dim, sketch_size, *, seed=None, dtype=np.float64):
        super().__init__(input_dim, sketch_size, seed=seed, dtype=dtype)
        self.padded_size = self._transform_size()
        self._rows = None

    def _transform_size(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def rows(self) -> np.ndarray:
        """The ``r`` selected rows of the transform (ascending); O(r) state computed once."""
        if self._rows is None:
            self._check_rows_memory()
            r = self.sketch_size
            self._rows = cpu.floyd_sample(self.key[0], self.key[1], self.padded_size, r, STREAM_SELECT)
        return read_only_view(self._rows)  # handed out: a caller's edit must not change S

    def reference_rows(self, xp=np):
        """The selected rows from the portable Philox path (must equal :attr:`rows`)."""
        self._check_rows_memory()
        return sample_without_replacement(xp, self.key, self.padded_size, self.sketch_size, STREAM_SELECT)

    def _check_rows_memory(self) -> None:
        r = self.sketch_size  # the sampled rows and the sampler's work: 40 bytes a row
        what = f"the {r} selected rows of a {type(self).__name__}"
        check_allocation(40 * r, what, "use a smaller sketch_size")

    def signs(self, start=0, stop=None, xp=np):
        """The diagonal signs ``D[start:stop]`` (float64 +-1)."""
        stop = self.input_dim if stop is None else stop
        start, stop = self._check_range(start, stop)
        check_allocation(16 * (stop - start), f"signs {start}:{stop}", "ask for fewer signs at a time")
        return signs_from_words(xp, lane_words(xp, self.key, start, stop, STREAM_SIGN), xp.float64)

    def _columns_from(self, rows, start, stop, xp):  # pragma: no cover - abstract
        raise NotImplementedError

    def _fast_columns(self, start, stop):
        return self._columns_from(self.rows, start, stop, np)

    def _reference_columns(self, start, stop, xp):
        return self._columns_from(self.reference_rows(), start, stop, xp)

    def _apply_sparse(self, A):
        # The transform mixes all rows: a sparse A is densified (documented memory cost n * k),
        # counted with the transform's own work before it is made
        n, k = A.shape
        check_allocation(
            A.dtype.itemsize * n * k + self._apply_bytes(k, A.dtype.itemsize),
            f"{type(self).__name__} @ A of a sparse {n} x {k} A (densified: the transform mixes every row)",
            "apply the sketch to fewer columns at a time",
        )
        return self._apply_numpy(A.toarray())

    def _columns_bytes(self) -> int:
        return 40 * self.sketch_size if self._rows is None else 0


class SRHT(_SubsampledTransform):
    """Subsampled randomized Hadamard transform.

    ``S = sqrt(m / r) * P F D`` where ``D`` is a diagonal of random signs, ``F = H / sqrt(m)`` with
    ``H`` the Walsh-Hadamard matrix of order ``m = 2**ceil(log2 n)`` (``A`` is implicitly
    zero-padded to ``m`` rows) and ``P`` selects ``r`` of its ``m`` rows uniformly without
    replacement; then ``E[S.T S] = I``. Applied by a compiled, cache-blocked fast Walsh-Hadamard
    transform, parallel over groups of 8 columns; extra memory ``threads * 8 * m`` values (not a
    padded copy of ``A``), time ``O(m log m k)``.

    The diagonal signs of entry ``j`` are bit 0 of lane ``j % 4`` of counter ``(j // 4, 0, STREAM_SIGN)``;
    the selected rows are a uniformly random ``r``-subset of ``[0, m)`` (Floyd's algorithm on
    stream ``STREAM_SELECT``), kept in ascending order. Any column block ``S[:, a:b]`` costs
    ``O(r (b - a))`` and ``O(r)`` memory, however large ``n`` is (up to ``2**62``).

    Parameters
    ----------
    input_dim, sketch_size, seed, dtype
        See :class:`rsketch.SketchOperator`; ``sketch_size <= input_dim``.

    See Also
    --------
    SRDCT : the same construction with the DCT-II (no padding).

    Examples
    --------
    >>> import numpy as np, rsketch
    >>> S = rsketch.SRHT(1000, 100, seed=0)
    >>> S.padded_size
    1024
    >>> np.allclose(S @ np.eye(1000)[:, :3], S.to_dense()[:, :3])
    True
    """

    kind = "srht"

    def _transform_size(self) -> int:
        if self.input_dim > 2**62:
            raise ValueError(
                f"input_dim must be <= 2**62 for SRHT (it pads to the next power of two, and 2**63 "
                f"overflows int64 indices); got {self.input_dim}"
            )
        return 1 << (self.input_dim - 1).bit_length()

    def _apply_bytes(self, k: int, itemsize: int) -> int:
        groups = min(numba.get_num_threads(), -(-k // 8))
        buffers = groups * min(8, k) * self.padded_size
        return itemsize * (self.sketch_size * k + self.input_dim + buffers) + self._columns_bytes()

    def _adjoint_bytes(self, k: int, itemsize: int) -> int:
        buffers = min(numba.get_num_threads(), k) * self.padded_size
        return itemsize * (self.input_dim * k + buffers) + self._columns_bytes()

    def _columns_from(self, rows, start, stop, xp):
        j = xp.arange(start, stop, dtype=xp.int64)[None, :]
        i = xp.asarray(rows)[:, None]
        d = self.signs(start, stop, xp)[None, :]
        h = xp.astype(1 - 2 * _parity(xp, i & j), xp.float64)
        return h * d * (1.0 / math.sqrt(self.sketch_size))

    def _apply_numpy(self, A):
        r, k = self.sketch_size, A.shape[1]
        out = np.empty((r, k), dtype=A.dtype)
        cpu.srht_apply(
            self.key[0], self.key[1], STREAM_SIGN, self.padded_size, self.rows, 1.0 / math.sqrt(r), A, out
        )
        return out

    def _adjoint_numpy(self, Z):
        n, k = self.input_dim, Z.shape[1]
        out = np.empty((n, k), dtype=Z.dtype)
        scale = 1.0 / math.sqrt(self.sketch_size)
        cpu.srht_adjoint(
            self.key[0],
            self.key[1],
            STREAM_SIGN,
            self.padded_size,
            self.rows,
            scale,
            np.ascontiguousarray(Z),
            out,
        )
        return out


class SRDCT(_SubsampledTransform):
    """Subsampled randomized discrete cosine transform.

    ``S = sqrt(n / r) * P F D`` with ``D`` random signs, ``F`` the orthonormal DCT-II of order
    ``n`` (no padding) through :func:`scipy.fft.dct`, and ``P`` selecting ``r`` of its ``n`` rows
    uniformly without replacement; ``E[S.T S] = I``. One transformed copy of ``A`` is held in
    memory; time ``O(n log n k)``. Its signs and selected rows are drawn as :class:`SRHT`'s are,
    with ``m = n``.

    Parameters
    ----------
    input_dim, sketch_size, seed, dtype
        See :class:`rsketch.SketchOperator`; ``sketch_size <= input_dim``.

    Examples
    --------
    >>> import numpy as np, rsketch
    >>> S = rsketch.SRDCT(1000, 100, seed=0)
    >>> S.padded_size
    1000
    >>> np.allclose(S @ np.eye(1000)[:, :3], S.to_dense()[:, :3])
    True
    """

    kind = "srdct"

    # Entry (i, j) has angle pi (2 j + 1) i / (2 n), reduced exactly modulo 2 pi in int64:
    # (2 j + 1) i < 2**63 needs n <= 2**31.
    _MAX_INPUT_DIM = 2**31

    def _transform_size(self) -> int:
        if self.input_dim > self._MAX_INPUT_DIM:
            raise ValueError(
                f"input_dim must be <= 2**31 for SRDCT (its entries' angles are reduced exactly in int64); "
                f"got {self.input_dim}; use SRHT for longer vectors"
            )
        return self.input_dim

    def _apply_bytes(self, k: int, itemsize: int) -> int:
        return itemsize * (2 * self.input_dim * k + 2 * self.sketch_size * k) + self._columns_bytes()

    def _adjoint_bytes(self, k: int, itemsize: int) -> int:
        return 3 * itemsize * self.input_dim * k + self._columns_bytes()

    def _columns_from(self, rows, start, stop, xp):
        n = self.input_dim
        j = xp.arange(start, stop, dtype=xp.int64)[None, :]
        i = xp.asarray(rows)[:, None]
        d = self.signs(start, stop, xp)[None, :]
        c = 1.0 - (1.0 - math.sqrt(0.5)) * xp.astype(i == 0, xp.float64)  # DCT-II row 0 has weight 1/sqrt(2)
        phase = ((2 * j + 1) * i) % (4 * n)  # exact: the angle modulo 2 pi, in units of pi / (2 n)
        ang = (math.pi / (2 * n)) * xp.astype(phase, xp.float64)
        return math.sqrt(2.0 / self.sketch_size) * c * xp.cos(ang) * d

    def _apply_numpy(self, A):
        B = A * self.signs().astype(A.dtype)[:, None]
        Y = scipy.fft.dct(B, type=2, norm="ortho", axis=0, overwrite_x=True, workers=os.cpu_count())
        return Y[self.rows] * A.dtype.type(math.sqrt(self.input_dim / self.sketch_size))

    def _adjoint_numpy(self, Z):
        n = self.input_dim
        buf = np.zeros((n, Z.shape[1]), dtype=Z.dtype)
        buf[self.rows] = Z
        X = scipy.fft.idct(buf, type=2, norm="ortho", axis=0, overwrite_x=True, workers=os.cpu_count())
        return X * (self.signs().astype(Z.dtype) * math.sqrt(n / self.sketch_size))[:, None]
