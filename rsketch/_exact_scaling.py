"""Power-of-two scaling of data into a safe range, as LAPACK's drivers do it.

Squared norms, inner products and a sketch's unscaled sums overflow for entries beyond about
``1e154`` (or ``1e308`` for the sums) and underflow below ``1e-154`` (entries below ``2.2e-308`` are
subnormal, with fewer bits). The solvers (``rsketch.lstsq``), the operators' products and the
leverage scores therefore work on ``A 2^-a``, with ``a`` chosen so that the largest entry is near
one, and scale the answer back. Scaling by a power of two is exact (``numpy.ldexp``), so the scaled
problem has exactly the same solution. Data within ``[2^-200, 2^200]`` is left alone: the common case
costs nothing and keeps its bits. float32 arithmetic has its own, narrower range (``[2^-40, 2^40]``):
its squares overflow beyond ``1.8e19``.

Examples
--------
>>> import numpy as np
>>> Y, shift = scale_columns(np.array([[3e200, 1.0], [1e200, 2.0]]))
>>> shift.tolist(), float(np.abs(Y[:, 0]).max()) < 2.0
([665, 0], True)
"""

from __future__ import annotations

import math

import array_api_compat
import numpy as np
import scipy.sparse as sp

from rsketch._backend import array_namespace, is_non_numpy_array, numpy_dtype, to_host

# Largest entries in [2^lo, 2^hi] need no scaling: their squares, and sums of a billion (2^30) of
# them, stay normal floats of the dtype the arithmetic runs in (float64 up to 2^1024, float32 up to
# 2^128: 2 * 40 + 30 = 110). float64's range served float32 too, and a float32 Gram of entries 1e20
# was left to overflow: eigh raised LinAlgError, SRHT gave inf for a finite S @ A.
SAFE_RANGE = {np.dtype(np.float64): (-200, 200), np.dtype(np.float32): (-40, 40)}


def safe_shift(amax: float, dtype=np.float64) -> int:
    """The ``a`` with ``amax 2^-a`` in ``[1, 2)``, or 0 when ``amax`` is zero or in the safe range of
    ``dtype``, the arithmetic's (float64 unless float32).

    Examples
    --------
    >>> safe_shift(1e300), safe_shift(3.0), safe_shift(5e-324)
    (996, 0, -1074)
    >>> safe_shift(1e20), safe_shift(1e20, np.float32)
    (0, 66)
    """
    lo, hi = SAFE_RANGE[arithmetic_dtype(dtype)]
    if not amax > 0 or 2.0**lo <= amax <= 2.0**hi:
        return 0
    return math.frexp(amax)[1] - 1


def arithmetic_dtype(dtype) -> np.dtype:
    """The float type a computation on data of ``dtype`` rounds in: float32 for float32, else float64.

    Examples
    --------
    >>> arithmetic_dtype(np.float32), arithmetic_dtype(np.int64)
    (dtype('float32'), dtype('float64'))
    """
    return np.dtype(np.float32) if np.dtype(dtype) == np.float32 else np.dtype(np.float64)


def max_abs(A, axis=None):
    """The largest ``|entry|`` of ``A`` (per column with ``axis=0``; SciPy sparse too), on the host."""
    if is_non_numpy_array(A):
        xp = array_namespace(A)
        return to_host(xp.max(xp.abs(A), axis=axis)) if A.size else np.zeros(A.shape[1] if axis == 0 else ())
    if sp.issparse(A) and axis == 0:
        return abs(A).max(axis=0).toarray().ravel()
    data = A.data if sp.issparse(A) else A
    if not data.size:
        return np.zeros(A.shape[1] if axis == 0 else ())
    # the larger of max and -min: two reads and no |A| copy (IHS's scaling had allocated one the size
    # of X); np.maximum keeps a NaN
    return np.maximum(np.max(data, axis=axis), -np.min(data, axis=axis))


def unit_exponent(amax: float) -> int:
    """The ``e`` with ``amax 2^-e`` in ``[1/2, 1)``, always (not only outside the safe range); 0 for a
    zero, infinite or NaN ``amax``.

    Examples
    --------
    >>> unit_exponent(3.0), unit_exponent(1e-300), unit_exponent(0.0)
    (2, -996, 0)
    """
    return math.frexp(amax)[1] if 0 < amax < math.inf else 0


def unit_exponents(top) -> np.ndarray:
    """:func:`unit_exponent` of each of ``top`` (for example each column's largest entry).

    Examples
    --------
    >>> unit_exponents(np.array([3.0, 0.0, 0.25])).tolist()
    [2, 0, -1]
    """
    top = np.asarray(top, dtype=np.float64)
    return np.where((top > 0) & (top < math.inf), np.frexp(top)[1], 0)


def shift_down(A, shifts):
    """``A 2^-shifts`` (exact: only exponents move; ``shifts`` an int, or one per column) in ``A``'s
    library and dtype; a SciPy sparse ``A`` as a copy of its format.

    Examples
    --------
    >>> shift_down(np.array([[3.0, 1.0]]), np.array([1, -2])).tolist()
    [[1.5, 4.0]]
    """
    shifts = np.asarray(shifts)
    if sp.issparse(A):
        A = A.copy()
        if shifts.ndim == 0:
            A.data = np.ldexp(A.data, -shifts)
        elif A.format == "csc":  # column j's entries are data[indptr[j]:indptr[j + 1]]
            A.data = np.ldexp(A.data, -np.repeat(shifts, np.diff(A.indptr)))
        else:
            A = A.tocsr()
            A.data = np.ldexp(A.data, -shifts[A.indices])
        return A
    if not is_non_numpy_array(A):
        return np.ldexp(A, -shifts)
    # No ldexp in the array API: multiply by 2^-s in two exact steps (2^-s alone may not be a float64).
    xp = array_namespace(A)
    half = shifts // 2
    for part in (half, shifts - half):
        # in A's dtype: a float64 factor made a float32 A's product float64
        A = A * xp.asarray(np.ldexp(1.0, -part), dtype=A.dtype, device=array_api_compat.device(A))
    return A


def scale_columns(Y) -> tuple[object, np.ndarray]:
    """``(Y 2^-b_j, b)``: each column's largest entry brought near one when out of the safe range of
    ``Y``'s dtype (float32's for float32 ``Y``)."""
    dtype = numpy_dtype(Y.dtype)
    shifts = np.array([safe_shift(float(a), dtype) for a in max_abs(Y, axis=0)], dtype=np.int64)
    if not shifts.any():
        return Y, shifts
    Y = shift_down(Y, shifts)
    return (Y if is_non_numpy_array(Y) or sp.issparse(Y) else np.ascontiguousarray(Y)), shifts


def with_columns_scaled(apply, A):
    """``apply(A)`` for a linear ``apply``, computed on ``A`` with each column outside the safe range
    scaled by a power of two to a largest entry in [1, 2) (:func:`scale_columns`) and scaled back.

    The sketches' kernels sum unscaled entries (a Gaussian's N(0, 1), the transforms' +-1 sums) and
    scale last, so a finite product could overflow on the way (two entries of ``1e308`` gave ``inf``
    where every exact entry of ``S @ A`` was below ``5.3e307``; an SRHT's ``S.T @ Z`` gave NaN).
    Scaling by powers of two is exact; scaled back, an entry is infinite only where the product
    itself is beyond the float range.

    Examples
    --------
    >>> A = np.array([[1e308], [1e308]])
    >>> float(with_columns_scaled(lambda B: np.array([[0.5, 0.5]]) @ B, A)[0, 0])
    1e+308
    """
    scaled, shifts = scale_columns(A)
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):  # beyond the range: inf, as IEEE
        return shift_down(apply(scaled), -shifts)


def scale_design(X):
    """``(X 2^-a, a)`` from the largest entry of ``X`` (one pass over ``X``), as :func:`scale_columns`."""
    shift = safe_shift(float(max_abs(X)), numpy_dtype(X.dtype))
    return (X, 0) if shift == 0 else (shift_down(X, shift), shift)
