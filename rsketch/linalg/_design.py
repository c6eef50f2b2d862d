"""The design matrix as the iterations see it: products with ``X`` by the cheapest route per format.

A C-contiguous dense ``X`` (float64) goes through the one-pass numba kernels of
:mod:`rsketch.kernels.cpu` (one streaming read of ``X`` per iteration); other dense layouts
use two BLAS products (two reads); sparse ``X`` uses SciPy's CSR/CSC products (``O(nnz)``).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from rsketch.kernels import cpu
from rsketch.linalg._backward_error import two_sum

# Right-hand sides up to this many go through the fused kernels; beyond it, blocked BLAS-3
# (a few thousand rows at a time, so the second read of each block hits cache).
_FUSED_MAX_K = 4
_BLOCK_ROWS = 4096


class Design:
    """Wrap ``X`` (validated, float64) with the three products the solvers need."""

    def __init__(self, X):
        self.X = X
        self.shape = X.shape
        self.sparse = sp.issparse(X)
        self.fused = (not self.sparse) and X.flags.c_contiguous
        self._chunks = cpu.n_chunks(X.shape[0])
        self._first = None

    def matmul(self, B):
        """``X @ B`` for ``B`` of shape ``(p, k)``."""
        return np.asarray(self.X @ B)

    def gram(self, V):
        """``(X.T @ X @ V, ||X @ V||**2 per column)``; ``V`` of shape ``(p, k)``."""
        X = self.X
        k = V.shape[1]
        if self.fused and k <= _FUSED_MAX_K:
            return cpu.gram_apply(X, np.ascontiguousarray(V), self._chunks)
        if self.fused:
            out = np.zeros((X.shape[1], k))
            nrm = np.zeros(k)
            for a in range(0, X.shape[0], _BLOCK_ROWS):
                Xb = X[a : a + _BLOCK_ROWS]
                T = Xb @ V
                nrm += np.einsum("ij,ij->j", T, T)
                out += Xb.T @ T
            return out, nrm
        T = np.asarray(X @ V)
        return np.asarray(X.T @ T), np.einsum("ij,ij->j", T, T)

    def gram_matrix(self, Y=None, B=None):
        """``X.T @ X`` (dense ``X``): our one-pass kernel for C-ordered ``X``, else BLAS.

        Given ``Y`` and ``B``, the kernel's pass also sums the plain gradient at ``B`` (kept for
        :meth:`first_gradient`): the first step of a Gram-solved refinement then needs no pass of its own.
        """
        X = self.X
        if not self.fused:
            return np.asarray(X.T @ X)
        if Y is None:
            return cpu.gram_matrix(X, self._chunks)
        G, gradient = cpu.gram_matrix(X, self._chunks, Y, B)
        self._first = (Y, B, gradient)
        return G

    def first_gradient(self, Y, B):
        """The fast ``residual_gradient(Y, B)`` if :meth:`gram_matrix` summed it for ``Y``, ``B``, or None."""
        if self._first is None or self._first[0] is not Y or self._first[1] is not B:
            return None
        return self._first[2]

    def residual_gradient(self, Y, B, accuracy="exact"):
        """``(X.T @ (Y - X @ B), ||Y - X @ B||**2 per column)``; ``Y`` ``(n, k)``, ``B`` ``(p, k)``.

        ``accuracy`` as for :func:`rsketch.kernels.cpu.residual_gradient`. The careful modes run
        the one-pass kernel on every layout: other layouts go through it in C-ordered blocks of
        rows, whose partial gradients are summed in double-double.
        """
        X = self.X
        k = B.shape[1]
        B = np.ascontiguousarray(B)
        if self.fused and (k <= _FUSED_MAX_K or accuracy != "fast"):
            return cpu.residual_gradient(X, Y, B, self._chunks, accuracy)
        if accuracy != "fast":
            return self._blocked_careful_gradient(Y, B, accuracy)
        if self.fused:
            out = np.zeros((X.shape[1], k))
            nrm = np.zeros(k)
            for a in range(0, X.shape[0], _BLOCK_ROWS):
                Xb = X[a : a + _BLOCK_ROWS]
                T = Y[a : a + _BLOCK_ROWS] - Xb @ B
                nrm += np.einsum("ij,ij->j", T, T)
                out += Xb.T @ T
            return out, nrm
        T = Y - np.asarray(X @ B)
        return np.asarray(X.T @ T), np.einsum("ij,ij->j", T, T)

    def _blocked_careful_gradient(self, Y, B, accuracy):
        X = self.X

        def rows_of(a, b):
            Xb = X[a:b].toarray() if self.sparse else X[a:b]
            return np.ascontiguousarray(Xb), np.ascontiguousarray(Y[a:b])

        return careful_gradient_in_blocks(rows_of, X.shape[0], X.shape[1], B, accuracy)


def careful_gradient_in_blocks(rows_of, n, p, B, accuracy):
    """:func:`rsketch.kernels.cpu.residual_gradient` of an ``X`` the kernel cannot read in one piece (not
    C-ordered, sparse, or on a device), in row blocks of at most 32 MB: ``rows_of(a, b)`` returns the
    host, C-ordered ``(X[a:b], Y[a:b])``. The blocks' partial gradients cancel: their sum is kept exact
    (double-double)."""
    rows = max(1, min(_BLOCK_ROWS, (1 << 22) // max(1, p)))
    hi = np.zeros((p, B.shape[1]))
    lo = np.zeros_like(hi)
    nrm = np.zeros(B.shape[1])
    for a in range(0, n, rows):
        Xb, Yb = rows_of(a, min(n, a + rows))
        part, part_nrm = cpu.residual_gradient(Xb, Yb, B, 1, accuracy)
        hi, err = two_sum(hi, part)
        lo += err
        nrm += part_nrm
    return hi + lo, nrm
