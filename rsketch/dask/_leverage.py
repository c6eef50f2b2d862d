"""Leverage-score sampling of a Dask array: approximate scores in two passes over the chunks."""

from __future__ import annotations

import math

import numpy as np
import scipy.linalg

from rsketch._random import check_key, derive_key, key_from_seed
from rsketch._validation import MAX_INDEX, check_allocation, check_float_dtype, check_int
from rsketch.dask._sketch import check_dask_operand
from rsketch.operators.gaussian import GaussianSketch
from rsketch.operators.sampling import DEFAULT_UNIFORM_MIX, LeverageSampling, check_uniform_mix, leverage_rank
from rsketch.operators.srht import SRHT

#: Passes over ``A`` that :func:`leverage_sampling` makes for its scores (:func:`approximate_leverage`).
SCORE_PASSES = 2


def approximate_leverage(A, key) -> np.ndarray:
    """Approximate leverage scores of a Dask ``A``, as ``rsketch.operators.sampling.approximate_leverage``.

    The same algorithm and the same sketches (Drineas, Magdon-Ismail, Mahoney & Woodruff 2012), in
    two passes over the chunks: ``R`` from the SRHT sketch ``Pi1 A`` (computed chunk by chunk, the
    small SVD on the client), then the squared row norms of ``A (R^-1 Pi2)``, a ``p x r2`` product per
    chunk. Memory: the chunks in flight and the ``n`` scores. The scores equal the in-memory ones up
    to rounding. Column chunks are joined first (``A.rechunk({1: -1})``): a row's score needs all
    its columns.

    Examples
    --------
    >>> import numpy as np, dask.array as da
    >>> from rsketch.operators.sampling import approximate_leverage as in_memory
    >>> A = np.random.default_rng(0).standard_normal((1000, 4))
    >>> s = approximate_leverage(da.from_array(A, chunks=300), (1, 2))
    >>> bool(np.allclose(s, in_memory(A, (1, 2)), rtol=1e-9))
    True
    """
    A, _ = check_dask_operand(A, None, "A")
    key = check_key(key)
    A = A.rechunk({1: -1})  # the second pass multiplies whole rows by Omega (a no-op if one chunk)
    n, p = A.shape
    r1 = min(n, 4 * p + 64)
    r2 = max(32, math.ceil(4 * math.log(n)))
    SA = np.asarray((SRHT(n, r1, seed=np.random.SeedSequence(list(derive_key(key, 1)))) @ A).compute())
    if not np.isfinite(SA).all():  # the chunks are finite (checked): the sketch is beyond the range
        raise ValueError(
            "A's entries are too large for its approximate leverage scores: their SRHT sketch overflows "
            "float64; scale A by a power of two first (the scores do not change), or use another sketch"
        )
    _, s, Vt = scipy.linalg.svd(SA, full_matrices=False, check_finite=False)
    rank = leverage_rank(s, SA.shape, A.dtype)  # ValueError for a zero A
    Omega = (Vt[:rank].T / s[:rank]) @ GaussianSketch(
        rank, r2, seed=np.random.SeedSequence(list(derive_key(key, 2)))
    ).to_dense().T
    B = A.map_blocks(lambda blk: blk @ Omega, chunks=(A.chunks[0], (r2,)), dtype=np.float64)
    return (B * B).sum(axis=1).compute()


def leverage_sampling(A, sketch_size, *, seed=None, dtype=np.float64, uniform_mix=DEFAULT_UNIFORM_MIX):
    """``LeverageSampling.from_matrix(A, sketch_size, method="approx", ...)`` for a Dask array ``A``.

    The scores come from :func:`approximate_leverage` (two passes over the chunks); ``S @ A`` then
    reads only the chunks that hold sampled rows. With the same ``seed`` the operator samples as
    the in-memory ``from_matrix`` does, up to the rounding of the scores.

    Parameters
    ----------
    A : dask.array.Array of shape (n, p)
    sketch_size, seed, dtype, uniform_mix
        As for :class:`rsketch.LeverageSampling`.

    Examples
    --------
    >>> import numpy as np, dask.array as da
    >>> A = da.from_array(np.random.default_rng(0).standard_normal((2000, 5)), chunks=500)
    >>> S = leverage_sampling(A, 100, seed=0)
    >>> (S @ A).compute().shape
    (100, 5)
    """
    A, _ = check_dask_operand(A, None, "A")
    # The operator's own checks, before the two passes over the data rather than after them.
    r = check_int(sketch_size, "sketch_size", minimum=1, maximum=MAX_INDEX)
    check_float_dtype(dtype)
    check_uniform_mix(uniform_mix)
    check_allocation(48 * r, f"the {r} sampled rows of a LeverageSampling", "use a smaller sketch_size")
    key = key_from_seed(seed)
    scores = approximate_leverage(A, key)
    return LeverageSampling._keyed(scores, sketch_size, key, seed, dtype, uniform_mix)
