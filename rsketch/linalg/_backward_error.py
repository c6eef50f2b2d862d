"""The Karlson-Walden backward error of a least-squares solution, computed accurately.

For tests, figures and users who want to judge a solution: the residual ``y - X coef`` and the
gradient ``X.T r`` are computed with error-free transformations (Dot2 of Ogita, Rump & Oishi 2005
for the residual; ``math.fsum`` of exact products for the gradient), so the measurement is not
limited by the rounding it is meant to detect, and the estimate uses the exact SVD of ``X``
(``O(n p^2)``; this is the judge, not the solver).
"""

from __future__ import annotations

import math

import numpy as np
import scipy.linalg
import scipy.sparse as sp

from rsketch._validation import as_matrix, check_operand

_SPLIT = 134217729.0  # 2^27 + 1: Veltkamp's splitting constant for float64


def _two_prod(a, b):
    """``(p, e)`` with ``p = fl(a b)`` and ``a b = p + e`` exactly (Dekker/Veltkamp)."""
    p = a * b
    ca = _SPLIT * a
    ah = ca - (ca - a)
    al = a - ah
    cb = _SPLIT * b
    bh = cb - (cb - b)
    bl = b - bh
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, e


def two_sum(a, b):
    """``(s, e)`` with ``s = fl(a + b)`` and ``a + b = s + e`` exactly (Knuth), elementwise."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def accurate_residual(X, y, coef):
    """``y - X coef`` as an unevaluated sum ``hi + lo``, accurate to about ``u^2`` relative (Dot2)."""
    s = np.array(y, dtype=np.float64, copy=True)
    err = np.zeros_like(s)
    for j in range(X.shape[1]):
        p, e = _two_prod(X[:, j], -coef[j])
        s, t = two_sum(s, p)
        err += t + e
    hi, lo = two_sum(s, err)
    return hi, lo


def accurate_gradient(X, r_hi, r_lo):
    """``X.T (r_hi + r_lo)``, each entry the correctly rounded sum of exact products (and ``X.T r_lo``)."""
    out = np.empty(X.shape[1])
    for j in range(X.shape[1]):
        p, e = _two_prod(X[:, j], r_hi)
        out[j] = math.fsum(np.concatenate([p, e, X[:, j] * r_lo]))
    return out


def backward_error(X, y, coef):
    """Karlson-Walden estimate of the normwise backward error of ``coef``, relative to ``||X||_F``.

    ``||(X.T X + t^2 I)^(-1/2) X.T r|| / (||coef|| ||X||_F)`` with ``r = y - X coef`` and
    ``t = ||r|| / ||coef||``: within a factor ``sqrt(2)`` of the smallest ``||dX||_F / ||X||_F`` for
    which ``coef`` solves ``min ||(X + dX) c - y||`` exactly (Karlson & Walden 1997, Gu 1998). A
    backward stable solver (Householder QR) attains a small multiple of the unit roundoff
    ``u = 1.1e-16``. Inputs are scaled by powers of two first, so any finite scale is measured.

    Parameters
    ----------
    X : array_like or sparse matrix of shape (n, p)
    y : array_like of shape (n,) or (n, k)
    coef : array_like of shape (p,) or (p, k)

    Returns
    -------
    float or ndarray of shape (k,)

    Examples
    --------
    >>> import numpy as np, rsketch
    >>> rng = np.random.default_rng(0)
    >>> X = rng.standard_normal((200, 5)); y = rng.standard_normal(200)
    >>> coef = np.linalg.lstsq(X, y, rcond=None)[0]
    >>> bool(rsketch.linalg.backward_error(X, y, coef) < 1e-15)
    True
    >>> bool(rsketch.linalg.backward_error(X, y, coef + 1e-6) > 1e-9)
    True
    """
    X, Y, C, vector = _check_inputs(X, y, coef)
    ax = math.frexp(float(np.max(np.abs(X))) or 1.0)[1]
    X = np.ldexp(X, -ax)
    U, s, Vt = scipy.linalg.svd(X, full_matrices=False)
    frob = math.sqrt(float(np.sum(s**2)))
    out = np.zeros(Y.shape[1])
    for j in range(Y.shape[1]):
        ay = math.frexp(float(np.max(np.abs(Y[:, j]))) or 1.0)[1]
        yj, cj = np.ldexp(Y[:, j], -ay), np.ldexp(C[:, j], ax - ay)
        r_hi, r_lo = accurate_residual(X, yj, cj)
        g = accurate_gradient(X, r_hi, r_lo)
        rnorm, cnorm = float(np.linalg.norm(r_hi)), float(np.linalg.norm(cj))
        if cnorm == 0:
            out[j] = float(np.linalg.norm(g)) / rnorm / frob if rnorm > 0 else 0.0
            continue
        w = (Vt @ g) / np.sqrt(s**2 + (rnorm / cnorm) ** 2)
        out[j] = float(np.linalg.norm(w)) / cnorm / frob
    return float(out[0]) if vector else out


def _check_inputs(X, y, coef):
    """``(X, Y, C, y_is_vector)``: float64, finite, of matching shapes (``Y`` and ``C`` 2-D), each
    checked by name (complex input had given the real part's value, a string array been parsed, a
    2-D ``y`` with a 1-D ``coef`` met an IndexError, and a zero ``X`` a ZeroDivisionError)."""
    X = as_matrix(X)
    n, p = X.shape
    X, _ = check_operand(X, n, "X")
    Y, vector = check_operand(y, n, "y", rows_label="X's rows")
    C, coef_vector = check_operand(coef, p, "coef", rows_label="X's columns")
    if vector != coef_vector or Y.shape[1] != C.shape[1]:
        raise ValueError(
            f"coef must have shape ({p},) for y of shape ({n},), or ({p}, k) for y of shape ({n}, k); "
            f"got coef of shape {np.shape(coef)} and y of shape {np.shape(y)}"
        )
    if not np.any(X):
        raise ValueError("X is zero: a backward error relative to ||X||_F is not defined")
    as_float = lambda A: np.asarray(A.toarray() if sp.issparse(A) else A, dtype=np.float64)  # noqa: E731
    return as_float(X), as_float(Y), as_float(C), vector
