"""An independent, deliberately naive Llama forward (no cache, no packing, float64, complex RoPE)."""

from __future__ import annotations

import numpy as np


def reference_logits(weights: dict, cfg, tokens, positions=None, n_layers=None) -> np.ndarray:
    """Logits [T, V] of one whole sequence, recomputed from scratch from the GGUF weights."""
    tokens = np.asarray(tokens)
    T = len(tokens)
    pos = np.arange(T) if positions is None else np.asarray(positions)
    H, Hkv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    n_layers = cfg.n_layers if n_layers is None else n_layers

    def norm(x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + cfg.norm_eps) * w

    def rope(x):  # x [T, heads, D]; adjacent pairs as complex numbers
        c = x[..., 0::2] + 1j * x[..., 1::2]
        freqs = cfg.rope_theta ** (-np.arange(D // 2) * 2.0 / D)
        c = c * np.exp(1j * pos[:, None, None] * freqs[None, None, :])
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = c.real, c.imag
        return out

    x = weights["token_embd.weight"][tokens]
    for i in range(n_layers):
        p = f"blk.{i}."
        h = norm(x, weights[p + "attn_norm.weight"])
        q = rope((h @ weights[p + "attn_q.weight"].T).reshape(T, H, D))
        k = rope((h @ weights[p + "attn_k.weight"].T).reshape(T, Hkv, D))
        v = (h @ weights[p + "attn_v.weight"].T).reshape(T, Hkv, D)
        o = np.zeros((T, H, D))
        for hh in range(H):
            kv = hh // (H // Hkv)
            for t in range(T):
                s = np.array([q[t, hh] @ k[j, kv] for j in range(t + 1)]) / np.sqrt(D)
                a = np.exp(s - s.max())
                a /= a.sum()
                o[t, hh] = a @ v[: t + 1, kv]
        x = x + o.reshape(T, H * D) @ weights[p + "attn_output.weight"].T
        h = norm(x, weights[p + "ffn_norm.weight"])
        g = h @ weights[p + "ffn_gate.weight"].T
        u = h @ weights[p + "ffn_up.weight"].T
        x = x + (g / (1 + np.exp(-g)) * u) @ weights[p + "ffn_down.weight"].T
    head = weights.get("output.weight", weights["token_embd.weight"])
    return norm(x, weights["output_norm.weight"]) @ head.T
