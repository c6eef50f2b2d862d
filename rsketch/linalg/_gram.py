"""``F.T F`` for a centred, weighted dense design ``F = diag(sqrt(w)) (X - 1 c.T)``, as an operator.

Ridge regression on a wide design solves ``(F.T F + alpha I) coef = F.T y`` by Nyström-preconditioned
CG (:func:`rsketch.linalg.nystrom_pcg`), which touches ``F.T F`` only through products. Two of them
cost the time, and :class:`GramOperator` makes each one pass over ``X``:

- **CG's product** ``F.T (F v)``: in blocks of rows small enough to stay in cache, each block's
  ``X_b v`` and ``X_b.T t`` one after the other, so ``X`` is read from memory once, not twice
  (at ``10,000 x 10,000``: 0.032 s against 0.049 s for ``X.T @ (X @ v)``, docs/lowrank.md).
- **The Nyström sketch** ``F.T F S.T`` for a sparse sign ``S``: ``F S.T`` from ``S``'s pattern (each
  of ``X``'s entries times ``s`` signs, ``O(s n p)``), so only the second product is a GEMM
  (``O(n p l)``). With a dense test matrix both are, and the sketch costs twice as much.

Centring and weights stay inside the products (``F`` is never formed): ``F V = W^1/2 (X V - 1 c.T V)``.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import LinearOperator

from rsketch._backend import array_namespace, is_non_numpy_array, like, numpy_namespace, to_host
from rsketch._validation import check_finite as _check_finite
from rsketch.linalg._lowrank import _sparse_product
from rsketch.operators import SketchOperator, SparseSign

__all__ = ["GramOperator"]

#: Bytes of ``X`` per block of a fused product: the block's ``X_b v`` and ``X_b.T t`` read it from
#: cache (L3) the second time. Blocks of 64 to 256 rows at 10,000 columns were within 10%.
FUSED_BLOCK_BYTES = 8 << 20
#: Products with at most this many columns are fused; wider ones are two GEMMs (compute bound,
#: and a block's ``p x k`` partial sum would cost more traffic than it saves).
FUSED_MAX_COLUMNS = 8
#: Below this many columns a sketch is multiplied as a dense block: the sparse product costs
#: ``O(s n p)`` at any width (0.2 s at 10,000 x 10,000, with the transposed copies), where the two
#: GEMMs of 50 columns took 0.45 s.
SPARSE_MIN_COLUMNS = 32
#: Rows of ``X`` per transposed block of the sketch's sparse product (a C-ordered ``p x b`` copy,
#: whose rows our threaded CSR kernel scatters whole: 0.1 s a pass at 10,000 x 10,000, where
#: gathering them took 0.37 s), and bytes of the ``l x rows`` block of ``F S.T`` that one GEMM
#: turns into the sketch.
SKETCH_BLOCK_ROWS = 256
SKETCH_CHUNK_BYTES = 64 << 20


class GramOperator(LinearOperator):
    """``F.T F`` with ``F = diag(sqrt(sample_weight)) (X - 1 center.T)``: dense, sparse or on a device.

    A symmetric positive semi-definite ``(p, p)`` LinearOperator for :func:`rsketch.linalg.nystrom_pcg`
    (ridge regression: ``nystrom_pcg(G, G.transpose_weighted(y - y_mean), alpha)``); its products
    are NumPy arrays on the host. ``F`` is never formed. For a dense NumPy ``X`` a product with up
    to eight columns reads ``X`` once, in blocks of rows that stay in cache, and :meth:`sketch`
    applies a sparse sign test matrix in ``O(s n p)`` before the one GEMM. A SciPy sparse ``X``
    stays sparse, and an ``X`` of another array-API library (CuPy) stays on its device: there each
    product is two, in ``X``'s library.

    Parameters
    ----------
    X : array of shape (n, p), float32 or float64
        NumPy, SciPy sparse, or another array-API library's. Used as given, never copied (a NumPy
        ``X`` streams best C-ordered).
    center : ndarray of shape (p,), optional
        Subtracted from every row (the weighted column means, for a fit with an intercept).
    sample_weight : ndarray of shape (n,), optional
        Non-negative: row ``i`` counts ``sample_weight[i]`` times.
    check_finite : bool, default True
        Check that ``X``, ``center`` and ``sample_weight`` hold no NaN or infinity (one read of
        ``X``); a caller that has checked them (``SketchedRidge``) skips it.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> X, w = rng.standard_normal((50, 20)), rng.uniform(size=50)
    >>> c = (w @ X) / w.sum()
    >>> F = np.sqrt(w)[:, None] * (X - c)
    >>> G = GramOperator(X, center=c, sample_weight=w)
    >>> v = rng.standard_normal(20)
    >>> bool(np.allclose(G @ v, F.T @ (F @ v)))
    True
    >>> from rsketch import SparseSign
    >>> S = SparseSign(20, 5, seed=0)
    >>> bool(np.allclose(G.sketch(S), F.T @ F @ S.to_dense().T))
    True
    """

    def __init__(self, X, *, center=None, sample_weight=None, check_finite=True):
        X = _plain(X)
        dtype = _host_dtype(X)
        if dtype is None or X.ndim != 2:
            raise TypeError(
                "X must be a 2-D float32 or float64 array (NumPy, SciPy sparse or another array-API "
                f"library's), got {type(X).__name__} {getattr(X, 'dtype', '')} {getattr(X, 'shape', '')}"
            )
        n, p = X.shape
        if n == 0 or p == 0:
            raise ValueError(f"X must have at least one row and one column, got shape {X.shape}")
        self.X = X  # any layout: the blocks' products take strided rows (a copy would double X)
        self.center = None if center is None else _vector(center, p, "center", dtype)
        self.sample_weight = (
            None if sample_weight is None else _vector(sample_weight, n, "sample_weight", dtype)
        )
        if check_finite:
            for name, a in (("X", X), ("center", self.center), ("sample_weight", self.sample_weight)):
                if a is not None:
                    _check_finite(a, name)
        if self.sample_weight is not None and (self.sample_weight < 0).any():
            raise ValueError("sample_weight must be non-negative")
        # the vectors in X's library too, for the products of a device X (the host ones otherwise)
        self._center_x = None if self.center is None else like(self.center, X)
        self._weight_x = None if self.sample_weight is None else like(self.sample_weight, X)
        super().__init__(dtype, (p, p))

    def _adjoint(self):
        return self

    def _matvec(self, v):
        return self._matmat(np.reshape(v, (-1, 1))).reshape(-1)

    _rmatvec = _matvec

    def _matmat(self, V):
        V = np.asarray(V)
        if V.dtype.kind not in "biuf":  # a complex V was cast to its real part (zeros for 1j)
            raise TypeError(f"GramOperator multiplies real arrays, got dtype {V.dtype}")
        V = V.astype(self.dtype, copy=False)
        if V.shape[1] > FUSED_MAX_COLUMNS or not isinstance(self.X, np.ndarray):
            return to_host(self.transpose_weighted(self._centred_product(V)))
        X = self.X
        n, p = X.shape
        rows = max(16, FUSED_BLOCK_BYTES // (p * X.itemsize))
        out = np.zeros((p, V.shape[1]), dtype=self.dtype)
        part = np.empty_like(out)
        total = np.zeros(V.shape[1], dtype=self.dtype)
        shift = None if self.center is None else self.center @ V
        for a in range(0, n, rows):
            block = X[a : a + rows]
            t = block @ V
            if shift is not None:
                t -= shift
            if self.sample_weight is not None:
                t *= self.sample_weight[a : a + rows, None]
            np.matmul(block.T, t, out=part)
            out += part
            total += t.sum(axis=0)
        if shift is not None:
            out -= np.outer(self.center, total)
        return out

    _rmatmat = _matmat

    def _centred_product(self, V):
        """``(X - 1 c.T) V`` in ``X``'s library (a sparse ``X``: NumPy)."""
        V = like(V, self.X)
        t = self.X @ V
        return t if self.center is None else t - self._center_x @ V

    def transpose_weighted(self, T):
        """``(X - 1 center.T).T diag(sample_weight) T`` for ``T`` of shape ``(n,)`` or ``(n, k)``, in
        ``X``'s library (a sparse ``X``: NumPy). With ``T = y - y_mean`` it is the right-hand side of
        the ridge's normal equations, ``F.T W^1/2 (y - y_mean)``.

        Examples
        --------
        >>> import numpy as np
        >>> X, c = np.arange(6.0).reshape(3, 2), np.array([2.0, 3.0])
        >>> GramOperator(X, center=c, sample_weight=np.array([1.0, 0.0, 2.0])).transpose_weighted(
        ...     np.ones(3)).tolist()
        [2.0, 2.0]
        """
        xp = numpy_namespace() if sp.issparse(self.X) else array_namespace(self.X)
        vector = T.ndim == 1
        T = xp.reshape(T, (-1, 1)) if vector else T
        if self._weight_x is not None:
            T = T * self._weight_x[:, None]
        out = self.X.T @ T
        if self.center is not None:
            out = out - self._center_x[:, None] * xp.sum(T, axis=0)[None, :]
        return xp.reshape(out, (-1,)) if vector else out

    def sketch(self, S: SketchOperator) -> np.ndarray:
        """``F.T F S.T`` for a sketch ``S`` of shape ``(l, p)``: ``(p, l)``, in ``X``'s dtype.

        For a :class:`~rsketch.SparseSign` (or CountSketch), ``F S.T`` comes from ``S``'s pattern
        (``O(s n p)``, rows in blocks), then one GEMM per chunk of rows; any other sketch is
        materialised as a dense ``p x l`` block and multiplied (two GEMMs).
        """
        if not isinstance(S, SketchOperator) or S.input_dim != self.shape[0]:
            raise ValueError(f"S must be a SketchOperator with input_dim {self.shape[0]}, got {S!r}")
        if not isinstance(S, SparseSign) or not isinstance(self.X, np.ndarray):
            return self._matmat(np.asarray(S.to_dense().T, dtype=self.dtype))
        X = self.X
        n, p = X.shape
        l = S.sketch_size
        if l < SPARSE_MIN_COLUMNS:
            return self._matmat(np.asarray(S.to_dense().T, dtype=self.dtype))
        S_csc = sketch_matrix(S, self.dtype)
        shift = None if self.center is None else S_csc @ self.center
        chunk = (
            max(SKETCH_BLOCK_ROWS, SKETCH_CHUNK_BYTES // (l * X.itemsize))
            // SKETCH_BLOCK_ROWS
            * SKETCH_BLOCK_ROWS
        )
        out = np.zeros((l, p), dtype=self.dtype)  # (F.T F S.T).T, built as S F.T F
        for a in range(0, n, chunk):
            b = min(n, a + chunk)
            Zt = np.empty((l, b - a), dtype=self.dtype)  # (F_chunk S.T).T = S F_chunk.T
            for c in range(a, b, SKETCH_BLOCK_ROWS):
                d = min(b, c + SKETCH_BLOCK_ROWS)
                # a C-ordered copy of the block's transpose: the scatter kernel reads its rows whole
                Zt[:, c - a : d - a] = _sparse_product(S_csc, np.ascontiguousarray(X[c:d].T))
            if shift is not None:
                Zt -= shift[:, None]
            if self.sample_weight is not None:
                Zt *= self.sample_weight[None, a:b]
            out += Zt @ X[a:b]
            if shift is not None:
                out -= np.outer(Zt.sum(axis=1), self.center)
        return out.T


def sketch_matrix(S: SketchOperator, dtype):
    """``S`` as a matrix of shape ``(sketch_size, input_dim)`` in ``dtype``: a SciPy CSC matrix for a
    :class:`~rsketch.SparseSign` (or CountSketch, :meth:`~rsketch.SparseSign.sparse_columns`, ``O(s n)``
    memory), the dense form for any other sketch. Either way the entries are ``S.to_dense()``'s."""
    if not isinstance(S, SparseSign):
        return np.asarray(S.to_dense(), dtype=dtype)
    return S.sparse_columns(dtype=dtype)


def _plain(X):
    """``X`` as the products take it: an ``np.matrix`` as a plain array (a view; its ``@`` had given
    ``(1, p)`` results), a non-native byte order swapped and a sparse format other than CSR or CSC as
    CSR (copies: lil and dok met errors, and a DIA matrix's padding was checked for NaN)."""
    if sp.issparse(X):
        return X if X.format in ("csr", "csc") else X.tocsr()
    if isinstance(X, np.ndarray):
        X = np.asarray(X)
        if not X.dtype.isnative:
            X = X.astype(X.dtype.newbyteorder("="))
    return X


def _host_dtype(X):
    """float32 or float64 for a NumPy, SciPy sparse or other array-API ``X`` of that type; else None."""
    if isinstance(X, np.ndarray) or sp.issparse(X):
        return X.dtype if X.dtype in (np.float32, np.float64) else None
    if not is_non_numpy_array(X):
        return None
    xp = array_namespace(X)
    if X.dtype == xp.float64:
        return np.dtype(np.float64)
    return np.dtype(np.float32) if X.dtype == xp.float32 else None


def _vector(v, size, name, dtype):
    """A real vector of ``size`` entries in ``dtype`` (complex values are refused, not truncated)."""
    v = np.asarray(to_host(v))
    if v.dtype.kind not in "biuf":
        raise TypeError(f"{name} must be a real numeric array, got dtype {v.dtype}")
    if v.shape != (size,):
        raise ValueError(f"{name} must have shape ({size},), got {v.shape}")
    return v.astype(dtype, copy=False)
