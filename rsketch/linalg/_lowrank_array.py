"""The range finder's passes for an ``A`` of another array library (CuPy): products and QRs on its device.

:func:`rsketch.svd` and :func:`rsketch.range_finder` run the algorithm of :mod:`rsketch.linalg._lowrank`
on such input, as :mod:`rsketch.dask._lowrank` does for Dask: the same test matrix (the sketch drawn
on the host, a dense ``n x l`` block moved to the device once), every product with ``A`` and every QR
of an ``m x l`` block on the device (cuBLAS and cuSOLVER's Householder QR for CuPy), and only the
small ``l x n`` projection ``Q.T A`` and its SVD on the host. float32 input stays float32.
"""

from __future__ import annotations

import array_api_compat
import numpy as np

from rsketch._backend import like, to_host
from rsketch._validation import check_finite

# A Krylov block that A's range no longer feeds (A of lower rank than the space) is rounding noise
# that CGS2 cannot make orthogonal to the earlier blocks (O(1) left); checked after each block, here
# and in rsketch.linalg._lowrank. A block that A still feeds leaves about 1e-14 in float64 and 1e-7 in
# float32: 1e-10 for both had stopped every float32 Krylov space at its second block (svd's singular
# values 2.5e-2 off at any passes, against 1.2e-7 from the float32 Dask path).
KRYLOV_ORTH_TOL = {np.dtype(np.float64): 1e-10, np.dtype(np.float32): 1e-4}


def refuse(A, name="A"):
    """The ``TypeError`` of a low-rank function that has no device path, for an ``A`` of another library."""
    raise TypeError(
        f"{name} is a {type(A).__module__.split('.')[0]} array: only range_finder and svd run on its "
        "device; pass a NumPy array (cupy.asnumpy) to this function"
    )


def check_matrix(A, name="A"):
    """``(A, dtype)`` for a 2-D, non-empty, finite float32/float64 array of a library (integers: float64).

    Examples
    --------
    >>> import array_api_strict as xps
    >>> A, dtype = check_matrix(xps.ones((3, 2), dtype=xps.float32))
    >>> dtype
    dtype('float32')
    """
    xp = array_api_compat.array_namespace(A)
    if A.ndim != 2:
        raise ValueError(f"{name} must be 2-D, got shape {tuple(A.shape)}")
    if 0 in A.shape:
        raise ValueError(f"{name} is empty (shape {tuple(A.shape)})")
    if xp.isdtype(A.dtype, "integral"):
        A = xp.astype(A, xp.float64)
    elif A.dtype not in (xp.float32, xp.float64):
        raise TypeError(f"{name} must be a real float32 or float64 array, got dtype {A.dtype}")
    check_finite(A, name)  # one reduction in A's library: nothing is copied to the host
    return A, np.dtype(np.float32 if A.dtype == xp.float32 else np.float64)


def orth(Y):
    """An orthonormal basis of ``Y``'s columns: Householder QR in ``Y``'s library."""
    return array_api_compat.array_namespace(Y).linalg.qr(Y)[0]


def basis(A, Z, rounds, method, keep=None, W=None):
    """The range finder's basis from the test block ``Z`` (host, ``n x l``): ``rounds`` rounds of subspace
    iteration or block Krylov after ``A @ Z``; with probes ``W`` (host), ``A @ W`` rides in that product.

    Returns ``(Q, A @ W or None, rounds made)``, arrays of ``A``'s library. ``keep`` receives
    ``Q_j.T A`` (host) of every block Krylov block but the last. Block Krylov stops at the round
    that finds ``A``'s range spent, so it can make fewer rounds than ``rounds``.
    """
    xp = array_api_compat.array_namespace(A)
    first = Z if W is None else np.concatenate([W, Z], axis=1)
    Y = A @ like(np.ascontiguousarray(first, dtype=_dtype_of(A)), A)
    AW = None if W is None else Y[:, : W.shape[1]]
    Y = Y if W is None else Y[:, W.shape[1] :]
    if method != "block_krylov":
        Q = orth(Y)
        for _ in range(rounds):
            Q = orth(A @ orth(xp.matrix_transpose(A) @ Q))
        return Q, AW, rounds
    blocks = [orth(Y)]
    for made in range(1, rounds + 1):
        P = xp.matrix_transpose(A) @ blocks[-1]  # A.T Q_{j-1}, (n, l)
        if keep is not None:
            keep.append(to_host(xp.matrix_transpose(P)))
        block = A @ orth(P)
        done = xp.concat(blocks, axis=1)
        for _ in range(2):  # CGS2 against the space so far
            block = block - done @ (xp.matrix_transpose(done) @ block)
        block = orth(block)
        if float(xp.max(xp.abs(xp.matrix_transpose(done) @ block))) > KRYLOV_ORTH_TOL[np.dtype(_dtype_of(A))]:
            if keep is not None:
                keep.clear()  # the projections kept on the way no longer apply
            return orth(xp.concat(blocks + [block], axis=1)), AW, made
        blocks.append(block)
    return xp.concat(blocks, axis=1), AW, rounds


def _dtype_of(A):
    xp = array_api_compat.array_namespace(A)
    return np.float32 if A.dtype == xp.float32 else np.float64


def project(A, Q, keep):
    """``Q.T A`` on the host (``l x n``): the kept block Krylov rows, then one pass for the rest."""
    xp = array_api_compat.array_namespace(A)
    done = sum(b.shape[0] for b in keep)
    rest = to_host(xp.matrix_transpose(Q[:, done:]) @ A)
    return np.concatenate(keep + [rest], axis=0) if keep else rest


def flip_signs(U, Vt):
    """scikit-learn's ``svd_flip(U, Vt)`` (``u_based_decision``) for ``U`` of another library, ``Vt`` host.

    Each column of ``U`` is made positive at its entry of largest magnitude (the first one on a tie).
    """
    xp = array_api_compat.array_namespace(U)
    rows = xp.argmax(xp.abs(U), axis=0)  # the first maximum, as numpy.argmax (a zero column: 0)
    # the k rows holding the maxima, k x k, in one transfer (an element at a time cost k transfers);
    # column j's maximum is entry (j, j)
    signs = np.sign(np.diagonal(to_host(xp.take(U, rows, axis=0)))).astype(Vt.dtype)
    return U * like(signs, U), Vt * signs[:, None]
