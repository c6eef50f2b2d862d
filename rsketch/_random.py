"""Counter-based randomness: Philox4x32-10 and the transforms built on it.

Every random quantity in rsketch is a pure function of a 64-bit *key* (from the user's seed)
and a 128-bit *counter* (which entry it is). Nothing is drawn from a stateful generator, so any
block of any operator can be generated alone, in any order, on any backend, and comes out the
same (RandBLAS's model; Salmon, Moraes, Dror & Shaw, "Parallel random numbers: as easy as
1, 2, 3", SC 2011).

Counter layout used by every operator: ``(c0, c1, c2, c3) = (index_lo, index_hi, block, stream)``
where ``index`` is the column (or sample) the words belong to, ``block`` numbers the 4-word
blocks within that index, and ``stream`` separates independent purposes of one operator (signs,
row hashes, Gaussian entries, ...). The functions here are written against an array namespace
``xp`` so that CuPy or Dask arrays use the same code; the numba kernels in
:mod:`rsketch.kernels.cpu` implement the same arithmetic and are tested bit-for-bit against it.
"""

from __future__ import annotations

import math

import numpy as np

from rsketch._backend import to_host
from rsketch._validation import check_seed, seed_sequence

# Philox4x32 constants (Random123).
PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
PHILOX_ROUNDS = 10

# Streams: one per independent purpose within an operator.
STREAM_SIGN = 1
STREAM_ROW = 2
STREAM_GAUSS = 3
STREAM_SAMPLE = 4
STREAM_SELECT = 5
STREAM_WEDGE = 6
STREAM_TAIL = 0x100  # tail iteration t of an attempt uses stream STREAM_TAIL + t

_MASK32 = 0xFFFFFFFF


def philox4x32(xp, c0, c1, c2, c3, key):
    """Philox4x32-10 of counter arrays ``(c0, c1, c2, c3)`` under ``key = (k0, k1)``.

    Parameters
    ----------
    xp : array namespace
        ``numpy`` or any namespace with unsigned 64-bit integer arithmetic.
    c0, c1, c2, c3 : arrays of a common broadcast shape
        The counter words; values must lie in ``[0, 2**32)``.
    key : tuple of two ints
        The 64-bit key as two 32-bit words.

    Returns
    -------
    tuple of four uint32 arrays
        The output words, each of the broadcast shape.

    Examples
    --------
    >>> import numpy as np
    >>> z = np.zeros(1, dtype=np.uint64)
    >>> [hex(int(w[0])) for w in philox4x32(np, z, z, z, z, (0, 0))]
    ['0x6627e8d5', '0xe169c58d', '0xbc57ac4c', '0x9b00dbd8']
    """
    u64 = xp.uint64
    mask = xp.asarray(_MASK32, dtype=u64)
    m0 = xp.asarray(PHILOX_M0, dtype=u64)
    m1 = xp.asarray(PHILOX_M1, dtype=u64)
    c0, c1, c2, c3 = (xp.astype(xp.asarray(c), u64) for c in (c0, c1, c2, c3))
    k0, k1 = int(key[0]) & _MASK32, int(key[1]) & _MASK32
    for _ in range(PHILOX_ROUNDS):
        p0 = m0 * c0  # products of two 32-bit words fit in 64 bits
        p1 = m1 * c2
        c0, c1, c2, c3 = (
            ((p1 >> 32) ^ c1 ^ k0) & mask,
            p1 & mask,
            ((p0 >> 32) ^ c3 ^ k1) & mask,
            p0 & mask,
        )
        k0 = (k0 + PHILOX_W0) & _MASK32
        k1 = (k1 + PHILOX_W1) & _MASK32
    return tuple(xp.astype(c, xp.uint32) for c in (c0, c1, c2, c3))


def counter_words(xp, index, block, stream):
    """The four counter words for ``index`` (array), ``block`` (array or int) and ``stream``."""
    index = xp.astype(xp.asarray(index), xp.uint64)
    block = xp.astype(xp.asarray(block), xp.uint64)
    lo = index & xp.asarray(_MASK32, dtype=xp.uint64)
    hi = index >> 32
    return lo, hi, block, xp.asarray(stream, dtype=xp.uint64)


def random_words(xp, key, index, block, stream):
    """Four uint32 words for each (index, block) pair of one stream (broadcast shapes)."""
    return philox4x32(xp, *counter_words(xp, index, block, stream), key)


def uniform_from_words(xp, w):
    """Map uint32 words to uniforms in the open interval (0, 1): ``(w + 0.5) / 2**32``."""
    return (xp.astype(w, xp.float64) + 0.5) * (1.0 / 4294967296.0)


# ---------------------------------------------------------------------------------------------
# Gaussian entries: the 128-layer ziggurat (Marsaglia & Tsang 2000, in Doornik's 2005 "ZIGNOR"
# form), driven by counters so that column j of an operator is a pure function of (key, j).
# Attempt a of column j reads words 2(a % 2), 2(a % 2) + 1 of counter (j, a // 2, STREAM_GAUSS):
# bits 0-6 of the first pick the layer, its bits 7-31 and the top 28 bits of the second give a
# 53-bit u in (-1, 1). Wedge tests draw one word from (j, a, STREAM_WEDGE); tail iteration t
# draws from (j, a, STREAM_TAIL + t). A column takes its first r accepted attempts. About 99% of
# attempts are accepted by one comparison, which is why this beats Box-Muller (log, sqrt,
# sin, cos per pair) several times over.
# ---------------------------------------------------------------------------------------------
ZIG_LAYERS = 128
ZIG_R = 3.442619855899
ZIG_V = 9.91256303526217e-3


def _ziggurat_tables():
    x = np.zeros(ZIG_LAYERS + 1)
    f = math.exp(-0.5 * ZIG_R * ZIG_R)
    x[0] = ZIG_V / f  # the bottom block (rectangle plus tail) has the same area V as the others
    x[1] = ZIG_R
    for i in range(2, ZIG_LAYERS):
        x[i] = math.sqrt(-2.0 * math.log(ZIG_V / x[i - 1] + f))
        f = math.exp(-0.5 * x[i] * x[i])
    return x, x[1:] / x[:-1]


ZIG_X, ZIG_RATIO = _ziggurat_tables()


def ziggurat_u(xp, w_first, w_second):
    """Layer (0..127) and the symmetric 53-bit uniform ``u`` in (-1, 1) of one attempt."""
    layer = xp.astype(w_first & xp.asarray(0x7F, dtype=xp.uint32), xp.int64)
    hi = xp.astype(w_first >> 7, xp.float64)  # 25 bits
    lo = xp.astype(w_second >> 4, xp.float64)  # 28 bits
    u53 = hi * 268435456.0 + lo
    return layer, (u53 + 0.5) * (2.0**-52) - 1.0


def ziggurat_columns(xp, key, start, stop, r):
    """Standard normals ``G[j - start, i]`` (rows ``i < r`` of columns ``start <= j < stop``), portable path.

    Vectorised over columns and attempts; the compiled kernel ``kernels.cpu.gaussian_columns``
    follows the same attempt order one column at a time.
    """
    m = stop - start
    n_attempts = r + r // 16 + 64
    while True:
        j = xp.arange(start, stop, dtype=xp.int64)[:, None]
        a = xp.arange(n_attempts, dtype=xp.int64)[None, :]
        w = random_words(xp, key, j, a // 2, STREAM_GAUSS)
        odd = (a % 2) == 1
        layer, u = ziggurat_u(xp, xp.where(odd, w[2], w[0]), xp.where(odd, w[3], w[1]))
        X = xp.asarray(ZIG_X)
        xi = xp.take(X, xp.reshape(layer, (-1,)))
        xi1 = xp.take(X, xp.reshape(layer + 1, (-1,)))
        xi = xp.reshape(xi, layer.shape)
        xi1 = xp.reshape(xi1, layer.shape)
        z = u * xi
        accept = xp.abs(u) * xi < xi1  # |u| < X[i+1]/X[i], written without the division
        # Wedges (layers 1..127 outside their rectangle).
        f0 = xp.exp(-0.5 * (xi * xi - z * z))
        f1 = xp.exp(-0.5 * (xi1 * xi1 - z * z))
        u2 = uniform_from_words(xp, random_words(xp, key, j, a, STREAM_WEDGE)[0])
        wedge = (~accept) & (layer > 0)
        accept = accept | (wedge & (f1 + u2 * (f0 - f1) < 1.0))
        # Tail (bottom layer outside its rectangle): iterate until every tail attempt is done.
        tail = (~accept) & (layer == 0)
        pending = tail
        t = 0
        while bool(xp.any(pending)):
            tw = random_words(xp, key, j, a, STREAM_TAIL + t)
            tx = xp.log(uniform_from_words(xp, tw[0])) / ZIG_R
            ty = xp.log(uniform_from_words(xp, tw[1]))
            done = pending & (-2.0 * ty >= tx * tx)
            z = xp.where(done, xp.where(u < 0, tx - ZIG_R, ZIG_R - tx), z)
            pending = pending & ~done
            t += 1
        accept = accept | tail
        rank = xp.cumulative_sum(xp.astype(accept, xp.int64), axis=1) - 1
        if bool(xp.all(rank[:, -1] >= r - 1)):
            break
        n_attempts *= 2
    keep = accept & (rank < r)
    return xp.reshape(z[keep], (m, r))


def bounded_from_words(xp, w, bound):
    """Map uint32 words to integers in ``[0, bound)`` by Lemire's multiply-shift (bias < bound/2**32).

    ``bound`` is an int or an integer array broadcasting against ``w``.
    """
    bound = xp.astype(xp.asarray(bound), xp.uint64)
    return xp.astype((xp.astype(w, xp.uint64) * bound) >> 32, xp.int64)


def uniform53_from_words(xp, w_lo, w_hi):
    """A uniform in [0, 1) with 53 random bits from two words (21 of ``w_lo``, all 32 of ``w_hi``)."""
    return (xp.astype(w_hi, xp.float64) * 2097152.0 + xp.astype(w_lo >> 11, xp.float64)) * (2.0**-53)


def key_from_seed(seed) -> tuple[int, int]:
    """Turn ``seed`` (None, int, SeedSequence, Generator or RandomState) into a 64-bit Philox key.

    An int or a ``SeedSequence`` gives the same key in every process and on every machine; a
    ``Generator`` or ``RandomState`` gives a key drawn from it (advancing it); ``None`` draws fresh
    OS entropy.

    Examples
    --------
    >>> key_from_seed(0) == key_from_seed(np.random.SeedSequence(0))
    True
    """
    seed = check_seed(seed)
    if isinstance(seed, np.random.Generator):
        words = seed.integers(0, 2**32, size=2, dtype=np.uint64)
    elif isinstance(seed, np.random.RandomState):
        words = seed.randint(0, 2**32, size=2, dtype=np.uint64)
    else:
        words = seed_sequence(seed).generate_state(2, dtype=np.uint32)
    return int(words[0]), int(words[1])


def check_key(key, name: str = "key") -> tuple[int, int]:
    """``key`` as a Philox key: two integers in ``[0, 2**32)`` (``TypeError``/``ValueError`` naming ``name``).

    Examples
    --------
    >>> check_key((1, np.uint32(2)))
    (1, 2)
    >>> check_key((1.9, 1))
    Traceback (most recent call last):
    ...
    TypeError: key must be two integers in [0, 2**32) (a Philox key, as key_from_seed gives), got (1.9, 1)
    """
    message = f"{name} must be two integers in [0, 2**32) (a Philox key, as key_from_seed gives), got {key!r}"
    if (
        not isinstance(key, (tuple, list))
        or len(key) != 2
        or not all(isinstance(w, (int, np.integer)) and not isinstance(w, bool) for w in key)
    ):
        raise TypeError(message)
    if not all(0 <= int(w) < 2**32 for w in key):
        raise ValueError(message)
    return int(key[0]), int(key[1])


def derive_key(key: tuple[int, int], purpose: int) -> tuple[int, int]:
    """A new key for a sub-computation, as a pure function of ``key`` and ``purpose``."""
    w = philox4x32(np, np.uint64(purpose), np.uint64(0), np.uint64(0), np.uint64(0xFFFFFFFF), key)
    return int(w[0]), int(w[1])


def lane_words(xp, key, start, stop, stream):
    """One uint32 word per element ``start <= j < stop``: lane ``j % 4`` of counter ``(j // 4, 0, stream)``.

    Used for per-element signs (SRHT's diagonal) and per-element hashes (row selection).
    """
    j = xp.arange(start, stop, dtype=xp.int64)
    words = random_words(xp, key, j // 4, 0, stream)
    lane = j % 4
    out = xp.where(lane == 0, words[0], words[1])
    out = xp.where(lane == 2, words[2], out)
    return xp.where(lane == 3, words[3], out)


def signs_from_words(xp, w, dtype):
    """+1 / -1 from bit 0 of each word."""
    return xp.astype(1 - 2 * xp.astype(w & xp.asarray(1, dtype=xp.uint32), xp.int64), dtype)


def bounded_exact(xp, key, index, bound, stream):
    """Exactly uniform integers in ``[0, bound)``, one per entry of ``index`` (int64 array).

    Attempt ``a`` of entry ``i`` reads words ``2 (a % 2)`` and ``2 (a % 2) + 1`` of counter
    ``(i, a // 2, stream)`` as the low and high halves of a 64-bit value, keeps its low
    ``bit_length(bound - 1)`` bits, and is accepted when that is below ``bound`` (probability
    above 1/2), so every value has probability exactly ``1 / bound``. ``bound`` (an int or an array
    broadcasting against ``index``) may be up to ``2**63 - 1``. The kernel ``kernels.cpu`` runs
    the same attempts.

    Examples
    --------
    >>> import numpy as np
    >>> v = bounded_exact(np, (1, 2), np.arange(10_000), 6, 4)
    >>> sorted(set(v.tolist()))
    [0, 1, 2, 3, 4, 5]
    """
    u64 = xp.uint64
    index = xp.astype(xp.asarray(index), xp.int64)
    b = xp.astype(xp.asarray(bound), u64) + xp.zeros(index.shape, dtype=u64)
    mask = b - xp.asarray(1, dtype=u64)
    for sh in (1, 2, 4, 8, 16, 32):
        mask = mask | (mask >> sh)
    out = xp.zeros(index.shape, dtype=u64)
    pending = xp.ones(index.shape, dtype=xp.bool)
    a = 0
    while True:
        w = random_words(xp, key, index, a // 2, stream)
        lo, hi = (w[0], w[1]) if a % 2 == 0 else (w[2], w[3])
        v = ((xp.astype(hi, u64) << 32) | xp.astype(lo, u64)) & mask
        ok = pending & (v < b)
        out = xp.where(ok, v, out)
        pending = pending & ~ok
        if not bool(xp.any(pending)):
            return xp.astype(out, xp.int64)
        a += 1


def sample_without_replacement(xp, key, m: int, r: int, stream: int) -> np.ndarray:
    """A uniformly random ``r``-subset of ``[0, m)`` in ascending order, in O(r) time and memory.

    Floyd's algorithm (Bentley & Floyd, CACM 1987): iteration ``i`` (``t = m - r + i``) takes ``v``
    uniform in ``[0, t]`` (:func:`bounded_exact` of index ``i``) and adds ``v``, or ``t`` when ``v``
    is already in the set; each of the ``C(m, r)`` subsets has the same probability. The words
    come from ``xp``; the set is built on the host. ``kernels.cpu.floyd_sample`` is the compiled
    twin (the tests compare them bit for bit).

    Examples
    --------
    >>> import numpy as np
    >>> sample_without_replacement(np, (3, 4), 10**15, 5, 5).shape
    (5,)
    >>> sample_without_replacement(np, (3, 4), 6, 6, 5)
    array([0, 1, 2, 3, 4, 5])
    """
    i = xp.arange(r, dtype=xp.int64)
    draws = to_host(bounded_exact(xp, key, i, i + (m - r + 1), stream)).tolist()  # np.asarray refuses CuPy's
    chosen: set[int] = set()
    out = np.empty(r, dtype=np.int64)
    for i, v in enumerate(draws):
        if v in chosen:
            v = m - r + i
        chosen.add(v)
        out[i] = v
    return np.sort(out)
