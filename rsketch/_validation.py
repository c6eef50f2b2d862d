"""Argument and array checks, in one place; every message names the argument at fault."""

from __future__ import annotations

import numbers

import numpy as np
import scipy.sparse as sp

_SPARSE_OK = ("csr", "csc", "coo")


def check_int(value, name: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """Return ``value`` as an int after checking its type and range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}")
    return value


def check_float_dtype(dtype, name: str = "dtype") -> np.dtype:
    """Accept float32 or float64 (anything ``np.dtype`` understands as one of them)."""
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"{name} must be numpy.float32 or numpy.float64, got {dtype!r}") from exc
    if dt not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise TypeError(f"{name} must be numpy.float32 or numpy.float64, got {dt}")
    return dt


def _float_dtype_for(dtype: np.dtype, name: str) -> np.dtype:
    kind = dtype.kind
    if kind == "f":
        # float16 and extended precision have no kernels: compute in the nearest supported width.
        return np.dtype(np.float32) if dtype.itemsize <= 4 else np.dtype(np.float64)
    if kind in "iub":
        return np.dtype(np.float64)
    if kind == "c":
        raise TypeError(f"{name} must be real-valued; got complex dtype {dtype}")
    raise TypeError(f"{name} must be a numeric (real) array; got dtype {dtype}")


def check_finite(A, name: str = "A") -> None:
    """Raise ``ValueError`` if a dense or sparse array holds NaN or infinity."""
    data = A.data if sp.issparse(A) else A
    if isinstance(data, np.ndarray):
        ok = bool(np.isfinite(data).all())
    else:
        from rsketch._backend import array_namespace

        xp = array_namespace(data)
        ok = bool(xp.all(xp.isfinite(data)))
    if not ok:
        raise ValueError(f"{name} contains NaN or infinite values")


def _float_dtype_for_namespace(A, name: str) -> np.dtype:
    from rsketch._backend import array_namespace

    xp = array_namespace(A)
    if xp.isdtype(A.dtype, "real floating"):
        return np.dtype(np.float32) if A.dtype == xp.float32 else np.dtype(np.float64)
    if xp.isdtype(A.dtype, "integral") or xp.isdtype(A.dtype, "bool"):
        return np.dtype(np.float64)
    if xp.isdtype(A.dtype, "complex floating"):
        raise TypeError(f"{name} must be real-valued; got complex dtype {A.dtype}")
    raise TypeError(f"{name} must be a numeric (real) array; got dtype {A.dtype}")


def check_operand(A, n_rows: int | None, name: str = "A", *, check_finite_values: bool = True):
    """Validate the right-hand operand of ``S @ A``.

    Returns ``(A2, is_vector)`` where ``A2`` is a 2-D float32/float64 NumPy array or a CSR/CSC
    matrix with ``n_rows`` rows (any number if None); a vector becomes one column and integer
    input becomes float64. Arrays of other namespaces (CuPy, ...) are checked the same way and
    returned in their own namespace. NaN/inf raise ``ValueError`` unless
    ``check_finite_values=False``, which skips that full pass over A for callers that check
    their (small) output instead (see ``SketchOperator.__matmul__``).
    """
    if sp.issparse(A):
        if A.format not in _SPARSE_OK:
            A = A.tocsr()
        if A.ndim != 2:
            raise ValueError(f"{name} must be 2-D, got a sparse array with {A.ndim} dimensions")
        dt = _float_dtype_for(A.dtype, name)
        if n_rows is not None and A.shape[0] != n_rows:
            raise ValueError(f"{name} must have {n_rows} rows (the sketch's n_rows), got shape {A.shape}")
        if A.shape[1] == 0 or A.shape[0] == 0:
            raise ValueError(f"{name} is empty (shape {A.shape}); expected at least one row and column")
        A = A.tocsr() if A.format == "coo" else A
        A = A.astype(dt, copy=False)
        if check_finite_values:
            check_finite(A, name)
        return A, False
    if not hasattr(A, "__array_namespace__") and not isinstance(A, np.ndarray):
        try:
            A = np.asarray(A)
        except (ValueError, TypeError) as exc:
            raise TypeError(f"{name} must be an array of real numbers: {exc}") from exc
    if isinstance(A.dtype, np.dtype):
        dt = _float_dtype_for(A.dtype, name)
    else:  # another array namespace: classify its dtype through the array API
        dt = _float_dtype_for_namespace(A, name)
    if A.ndim not in (1, 2):
        raise ValueError(f"{name} must be 1-D or 2-D, got {A.ndim} dimensions (shape {A.shape})")
    if n_rows is not None and A.shape[0] != n_rows:
        raise ValueError(f"{name} must have {n_rows} rows (the sketch's n_rows), got shape {A.shape}")
    if 0 in A.shape:
        raise ValueError(f"{name} is empty (shape {A.shape}); expected at least one row and column")
    is_vector = A.ndim == 1
    if isinstance(A, np.ndarray):
        A = A.astype(dt, copy=False)
        if is_vector:
            A = A[:, None]
    else:
        from rsketch._backend import array_namespace

        xp = array_namespace(A)
        A = xp.astype(A, getattr(xp, dt.name))
        if is_vector:
            A = A[:, None]
    if check_finite_values:
        check_finite(A, name)
    return A, is_vector


def check_option(value, name: str, allowed) -> str:
    """A string option that must be one of ``allowed``."""
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{name} must be one of {sorted(allowed)}, got {value!r}")
    return value
