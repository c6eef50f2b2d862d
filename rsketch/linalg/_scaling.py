"""Power-of-two scaling of the problem into a safe range, as LAPACK's drivers do it.

The solvers form squared norms and inner products; for entries beyond about ``1e154`` or below
``1e-154`` those overflow or underflow (and entries below ``2.2e-308`` are subnormal, with fewer
bits). ``rsketch.lstsq`` therefore solves ``(X 2^-a) c' = y 2^-b`` with ``a`` and ``b`` chosen so that
the largest entries are near one, and returns ``coef = c' 2^(b - a)``. Scaling by a power of two is
exact (``numpy.ldexp``), so the scaled problem has exactly the same solution, and every relative
measure (residual ratio, backward error relative to ``||X||_F``) is unchanged. Data already within
``[2^-200, 2^200]`` is left alone, so the common case costs nothing: the design's range is judged
from the sketch ``S X``, which the solver computes anyway, and only data outside the range is
copied.

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

from rsketch._backend import array_namespace, is_non_numpy_array, to_host
from rsketch.linalg._common import apply_sketch

# Largest entries in [2^LO, 2^HI] need no scaling: their squares, and sums of a billion of them, stay
# normal floats.
SAFE_LO, SAFE_HI = -200, 200


def _shift(amax: float) -> int:
    """The ``a`` with ``amax 2^-a`` in ``[1, 2)``, or 0 when ``amax`` is zero or in the safe range."""
    if not amax > 0 or 2.0**SAFE_LO <= amax <= 2.0**SAFE_HI:
        return 0
    return math.frexp(amax)[1] - 1


def _max_abs(A, axis=None):
    """The largest ``|entry|`` of ``A`` (per column with ``axis=0``), on the host."""
    if is_non_numpy_array(A):
        xp = array_namespace(A)
        return to_host(xp.max(xp.abs(A), axis=axis)) if A.size else np.zeros(A.shape[1] if axis == 0 else ())
    data = A.data if sp.issparse(A) else A
    return np.max(np.abs(data), axis=axis) if data.size else np.zeros(A.shape[1] if axis == 0 else ())


def _ldexp(A, shifts):
    """``A 2^-shifts`` (exact; ``shifts`` an int, or one per column of a dense ``A``) in ``A``'s library."""
    shifts = np.asarray(shifts)
    if sp.issparse(A):
        A = A.copy()
        A.data = np.ldexp(A.data, -shifts)
        return A
    if not is_non_numpy_array(A):
        return np.ldexp(A, -shifts)
    # No ldexp in the array API: multiply by 2^-s in two exact steps (2^-s alone may not be a float64).
    xp = array_namespace(A)
    half = shifts // 2
    for part in (half, shifts - half):
        A = A * xp.asarray(np.ldexp(1.0, -part), device=array_api_compat.device(A))
    return A


def scale_columns(Y) -> tuple[np.ndarray, np.ndarray]:
    """``(Y 2^-b_j, b)``: each column's largest entry brought near one when out of the safe range."""
    shifts = np.array([_shift(float(a)) for a in _max_abs(Y, axis=0)], dtype=np.int64)
    if not shifts.any():
        return Y, shifts
    Y = _ldexp(Y, shifts)
    return (Y if is_non_numpy_array(Y) else np.ascontiguousarray(Y)), shifts


def scale_design(X):
    """``(X 2^-a, a)`` from the largest entry of ``X`` (one pass over ``X``)."""
    shift = _shift(float(_max_abs(X)))
    return (X, 0) if shift == 0 else (_ldexp(X, shift), shift)


def sketch_design(S, X, first_pass=None):
    """``(X', S X', a, passes)`` with ``X' = X 2^-a``: ``S X`` judges the range; ``X`` is read again only
    if off. ``passes`` counts the reads of ``X`` (1: the sketch; 2: and its largest entry; 3: and the
    sketch of ``X'``), which Dask input logs.

    ``first_pass(S, X)``, if given, computes ``S X`` (with whatever else that pass gives).
    """
    SX = (first_pass or apply_sketch)(S, X)
    amax = float(_max_abs(SX))
    if math.isfinite(amax) and _shift(amax) == 0:
        return X, SX, 0, 1
    shift = _shift(float(_max_abs(X)))  # the sketch overflowed or is out of range: scale by X itself
    if shift == 0:
        return X, SX, 0, 2
    X = _ldexp(X, shift)
    return X, apply_sketch(S, X), shift, 3


def unscale(coef: np.ndarray, x_shift: int, y_shifts: np.ndarray) -> np.ndarray:
    """``coef 2^(b - a)``; a ``ValueError`` when the true solution is beyond float64's range.

    Examples
    --------
    >>> unscale(np.ones((2, 1)), 3, np.array([5])).ravel().tolist()
    [4.0, 4.0]
    """
    if x_shift == 0 and not y_shifts.any():
        return coef
    with np.errstate(over="ignore", under="ignore"):
        out = np.ldexp(coef, (y_shifts - x_shift)[None, :])
    if not np.isfinite(out).all():
        raise ValueError(
            "the least-squares solution is beyond the float64 range (its entries would overflow): "
            "rescale X or y"
        )
    lost = (np.abs(coef).max(axis=0) > 0) & (np.abs(out).max(axis=0) < np.finfo(np.float64).tiny)
    if lost.any():
        raise ValueError(
            "the least-squares solution is below the float64 range (its entries would underflow to "
            "subnormals or zero): rescale X or y"
        )
    return out
