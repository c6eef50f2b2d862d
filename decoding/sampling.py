"""Token selection: greedy, temperature, top-k and top-p (nucleus), on rows of logits.

:func:`filtered_probs` gives the distribution a sampler draws from; :func:`sample` draws from it
by its inverse CDF at a uniform of :class:`TokenNoise` (one per sample and position, a pure function
of the seed), or takes the argmax when ``temperature == 0``. Speculative verification
(:func:`decoding.speculative.verify_sampling`) computes the same token and accepts a draft token
where it is that token, so sampled speculative decoding gives autoregressive sampling's tokens.
"""

from __future__ import annotations

import numbers
from decimal import Decimal

import numpy as np

from rsketch._random import key_from_seed, random_words

__all__ = [
    "SamplingParams",
    "TokenNoise",
    "validate_sampling",
    "filtered_probs",
    "sample",
    "inverse_cdf",
    "greedy",
]

#: The Philox stream of :class:`TokenNoise` ("TOK"; rsketch's operators use 1-6 and ``0x100`` on).
STREAM_TOKENS = 0x544F4B


class TokenNoise:
    """The uniforms sampled decoding draws tokens with: ``u(sample, position)`` in ``(0, 1)``.

    Philox4x32-10 (:mod:`rsketch._random`, counter-based as RandBLAS's) under a key from ``seed``,
    at the counter ``(sample, position)``: the token that sample ``i`` (its index among the call's
    prompts) draws at position ``t`` (its ``t``-th generated token) depends on nothing else, not on
    the batch it runs in, on the order of the draws, on threads, or on how many draft tokens a
    speculative step verified (a draft budget that trims by timings made sampled speculative
    decoding differ from run to run). 52 random bits: ``(k + 1/2) 2^-52``, exact in float64.
    One call costs about 65 us whatever its length, one per step (1% of a batch-1 step).

    Parameters
    ----------
    seed : None, int, numpy.random.SeedSequence, numpy.random.Generator or numpy.random.RandomState
        As :func:`rsketch._random.key_from_seed` takes it (a Generator gives a key drawn from it).

    Examples
    --------
    >>> noise = TokenNoise(0)
    >>> u = noise.uniforms([0, 1, 0], [5, 5, 5])
    >>> bool(u[0] == u[2]), bool(u[0] != u[1]), bool(((0 < u) & (u < 1)).all())
    (True, True, True)
    """

    __slots__ = ("key",)

    def __init__(self, seed=None):
        self.key = key_from_seed(seed)

    def uniforms(self, samples, positions) -> np.ndarray:
        """``u(samples[j], positions[j])`` for each ``j`` (arrays of non-negative integers)."""
        samples = np.asarray(samples, dtype=np.uint64)
        positions = np.asarray(positions, dtype=np.uint64)
        w = random_words(np, self.key, samples, positions, STREAM_TOKENS)
        k = w[1].astype(np.float64) * 1048576.0 + (w[0] >> 12).astype(np.float64)  # 32 + 20 bits
        return (k + 0.5) * 2.0**-52


def inverse_cdf(p: np.ndarray, u: np.ndarray) -> np.ndarray:
    """The token of each row of probabilities ``p`` ``[B, V]`` at the uniform ``u`` ``[B]``: the
    first ``x`` whose cumulative probability exceeds ``u`` times the row's total (never a token of
    probability zero, since ``u > 0``).

    Examples
    --------
    >>> inverse_cdf(np.array([[0.5, 0.0, 0.5], [0.5, 0.0, 0.5]]), np.array([0.4, 0.6])).tolist()
    [0, 2]
    """
    cdf = np.cumsum(p, axis=-1)
    return np.minimum((cdf < u[:, None] * cdf[:, -1:]).sum(axis=-1), p.shape[-1] - 1)


class SamplingParams:
    """Validated sampling options (see :func:`validate_sampling`).

    Examples
    --------
    >>> SamplingParams(temperature=0.7, top_k=50, top_p=0.9).greedy
    False
    """

    __slots__ = ("temperature", "top_k", "top_p")

    def __init__(self, temperature=0.0, top_k=None, top_p=None):
        self.temperature, self.top_k, self.top_p = validate_sampling(temperature, top_k, top_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def __repr__(self):
        return f"SamplingParams(temperature={self.temperature}, top_k={self.top_k}, top_p={self.top_p})"


def validate_sampling(temperature, top_k, top_p):
    """Check ``temperature >= 0`` (0 is greedy), integer ``top_k >= 1`` or None, ``top_p`` in (0, 1] or None.

    Returns the normalized ``(temperature, top_k, top_p)``; raises ``ValueError``/``TypeError``
    naming the argument.

    Examples
    --------
    >>> validate_sampling(1, np.int64(40), None)
    (1.0, 40, None)
    >>> validate_sampling(0.7, None, 1.5)
    Traceback (most recent call last):
    ...
    ValueError: top_p must be in (0, 1], got 1.5
    """
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise TypeError(f"temperature must be a real number, got {type(temperature).__name__}")
    need = "a finite number >= 0 (0 means greedy)"
    temperature = _as_float(temperature, "temperature", need)
    if not (np.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be {need}, got {temperature}")
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral):
            raise TypeError(f"top_k must be an integer or None, got {type(top_k).__name__}")
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {_shown(top_k)}")
        top_k = int(top_k)
    if top_p is not None:
        if isinstance(top_p, bool) or not isinstance(top_p, numbers.Real):
            raise TypeError(f"top_p must be a real number or None, got {type(top_p).__name__}")
        if not 0.0 < _as_float(top_p, "top_p", "in (0, 1]") <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {_shown(top_p)}")
        top_p = float(top_p)
    return temperature, top_k, top_p


def _as_float(value, name: str, need: str) -> float:
    """``float(value)``; a real number beyond the float range (a Python int or a Fraction can be)
    is out of range like any other: ``ValueError`` saying what ``name`` must be, not ``float()``'s
    bare ``OverflowError``."""
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{name} must be {need}, got {_shown(value)}") from None


def _shown(value) -> str:
    """``value`` for an error message; a number of more than 20 digits in scientific notation
    (Python refuses to print an int of more than 4,300 digits, and hundreds of digits say no more)."""
    if isinstance(value, numbers.Rational) and max(abs(value.numerator), value.denominator) >= 10**20:
        return format(Decimal(value.numerator) / Decimal(value.denominator), ".3e")  # 1/10**5000 too
    return str(value)


def greedy(logits: np.ndarray) -> np.ndarray:
    """Argmax of each row of ``logits`` ``[B, V]`` -> ``[B]`` (ties: lowest id); a row whose maximum
    is not finite raises :func:`non_finite_logits`'s error (NumPy's argmax of a NaN row is 0: the
    engine decoded token 0 from a model whose activations overflowed).

    Examples
    --------
    >>> greedy(np.array([[0.1, 0.7, 0.7], [2.0, 0.0, 1.0]])).tolist()
    [1, 0]
    """
    idx = np.argmax(logits, axis=-1)
    # the first NaN is the argmax of a row that holds one: checking the chosen entries is enough
    chosen = np.take_along_axis(np.asarray(logits), np.expand_dims(idx, -1), axis=-1)
    if not np.isfinite(chosen).all():
        raise non_finite_logits(chosen)
    return idx


def non_finite_logits(values) -> FloatingPointError:
    """The error for logits that are NaN or infinite (the model's, not the caller's, numbers)."""
    rows = np.flatnonzero(~np.isfinite(np.asarray(values).reshape(np.shape(values)[0], -1)).all(axis=-1))
    return FloatingPointError(
        f"the model's logits are not finite (NaN or inf) in row(s) {rows[:8].tolist()}: its activations "
        "overflowed (a float16 KV cache holds values up to 65504: set model.kv_dtype = numpy.float32, "
        "or load it with dtype=numpy.float32) or its weights hold values too large for them"
    )


#: ``exp(-EXP_FLOOR)`` is 0 in float64 (``exp`` underflows to 0 below about -745.1), so a scaled
#: logit below ``-EXP_FLOOR`` has no probability however far below it lies.
EXP_FLOOR = 1000.0


def filtered_probs(logits: np.ndarray, temperature: float, top_k=None, top_p=None) -> np.ndarray:
    """Probabilities ``[B, V]`` after temperature, then top-k, then top-p (float64).

    ``temperature == 0`` gives a one-hot row at the argmax; so does any temperature too small for
    ``exp((logit - max) / temperature)`` to be nonzero below the maximum (ties at the maximum share
    the mass), without overflow or a NaN, down to the smallest positive float.

    Examples
    --------
    >>> p = filtered_probs(np.log(np.array([[0.5, 0.3, 0.2]])), 1.0, top_p=0.7)
    >>> np.round(p, 3).tolist()
    [[0.625, 0.375, 0.0]]
    >>> filtered_probs(np.array([[0.5, 2.0, -1.0]]), 1e-310).tolist()
    [[0.0, 1.0, 0.0]]
    """
    logits = np.atleast_2d(np.asarray(logits, dtype=np.float64))
    B, V = logits.shape
    if temperature == 0.0:
        out = np.zeros((B, V))
        out[np.arange(B), greedy(logits)] = 1.0
        return out
    # Each row's maximum is subtracted before dividing, so the top logit becomes 0 and no quotient
    # can overflow: logits / temperature would be inf for a tiny temperature, and inf - inf NaN.
    # A shifted logit below -EXP_FLOOR * temperature is raised to it: its exp is 0 either way, and
    # the quotient stays finite (a temperature so small that every other logit reaches the floor
    # is greedy decoding).
    top = logits.max(axis=-1, keepdims=True)  # NaN where a row holds one
    if not np.isfinite(top).all():
        raise non_finite_logits(top)
    d = logits - top
    z = np.maximum(d, -EXP_FLOOR * float(temperature)) / temperature  # the row's maximum is 0
    if top_k is not None and top_k < V:
        kth = np.partition(z, V - top_k, axis=-1)[:, V - top_k][:, None]  # k-th largest per row
        z = np.where(z >= kth, z, -np.inf)
    p = np.exp(z)
    p /= p.sum(axis=-1, keepdims=True)
    if top_p is not None and top_p < 1.0:
        order = np.argsort(-p, axis=-1, kind="stable")
        ps = np.take_along_axis(p, order, axis=-1)
        before = np.cumsum(ps, axis=-1) - ps  # mass strictly before each token
        keep_sorted = before < top_p  # smallest prefix reaching top_p (the first token always kept)
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, axis=-1)
        p = np.where(keep, p, 0.0)
        p /= p.sum(axis=-1, keepdims=True)
    return p


#: Rows :func:`sample` filters at a time: its float64 temporaries (probabilities, sort order,
#: cumulative sums; about eight ``[rows, V]`` arrays) then take ``SAMPLE_ROWS * V * 64`` bytes at
#: most, whatever the batch.
SAMPLE_ROWS = 16


def sample(logits: np.ndarray, params: SamplingParams, noise: TokenNoise, samples, positions) -> np.ndarray:
    """A token per row of ``logits`` ``[B, V]``: the argmax if greedy, else the inverse CDF of
    :func:`filtered_probs` at ``noise.uniforms(samples, positions)`` (row ``j`` is sample
    ``samples[j]``'s token at ``positions[j]``).

    Examples
    --------
    >>> logits = np.log(np.array([[0.1, 0.9], [0.8, 0.2]]))
    >>> sample(logits, SamplingParams(), TokenNoise(0), [0, 1], [0, 0]).tolist()
    [1, 0]
    >>> sample(logits, SamplingParams(temperature=1.0, top_k=1), TokenNoise(0), [0, 1], [0, 0]).tolist()
    [1, 0]
    """
    if params.greedy:
        return greedy(logits)
    logits = np.atleast_2d(logits)
    B = logits.shape[0]
    u = noise.uniforms(samples, positions)  # every draw first, in one call
    out = np.empty(B, dtype=np.int64)
    for a in range(0, B, SAMPLE_ROWS):  # blocks of rows: the float64 temporaries stay bounded
        p = filtered_probs(logits[a : a + SAMPLE_ROWS], params.temperature, params.top_k, params.top_p)
        out[a : a + SAMPLE_ROWS] = inverse_cdf(p, u[a : a + SAMPLE_ROWS])
    return out
