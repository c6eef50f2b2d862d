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
A design of entries near ``1e250``: its sketch is finite but out of range, so ``X`` is read again for
its largest entry and sketched once more, scaled (``scale_columns`` itself: ``rsketch._exact_scaling``):

>>> import numpy as np, rsketch
>>> X = np.random.default_rng(0).standard_normal((500, 3)) * 1e250
>>> S = rsketch.make_sketch("sparse_sign", 500, 30, seed=0)
>>> X2, SX, shift, passes = sketch_design(S, X)
>>> shift, passes, float(np.abs(X2).max()) < 2.0
(832, 3, True)
"""

from __future__ import annotations

import math

import numpy as np

from rsketch._exact_scaling import max_abs, safe_shift, scale_columns, scale_design, shift_down
from rsketch.linalg._common import apply_sketch

__all__ = ["scale_columns", "scale_design", "sketch_design", "unscale"]


def sketch_design(S, X, first_pass=None):
    """``(X', S X', a, passes)`` with ``X' = X 2^-a``: ``S X`` judges the range; ``X`` is read again only
    if off. ``passes`` counts the reads of ``X`` (1: the sketch; 2: and its largest entry; 3: and the
    sketch of ``X'``), which Dask input logs.

    ``first_pass(S, X)``, if given, computes ``S X`` (with whatever else that pass gives).
    """
    SX = (first_pass or apply_sketch)(S, X)
    amax = float(max_abs(SX))
    if math.isfinite(amax) and safe_shift(amax) == 0:
        return X, SX, 0, 1
    shift = safe_shift(float(max_abs(X)))  # the sketch overflowed or is out of range: scale by X itself
    if shift == 0:
        return X, SX, 0, 2
    X = shift_down(X, shift)
    return X, apply_sketch(S, X), shift, 3


def unscale(coef, x_shift: int, y_shifts, *, what="the least-squares solution", fix="rescale X or y"):
    """``coef 2^(b - a)`` in ``coef``'s dtype; a ``ValueError`` (``what`` the solution, ``fix`` the
    remedy) when the true solution is beyond or below that dtype's range.

    Examples
    --------
    >>> unscale(np.ones((2, 1)), 3, np.array([5])).ravel().tolist()
    [4.0, 4.0]
    """
    if x_shift == 0 and not y_shifts.any():
        return coef
    with np.errstate(over="ignore", under="ignore"):
        out = np.ldexp(coef, (y_shifts - x_shift)[None, :]).astype(coef.dtype, copy=False)
    if not np.isfinite(out).all():
        raise ValueError(f"{what} is beyond the {out.dtype} range (its entries would overflow): {fix}")
    lost = (np.abs(coef).max(axis=0) > 0) & (np.abs(out).max(axis=0) < np.finfo(out.dtype).tiny)
    if lost.any():
        raise ValueError(
            f"{what} is below the {out.dtype} range (its entries would underflow to subnormals or "
            f"zero): {fix}"
        )
    return out
