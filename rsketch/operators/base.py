"""The sketch-operator base class: a small description whose entries are generated on demand.

An operator is ``(kind, shape, key, options)``. Its dense entries exist only when asked for,
one block of columns at a time (:meth:`SketchOperator.columns`); ``S @ A`` runs a fast kernel
where one exists for the input's backend and otherwise sums ``S[:, a:b] @ A[a:b]`` over blocks,
which is also the reference the kernels are tested against.

Scaling lives in the operator: every family is scaled so that ``E[S.T @ S] = I`` (RandBLAS
calls this the isometry scale); no caller ever rescales.
"""

from __future__ import annotations

import warnings

import array_api_compat
import numpy as np
import scipy.sparse as sp
from array_api_compat import device as array_device
from scipy.sparse.linalg import LinearOperator

from rsketch._backend import array_namespace, is_device_sparse, numpy_dtype, numpy_namespace
from rsketch._exact_scaling import with_columns_scaled
from rsketch._random import key_from_seed
from rsketch._validation import (
    MAX_INDEX,
    check_allocation,
    check_finite,
    check_float_dtype,
    check_int,
    check_operand,
)

# Entries per generated block in the block-summation paths: bounded memory (32 MB in float64).
_BLOCK_ENTRIES = 1 << 22
# The private accumulators of one S @ A together stay below this many bytes (the kernels take
# fewer of them when they would not fit, a choice made from the shape alone); see
# rsketch.operators.gaussian.gaussian_lanes and rsketch.operators.sparse.sparse_chunks.
ACCUMULATOR_BYTES = 256 * 2**20


class SketchOperator:
    """A random linear map ``S`` of shape ``(sketch_size, input_dim)`` with ``E[S.T @ S] = I``.

    Subclasses describe one distribution each. They implement ``_reference_columns`` (dense
    columns from the array-namespace Philox, the portable path) and may override
    ``_fast_columns``, ``_apply_numpy``, ``_apply_sparse`` and ``_adjoint_numpy`` with kernels.

    Parameters
    ----------
    input_dim : int
        The length ``n`` of the vectors ``S`` acts on: the number of rows of every ``A`` in
        ``S @ A``, and the number of columns of ``S`` (``S.shape[1]``).
    sketch_size : int
        Number of rows of ``S`` (``r`` in the papers).
    seed : None, int, numpy.random.SeedSequence, numpy.random.Generator or numpy.random.RandomState
        Source of the Philox key. The same int or SeedSequence gives the same operator in every
        process and on every machine.
    dtype : numpy.float32 or numpy.float64
        Dtype of materialised entries (:meth:`to_dense`, :meth:`columns`). ``S @ A`` computes in
        ``A``'s floating dtype.

    Examples
    --------
    >>> import numpy as np, rsketch
    >>> S = rsketch.GaussianSketch(1000, 50, seed=0)
    >>> A = np.ones((1000, 3))
    >>> (S @ A).shape
    (50, 3)
    >>> np.allclose(S @ A, S.to_dense() @ A)
    True
    """

    kind: str = "abstract"

    def __init__(self, input_dim, sketch_size, *, seed=None, dtype=np.float64):
        # Kernels index rows, columns and Philox counters with int64: larger sizes cannot be addressed.
        self.input_dim = check_int(input_dim, "input_dim", minimum=1, maximum=MAX_INDEX)
        self.sketch_size = check_int(sketch_size, "sketch_size", minimum=1, maximum=MAX_INDEX)
        if not self._allows_oversize and self.sketch_size > self.input_dim:
            raise ValueError(
                f"sketch_size must be <= input_dim for {type(self).__name__} (it selects distinct rows); "
                f"got sketch_size={self.sketch_size}, input_dim={self.input_dim}"
            )
        self.dtype = check_float_dtype(dtype)
        self.seed = seed
        self.key = key_from_seed(seed)

    # Whether sketch_size may exceed input_dim (projections and sampling with replacement may).
    _allows_oversize = True
    # Whether every entry of A reaches the output with a nonzero coefficient, so that a NaN/inf
    # in A always shows in S @ A: then the (full-pass) input scan is replaced by a scan of the
    # small output, and the input is scanned only when the output is not finite. Sampling
    # sketches read only some rows and must scan the input.
    _nonfinite_propagates = True

    # ----------------------------------------------------------------------------- description
    @property
    def n_rows(self) -> int:
        """Deprecated alias of :attr:`input_dim` (``S.shape[1]``, not the operator's row count)."""
        warnings.warn(
            "SketchOperator.n_rows is deprecated and will be removed: it is S.shape[1], the length of the "
            "vectors S acts on; use S.input_dim (and S.sketch_size for the operator's rows)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.input_dim

    @property
    def shape(self) -> tuple[int, int]:
        """``(sketch_size, input_dim)``."""
        return (self.sketch_size, self.input_dim)

    ndim = 2

    def _options(self) -> dict:
        return {}

    def __repr__(self) -> str:
        opts = "".join(f", {k}={v!r}" for k, v in self._options().items())
        return (
            f"{type(self).__name__}(input_dim={self.input_dim}, sketch_size={self.sketch_size}, "
            f"key=({self.key[0]:#010x}, {self.key[1]:#010x}){opts}, dtype={self.dtype.name})"
        )

    # ----------------------------------------------------------------------------- entries
    def columns(self, start: int, stop: int) -> np.ndarray:
        """Dense columns ``start:stop`` of ``S`` (shape ``(sketch_size, stop - start)``).

        Generated alone, without generating any other column.

        Examples
        --------
        >>> import rsketch
        >>> S = rsketch.CountSketch(100, 10, seed=1)
        >>> bool((S.columns(20, 30) == S.to_dense()[:, 20:30]).all())
        True
        """
        start, stop = self._check_range(start, stop)
        self._check_columns_memory(start, stop)
        return self._fast_columns(start, stop).astype(self.dtype, copy=False)

    def reference_columns(self, start: int, stop: int, xp=None):
        """Columns ``start:stop`` from the portable array-namespace path (NumPy by default)."""
        start, stop = self._check_range(start, stop)
        self._check_columns_memory(start, stop)
        xp = xp or numpy_namespace()
        return self._reference_columns(start, stop, xp)

    def to_dense(self) -> np.ndarray:
        """Materialise ``S`` as a dense ``(sketch_size, input_dim)`` array (for tests and small problems)."""
        return self.columns(0, self.input_dim)

    def __getitem__(self, index):
        if (
            isinstance(index, tuple)
            and len(index) == 2
            and isinstance(index[0], slice)  # (an array's == is elementwise: no truth value)
            and index[0] == slice(None)
            and isinstance(index[1], slice)
            and index[1].step in (None, 1)
        ):
            start, stop, _ = index[1].indices(self.input_dim)
            return self.columns(start, max(start, stop))
        raise IndexError("a sketch operator supports only column blocks S[:, a:b]")

    def _check_range(self, start, stop):
        start = check_int(start, "start", minimum=0, maximum=self.input_dim)
        stop = check_int(stop, "stop", minimum=start, maximum=self.input_dim)
        return start, stop

    def _check_columns_memory(self, start, stop):
        # A dense block plus one temporary of its size (the generators build it in float64).
        check_allocation(
            16 * self.sketch_size * (stop - start) + self._columns_bytes(),
            f"columns {start}:{stop} of a {type(self).__name__} with sketch_size={self.sketch_size} "
            f"(a dense {self.sketch_size} x {stop - start} block)",
            "ask for fewer columns at a time",
        )

    def _columns_bytes(self) -> int:
        # Memory a subclass needs for its O(r) state (selected or sampled rows) besides the block.
        return 0

    def _fast_columns(self, start, stop):
        return self._reference_columns(start, stop, numpy_namespace())

    def _reference_columns(self, start, stop, xp):  # pragma: no cover - abstract
        raise NotImplementedError

    def _block_size(self) -> int:
        return max(1, _BLOCK_ENTRIES // self.sketch_size)

    # ----------------------------------------------------------------------------- products
    #: NumPy's ``ndarray @ S`` returns NotImplemented instead of making ``S`` a 0-d object array,
    #: so that Python calls :meth:`__rmatmul__` (SciPy's sparse matrices defer already).
    __array_ufunc__ = None

    def __rmatmul__(self, A):
        """``A @ S`` (``A`` with ``sketch_size`` columns) as ``(S.T @ A.T).T``.

        Examples
        --------
        >>> import numpy as np, rsketch
        >>> S = rsketch.CountSketch(6, 3, seed=0)
        >>> A = np.arange(6.0).reshape(2, 3)
        >>> bool(np.array_equal(A @ S, (S.T @ A.T).T))
        True
        """
        A = _left_operand(A, self.sketch_size, "A @ S", "the sketch's sketch_size")
        return _transposed(self._adjoint(_transposed(A), name="A"))  # errors name the caller's A

    def __matmul__(self, A):
        _not_an_operator(A)
        if array_api_compat.is_dask_array(A):  # lazy, chunk by chunk at each chunk's row offset
            from rsketch.dask._sketch import sketch_dask

            return sketch_dask(self, A)
        if is_device_sparse(A):  # a cupyx.scipy.sparse matrix: on the GPU
            from rsketch.kernels.cuda import sketch_apply_sparse

            return sketch_apply_sparse(self, A)
        A, is_vector = check_operand(
            A,
            self.input_dim,
            "A",
            check_finite_values=not self._nonfinite_propagates,
            rows_label="the sketch's input_dim",
        )
        k, itemsize = A.shape[1], _itemsize(A.dtype)
        check_allocation(
            self._apply_bytes(k, itemsize) + self._operand_copy_bytes(A),
            f"{type(self).__name__} @ A with sketch_size={self.sketch_size}, input_dim={self.input_dim} "
            f"and {k} column(s) (the {self.sketch_size} x {k} output and the kernel's work arrays)",
            "use a smaller sketch_size or apply the sketch to fewer columns at a time",
        )
        out = self._apply(A)
        xo = array_namespace(out)
        if self._nonfinite_propagates and not bool(xo.all(xo.isfinite(out))):
            check_finite(A, "A")  # raises if A held NaN/inf; otherwise the sum overflowed (IEEE inf)
            # the sums overflowed on the way: again on A's columns scaled by powers of two, for a
            # device A too (its kernels sum unscaled as the CPU's do: 1e308 entries had given inf)
            out = with_columns_scaled(self._apply, A)
        return out[:, 0] if is_vector else out

    def _apply(self, A):
        """``S @ A`` of a checked ``A`` by the path its kind of array takes."""
        with np.errstate(invalid="ignore", over="ignore"):  # a non-finite output is checked after
            if sp.issparse(A):
                return self._apply_sparse(A)
            if isinstance(A, np.ndarray):
                return self._apply_numpy(A)
            if array_api_compat.is_cupy_array(A):  # on the GPU: the CUDA kernels
                from rsketch.kernels.cuda import sketch_apply

                return sketch_apply(self, A)
            return self._reference_apply(A)

    # Bytes that S @ A (k columns of the given itemsize) and S.T @ Z allocate: the output and the
    # kernels' work arrays. The defaults are those of the block-summation paths below.
    def _apply_bytes(self, k: int, itemsize: int) -> int:
        return itemsize * self.sketch_size * k * 2 + 16 * self.sketch_size * self._block_size()

    def _adjoint_bytes(self, k: int, itemsize: int) -> int:
        return itemsize * self.input_dim * k + 16 * self.sketch_size * self._block_size()

    def _operand_copy_bytes(self, A) -> int:
        """Bytes of a copy of ``A`` that the product makes (kernels that need a contiguous operand)."""
        return 0

    def reference_apply(self, A):
        """``S @ A`` as the sum over column blocks of ``S[:, a:b] @ A[a:b]`` (portable path).

        ``A`` is checked as for ``S @ A`` (integer input becomes float64, a vector gives a vector).

        Examples
        --------
        >>> import numpy as np, rsketch
        >>> S = rsketch.SparseSign(50, 8, seed=0)
        >>> A = np.arange(100).reshape(50, 2)
        >>> bool(np.allclose(S.reference_apply(A), S @ A, rtol=1e-12))
        True
        """
        A, is_vector = check_operand(A, self.input_dim, "A", rows_label="the sketch's input_dim")
        self._check_reference_memory(self.sketch_size, A)
        out = self._reference_apply(A)
        return out[:, 0] if is_vector else out

    def _check_reference_memory(self, rows, operand):
        """The portable products' output (``rows x k``, twice: the blocks' sums) and one dense block of
        columns, checked as the fast paths are (``sketch_size=2**40`` met numpy's "Unable to allocate
        8 TiB"; a Gaussian's ``reference_adjoint`` of ``2**40`` rows ran on until killed)."""
        k = operand.shape[1]
        check_allocation(
            2 * _itemsize(operand.dtype) * rows * k + 16 * self.sketch_size * self._block_size(),
            f"the portable {type(self).__name__} product with sketch_size={self.sketch_size}, "
            f"input_dim={self.input_dim} and {k} column(s)",
            "use smaller sizes",
        )

    def _reference_apply(self, A):
        if sp.issparse(A):
            return self._block_sum_sparse(A, self.reference_columns)
        xp = array_namespace(A)
        out = xp.zeros((self.sketch_size, A.shape[1]), dtype=A.dtype, device=array_device(A))
        bs = self._block_size()
        for a in range(0, self.input_dim, bs):
            b = min(self.input_dim, a + bs)
            out = out + self._columns_on(A, a, b, xp) @ A[a:b, :]
        return out

    def _columns_on(self, A, a, b, xp):
        """``S[:, a:b]`` in ``A``'s namespace, dtype and device (the portable path generates on the default
        device; a GPU's array must not be combined with another device's)."""
        cols = xp.astype(self._reference_columns(a, b, xp), A.dtype)
        return array_api_compat.to_device(cols, array_device(A))

    def _apply_numpy(self, A):
        out = np.zeros((self.sketch_size, A.shape[1]), dtype=A.dtype)
        bs = self._block_size()
        for a in range(0, self.input_dim, bs):
            b = min(self.input_dim, a + bs)
            out += self._fast_columns(a, b).astype(A.dtype, copy=False) @ A[a:b]
        return out

    def _apply_sparse(self, A):
        return self._block_sum_sparse(A, lambda a, b: self._fast_columns(a, b))

    def _block_sum_sparse(self, A, columns):
        A = A.tocsr()
        out = np.zeros((self.sketch_size, A.shape[1]), dtype=A.dtype)
        bs = self._block_size()
        for a in range(0, self.input_dim, bs):
            b = min(self.input_dim, a + bs)
            block = np.asarray(columns(a, b), dtype=A.dtype)
            out += (A[a:b].T @ block.T).T
        return out

    # ----------------------------------------------------------------------------- adjoint
    @property
    def T(self) -> AdjointSketch:
        """The adjoint ``S.T`` (shape ``(input_dim, sketch_size)``), applied without forming ``S``."""
        return AdjointSketch(self)

    def _adjoint(self, Z, name="Z"):
        _not_an_operator(Z)
        Z, is_vector = check_operand(Z, self.sketch_size, name, rows_label="the sketch's sketch_size")
        k, itemsize = Z.shape[1], _itemsize(Z.dtype)
        check_allocation(
            self._adjoint_bytes(k, itemsize) + (itemsize * self.sketch_size * k if sp.issparse(Z) else 0),
            f"{type(self).__name__}.T @ Z with input_dim={self.input_dim} and {k} column(s) "
            f"(the {self.input_dim} x {k} output and the kernel's work arrays)",
            "apply the adjoint to fewer columns at a time",
        )
        if sp.issparse(Z):
            Z = Z.toarray()
        out = self._adjoint_apply(Z)
        xo = array_namespace(out)
        if not bool(xo.all(xo.isfinite(out))):  # Z is finite (checked): a sum overflowed
            out = with_columns_scaled(self._adjoint_apply, Z)
        return out[:, 0] if is_vector else out

    def _adjoint_apply(self, Z):
        """``S.T @ Z`` of a checked dense ``Z`` by the path its kind of array takes."""
        with np.errstate(invalid="ignore", over="ignore"):  # a non-finite output is checked after
            if isinstance(Z, np.ndarray):
                return self._adjoint_numpy(Z)
            if array_api_compat.is_cupy_array(Z):  # on the GPU: the CUDA kernels where there are some
                from rsketch.kernels.cuda import sketch_adjoint

                return sketch_adjoint(self, Z)
            return self._reference_adjoint(Z)

    def reference_adjoint(self, Z):
        """``S.T @ Z`` block by block from the portable path (``Z`` checked as for ``S.T @ Z``).

        Examples
        --------
        >>> import numpy as np, rsketch
        >>> S = rsketch.SparseSign(50, 8, seed=0)
        >>> Z = np.arange(16).reshape(8, 2)
        >>> bool(np.allclose(S.reference_adjoint(Z), S.T @ Z, rtol=1e-12))
        True
        """
        Z, is_vector = check_operand(Z, self.sketch_size, "Z", rows_label="the sketch's sketch_size")
        self._check_reference_memory(self.input_dim, Z)
        if sp.issparse(Z):
            Z = Z.toarray()
        out = self._reference_adjoint(Z)
        return out[:, 0] if is_vector else out

    def _reference_adjoint(self, Z):
        xp = array_namespace(Z)
        bs = self._block_size()
        parts = [
            self._columns_on(Z, a, min(self.input_dim, a + bs), xp).T @ Z
            for a in range(0, self.input_dim, bs)
        ]
        return xp.concat(parts, axis=0)

    def _adjoint_numpy(self, Z):
        out = np.empty((self.input_dim, Z.shape[1]), dtype=Z.dtype)
        bs = self._block_size()
        for a in range(0, self.input_dim, bs):
            b = min(self.input_dim, a + bs)
            out[a:b] = self._fast_columns(a, b).astype(Z.dtype, copy=False).T @ Z
        return out

    def as_linear_operator(self) -> LinearOperator:
        """A ``scipy.sparse.linalg.LinearOperator`` with ``matvec``/``rmatvec`` (and ``matmat``).

        Examples
        --------
        >>> import numpy as np, rsketch
        >>> L = rsketch.SRHT(64, 8, seed=0).as_linear_operator()
        >>> L.shape, L.matvec(np.ones(64)).shape
        ((8, 64), (8,))
        """
        return LinearOperator(
            shape=self.shape,
            matvec=lambda x: self @ np.asarray(x).reshape(-1),
            rmatvec=lambda z: self._adjoint(np.asarray(z).reshape(-1)),
            matmat=lambda X: self @ X,
            rmatmat=lambda Z: self._adjoint(Z),
            dtype=self.dtype,
        )


def read_only_view(a: np.ndarray) -> np.ndarray:
    """A read-only view of ``a``: an operator's cached state handed out to callers must not change
    under them (a caller who sorted the array ``indices()`` returned changed every later ``S @ A``).
    A view at each access, not a flag on the array itself: pickling and ``copy.deepcopy`` drop flags.

    Examples
    --------
    >>> v = read_only_view(np.arange(3))
    >>> v.flags.writeable, np.shares_memory(v, v.base)
    (False, True)
    """
    v = a.view()
    v.flags.writeable = False
    return v


def _left_operand(A, columns: int, what: str, label: str):
    """The left operand of ``what`` (``A @ S`` or ``A @ S.T``), a 1-D or 2-D array with ``columns``
    columns: a list becomes a NumPy array (the product checks its values once transposed); a wrong
    shape is named as the caller wrote it, not as the transposed operand the product receives."""
    if not hasattr(A, "shape"):
        A = np.asarray(A)
    shape = tuple(A.shape)
    if len(shape) not in (1, 2):
        raise ValueError(f"{what} needs A 1-D or 2-D, got shape {shape}")
    if shape[-1] != columns:
        raise ValueError(f"{what} needs A with {columns} columns ({label}), got shape {shape}")
    return A


def _not_an_operator(A) -> None:
    """``TypeError`` for a sketch operator as the operand of another (``S @ S``): the products are not
    formed (it had read as "A must be a numeric (real) array; got dtype object")."""
    if isinstance(A, (SketchOperator, AdjointSketch)):
        raise TypeError(
            f"sketch operators do not compose: the operand is a sketch ({type(A).__name__}); apply them "
            "in turn (S1 @ (S2 @ A)), or use the dense form (S2.to_dense())"
        )


def _transposed(A):
    """``A.T`` of a 2-D operand of any kind (NumPy, SciPy sparse, Dask, CuPy); a vector as it is."""
    return A if A.ndim == 1 else A.T


def _itemsize(dtype) -> int:
    """Bytes per value of a float32/float64 dtype of any array namespace."""
    return numpy_dtype(dtype).itemsize


def canonical_csr(A):
    """``A`` as CSR with sorted, unique column indices per row; a copy only when ``A`` is not so already.

    The kernels' sums then do not depend on how duplicates were stored, and the caller's matrix is
    never modified (``sum_duplicates`` works in place).

    Examples
    --------
    >>> import scipy.sparse as sp
    >>> A = sp.csr_matrix(([1.0, 2.0], [1, 1], [0, 2]), shape=(1, 2))  # column 1 stored twice
    >>> canonical_csr(A).toarray()
    array([[0., 3.]])
    """
    A = A.tocsr()
    if not A.has_canonical_format:
        A = A.copy()
        A.sum_duplicates()
    return A


class AdjointSketch:
    """``S.T``: applies the adjoint of a sketch operator; ``S.T.T is S``'s operator.

    Examples
    --------
    >>> import numpy as np, rsketch
    >>> S = rsketch.SparseSign(200, 20, seed=3)
    >>> x, z = np.ones(200), np.arange(20.0)
    >>> bool(np.isclose((S @ x) @ z, x @ (S.T @ z)))
    True
    """

    def __init__(self, operator: SketchOperator):
        self.operator = operator

    @property
    def shape(self):
        return (self.operator.input_dim, self.operator.sketch_size)

    ndim = 2

    @property
    def T(self) -> SketchOperator:
        return self.operator

    @property
    def dtype(self):
        return self.operator.dtype

    __array_ufunc__ = None  # ndarray @ S.T defers to __rmatmul__ (see SketchOperator)

    def __matmul__(self, Z):
        return self.operator._adjoint(Z)

    def __rmatmul__(self, A):
        """``A @ S.T`` (``A`` with ``input_dim`` columns) as ``(S @ A.T).T``: the sketch of ``A``'s rows.

        Examples
        --------
        >>> import numpy as np, rsketch
        >>> S = rsketch.SparseSign(6, 3, seed=0)
        >>> A = np.arange(12.0).reshape(2, 6)
        >>> bool(np.array_equal(A @ S.T, (S @ A.T).T))
        True
        """
        A = _left_operand(A, self.operator.input_dim, "A @ S.T", "the sketch's input_dim")
        return _transposed(self.operator @ _transposed(A))

    def to_dense(self) -> np.ndarray:
        return self.operator.to_dense().T

    def __repr__(self) -> str:
        return f"{self.operator!r}.T"
