"""The solvers' passes over a Dask ``X``: :class:`DaskDesign`, one map-reduce over row chunks per pass.

:func:`rsketch.lstsq` runs unchanged on Dask input: the problem check keeps ``X`` lazy (``y``, an
``n x k`` array, is brought to the client), ``S @ X`` is computed chunk by chunk
(:mod:`rsketch.dask._sketch`), and every later pass (the residual and gradient of a refinement
step, a CG iteration, ``X.T X``) is a task per row chunk whose small ``p x k`` partial comes back
to the client, where the partials are added in chunk order: the careful gradients in double-double,
as :class:`rsketch.linalg._design.Design` adds its row blocks. The ``p``-sized work stays on the
client. Dask runs the tasks with the scheduler in effect (threads, or a ``distributed.Client``).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from rsketch._validation import check_allocation, check_finite
from rsketch.dask._sketch import (
    CHUNK_PRODUCTS,
    SPLIT_EVERY,
    check_dask_operand,
    is_dask_array,
    row_offsets,
    tree_sum,
)
from rsketch.kernels import cpu
from rsketch.linalg._backward_error import two_sum


def validate_dask_problem(X, y):
    """Check a least-squares problem with a Dask ``X`` or ``y``: ``(X, Y, is_vector)``.

    ``X`` stays a lazy float64 Dask array (its column chunks merged into one; no data is read:
    NaN or inf is found, and reported, while it is computed); ``Y`` is brought to the client as a
    C-contiguous float64 ``(n, k)`` array and checked. Chunk sizes must be known.

    Examples
    --------
    >>> import numpy as np, dask.array as da
    >>> X, Y, vec = validate_dask_problem(da.ones((100, 3), chunks=(30, 2)), np.ones(100))
    >>> X.chunks[1], Y.shape, vec
    ((3,), (100, 1), True)
    """
    import dask.array as da

    if not is_dask_array(X):
        if sp.issparse(X):  # np.asarray of it is a 0-d object array ("X must be 2-D ... shape ()")
            raise TypeError(
                "X is a SciPy sparse matrix and y a Dask array: pass y as a NumPy array (y.compute()) "
                "for a sparse X, or X as a Dask array"
            )
        X = da.from_array(np.asarray(X))
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D (n samples x p features), got shape {X.shape}")
    X, _ = check_dask_operand(X, None, "X")
    n, p = X.shape
    if n < p:
        raise ValueError(
            f"X must have at least as many rows as columns (n >= p) for an overdetermined "
            f"least-squares problem; got shape {X.shape}"
        )
    if is_dask_array(y):
        check_dask_operand(y, n, "y")
        y = y.compute()
    y = np.asarray(y)
    if y.ndim not in (1, 2) or y.shape[0] != n:
        raise ValueError(f"y must have shape ({n},) or ({n}, k) to match X of shape {X.shape}; got {y.shape}")
    if y.dtype.kind not in "iubf":
        raise TypeError(f"y must be a numeric (real) array; got dtype {y.dtype}")
    is_vector = y.ndim == 1
    if y.size == 0:  # (n, 0): the Gram kernel met it with a bare unpacking error
        raise ValueError(f"y is empty: it has shape {y.shape}")
    Y = np.ascontiguousarray(y.reshape(n, -1), dtype=np.float64)
    check_finite(Y, "y")
    return X.astype(np.float64).rechunk({1: -1}), Y, is_vector


def _finite(Xb, *outputs):
    # A chunk's outputs are small: scan the chunk itself only when they are not finite, so that NaN/inf
    # in X is reported as in memory (the sketch may not have read this chunk: sampling reads few).
    if not all(np.isfinite(out).all() for out in outputs):
        check_finite(Xb, "X")
    return outputs


def _gradient_part(Xb, Yb, B, accuracy):
    Xb = np.ascontiguousarray(Xb, dtype=np.float64)
    g, nrm = cpu.residual_gradient(Xb, np.ascontiguousarray(Yb), B, cpu.n_chunks(Xb.shape[0]), accuracy)
    return _finite(Xb, g, nrm)


def _gram_part(Xb, V):
    T = Xb @ V
    return _finite(Xb, Xb.T @ T, np.einsum("ij,ij->j", T, T))


# The Gram partials through cpu.gram_matrix, as the fused first pass of the other sketches: its sums
# depend on the rows only, not on the BLAS threads a worker has (a distributed nanny gives one). A probe
# saw the uniform and leverage sketches' lstsq differ in the last bits between a process cluster and
# threads with BLAS here; not reproduced at 20,000 x 30 (2026-12-07), bitwise either way there.
def _gram_matrix_part(Xb):
    Xb = np.ascontiguousarray(Xb, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        return _finite(Xb, cpu.gram_matrix(Xb, cpu.n_chunks(Xb.shape[0])))[0]


def _normal_part(Xb, Yb):
    Xb, Yb = np.ascontiguousarray(Xb, dtype=np.float64), np.ascontiguousarray(Yb, dtype=np.float64)
    # As _first_pass_part: a finite X near the range overflows here (X of 1e250 warned), and the solver
    # rescales it and computes the normal equations again, as in memory, where no such warning came
    with np.errstate(invalid="ignore", over="ignore"):
        G, (XtY, _) = cpu.gram_matrix(Xb, cpu.n_chunks(Xb.shape[0]), Yb, np.zeros((Xb.shape[1], Yb.shape[1])))
        return _finite(Xb, G, XtY)


def _first_pass_part(Xb, Yb, S, a):
    """``[[S[:, a:b] Xb, 0], [Xb.T Xb, Xb.T Yb]]`` as one ``(1, r + p, p + k)`` partial (one read)."""
    Xb = np.ascontiguousarray(Xb, dtype=np.float64)
    r, (m, p), k = S.sketch_size, Xb.shape, Yb.shape[1]
    out = np.zeros((1, r + p, p + k))
    with np.errstate(invalid="ignore", over="ignore"):
        out[0, :r, :p] = CHUNK_PRODUCTS[S.kind](S, a, Xb)
        G, (XtY, _) = cpu.gram_matrix(Xb, cpu.n_chunks(m), Yb, np.zeros((p, k)))
    out[0, r:, :p], out[0, r:, p:] = G, XtY
    return _finite(Xb, out)[0]


def _product_part(Xb, B):
    return _finite(Xb, Xb @ B)[0]


class DaskDesign:
    """:class:`rsketch.linalg._design.Design`'s products for a Dask ``X``, each one pass over its chunks.

    ``passes`` counts the passes made. ``Y`` arguments are client arrays; each one is sent to the
    workers once, in ``X``'s row chunks, and kept there while it is in use.

    Examples
    --------
    >>> import numpy as np, dask.array as da
    >>> A = np.random.default_rng(0).standard_normal((1000, 3))
    >>> d = DaskDesign(da.from_array(A, chunks=(300, 3)))
    >>> Y, B = np.ones((1000, 1)), np.zeros((3, 1))
    >>> g, nrm = d.residual_gradient(Y, B, accuracy="exact")
    >>> bool(np.allclose(g, A.T @ Y)), float(nrm[0]), d.passes
    (True, 1000.0, 1)
    """

    sparse = False

    def __init__(self, X):
        self.X = X
        self.shape = X.shape
        self.passes = 0
        self._y = (None, None)
        self._normal = None

    def _blocks(self):
        return self.X.to_delayed().ravel()

    def _y_blocks(self, Y):
        import dask.array as da

        if self._y[0] is not Y:
            Yd = da.from_array(Y, chunks=(self.X.chunks[0], (Y.shape[1],))).persist()
            self._y = (Y, Yd)
        return self._y[1].to_delayed().ravel()

    def _run(self, func, *per_chunk, args=()):
        import dask

        task = dask.delayed(func, pure=True)
        self.passes += 1
        return dask.compute(*[task(*blocks, *args) for blocks in zip(*per_chunk, strict=True)])

    def matmul(self, B):
        """``X @ B`` for ``B`` of shape ``(p, k)``, brought to the client."""
        self.passes += 1
        k = B.shape[1]
        out = self.X.map_blocks(_product_part, B, chunks=(self.X.chunks[0], (k,)), dtype=np.float64)
        return np.asarray(out.compute())

    def gram(self, V):
        """``(X.T @ X @ V, ||X @ V||**2 per column)``; ``V`` of shape ``(p, k)``."""
        parts = self._run(_gram_part, self._blocks(), args=(np.ascontiguousarray(V),))
        return sum(p[0] for p in parts), sum(p[1] for p in parts)

    def sketch_with_normal_equations(self, S, Y):
        """``S @ X`` and, in the same pass (one task per chunk, read once), ``X.T X`` and ``X.T Y``.

        Over a store whose reads cost more than the arithmetic (Zarr, ``.npy`` on disk), the Gram solves
        of :func:`rsketch.linalg._precondition.refine` then need no pass of their own, and its first
        gradient comes from them (:meth:`first_gradient`). Each chunk's task returns its partials of
        all three stacked in one array, added in the tree of :func:`rsketch.dask._sketch.sketch_dask`
        (so ``S X`` is bitwise ``S @ X``); sampling sketches, which read only some chunks, run apart.
        """
        import dask
        import dask.array as da

        self.passes += 1
        try:
            if S.kind not in CHUNK_PRODUCTS:
                normal = dask.delayed(_normal_part, pure=True)
                parts = [normal(Xb, Yb) for Xb, Yb in zip(self._blocks(), self._y_blocks(Y), strict=True)]
                SX, parts = dask.compute(S @ self.X, parts)
                with np.errstate(invalid="ignore", over="ignore"):  # overflow: as in _normal_part
                    G, XtY = sum(part[0] for part in parts), sum(part[1] for part in parts)
            else:
                (r, p), k = (S.sketch_size, self.shape[1]), Y.shape[1]
                check_allocation(  # as sketch_dask: sketch_size=2**40 had met "Unable to allocate 24 TiB"
                    8 * (r + p) * (p + k) * (SPLIT_EVERY + 2),
                    f"the first pass over a Dask X ({self.shape[0]} x {p}) with sketch_size={r}: partials of "
                    f"S X, X.T X and X.T y, ({r} + {p}) x ({p} + {k}) each, and their tree's sums",
                    "use a smaller sketch_size",
                )
                task = dask.delayed(_first_pass_part, pure=True)
                parts = [
                    da.from_delayed(task(Xb, Yb, S, a), shape=(1, r + p, p + k), dtype=np.float64)
                    for Xb, Yb, (a, _) in zip(
                        self._blocks(), self._y_blocks(Y), row_offsets(self.X.chunks[0]), strict=True
                    )
                ]
                total = tree_sum(da.concatenate(parts)).compute()
                SX, G, XtY = total[:r, :p], total[r:, :p], total[r:, p:]
        except ValueError as exc:  # the sketch's check names its operand A; here it is X
            if "NaN or infinite" not in str(exc):
                raise
            raise ValueError("X contains NaN or infinite values") from exc
        with np.errstate(invalid="ignore", over="ignore"):
            self._normal = ((G + G.T) / 2, XtY, Y)
        return np.asarray(SX)

    def first_gradient(self, Y, B):
        """``X.T (Y - X B)`` and ``||Y - X B||**2`` from the normal equations the sketch's pass summed.

        Accurate to the Gram's rounding, which is all the first step of a refinement needs: it only
        starts the refinement (its gradient is plain sums anyway), and the next step's pass corrects
        it. The residual norm only chooses the next pass's accuracy (exact below
        ``32 ||y|| / sqrt(n)``), and its cancellation leaves it good to about ``sqrt(u) ||y||``, far
        finer than that threshold. None when :meth:`sketch_with_normal_equations` did not run for ``Y``.
        """
        if self._normal is None or self._normal[2] is not Y:
            return None
        G, XtY = self._normal[:2]
        GB = G @ B
        rn2 = np.einsum("ij,ij->j", Y, Y) - 2 * np.einsum("ij,ij->j", B, XtY) + np.einsum("ij,ij->j", B, GB)
        return XtY - GB, np.maximum(rn2, 0.0)

    def gram_matrix(self, Y=None, B=None):
        """``X.T @ X``, summed over the row chunks in order (from the sketch's pass when it gave it).

        ``Y`` and ``B`` are the in-memory design's signature; here the first gradient comes from the
        sketch's pass (:meth:`first_gradient`).
        """
        if self._normal is not None:
            return self._normal[0]
        G = sum(self._run(_gram_matrix_part, self._blocks()))
        return (G + G.T) / 2

    def residual_gradient(self, Y, B, accuracy="exact"):
        """``(X.T @ (Y - X @ B), ||Y - X @ B||**2 per column)``, one pass.

        Each chunk runs the one-pass kernel at ``accuracy``; the careful modes add the chunks'
        partial gradients in double-double (they cancel), as ``Design`` adds its row blocks.
        """
        B = np.ascontiguousarray(B, dtype=np.float64)
        parts = self._run(_gradient_part, self._blocks(), self._y_blocks(Y), args=(B, accuracy))
        nrm = sum(p[1] for p in parts)
        if accuracy == "fast":
            return sum(p[0] for p in parts), nrm
        hi, lo = np.zeros_like(parts[0][0]), np.zeros_like(parts[0][0])
        for g, _ in parts:
            hi, err = two_sum(hi, g)
            lo += err
        return hi + lo, nrm
