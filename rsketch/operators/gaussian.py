"""Gaussian projection: i.i.d. N(0, 1/r) entries, generated in column blocks."""

from __future__ import annotations

import math

import numba
import numpy as np

from rsketch._random import STREAM_GAUSS, ZIG_X, ziggurat_columns
from rsketch.kernels import cpu
from rsketch.operators.base import ACCUMULATOR_BYTES, SketchOperator, canonical_csr


class GaussianSketch(SketchOperator):
    """Dense Gaussian sketch: ``S[i, j] ~ N(0, 1/r)`` independently.

    Column ``j`` is a pure function of the key and ``j``: its entries are the first ``r``
    accepted attempts of a 128-layer ziggurat (Marsaglia & Tsang 2000) fed by the Philox
    counters ``(j, q, STREAM_GAUSS)``, ``q = 0, 1, ...`` (see :mod:`rsketch._random`). ``S @ A``
    and ``S.T @ Z`` run one compiled kernel each, parallel over ranges of columns of ``S``: it
    generates ``S`` in tiles of 64 columns x 1024 rows (512 KiB, in cache) and multiplies each tile
    into private accumulators with fused multiply-adds, without BLAS. Every output entry is summed
    in an order fixed by the shape (see :func:`gaussian_lanes`), so the result is bitwise the same
    for every thread count (``docs/operators.md``, "Reproducibility").

    Cost: ``O(r n k)`` flops and ``r n`` normals per product; memory: the output, at most
    :data:`ACCUMULATOR_BYTES` of accumulators, and one tile per thread; ``S`` is never held whole.
    The best-understood sketch (exact finite-sample theory) and the slowest to apply.

    Parameters
    ----------
    input_dim, sketch_size, seed, dtype
        See :class:`rsketch.SketchOperator`.

    Examples
    --------
    >>> import numpy as np, rsketch
    >>> S = rsketch.GaussianSketch(4000, 400, seed=0)
    >>> x = np.ones(4000) / np.sqrt(4000)
    >>> bool(0.8 < np.linalg.norm(S @ x) < 1.2)
    True
    """

    kind = "gaussian"

    def _block_size(self) -> int:
        return max(16, (1 << 20) // self.sketch_size)

    def _unscaled_columns_numpy(self, start, stop, dtype=np.float64):
        G = np.empty((stop - start, self.sketch_size), dtype=dtype)
        cpu.gaussian_columns(self.key[0], self.key[1], start, stop, self.sketch_size, STREAM_GAUSS, G, ZIG_X)
        return G  # G[j - start, i] = unscaled S[i, j]

    def fill_transposed(self, out: np.ndarray) -> np.ndarray:
        """Write ``S.T`` (shape ``(input_dim, sketch_size)``, row-major) into ``out`` and return it.

        For callers that reuse one dense copy of many Gaussian sketches of the same shape (e.g.
        :func:`rsketch.efficiency`): no allocation, and ``out.T`` is ``S`` for BLAS products.

        Examples
        --------
        >>> import numpy as np, rsketch
        >>> S = rsketch.GaussianSketch(50, 5, seed=0)
        >>> np.array_equal(S.fill_transposed(np.empty((50, 5))).T, S.to_dense())
        True
        """
        if type(out) is not np.ndarray:  # a list had met an AttributeError
            raise TypeError(f"out must be a NumPy array, got {type(out).__name__}")
        if (
            out.shape != (self.input_dim, self.sketch_size)
            or out.dtype != np.float64
            or not out.flags.c_contiguous
            or not out.flags.writeable  # a read-only one had met numba's typing error
        ):
            raise ValueError(
                f"out must be a writeable C-contiguous float64 array of shape "
                f"{(self.input_dim, self.sketch_size)}, got a{'' if out.flags.writeable else ' read-only'} "
                f"{out.dtype} array of shape {out.shape}"
            )
        cpu.gaussian_columns(
            self.key[0], self.key[1], 0, self.input_dim, self.sketch_size, STREAM_GAUSS, out, ZIG_X
        )
        out *= 1.0 / math.sqrt(self.sketch_size)
        return out

    def _fast_columns(self, start, stop):
        G = self._unscaled_columns_numpy(start, stop)
        G *= 1.0 / math.sqrt(self.sketch_size)  # in place: no second (stop - start) x r array
        return G.T

    def _reference_columns(self, start, stop, xp):
        G = ziggurat_columns(xp, self.key, start, stop, self.sketch_size)
        return G.T * (1.0 / math.sqrt(self.sketch_size))

    # ----------------------------------------------------------------------------- products
    def _lanes(self, k: int) -> tuple[int, bool]:
        return gaussian_lanes(self.input_dim, self.sketch_size, k)

    def _apply_bytes(self, k: int, itemsize: int) -> int:
        r = self.sketch_size
        lanes, direct = self._lanes(k)
        acc = 8 * r * k * (1 if direct else lanes)
        out = 0 if (direct and itemsize == 8) else itemsize * r * k
        tiles = numba.get_num_threads() * 8 * cpu._GAUSS_COLS * (min(r, cpu._GAUSS_ROWS) + k)
        return acc + out + tiles

    def _adjoint_bytes(self, k: int, itemsize: int) -> int:
        tiles = numba.get_num_threads() * 8 * cpu._GAUSS_COLS * (min(self.sketch_size, cpu._GAUSS_ROWS) + k)
        return itemsize * self.input_dim * k + 8 * self.sketch_size * k + tiles

    def _finish(self, acc, lanes, direct, k, dtype):
        r = self.sketch_size
        scale = 1.0 / math.sqrt(r)
        if direct:  # one lane, accumulated in the output itself (stored (k, r): returned transposed)
            out = acc.reshape(k, r).T
            out *= scale
            return out if dtype == np.float64 else out.astype(dtype)
        out = np.empty((r, k), dtype=dtype)
        cpu.reduce_lanes(acc, lanes, k, r, scale, out)
        return out

    def _apply_numpy(self, A):
        k = A.shape[1]
        lanes, direct = self._lanes(k)
        acc = np.zeros(lanes * k * self.sketch_size)
        cpu.gaussian_apply_dense(
            self.key[0], self.key[1], self.sketch_size, STREAM_GAUSS, A, acc, lanes, ZIG_X
        )
        return self._finish(acc, lanes, direct, k, A.dtype)

    def _apply_sparse(self, A):
        A = canonical_csr(A)
        n, k = A.shape
        lanes, direct = self._lanes(k)
        acc = np.zeros(lanes * k * self.sketch_size)
        cpu.gaussian_apply_csr(
            self.key[0],
            self.key[1],
            self.sketch_size,
            STREAM_GAUSS,
            A.indptr,
            A.indices,
            A.data,
            n,
            k,
            acc,
            lanes,
            ZIG_X,
        )
        return self._finish(acc, lanes, direct, k, A.dtype)

    def _adjoint_numpy(self, Z):
        Zt = np.ascontiguousarray(Z.T, dtype=np.float64).reshape(-1)
        out = np.empty((self.input_dim, Z.shape[1]), dtype=Z.dtype)
        scale = 1.0 / math.sqrt(self.sketch_size)
        cpu.gaussian_adjoint(self.key[0], self.key[1], self.sketch_size, STREAM_GAUSS, Zt, out, scale, ZIG_X)
        return out


# Private accumulators of S @ A: at most 64 lanes of >= 2048 columns of S each, together at most
# ACCUMULATOR_BYTES. Both numbers are constants, so the lanes (and the result's bits) depend on the
# shape (n, r, k) alone, never on the thread count or the memory free.
_MAX_LANES = 64
_LANE_COLUMNS = 2048


def gaussian_lanes(n: int, r: int, k: int) -> tuple[int, bool]:
    """Lanes of a Gaussian ``S @ A`` of shape ``(r, n) @ (n, k)``, and whether the output is the accumulator.

    Each lane sums its contiguous range of columns of ``S`` in ascending order into a private
    ``k x r`` accumulator; the lanes are then added in order. When even one accumulator would exceed
    :data:`ACCUMULATOR_BYTES` there is one lane, accumulated in the output's own memory.

    Examples
    --------
    >>> gaussian_lanes(200_000, 1000, 10)
    (64, False)
    >>> gaussian_lanes(1000, 1000, 10)
    (1, False)
    >>> gaussian_lanes(100, 10**7, 4)
    (1, True)
    """
    by_n = min(_MAX_LANES, max(1, n // _LANE_COLUMNS))
    fit = ACCUMULATOR_BYTES // (8 * r * k)
    if fit < 1:
        return 1, True
    lanes = min(by_n, fit)
    return lanes, lanes == 1 and k == 1
