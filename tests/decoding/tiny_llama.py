"""Tiny random Llama GGUF files written with gguf.GGUFWriter (test helpers)."""

from __future__ import annotations

import gguf
import numpy as np

TINY_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (independent of the code under test)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


def tiny_vocab():
    """256 byte tokens, a few merges, and three control tokens."""
    table = bytes_to_unicode()
    tokens = [table[b] for b in range(256)]
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"]
    for m in merges:
        tokens.append(m.replace(" ", ""))
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [1] * len(tokens) + [3] * len(specials)
    tokens += specials
    return tokens, merges, types


def write_tiny_llama(
    path,
    *,
    n_layers=2,
    d=32,
    n_heads=4,
    n_kv_heads=2,
    d_ff=48,
    context=96,
    theta=10000.0,
    eps=1e-5,
    seed=0,
    tensor_type=gguf.GGMLQuantizationType.F64,
    tied=True,
    scale=0.3,
    metadata=None,
):
    """Write a random llama GGUF; returns the dict of float64 weights (NumPy [out, in] shapes).

    ``metadata``: ``{key: (value, GGUFValueType)}`` written instead of the usual value of ``key``
    (or added), to make files whose metadata is corrupt.
    """
    rng = np.random.default_rng(seed)
    tokens, merges, types = tiny_vocab()
    V = len(tokens)
    hd = d // n_heads
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(n_layers)
    w.add_context_length(context)
    w.add_embedding_length(d)
    w.add_feed_forward_length(d_ff)
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv_heads)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(eps)
    w.add_vocab_size(V)
    w.add_rope_dimension_count(hd)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types(types)
    w.add_bos_token_id(V - 3)
    w.add_eos_token_id(V - 1)
    w.add_chat_template(TINY_TEMPLATE)
    for key, (value, vtype) in (metadata or {}).items():
        for kv in w.kv_data:  # replaced, not duplicated
            kv.pop(key, None)
        w.add_key_value(key, value, vtype)
    weights = {"token_embd.weight": rng.normal(size=(V, d))}
    weights["output_norm.weight"] = 1 + 0.1 * rng.normal(size=d)
    if not tied:
        weights["output.weight"] = rng.normal(size=(V, d)) * scale
    for i in range(n_layers):
        p = f"blk.{i}."
        weights[p + "attn_norm.weight"] = 1 + 0.1 * rng.normal(size=d)
        weights[p + "ffn_norm.weight"] = 1 + 0.1 * rng.normal(size=d)
        weights[p + "attn_q.weight"] = rng.normal(size=(n_heads * hd, d)) * scale
        weights[p + "attn_k.weight"] = rng.normal(size=(n_kv_heads * hd, d)) * scale
        weights[p + "attn_v.weight"] = rng.normal(size=(n_kv_heads * hd, d)) * scale
        weights[p + "attn_output.weight"] = rng.normal(size=(d, n_heads * hd)) * scale
        weights[p + "ffn_gate.weight"] = rng.normal(size=(d_ff, d)) * scale
        weights[p + "ffn_up.weight"] = rng.normal(size=(d_ff, d)) * scale
        weights[p + "ffn_down.weight"] = rng.normal(size=(d, d_ff)) * scale
    T = gguf.GGMLQuantizationType
    for name, arr in weights.items():
        if arr.ndim == 1 or tensor_type == T.F32:
            w.add_tensor(name, arr.astype(np.float32))
            weights[name] = arr.astype(np.float32).astype(np.float64)
        elif tensor_type == T.F64:
            w.add_tensor(name, arr)
        elif tensor_type == T.F16:
            w.add_tensor(name, arr.astype(np.float16))
            weights[name] = arr.astype(np.float16).astype(np.float64)
        else:
            q = gguf.quants.quantize(arr.astype(np.float32), tensor_type)
            w.add_tensor(name, q, raw_dtype=tensor_type)
            weights[name] = None  # the caller dequantizes independently
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return weights
