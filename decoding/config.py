"""The Llama hyper-parameters, read and validated from GGUF metadata."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .gguf_reader import describe_value, quoted

__all__ = ["LlamaConfig"]


@dataclass(frozen=True)
class LlamaConfig:
    """Hyper-parameters of a Llama model.

    Parameters
    ----------
    n_layers, d_model, n_heads, n_kv_heads, d_ff, vocab_size, context_length : int
        Block count, embedding width, query heads, key/value heads (grouped-query attention when
        fewer than ``n_heads``), MLP width, vocabulary and trained context.
    rope_theta : float
        RoPE base frequency.
    norm_eps : float
        RMSNorm epsilon.
    head_dim : int
        ``d_model // n_heads``; RoPE rotates all of it.

    Examples
    --------
    >>> cfg = LlamaConfig(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=128, vocab_size=100,
    ...                   context_length=256, rope_theta=10000.0, norm_eps=1e-5)
    >>> cfg.head_dim
    16
    """

    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    vocab_size: int
    context_length: int
    rope_theta: float
    norm_eps: float

    def __post_init__(self):
        for name in ("n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff", "vocab_size", "context_length"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"config {name} must be a positive integer, got {v!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} is not a multiple of n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for RoPE")
        if not (np.isfinite(self.rope_theta) and self.rope_theta > 1):
            raise ValueError(f"rope_theta must be a finite number > 1, got {self.rope_theta!r}")
        if not (np.isfinite(self.norm_eps) and 0 < self.norm_eps < 1):
            raise ValueError(f"norm_eps must be in (0, 1), got {self.norm_eps!r}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @classmethod
    def from_metadata(cls, md: dict) -> LlamaConfig:
        """Build from GGUF metadata; raises ``ValueError`` naming any missing or ill-typed key.

        Examples
        --------
        >>> md = {"general.architecture": "llama", "llama.attention.head_count": 4,
        ...       "llama.vocab_size": "abc"}
        >>> LlamaConfig.from_metadata(md)
        Traceback (most recent call last):
        ...
        ValueError: GGUF metadata 'llama.vocab_size' must be an integer, got string 'abc'
        """
        arch = md.get("general.architecture")
        if arch is not None and not isinstance(arch, str):
            raise ValueError(f"GGUF general.architecture must be a string, got {describe_value(arch)}")
        if arch != "llama":
            raise ValueError(f"GGUF general.architecture is {quoted(arch)}; only 'llama' is supported")

        def get(key, kind, default=None):
            full = f"llama.{key}"
            if full not in md:
                if default is not None:
                    return default
                raise ValueError(f"GGUF metadata lacks {full!r}")
            v = md[full]
            if kind is int and (not isinstance(v, int) or isinstance(v, bool)):
                raise ValueError(f"GGUF metadata {full!r} must be an integer, got {describe_value(v)}")
            if kind is float and (not isinstance(v, (int, float)) or isinstance(v, bool)):
                raise ValueError(f"GGUF metadata {full!r} must be a number, got {describe_value(v)}")
            return kind(v)

        n_heads = get("attention.head_count", int)
        if "llama.vocab_size" in md:
            vocab = get("vocab_size", int)  # a float such as 49152.7 is refused, not truncated
        else:
            tokens = md.get("tokenizer.ggml.tokens")
            if tokens is None:
                raise ValueError("GGUF metadata lacks llama.vocab_size and tokenizer.ggml.tokens")
            if not isinstance(tokens, list):
                raise ValueError(
                    f"GGUF tokenizer.ggml.tokens must be an array of strings, got {describe_value(tokens)}"
                )
            vocab = len(tokens)
        cfg = cls(
            n_layers=get("block_count", int),
            d_model=get("embedding_length", int),
            n_heads=n_heads,
            n_kv_heads=get("attention.head_count_kv", int, n_heads),
            d_ff=get("feed_forward_length", int),
            vocab_size=vocab,
            context_length=get("context_length", int),
            rope_theta=get("rope.freq_base", float, 10000.0),
            norm_eps=get("attention.layer_norm_rms_epsilon", float),
        )
        rope_dims = get("rope.dimension_count", int, cfg.head_dim)
        if rope_dims != cfg.head_dim:
            raise ValueError(
                f"llama.rope.dimension_count {rope_dims} != head_dim {cfg.head_dim} (partial RoPE)"
            )
        _check_rope_scaling(md)
        return cfg


def _check_rope_scaling(md: dict) -> None:
    """``ValueError`` for RoPE scaling in the metadata, which llama.cpp applies and we do not.

    llama.cpp divides the frequencies by ``llama.rope.scaling.factor`` (or the older
    ``llama.rope.scale_linear``; 0 reads as 1) unless ``llama.rope.scaling.type`` is ``"none"``,
    whose default is ``"linear"``. A file with a factor of 8 had loaded here and generated with
    unscaled positions, silently unlike llama.cpp.
    """
    kind = md.get("llama.rope.scaling.type", "linear")
    if not isinstance(kind, str):
        raise ValueError(f"GGUF llama.rope.scaling.type must be a string, got {describe_value(kind)}")
    for key in ("llama.rope.scaling.factor", "llama.rope.scale_linear"):
        if key not in md:
            continue
        factor = md[key]
        if isinstance(factor, bool) or not isinstance(factor, (int, float)):
            raise ValueError(f"GGUF {key} must be a number, got {describe_value(factor)}")
        if kind != "none" and factor not in (0, 1):
            raise ValueError(
                f"GGUF {key} is {factor!r} with llama.rope.scaling.type {describe_value(kind)}: scaled "
                "RoPE is not supported (only no scaling: a factor of 1, or the type 'none')"
            )
        return  # the first key present is the one llama.cpp reads
