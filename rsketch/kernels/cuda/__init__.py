"""CUDA kernels (numba-cuda), the GPU twins of :mod:`rsketch.kernels.cpu`, and ``S @ A`` on the device.

``SketchOperator.__matmul__`` sends a CuPy array here: :func:`sketch_apply` checks that the GPU
stack is present (:func:`require_gpu`) and runs the operator's kernels (:mod:`.apply`,
:mod:`.kernels`). The kernels are written with ``numba.cuda.jit`` so that numba's CUDA simulator
(``NUMBA_ENABLE_CUDASIM=1``) runs them on NumPy arrays on a CPU: that is how the test suite checks
each one against its CPU twin on machines without a GPU. The kernel modules are imported only when
a device product is asked for.
"""

from __future__ import annotations

import importlib

import numpy as np

from rsketch._backend import to_host
from rsketch._exact_scaling import safe_shift, shift_down
from rsketch._validation import _float_dtype_for, check_finite

_INSTALL = "install the GPU extra: pip install 'rsketch[gpu]' (CuPy and numba-cuda)"


def require_gpu():
    """Check that CuPy, numba-cuda and a CUDA device are all present.

    Raises
    ------
    ImportError
        When CuPy or numba-cuda is not installed (the message says to install ``rsketch[gpu]``), or
        when numba-cuda cannot compile kernels with the installed NumPy (:func:`check_kernel_compiler`).
    RuntimeError
        When they are installed but no CUDA device (or driver) is available.

    Examples
    --------
    >>> import sys
    >>> saved, sys.modules["cupy"] = sys.modules.get("cupy"), None  # as if CuPy were not installed
    >>> try:
    ...     require_gpu()
    ... except ImportError as exc:
    ...     print(exc)
    CuPy is not installed; install the GPU extra: pip install 'rsketch[gpu]' (CuPy and numba-cuda)
    >>> if saved is None: del sys.modules["cupy"]
    ... else: sys.modules["cupy"] = saved
    """
    try:
        cupy = importlib.import_module("cupy")
    except ImportError as exc:
        raise ImportError(f"CuPy is not installed; {_INSTALL}") from exc
    try:
        numba_cuda = importlib.import_module("numba.cuda")
    except ImportError as exc:
        raise ImportError(f"numba-cuda is not installed; {_INSTALL}") from exc
    check_kernel_compiler()
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # CuPy raises its own CUDARuntimeError without a driver
        raise RuntimeError(
            f"no CUDA device is available to CuPy ({exc}); run on a machine with an NVIDIA GPU and its "
            "driver, or pass NumPy arrays to compute on the CPU"
        ) from exc
    if count == 0 or not numba_cuda.is_available():
        raise RuntimeError(
            "no CUDA device is available (CuPy sees "
            f"{count} device(s), numba.cuda.is_available() is {numba_cuda.is_available()}); run on a "
            "machine with an NVIDIA GPU and its driver, or pass NumPy arrays to compute on the CPU"
        )


def check_kernel_compiler(probe: str = "numba.cuda.np.arrayobj"):
    """Check that numba-cuda can compile kernels with the installed NumPy, before a kernel is launched.

    numba-cuda 0.30.4 (the last release; the project is in maintenance mode) registers an overload
    of ``np.row_stack`` when it first compiles a kernel, and NumPy 2.5 removed ``np.row_stack``: every
    kernel launch then fails deep inside numba-cuda with an ``AttributeError``. Importing ``probe``, the
    module that registers it (numba-cuda imports it at the first compile anyway), finds this at once.

    Raises
    ------
    ImportError
        When numba-cuda cannot compile kernels with this NumPy (the message says to install
        ``numpy<2.5``, as the ``gpu`` extra does).

    Examples
    --------
    >>> check_kernel_compiler("json")  # any module that imports cleanly passes
    >>> check_kernel_compiler("no_such_module")  # and one that a later numba-cuda may not have
    """
    try:
        importlib.import_module(probe)
    except ModuleNotFoundError:  # a numba-cuda without that module: nothing to probe
        return
    except AttributeError as exc:
        raise ImportError(
            f"numba-cuda cannot compile kernels with NumPy {np.__version__} ({exc}); install "
            "'numpy<2.5' (the GPU extra pins it: pip install 'rsketch[gpu]')"
        ) from exc


def sketch_apply(S, A):
    """``S @ A`` for a checked 2-D CuPy array ``A``, computed on the device (a CuPy array of A's dtype).

    Examples
    --------
    >>> import numpy as np, rsketch
    >>> S = rsketch.CountSketch(100, 10, seed=0)
    >>> S @ np.ones((100, 2)) is not None  # NumPy input never comes here; CuPy input does
    True
    """
    require_gpu()
    apply = importlib.import_module("rsketch.kernels.cuda.apply")
    return apply.sketch_apply(S, A)


def sketch_adjoint(S, Z):
    """``S.T @ Z`` for a checked 2-D CuPy array ``Z``, computed on the device (a CuPy array of Z's dtype).

    Examples
    --------
    >>> import numpy as np, rsketch
    >>> S = rsketch.CountSketch(100, 10, seed=0)
    >>> (S.T @ np.ones((10, 2))).shape  # NumPy input never comes here; CuPy input does
    (100, 2)
    """
    require_gpu()
    apply = importlib.import_module("rsketch.kernels.cuda.apply")
    return apply.sketch_adjoint(S, Z)


def check_device_csr(A, rows: int):
    """``A`` (a ``cupyx.scipy.sparse`` matrix, or SciPy's in the simulator) as canonical CSR of float32/64.

    The checks of ``rsketch._validation.check_operand`` for device sparse input: ``rows`` rows, not empty,
    real dtype (integers become float64); duplicates are summed on a copy, never in the caller's matrix.

    Examples
    --------
    >>> import scipy.sparse as sp
    >>> A = sp.csr_matrix(([1, 2], [1, 1], [0, 2]), shape=(1, 2))  # column 1 stored twice, int64
    >>> check_device_csr(A, 1).toarray()
    array([[0., 3.]])
    """
    if len(A.shape) != 2:  # CuPy 14's 1-D csr_array: the kernels take rows and columns
        raise ValueError(
            f"A must be a 2-D sparse matrix on the device, got shape {A.shape}: give a vector as an "
            f"({A.shape[0]}, 1) matrix (cupyx.scipy.sparse.csr_matrix)"
        )
    if A.shape[0] != rows:
        raise ValueError(f"A must have {rows} rows (the sketch's input_dim), got shape {A.shape}")
    if 0 in A.shape:
        raise ValueError(f"A is empty (shape {A.shape}); expected at least one row and column")
    dtype = _float_dtype_for(A.dtype, "A")
    A = A.tocsr()
    A = A.astype(dtype) if A.dtype != dtype else A
    if not A.has_canonical_format:
        A = A.copy()
        A.sum_duplicates()
    return A


def sketch_apply_sparse(S, A):
    """``S @ A`` for a ``cupyx.scipy.sparse`` matrix ``A``, computed on the device (a dense CuPy array).

    ``NaN``/``inf`` in ``A`` raise ``ValueError`` as on the CPU: sampling sketches scan ``A`` first
    (they read only some rows); the others scan it only when the output is not finite.

    Examples
    --------
    >>> import numpy as np, scipy.sparse as sp, rsketch
    >>> S = rsketch.CountSketch(100, 10, seed=0)
    >>> (S @ sp.eye(100, 3, format="csr")).shape  # SciPy input stays on the CPU; cupyx input comes here
    (10, 3)
    """
    require_gpu()
    apply = importlib.import_module("rsketch.kernels.cuda.apply")
    return apply_checked_sparse(S, check_device_csr(A, S.input_dim), apply.sketch_apply_sparse)


def apply_checked_sparse(S, A, apply):
    """``apply(S, A)`` with the finiteness rule of ``SketchOperator.__matmul__`` (``A`` already checked)."""
    if not S._nonfinite_propagates:
        check_finite(A.data, "A")
    out = apply(S, A)
    if S._nonfinite_propagates and not bool((abs(out) < float("inf")).all()):
        check_finite(A.data, "A")  # raises if A held NaN/inf; otherwise the sum overflowed (IEEE inf)
        out = _with_csr_columns_scaled(S, A, apply)
    return out


def _with_csr_columns_scaled(S, A, apply):
    """``apply(S, A)`` on a CSR ``A`` whose columns out of the safe range are scaled by powers of two,
    then scaled back (exact), as the dense operands are (:func:`rsketch._exact_scaling.with_columns_scaled`,
    whose column maxima and scaling take SciPy's sparse formats, not cupyx's): the kernels sum
    unscaled values, so entries of ``1e308`` had given ``inf`` for a finite product."""
    data, indices = to_host(A.data)[: A.nnz], to_host(A.indices)[: A.nnz]
    largest = np.zeros(A.shape[1])
    np.maximum.at(largest, indices, np.abs(data))
    shifts = np.array([safe_shift(float(a), data.dtype) for a in largest], dtype=np.int64)
    if not shifts.any():
        return apply(S, A)
    scaled = A.copy()
    scaled.data = shift_down(A.data[: A.nnz], shifts[indices])
    return shift_down(apply(S, scaled), -shifts)
