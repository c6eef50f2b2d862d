"""``S @ A`` on the device: the CUDA kernels chosen by the operator's ``kind``.

The operator is read as a description (``kind``, ``key``, sizes, options): this module sits below
:mod:`rsketch.operators` and imports nothing from it. ``A`` is a checked, 2-D float32/float64 array of
the device's namespace (CuPy on a GPU, NumPy in the simulator); the result lives in the same
namespace and has ``A``'s dtype. O(r) host state (SRHT's selected rows, sampled indices drawn by
Floyd's algorithm or by leverage scores) is computed by the CPU kernels and copied over.
"""

from __future__ import annotations

import math

import numpy as np

from rsketch._random import STREAM_GAUSS, STREAM_ROW, STREAM_SAMPLE, STREAM_SIGN, ZIG_X
from rsketch.kernels.cuda.kernels import (
    array_module,
    gather_rows,
    gaussian_columns,
    lane_signs,
    sparse_adjoint,
    sparse_apply_csr,
    sparse_apply_dense,
    srht_apply,
    uniform_indices,
)

# Columns of a Gaussian S generated per block (one thread each): at most 2**27 entries (1 GiB) on the
# device, so that a block has enough columns (threads) to fill a GPU at r = 2,000.
_GAUSS_BLOCK_ENTRIES = 1 << 27


def _gaussian(S, A, xp):
    n, r = S.input_dim, S.sketch_size
    X = xp.asarray(ZIG_X)
    out = xp.zeros((r, A.shape[1]), dtype=np.float64)
    step = max(1, _GAUSS_BLOCK_ENTRIES // r)
    for a in range(0, n, step):
        b = min(n, a + step)
        G = xp.empty((b - a, r), dtype=np.float64)
        gaussian_columns(S.key[0], S.key[1], a, b, r, STREAM_GAUSS, G, X)
        out += G.T @ A[a:b].astype(np.float64, copy=False)  # cuBLAS GEMM on a GPU
    out *= 1.0 / math.sqrt(r)
    return out.astype(A.dtype, copy=False)


def _sparse(S, A, xp):
    acc = xp.zeros((S.sketch_size, A.shape[1]), dtype=A.dtype)
    sparse_apply_dense(S.key[0], S.key[1], S.nnz_per_column, S.sketch_size, STREAM_ROW, A, acc)
    # Rounded as the CPU rounds: a float64 product, then A's dtype.
    return (acc.astype(np.float64) * (1.0 / math.sqrt(S.nnz_per_column))).astype(A.dtype)


def _srht(S, A, xp):
    r = S.sketch_size
    out = xp.empty((r, A.shape[1]), dtype=A.dtype)
    rows = xp.array(S.rows)  # a copy: the operator's rows are read-only (the simulator writes args back)
    srht_apply(S.key[0], S.key[1], STREAM_SIGN, S.padded_size, rows, 1.0 / math.sqrt(r), A, out)
    return out


def _srdct(S, A, xp):
    if xp is np:
        import scipy.fft as fft
    else:
        import cupyx.scipy.fft as fft
    d = lane_signs(S.key[0], S.key[1], 0, S.input_dim, STREAM_SIGN, xp).astype(A.dtype)
    Y = fft.dct(A * d[:, None], type=2, norm="ortho", axis=0)
    return Y[xp.asarray(S.rows)] * A.dtype.type(math.sqrt(S.input_dim / S.sketch_size))


def _sampling(S, A, xp):
    r = S.sketch_size
    if S.kind == "uniform" and S.replace:
        idx = uniform_indices(S.key[0], S.key[1], r, S.input_dim, STREAM_SAMPLE, xp)
    else:  # Floyd's algorithm and CDF inversion: O(r) on the host; a copy, as for the SRHT's rows
        idx = xp.array(S.indices())
    out = xp.empty((r, A.shape[1]), dtype=A.dtype)
    gather_rows(A, idx, xp.asarray(S.scales().astype(A.dtype)), out)
    return out


_APPLY = {
    "gaussian": _gaussian,
    "sparse_sign": _sparse,
    "countsketch": _sparse,
    "srht": _srht,
    "srdct": _srdct,
    "uniform": _sampling,
    "leverage": _sampling,
}


def sketch_apply(S, A):
    """``S @ A`` for a checked 2-D device array ``A``, computed by the CUDA kernels.

    Raises
    ------
    NotImplementedError
        For an operator kind without device kernels.
    """
    try:
        apply = _APPLY[S.kind]
    except KeyError:
        raise NotImplementedError(
            f"{type(S).__name__} (kind {S.kind!r}) has no GPU kernels; apply it to a NumPy array"
        ) from None
    return apply(S, A, array_module(A))


# ----------------------------------------------------------------------------- sparse input (CSR)
def _gaussian_csr(S, A, xp):
    n, r = S.input_dim, S.sketch_size
    X = xp.asarray(ZIG_X)
    out = xp.zeros((A.shape[1], r), dtype=np.float64)  # (S @ A).T, from A.T @ S.T by cuSPARSE
    step = max(1, _GAUSS_BLOCK_ENTRIES // r)
    for a in range(0, n, step):
        b = min(n, a + step)
        G = xp.empty((b - a, r), dtype=np.float64)
        gaussian_columns(S.key[0], S.key[1], a, b, r, STREAM_GAUSS, G, X)
        out += A[a:b].T.astype(np.float64) @ G
    out *= 1.0 / math.sqrt(r)
    return out.T.astype(A.dtype)


def _sparse_csr(S, A, xp):
    n, k = A.shape
    acc = xp.zeros((S.sketch_size, k), dtype=A.dtype)
    sparse_apply_csr(
        S.key[0],
        S.key[1],
        S.nnz_per_column,
        S.sketch_size,
        STREAM_ROW,
        A.indptr,
        A.indices,
        A.data,
        n,
        k,
        acc,
    )
    return (acc.astype(np.float64) * (1.0 / math.sqrt(S.nnz_per_column))).astype(A.dtype)


def _transform_csr(S, A, xp):
    return _APPLY[S.kind](S, A.toarray(), xp)  # the transform mixes all rows: densified, as on the CPU


def _sampling_csr(S, A, xp):
    r = S.sketch_size
    if S.kind == "uniform" and S.replace:
        idx = uniform_indices(S.key[0], S.key[1], r, S.input_dim, STREAM_SAMPLE, xp)
    else:
        idx = xp.asarray(S.indices())
    out = A[idx].toarray()
    out *= xp.asarray(S.scales().astype(A.dtype))[:, None]
    return out


_APPLY_CSR = {
    "gaussian": _gaussian_csr,
    "sparse_sign": _sparse_csr,
    "countsketch": _sparse_csr,
    "srht": _transform_csr,
    "srdct": _transform_csr,
    "uniform": _sampling_csr,
    "leverage": _sampling_csr,
}


def sketch_apply_sparse(S, A):
    """``S @ A`` for a checked, canonical CSR matrix ``A`` on the device (``cupyx.scipy.sparse``; SciPy's in
    the simulator): a dense array of the device's namespace and A's dtype."""
    try:
        apply = _APPLY_CSR[S.kind]
    except KeyError:
        raise NotImplementedError(
            f"{type(S).__name__} (kind {S.kind!r}) has no GPU kernels; apply it to a NumPy array"
        ) from None
    return apply(S, A, array_module(A.data))


# ----------------------------------------------------------------------------- the adjoint S.T @ Z
def sketch_adjoint(S, Z):
    """``S.T @ Z`` for a checked 2-D device array ``Z`` (``r x k``): the sparse sign kinds by the gather
    kernel (the CPU's bits); the other kinds by the operator's portable path in the device's namespace."""
    if S.kind not in ("sparse_sign", "countsketch"):
        return S._reference_adjoint(Z)  # Z checked by the caller
    xp = array_module(Z)
    Z = xp.ascontiguousarray(Z)
    out = xp.empty((S.input_dim, Z.shape[1]), dtype=Z.dtype)
    scale = 1.0 / math.sqrt(S.nnz_per_column)
    sparse_adjoint(S.key[0], S.key[1], S.nnz_per_column, S.sketch_size, STREAM_ROW, scale, Z, out)
    return out
