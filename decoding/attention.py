"""Packed (varlen) grouped-query attention against the unpadded cache.

Vocabulary (flash-attention's varlen interface): the batch's new tokens are packed into one
dimension of length ``T``; sequence ``b`` owns rows ``cu_seqlens[b] : cu_seqlens[b + 1]`` (``n_b``
tokens) and cache region ``seq_ids[b]``, which already held ``L_b`` tokens before this forward
and now holds ``L_b + n_b`` (the forward wrote the new keys first). New token ``i`` of sequence
``b`` sees keys ``0 .. L_b + i``: causal, aligned bottom-right. An optional boolean
``key_valid[seq, slot]`` additionally hides cache slots (pads of a padded layout).
"""

from __future__ import annotations

import numpy as np

__all__ = ["packed_attention"]

_NEG = -1e30  # finite, so a row with every key hidden stays finite (its output is then ignored)


def _softmax_(s: np.ndarray) -> np.ndarray:
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    return s


def packed_attention(q, cache, layer, seq_ids, cu_seqlens, old_lengths, key_valid=None):
    """Attention output ``[T, n_heads, head_dim]`` for packed queries ``q`` ``[T, n_heads, head_dim]``.

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
    T, H, D = q.shape
    Hkv = cache.n_kv_heads
    G = H // Hkv
    scale = 1.0 / np.sqrt(D)
    out = np.empty_like(q)
    kbuf, vbuf = cache.k[layer], cache.v[layer]  # [Hkv, slots, D]
    for b in range(len(seq_ids)):
        a, e = int(cu_seqlens[b]), int(cu_seqlens[b + 1])
        n = e - a
        if n == 0:
            continue
        s = int(seq_ids[b])
        L = int(old_lengths[b])
        S = L + n
        start = int(cache.starts[s])
        kb = kbuf[:, start : start + S]  # [Hkv, S, D]
        vb = vbuf[:, start : start + S]  # [Hkv, S, D]
        # queries grouped by KV head: [n, H, D] -> [Hkv, G * n, D]
        qb = q[a:e].reshape(n, Hkv, G, D).transpose(1, 2, 0, 3).reshape(Hkv, G * n, D)
        scores = qb @ kb.transpose(0, 2, 1)  # [Hkv, G * n, S]
        scores *= scale
        if n > 1 or key_valid is not None:
            # allowed[i, j]: key j <= L + i (bottom-right causal) and valid
            allowed = np.arange(S)[None, :] <= (L + np.arange(n))[:, None]  # [n, S]
            if key_valid is not None:
                allowed = allowed & key_valid[s, :S][None, :]
            scores = scores.reshape(Hkv, G, n, S)
            scores[:, :, ~allowed] = _NEG
            scores = scores.reshape(Hkv, G * n, S)
        p = _softmax_(scores)
        ob = p @ vb  # [Hkv, G * n, D]
        out[a:e] = ob.reshape(Hkv, G, n, D).transpose(2, 0, 1, 3).reshape(n, H, D)
    return out
