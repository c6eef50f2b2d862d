"""The solvers' passes over an ``X`` of another array library (CuPy on a GPU): :class:`ArrayDesign`.

:func:`rsketch.lstsq` runs unchanged on such input, as it does on Dask's: ``X`` and ``y`` stay where
they are, every pass over them (the sketch ``S X``, a CG product, a residual and gradient, ``X.T X``)
runs in their library (cuBLAS GEMMs on a GPU), and only its small ``p x k`` result comes to the host,
where the ``p``-sized work is done: the SVD of the ``p x p`` triangle of the sketch's QR (the QR itself
runs on the device), the preconditioner, the backward-error estimate. The answer goes back to the
input's device.

The careful gradients that judge a refinement step (``accuracy="exact"`` and ``"compensated"``, see
:func:`rsketch.kernels.cpu.residual_gradient`) run on a GPU in the CUDA twin of the CPU kernel
(:func:`rsketch.kernels.cuda.kernels.residual_gradient`, the CPU's bits for the same chunks); for a
host library without kernels of ours (``array_api_strict``, PyTorch on the CPU) they run in the CPU
kernel, on row blocks shared through DLPack.
"""

from __future__ import annotations

import array_api_compat
import numpy as np

from rsketch._backend import array_library, check_same_library, like, to_host
from rsketch._validation import check_finite
from rsketch.linalg._design import Design, careful_gradient_in_blocks
from rsketch.operators.sampling import leverage_rank

# Chunks of the device's careful gradient (one thread per chunk and right-hand side): enough threads
# to fill a GPU's memory pipes, and partial sums of at most 64 MB.
_DEVICE_CHUNKS = 1 << 14
_DEVICE_PARTIAL_ENTRIES = 1 << 22


def checked_float64(a, name):
    """``a`` (an array of another library) as float64 in its library, checked real and finite there.

    Examples
    --------
    >>> import array_api_strict as xps
    >>> checked_float64(xps.asarray([1, 2]), "y").dtype == xps.float64
    True
    """
    xp = array_api_compat.array_namespace(a)
    if not (xp.isdtype(a.dtype, "real floating") or xp.isdtype(a.dtype, "integral")):
        raise TypeError(f"{name} must be a numeric (real) array; got dtype {a.dtype}")
    a = xp.astype(a, xp.float64) if a.dtype != xp.float64 else a
    check_finite(a, name)  # one reduction in a's library: nothing is copied to the host
    return a


def validate_array_problem(X, y):
    """Check a least-squares problem whose ``X`` is an array of another library: ``(X, Y, is_vector)``.

    ``X`` becomes a float64 ``(n, p)`` array and ``Y`` a float64 ``(n, k)`` array of that library, on
    its device; both are checked finite there (one reduction each). Mixing a CuPy array with a NumPy
    one is a ``TypeError`` naming both.

    Examples
    --------
    >>> import array_api_strict as xps
    >>> X, Y, vec = validate_array_problem(xps.ones((5, 2)), xps.ones(5))
    >>> X.dtype == xps.float64, Y.shape, vec
    (True, (5, 1), True)
    """
    check_same_library(X=X, y=y)
    xp = array_api_compat.array_namespace(X)
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D (n samples x p features), got shape {X.shape}")
    n, p = X.shape
    if n < p:
        raise ValueError(
            f"X must have at least as many rows as columns (n >= p) for an overdetermined "
            f"least-squares problem; got shape {X.shape}"
        )
    if n == 0 or p == 0:
        raise ValueError(f"X is empty (shape {X.shape}); expected at least one row and column")
    if not array_api_compat.is_array_api_obj(y) or array_api_compat.array_namespace(y) is not xp:
        raise TypeError(
            f"y must be an array of X's library ({xp.__name__}), on X's device; got {type(y).__name__}"
        )
    if y.ndim not in (1, 2) or y.shape[0] != n:
        raise ValueError(f"y must have shape ({n},) or ({n}, k) to match X of shape {X.shape}; got {y.shape}")
    X = checked_float64(X, "X")
    Y = checked_float64(y, "y")
    is_vector = y.ndim == 1
    return X, xp.reshape(Y, (n, -1)), is_vector


def leverage_scores(X) -> np.ndarray:
    """Exact leverage scores (host) of an ``X`` of another library: its thin SVD on its device (cuSOLVER),
    the squared row norms of ``U``'s first ``rank`` columns
    (:func:`rsketch.operators.sampling.leverage_rank`, the CPU's rule).

    Examples
    --------
    >>> import numpy as np, array_api_strict as xps
    >>> leverage_scores(xps.asarray(np.eye(3)[:, :2])).tolist()
    [1.0, 1.0, 0.0]
    """
    xp = array_api_compat.array_namespace(X)
    U, s, _ = xp.linalg.svd(X, full_matrices=False)
    rank = leverage_rank(to_host(s), X.shape)  # the host's exact rule (float32's cut real columns)
    return to_host(xp.sum(U[:, :rank] ** 2, axis=1))


def device_chunks(n: int, p: int, k: int) -> int:
    """Row chunks of the device's careful gradient: a function of the shape only (reproducible).

    Examples
    --------
    >>> device_chunks(4_000_000, 100, 1), device_chunks(10, 3, 1)
    (16384, 10)
    """
    return max(1, min(n, _DEVICE_CHUNKS, _DEVICE_PARTIAL_ENTRIES // max(1, p * k)))


class ArrayDesign:
    """:class:`rsketch.linalg._design.Design`'s products for an ``X`` of another array library.

    Each product is one pass over ``X`` in its library; what comes back is a NumPy array of ``p`` rows.
    ``Y`` arguments are arrays of ``X``'s library; ``B`` and ``V`` are host arrays.

    Examples
    --------
    >>> import numpy as np, array_api_strict as xps
    >>> A = np.random.default_rng(0).standard_normal((50, 3))
    >>> d = ArrayDesign(xps.asarray(A))
    >>> g, nrm = d.residual_gradient(xps.ones((50, 1)), np.zeros((3, 1)), accuracy="exact")
    >>> bool(np.allclose(g, A.sum(axis=0)[:, None])), nrm.tolist()
    (True, [50.0])
    """

    sparse = False

    def __init__(self, X):
        self.X = X
        self.xp = array_api_compat.array_namespace(X)
        self.shape = tuple(X.shape)
        self._first = None
        self._x_rows = None  # X in C order for the device's gradient kernel, made at its first call

    def _to_device(self, B):
        return like(np.ascontiguousarray(B, dtype=np.float64), self.X)

    def matmul(self, B):
        """``X @ B`` for a host ``B`` of shape ``(p, k)``: an array of ``X``'s library."""
        return self.X @ self._to_device(B)

    def gram(self, V):
        """``(X.T @ X @ V, ||X @ V||**2 per column)`` (host); ``V`` of shape ``(p, k)``."""
        return self._xt_and_norms(self.matmul(V))

    def _xt_and_norms(self, T):
        """``(X.T @ T, ||T||**2 per column)`` on the host."""
        xp = self.xp
        return to_host(xp.matrix_transpose(self.X) @ T), to_host(xp.sum(T * T, axis=0))

    def gram_matrix(self, Y=None, B=None):
        """``X.T @ X`` (host); given ``Y`` and ``B``, also the plain gradient at ``B`` (kept for
        :meth:`first_gradient`)."""
        G = to_host(self.xp.matrix_transpose(self.X) @ self.X)
        if Y is not None:
            self._first = (Y, B, self.residual_gradient(Y, B, accuracy="fast"))
        return G

    first_gradient = Design.first_gradient  # the gradient gram_matrix computed for Y, B, or None

    def residual_gradient(self, Y, B, accuracy="exact"):
        """``(X.T @ (Y - X @ B), ||Y - X @ B||**2 per column)`` on the host; ``accuracy`` as for
        :meth:`rsketch.linalg._design.Design.residual_gradient`."""
        if accuracy == "fast":
            return self._xt_and_norms(Y - self.matmul(B))
        if array_library(self.X) == "cupy":
            from rsketch.kernels.cuda import kernels as device_kernels

            n, p = self.shape
            cupy = device_kernels.array_module(self.X)
            if self._x_rows is None:  # once: each refinement step had copied a Fortran-ordered X anew
                self._x_rows = cupy.ascontiguousarray(self.X)
            Y = cupy.ascontiguousarray(Y)
            g, nrm = device_kernels.residual_gradient(
                self._x_rows, Y, B, device_chunks(n, p, Y.shape[1]), accuracy
            )
            return to_host(g), to_host(nrm)

        # A host library: its row blocks, shared through DLPack, through the CPU kernel.
        def rows_of(a, b):
            return np.ascontiguousarray(to_host(self.X[a:b, :])), np.ascontiguousarray(to_host(Y[a:b, :]))

        B = np.ascontiguousarray(B, dtype=np.float64)
        return careful_gradient_in_blocks(rows_of, self.shape[0], self.shape[1], B, accuracy)
