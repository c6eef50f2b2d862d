"""Packed (varlen) grouped-query attention against the unpadded cache.

Vocabulary (flash-attention's varlen interface): the batch's new tokens are packed into one
dimension of length ``T``; sequence ``b`` owns rows ``cu_seqlens[b] : cu_seqlens[b + 1]`` (``n_b``
tokens) and cache region ``seq_ids[b]``, which already held ``L_b`` tokens before this forward
and now holds ``L_b + n_b`` (the forward wrote the new keys first). New token ``i`` of sequence
``b`` sees keys ``0 .. L_b + i``: causal, aligned bottom-right. An optional boolean
``key_valid[seq, slot]`` additionally hides cache slots (pads of a padded layout).

The masks depend only on the batch's layout, not on the layer, so :class:`AttentionPlan` builds
them once per forward and :func:`attend` reuses them in every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._xp import namespace, on_device
from .kernels import _MASKED as _NEG
from .kernels import varlen_attention_args, varlen_attention_run

__all__ = ["AttentionPlan", "attend", "packed_attention"]


def _softmax_(s: np.ndarray) -> np.ndarray:
    xp = namespace(s)
    if xp is not np:  # the array API has no out=
        e = xp.exp(s - xp.max(s, axis=-1, keepdims=True))
        return e / xp.sum(e, axis=-1, keepdims=True)
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    return s


@dataclass
class AttentionPlan:
    """Per-forward attention layout: one batched group, or a list of per-sequence pieces.

    On NumPy the one-call kernel :func:`decoding.kernels.varlen_attention` takes every layout
    (``tokens``). Elsewhere (a device), ``batched`` holds ``(sel, n, S, bias, rows, back)``: every
    sequence with new tokens runs in one batched matmul over a ``[Hkv, B, S, D]`` view of its cache
    region, its queries in ``n`` rows (``n`` the largest count), with an additive ``bias``
    ``[1, B, 1, n, S]`` (or None) hiding each sequence's keys beyond its own length, future keys and
    invalid slots. Where the counts differ (a ragged verification step, a prefill of prompts of
    several lengths), ``rows`` gathers the packed queries into that layout, a shorter sequence's
    extra rows repeating its last query, and ``back`` takes the packed rows out of the result;
    where they are equal both are None. Only the attention is laid out so: the projections and the
    cache stay packed and unpadded. ``pieces`` lists ``(a, e, start, S, bias)`` per sequence (rows
    ``a:e`` of the packed queries, cache slots ``start : start + S``, bias ``[n, S]`` or None) for
    ``grouped=False`` and where the batched scores would exceed :data:`BATCHED_SCORES`.

    Examples
    --------
    One sequence of 2 new tokens on an empty cache (see :func:`packed_attention`):

    >>> from decoding.kv_cache import KVCache
    >>> c = KVCache(1, 1, 2, max_seqs=1, capacity=4, dtype=np.float64)
    >>> plan = AttentionPlan.build(c, np.array([0]), np.array([0, 2]), np.array([0]))
    >>> plan.tokens is not None  # NumPy: the one-call kernel
    True
    """

    batched: tuple | None
    pieces: list
    dtype: np.dtype
    #: NumPy caches: ``(start, length, seq, key_valid)`` per packed token, for the one-call kernel
    #: :func:`decoding.kernels.varlen_attention` (which then replaces both paths above)
    tokens: tuple | None = None
    #: the kernel's arguments that do not change between layers, built by the first layer
    kernel_args: tuple | None = None

    @classmethod
    def build(
        cls,
        cache,
        seq_ids,
        cu_seqlens,
        old_lengths,
        key_valid=None,
        *,
        grouped=True,
        dtype=None,
        n_heads=None,
    ):
        """The plan of one forward's layout; ``n_heads`` (the query heads, default the cache's KV heads)
        sizes the batched scores against :data:`BATCHED_SCORES`."""
        n_heads = cache.n_kv_heads if n_heads is None else int(n_heads)
        xp = getattr(cache, "xp", np)  # masks are built on the host, used where the cache lives
        device = getattr(cache, "device", None)
        seq_ids = np.asarray(seq_ids, dtype=np.int64)
        cu = np.asarray(cu_seqlens, dtype=np.int64)
        old = np.asarray(old_lengths, dtype=np.int64)
        dtype = np.dtype(cache.dtype if dtype is None else dtype)
        counts = np.diff(cu)
        B = seq_ids.size
        if xp is np and grouped:
            offset = np.arange(int(cu[-1])) - np.repeat(cu[:-1], counts)  # index within its sequence
            tokens = (
                np.repeat(cache.starts[seq_ids], counts),
                np.repeat(old, counts) + offset + 1,  # causal: keys 0 .. L_b + i
                np.repeat(seq_ids, counts),
                key_valid,
            )
            return cls(None, [], dtype, tokens)
        busy = counts > 0
        if grouped and busy.any():  # one sequence too: no zeros_like and row assignment
            batched = _batched_layout(
                cache, seq_ids[busy], cu[:-1][busy], counts[busy], old[busy], key_valid, dtype, n_heads
            )
            if batched is not None:
                return cls(batched, [], dtype)
        pieces = []
        for b in range(B):
            a, e = int(cu[b]), int(cu[b + 1])
            n = e - a
            if n == 0:
                continue
            s, L = int(seq_ids[b]), int(old[b])
            S = L + n
            bias = None
            if n > 1 or key_valid is not None:
                allowed = np.arange(S)[None, :] <= (L + np.arange(n))[:, None]  # [n, S]
                if key_valid is not None:
                    allowed = allowed & key_valid[s, :S][None, :]
                if not allowed.all():
                    bias = on_device(np.where(allowed, 0.0, _NEG).astype(dtype), xp, device)
            pieces.append((a, e, int(cache.starts[s]), S, bias))
        return cls(None, pieces, dtype)


#: The most scores (``B * H * n * S`` values) one batched attention may hold; a larger layout (a
#: prefill of many long prompts) runs one sequence at a time. 2**26 values: 256 MB in float32. A
#: verification step at batch 32 (11 rows over 2,048 keys, 9 heads) holds 6.5 million.
BATCHED_SCORES = 1 << 26


def _batched_layout(cache, seq_ids, starts, counts, old, key_valid, dtype, n_heads):
    """``AttentionPlan.batched`` for sequences ``seq_ids`` (each with new tokens, packed at rows
    ``starts[b]:starts[b] + counts[b]``), or None where the scores would pass :data:`BATCHED_SCORES`.

    One batched product for any counts keeps a step's kernel launches independent of the batch
    size: a loop over the sequences costs about a dozen launches each per layer, which on a GPU
    outweighs the products themselves for a small model (30 layers x 8 sequences x 12 launches of
    some microseconds each, per forward). A shorter sequence's extra query rows repeat its last
    query (its keys, its mask), so they stay finite, and are dropped by ``back``.
    """
    xp, device = getattr(cache, "xp", np), getattr(cache, "device", None)
    B, n = seq_ids.size, int(counts.max())
    S = int((old + counts).max())
    if B * n_heads * n * S > BATCHED_SCORES:
        return None
    last = np.minimum(np.arange(n)[None, :], counts[:, None] - 1)  # [B, n]: row i, or the last one
    # allowed[b, i, j]: key j <= L_b + i (bottom-right causal, and within b's own length)
    allowed = np.arange(S)[None, None, :] <= (old[:, None] + last)[:, :, None]
    if key_valid is not None:
        allowed = allowed & key_valid[seq_ids, :S][:, None, :]  # [B, n, S]
    bias = None
    if not allowed.all():
        bias = on_device(np.where(allowed, 0.0, _NEG).astype(dtype)[None, :, None], xp, device)
    lo = int(seq_ids[0])
    sel = slice(lo, lo + B) if (seq_ids == lo + np.arange(B)).all() else on_device(seq_ids, xp, device)
    if (counts == n).all() and (starts == n * np.arange(B)).all():
        return sel, n, S, bias, None, None  # the packed rows are the layout's rows already
    rows = (starts[:, None] + last).reshape(-1)  # layout row -> packed row
    T = int(counts.sum())
    back = np.repeat(n * np.arange(B) - starts, counts) + np.arange(T)  # packed row -> layout row
    return sel, n, S, bias, on_device(rows, xp, device), on_device(back, xp, device)


def _regroup(xp, x, shape, axes, out_shape):
    """``x`` reshaped to ``shape``, its axes permuted, reshaped to ``out_shape`` (the heads' layouts)."""
    return xp.reshape(xp.permute_dims(xp.reshape(x, shape), axes), out_shape)


def attend(q: np.ndarray, cache, layer: int, plan: AttentionPlan) -> np.ndarray:
    """Attention output ``[T, H, D]`` of rotated queries ``q`` ``[T, H, D]`` for ``layer``, by ``plan``.

    Examples
    --------
    >>> from decoding.kv_cache import KVCache
    >>> c = KVCache(1, 1, 2, max_seqs=1, capacity=4, dtype=np.float64)
    >>> slots = c.prepare([0], [2]); kv = np.array([[[1.0, 0.0]], [[0.0, 1.0]]])
    >>> c.write(0, slots, kv, kv)
    >>> plan = AttentionPlan.build(c, np.array([0]), np.array([0, 2]), np.array([0]))
    >>> attend(np.ones((2, 1, 2)), c, 0, plan)[0, 0].tolist()  # the first token sees itself only
    [1.0, 0.0]
    """
    if plan.tokens is not None:
        q = np.ascontiguousarray(q)
        k = cache.k[layer]
        if plan.kernel_args is None or plan.kernel_args[:4] != (*q.shape, np.result_type(q, k)):
            start, length, seq, key_valid = plan.tokens
            plan.kernel_args = varlen_attention_args(
                q.shape, k.shape[0], np.result_type(q, k), start, length, seq, key_valid
            )  # once a forward: every layer attends over the same runs of keys
        return varlen_attention_run(q, k, cache.v[layer], plan.kernel_args)
    T, H, D = q.shape
    Hkv = cache.n_kv_heads
    G = H // Hkv
    scale = 1.0 / float(np.sqrt(D))
    xp = namespace(q)  # NumPy, or a GPU library's array-API namespace: the same steps in both
    if plan.batched is not None:
        sel, n, S, bias, rows, back = plan.batched
        if rows is not None:
            q = xp.take(q, rows, axis=0)  # [B n, H, D]: each sequence's queries in n rows
        cap = cache.capacity
        k4 = xp.reshape(cache.k[layer, ...], (Hkv, cache.max_seqs, cap, D))  # [Hkv, max_seqs, cap, D]
        v4 = xp.reshape(cache.v[layer, ...], (Hkv, cache.max_seqs, cap, D))
        if isinstance(sel, slice):
            kb, vb = k4[:, sel, :S, :], v4[:, sel, :S, :]  # [Hkv, B, S, D]; a view
        else:
            kb, vb = xp.take(k4[:, :, :S, :], sel, axis=1), xp.take(v4[:, :, :S, :], sel, axis=1)  # S slots
        B = kb.shape[1]
        # [B n, H, D] = [B, n, Hkv, G, D] -> [Hkv, B, G, n, D] -> [Hkv, B, G * n, D]
        qb = _regroup(xp, q, (B, n, Hkv, G, D), (2, 0, 3, 1, 4), (Hkv, B, G * n, D))
        scores = (qb @ xp.matrix_transpose(kb)) * scale  # [Hkv, B, G * n, S]
        if bias is not None:
            scores = xp.reshape(scores, (Hkv, B, G, n, S)) + bias  # bias [1, B, 1, n, S]
            scores = xp.reshape(scores, (Hkv, B, G * n, S))
        ob = _softmax_(scores) @ vb  # [Hkv, B, G * n, D]
        out = _regroup(xp, ob, (Hkv, B, G, n, D), (1, 3, 0, 2, 4), (B * n, H, D))
        return out if back is None else xp.take(out, back, axis=0)  # [T, H, D]

    out = xp.zeros_like(q)
    for a, e, start, S, bias in plan.pieces:
        n = e - a
        kb = cache.k[layer, :, start : start + S, :]  # [Hkv, S, D]
        vb = cache.v[layer, :, start : start + S, :]  # [Hkv, S, D]
        # queries grouped by KV head: [n, H, D] -> [Hkv, G * n, D]
        qb = _regroup(xp, q[a:e, ...], (n, Hkv, G, D), (1, 2, 0, 3), (Hkv, G * n, D))
        scores = (qb @ xp.matrix_transpose(kb)) * scale  # [Hkv, G * n, S]
        if bias is not None:
            scores = xp.reshape(xp.reshape(scores, (Hkv, G, n, S)) + bias, (Hkv, G * n, S))  # bias [n, S]
        ob = _softmax_(scores) @ vb  # [Hkv, G * n, D]
        out[a:e, ...] = _regroup(xp, ob, (Hkv, G, n, D), (2, 0, 1, 3), (n, H, D))
    return out


def packed_attention(q, cache, layer, seq_ids, cu_seqlens, old_lengths, key_valid=None, *, grouped=True):
    """One-shot :func:`attend`: build the plan and apply it (see :class:`AttentionPlan`).

    Parameters
    ----------
    q : array [T, H, D]
        Rotated queries of every new token.
    cache : KVCache
        Holds, for ``layer``, each sequence's old keys and (already written) new keys.
    seq_ids : int array [B]
    cu_seqlens : int array [B + 1]
    old_lengths : int array [B]
        Cached tokens of each sequence before this forward.
    key_valid : bool array [max_seqs, capacity] or None
        Slots that may be attended to.
    grouped : bool
        Allow the batched path for equal counts; ``False`` forces the per-sequence loop.

    Examples
    --------
    One sequence of 2 new tokens on an empty cache: the first token only sees itself.

    >>> from decoding.kv_cache import KVCache
    >>> c = KVCache(1, 1, 2, max_seqs=1, capacity=4, dtype=np.float64)
    >>> slots = c.prepare([0], [2]); kv = np.array([[[1.0, 0.0]], [[0.0, 1.0]]])
    >>> c.write(0, slots, kv, kv)
    >>> out = packed_attention(np.ones((2, 1, 2)), c, 0, np.array([0]), np.array([0, 2]), np.array([0]))
    >>> out[0, 0].tolist()
    [1.0, 0.0]
    """
    plan = AttentionPlan.build(
        cache, seq_ids, cu_seqlens, old_lengths, key_valid, grouped=grouped, n_heads=q.shape[1]
    )
    return attend(q, cache, layer, plan)
