"""Low-rank approximation of a tall Dask array: the passes of :func:`rsketch.range_finder`,
:func:`rsketch.svd` and :func:`rsketch.qr_pivoted` as map-reduces over its row chunks.

A tall ``A`` (``m x n``, chunked by rows, ``n`` small enough for an ``n x l`` array on the client):

- ``A @ Z`` (``Z`` a client ``n x l`` array) is a map over the chunks, whose ``m x l`` result is
  persisted (the basis lives where the chunks do);
- ``A.T @ Q`` and ``Q.T @ A`` are reductions whose ``n x l`` result comes to the client;
- a basis is orthonormalised by CholeskyQR2 (two Gram reductions and triangular solves per chunk),
  or by Dask's TSQR when the block is too ill-conditioned for it;
- a first pass from ``A.T`` is the lazy sketch ``S @ A`` of :mod:`rsketch.dask._sketch`.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

from rsketch._exact_scaling import unit_exponent
from rsketch.dask._sketch import check_dask_operand
from rsketch.linalg import _common

# As rsketch.linalg._lowrank.CHOLQR_MAX_COND: CholeskyQR2 is orthonormal to O(u) below it.
CHOLQR_MAX_COND = {np.dtype(np.float64): 1e5, np.dtype(np.float32): 1e2}


def check_tall_dask(A, name="A"):
    """A 2-D float Dask array with one column chunk (no data read); its dtype."""
    A, is_vector = check_dask_operand(A, None, name)
    if is_vector:
        raise ValueError(f"{name} must be 2-D, got a vector of shape {A.shape[:1]}")
    return A.rechunk({1: -1}), A.dtype


def _solve_right(block, R):
    """``block @ R^-1`` for an upper-triangular ``R`` (a triangular solve, never an inverse)."""
    return scipy.linalg.solve_triangular(R, np.asarray(block).T, trans="T", lower=False, check_finite=False).T


def times_inverse_triangle(Y, R):
    """``Y @ R^-1``, chunk by chunk (lazy)."""
    return Y.map_blocks(_solve_right, R, dtype=Y.dtype, chunks=(Y.chunks[0], (R.shape[1],)))


def refuse_nonfinite(A, name="A"):
    """Raise the ``ValueError`` for a product of ``A`` that is not finite: the first row chunk holding
    NaN or infinity by name, else the overflow of finite entries (one pass, on that path only)."""
    finite = A.map_blocks(
        lambda b: np.array([[np.isfinite(b).all()]]), chunks=((1,) * A.numblocks[0], (1,)), dtype=bool
    )
    finite = np.asarray(finite.compute()).ravel()
    if finite.all():
        raise ValueError(
            f"the products of {name} are not finite: its entries are too large (or too small, subnormal) "
            f"for them; scale {name}"
        )
    i = int(np.argmin(finite))
    a = int(sum(A.chunks[0][:i]))
    raise ValueError(f"{name} (rows {a}:{a + A.chunks[0][i]}) contains NaN or infinite values")


def times(A, M):
    """``A @ M`` for a Dask ``A`` of one column chunk and an in-memory ``M``, chunk by chunk (lazy).

    A chunk holding NaN or infinity gives NaN/inf rows without NumPy's "invalid value encountered in
    matmul" (in the scheduler's threads, where the caller's ``errstate`` does not reach): :func:`orth`
    then refuses them by name (:func:`refuse_nonfinite`), as the sketches' products do."""
    return A.map_blocks(
        _quiet_matmul, M, chunks=(A.chunks[0], (M.shape[1],)), dtype=np.result_type(A.dtype, M.dtype)
    )


def _quiet_matmul(block, M):
    with np.errstate(over="ignore", invalid="ignore"):
        return block @ M


def orth(Y, A):
    """Orthonormal basis of ``range(Y)`` for a tall Dask ``Y`` (products of ``A``), persisted:
    CholeskyQR2, else TSQR. Where the Gram overflows, ``Y`` is scaled by a power of two first (only
    its range matters; one more pass for its largest entry), as in memory; a Gram still not finite
    is ``A``'s NaN or overflow (:func:`refuse_nonfinite`), not a matrix to factor."""
    import dask.array as da

    Y = Y.rechunk({1: -1}).persist()
    limit = CHOLQR_MAX_COND.get(np.dtype(Y.dtype), 1e5)
    Q = Y
    for i in range(2):
        with np.errstate(over="ignore", invalid="ignore"):
            G = np.asarray((Q.T @ Q).compute(), dtype=np.float64)
        if not np.isfinite(G).all() and i == 0:
            e = unit_exponent(float(abs(Y).max().compute()))
            if e:
                Y = (Y * np.ldexp(1.0, -e)).persist()
                Q = Y
                G = np.asarray((Q.T @ Q).compute(), dtype=np.float64)
        if not np.isfinite(G).all():
            refuse_nonfinite(A)
        try:
            R = scipy.linalg.cholesky((G + G.T) / 2, lower=False, check_finite=False)
        except np.linalg.LinAlgError:
            break
        if not np.linalg.cond(R) <= limit:
            break
        Q = times_inverse_triangle(Q, R.astype(Y.dtype)).persist()
    else:
        return Q
    return da.linalg.tsqr(Y)[0].persist()


def basis(A, first, passes, method):
    """The range finder's basis of a tall Dask ``A``, persisted, and ``Q_j.T A`` of the block Krylov
    blocks but the last (as :func:`rsketch.linalg._lowrank._basis`).

    ``first`` is the first pass's test: for an odd ``passes`` the client's ``n x l`` block in ``A``'s
    dtype (``A @ first``: ``S.T``, or the identity where ``l >= n``, as in memory), for an even one the
    ``(l, m)`` sketch operator (the lazy ``S @ A``).
    """
    if passes % 2:
        Y, width = times(A, first), first.shape[1]
    else:
        Z = np.asarray((first @ A).compute()).T
        Y, width = times(A, np.linalg.qr(Z)[0].astype(A.dtype)), first.shape[0]
    rounds = (passes - 1) // 2
    if method == "block_krylov":  # the space cannot outgrow min(m, n), as in memory
        rounds = min(rounds, min(A.shape) // width - 1)
    blocks, keep = [orth(Y, A)], []
    for _ in range(rounds):
        P = np.asarray((A.T @ blocks[-1]).compute())
        if method == "block_krylov":
            keep.append(P.T.copy())
        Z = np.linalg.qr(P)[0].astype(A.dtype)
        # Persisted: one pass. Left lazy, block Krylov's CGS2 below read A again for each projection
        # onto an earlier block (svd(passes=7): 15 reads of A, 9 reported).
        Y = times(A, Z).persist()
        if method == "subspace":
            blocks = [orth(Y, A)]
            continue
        for _ in range(2):  # CGS2 against the blocks so far, as in memory
            for B in blocks:
                Y = Y - B @ (B.T @ Y).compute()
            Y = Y.persist()
        blocks.append(orth(Y, A))
    import dask.array as da

    Q = blocks[0] if len(blocks) == 1 else da.concatenate(blocks, axis=1).rechunk({1: -1}).persist()
    return Q, keep


def project(A, Q, keep):
    """``Q.T A`` (``l x n``) on the client: one pass for the blocks ``keep`` does not hold."""
    done = sum(b.shape[0] for b in keep)
    rest = np.asarray((Q[:, done:].T @ A).compute())
    return np.vstack(keep + [rest])


def rest_in_range(A, Q, columns, bound):
    """Whether every column of ``A[:, columns]`` lies within ``bound`` of ``range(Q)`` (``Q`` a Dask
    array with orthonormal columns, or None for none): two passes (``Q.T A_c``, then the norms of
    ``A_c - Q (Q.T A_c)``), as :func:`rsketch.linalg._cqrrpt._rest_in_range` in memory."""
    rest = A[:, columns]
    if Q is not None:
        rest = rest - Q @ np.asarray((Q.T @ rest).compute())
    return bool(np.all(column_norms(rest) <= bound))  # False for NaN; scaled norms (0 at 2**-600 before)


def _chunk_norms(block):
    """The column norms of one chunk as a ``(1, k)`` partial, scaled where their squares leave the range."""
    return _common.column_norms(np.asarray(block))[None]


def column_norms(R):
    """The Euclidean norm of each column of a Dask ``R``, on the client: one pass.

    The square roots of Dask's column sums of squares; the columns where those may be wrong (squares
    that overflow, from entries of about ``1e154``, or underflow, below ``1e-154``: 0 at ``2**-600``)
    from the same pass's partials instead, the norms of each chunk by
    :func:`rsketch.linalg._common.column_norms` (the in-memory estimate's: scaled where needed),
    combined by it again.
    """
    import dask

    parts = R.map_blocks(_chunk_norms, chunks=((1,) * R.numblocks[0], R.chunks[1]), dtype=R.dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        squares, parts = dask.compute((R * R).sum(axis=0), parts)
    norms = np.sqrt(np.asarray(squares))
    redo = _common._suspect(norms)
    if redo.any():
        norms[redo] = _common.column_norms(np.asarray(parts)[:, redo])
    return norms


def estimate_error(A, approx, W):
    """HMT (4.3) for a Dask ``A``: ``max_i ||A w_i - approx(w_i)||`` over the columns of ``W``
    (the caller scales it); ``approx(W)`` is a Dask array (``U (s Vt W)``, ``Q (Q.T A W)``). One pass."""
    R = (A @ W - approx(W)).persist()
    return float(column_norms(R).max())


def flip_signs(U, Vt):
    """scikit-learn's ``svd_flip(u_based_decision=True)`` for a Dask ``U``: the largest entry of each
    column of ``U`` made positive (one pass over ``U``)."""
    rows = np.asarray(abs(U).argmax(axis=0).compute())
    picked = np.asarray(U.vindex[rows, np.arange(U.shape[1])].compute())
    signs = np.where(picked < 0, -1.0, 1.0).astype(Vt.dtype)
    return U * signs, Vt * signs[:, None]


def cqrrpt(A, SA, rank, R_sk):
    """The passes of CQRRPT after the sketch: ``A_pre = A[:, perm[:k]] R_sk11^-1`` (lazy), its Gram
    (one pass), and ``Q = A_pre R_pre^-1`` (lazy, chunk by chunk); ``(Q, R_pre)``."""
    R1 = np.asarray(R_sk[:rank, :rank], dtype=A.dtype)
    A_pre = times_inverse_triangle(A, R1)
    G = np.asarray((A_pre.T @ A_pre).compute(), dtype=np.float64)
    if not np.isfinite(G).all():  # NaN/inf in a pivot column that the sketch did not read, or overflow
        refuse_nonfinite(A)
    try:
        R_pre = scipy.linalg.cholesky((G + G.T) / 2, lower=False, check_finite=False)
    except np.linalg.LinAlgError:
        raise ValueError(
            "the sketch did not precondition A (Cholesky of the preconditioned Gram failed); use a "
            "larger sketch_size or a Gaussian sketch"
        ) from None
    return times_inverse_triangle(A_pre, R_pre.astype(A.dtype)), R_pre
