"""Gaussian projection: i.i.d. N(0, 1/r) entries, generated in column blocks."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

from rsketch._random import STREAM_GAUSS, ZIG_X, ziggurat_columns
from rsketch._validation import one_blas_thread
from rsketch.kernels import cpu
from rsketch.operators.base import SketchOperator


class GaussianSketch(SketchOperator):
    """Dense Gaussian sketch: ``S[i, j] ~ N(0, 1/r)`` independently.

    Column ``j`` is a pure function of the key and ``j``: its entries are the first ``r``
    accepted attempts of a 128-layer ziggurat (Marsaglia & Tsang 2000) fed by the Philox
    counters ``(j, q, STREAM_GAUSS)``, ``q = 0, 1, ...`` (see :mod:`rsketch._random`). ``S @ A``
    generates ``S`` in column blocks (bounded memory, about 8 MB) with a compiled kernel,
    parallel over columns, and multiplies each block with BLAS, so it never holds ``S`` whole.

    Cost: ``O(r n k)`` flops and ``r n`` normals per product; memory ``O(r k)`` plus one block.
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
        if (
            out.shape != (self.input_dim, self.sketch_size)
            or out.dtype != np.float64
            or not out.flags.c_contiguous
        ):
            raise ValueError(
                f"out must be a C-contiguous float64 array of shape {(self.input_dim, self.sketch_size)}, "
                f"got {out.dtype} {out.shape}"
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

    def _apply_numpy(self, A):
        n, r, k = self.input_dim, self.sketch_size, A.shape[1]
        bs = self._block_size()
        starts = list(range(0, n, bs))
        n_workers = max(1, min(numba.get_num_threads(), len(starts)))

        def work(w):
            # Worker w takes blocks w, w + n_workers, ...: generation (numba, no GIL) then a
            # one-thread BLAS product, accumulated privately.
            acc = np.zeros((r, k), dtype=A.dtype)
            G = np.empty((bs, r), dtype=A.dtype)
            for a in starts[w::n_workers]:
                b = min(n, a + bs)
                cpu.gaussian_columns_serial(
                    self.key[0], self.key[1], a, b, r, STREAM_GAUSS, G[: b - a], ZIG_X
                )
                acc += G[: b - a].T @ A[a:b]
            return acc

        if len(starts) == 1:  # one block: nothing to overlap, skip the pool set-up
            parts = [work(0)]
        else:
            with one_blas_thread(), ThreadPoolExecutor(n_workers) as pool:
                parts = list(pool.map(work, range(n_workers)))
        out = parts[0]
        for part in parts[1:]:
            out += part
        out *= A.dtype.type(1.0 / math.sqrt(r))
        return out
