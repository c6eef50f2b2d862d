"""Quantized weights (Q4_1, Q8_0 blocks in memory): the kernels against NumPy references of the same sums.

The references are independent of the code under test where they can be: gguf's own quantizer
and dequantizer, and a float64 product of the dequantized weights. The product's bound is float32
rounding of a sum of ``K`` terms: ``|error| <= K * eps32 * (|x| @ |W|.T)`` (a worst-case bound;
the kernels' reassociated sums sit far inside it).
"""

from __future__ import annotations

import gguf
import numba
import numpy as np
import pytest

from decoding import Model, load_model
from decoding.gguf_reader import dequantize, read_gguf
from decoding.kernels import linear
from decoding.quantized import QuantizedMatrix, quantized_linear

from .tiny_llama import write_tiny_llama

Q = gguf.GGMLQuantizationType
EPS32 = np.finfo(np.float32).eps


def quantized(rng, shape, qtype, scale=1.0):
    w = (rng.normal(size=shape) * scale).astype(np.float32)
    return QuantizedMatrix.from_raw(gguf.quants.quantize(w, qtype), qtype, shape), w


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0])
def test_dequantize_matches_gguf_and_the_float_path(qtype):
    rng = np.random.default_rng(0)
    qm, w = quantized(rng, (37, 96), qtype)
    raw = gguf.quants.quantize(w, qtype)
    ours = qm.dequantize()
    # gguf's dequantizer (float32 arithmetic, two roundings for Q4_1): within one rounding of each value
    theirs = gguf.quants.dequantize(raw, qtype).astype(np.float32)
    np.testing.assert_allclose(ours, theirs, rtol=2 * EPS32, atol=2 * EPS32 * np.abs(theirs).max())
    # the float32 engine's weights are the same values, bit for bit
    np.testing.assert_array_equal(ours, dequantize(raw, qtype, (37, 96), dtype=np.float32))
    np.testing.assert_array_equal(qm.dequantize(rows=[5, 0, 5]), ours[[5, 0, 5]])


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0])
def test_held_layout_gives_the_file_bytes_back(qtype):
    # Held with float32 scales (24 / 36 bytes a block): widening float16 is exact, so the file's
    # bytes come back bit for bit, for the whole matrix and for chosen rows; scales spanning
    # float16's range (subnormal to large) included.
    rng = np.random.default_rng(5)
    w = (rng.normal(size=(12, 128)) * np.logspace(-7, 4, 12)[:, None]).astype(np.float32)
    raw = gguf.quants.quantize(w, qtype).reshape(12, -1)
    qm = QuantizedMatrix.from_raw(raw, qtype, (12, 128))
    assert qm.blocks.shape == (12, 4 * (24 if qtype == Q.Q4_1 else 36))
    np.testing.assert_array_equal(qm.file_blocks(), raw)
    np.testing.assert_array_equal(qm.file_blocks([3, 0, 11]), raw[[3, 0, 11]])
    d = qm.blocks.reshape(12, 4, -1)[..., :4].copy().view("<f4")[..., 0]  # first scale of each block
    np.testing.assert_array_equal(
        d, raw.reshape(12, 4, -1)[..., :2].copy().view("<f2")[..., 0].astype(np.float32)
    )
    # chosen float16 scales: negative, -0.0, the smallest subnormal, the largest finite
    chosen = np.array([-1.5, -0.0, 6e-8, 65504.0, -6e-8, 0.0, 1e-4, -2.0], dtype="<f2")
    blocks = raw.reshape(12 * 4, -1).copy()
    blocks[:8, 0:2] = chosen[:, None].view(np.uint8)  # d of the first eight blocks
    if qtype == Q.Q4_1:
        blocks[:8, 2:4] = np.roll(chosen, 1)[:, None].view(np.uint8)  # and m
    qm = QuantizedMatrix.from_raw(blocks, qtype, (12, 128))
    np.testing.assert_array_equal(qm.file_blocks(), blocks.reshape(12, -1))
    np.testing.assert_array_equal(
        qm.dequantize(), dequantize(blocks.reshape(-1), qtype, (12, 128), dtype=np.float32)
    )
    np.testing.assert_array_equal(quantized_linear(np.eye(128, dtype=np.float32), qm), qm.dequantize().T)


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0])
@pytest.mark.parametrize(("N", "K"), [(1, 32), (7, 64), (33, 576), (130, 1536)])
@pytest.mark.parametrize("T", [1, 2, 3, 4, 5, 6, 7, 8, 13])
def test_product_within_float32_rounding(qtype, N, K, T):
    rng = np.random.default_rng(N * 1000 + K + T)
    qm, _ = quantized(rng, (N, K), qtype)
    x = rng.normal(size=(T, K)).astype(np.float32)
    W = qm.dequantize().astype(np.float64)
    got = quantized_linear(x, qm)
    assert got.dtype == np.float32 and got.shape == (T, N)
    ref = x.astype(np.float64) @ W.T
    bound = K * EPS32 * (np.abs(x).astype(np.float64) @ np.abs(W).T)
    assert np.all(np.abs(got - ref) <= bound)
    np.testing.assert_array_equal(linear(x, qm), got)  # the engine's dispatch


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0])
def test_kernel_weights_are_the_reference_bit_for_bit(qtype):
    # x = the identity: every output is one weight times 1 plus zeros, so the product is W.T exactly
    rng = np.random.default_rng(1)
    qm, _ = quantized(rng, (9, 64), qtype)
    W = qm.dequantize()
    np.testing.assert_array_equal(quantized_linear(np.eye(64, dtype=np.float32), qm), W.T)
    for k in (0, 17, 63):  # one token: the in-register kernel (decoding._simd.row_dot4_*)
        e_k = np.eye(64, dtype=np.float32)[k : k + 1]
        np.testing.assert_array_equal(quantized_linear(e_k, qm)[0], W[:, k])


def test_long_inputs_go_in_blocks_and_thread_count_changes_nothing():
    rng = np.random.default_rng(2)
    qm, _ = quantized(rng, (70, 96), Q.Q4_1)
    x = rng.normal(size=(300, 96)).astype(np.float32)
    whole = quantized_linear(x, qm)
    # blocks of a multiple of four rows keep every row in the same four-token group: the same sums
    np.testing.assert_array_equal(quantized_linear(x, qm, max_rows=8), whole)
    threads = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = quantized_linear(x, qm)
    finally:
        numba.set_num_threads(threads)
    np.testing.assert_array_equal(one, whole)  # fixed row chunks: bitwise the same on any thread count


def test_bad_input_is_named():
    rng = np.random.default_rng(3)
    w = rng.normal(size=(2, 64)).astype(np.float32)
    raw = gguf.quants.quantize(w, Q.Q8_0)
    with pytest.raises(ValueError, match="ggml_type"):
        QuantizedMatrix.from_raw(raw, Q.Q5_0, (2, 64))
    with pytest.raises(ValueError, match="multiple of 32"):
        QuantizedMatrix.from_raw(raw, Q.Q8_0, (4, 16))
    with pytest.raises(ValueError, match="needs 136 bytes"):
        QuantizedMatrix.from_raw(raw[:-1], Q.Q8_0, (2, 64))
    bad = raw.copy().reshape(-1)
    bad[0:2] = np.array([np.inf], dtype="<f2").view(np.uint8)  # the first block's scale
    with pytest.raises(ValueError, match="non-finite block scales"):
        QuantizedMatrix.from_raw(bad, Q.Q8_0, (2, 64))
    qm = QuantizedMatrix.from_raw(raw, Q.Q8_0, (2, 64))
    with pytest.raises(ValueError, match=r"x must have shape \(T, 64\)"):
        quantized_linear(np.ones((1, 32), np.float32), qm)
    with pytest.raises(TypeError, match="QuantizedMatrix"):
        quantized_linear(np.ones((1, 64), np.float32), w)
    q4 = quantized(rng, (2, 64), Q.Q4_1)[0]
    with pytest.raises(ValueError, match="one type and width"):
        QuantizedMatrix.concatenate([qm, q4])
    with pytest.raises(ValueError, match="dtype must be 'quantized'"):
        load_model("smollm2-135m", dtype="q4")


@pytest.fixture(scope="module", params=[Q.Q4_1, Q.Q8_0])
def tiny_quantized(request, tmp_path_factory):
    path = tmp_path_factory.mktemp("tq") / "tiny_q.gguf"
    write_tiny_llama(path, tensor_type=request.param, d=64, n_heads=4, n_kv_heads=2, d_ff=96, seed=5)
    f = read_gguf(path)
    return Model.from_gguf(f), Model.from_gguf(f, dtype=np.float32), request.param


def greedy(model, prompt, steps):
    cache = model.new_cache(max_seqs=2, capacity=len(prompt[0]) + steps + 1)
    seqs = np.array([cache.allocate(), cache.allocate()])
    tokens = np.concatenate(prompt)
    cu = np.array([0, len(prompt[0]), len(prompt[0]) + len(prompt[1])])
    logits = model.forward(tokens, cache=cache, seq_ids=seqs, cu_seqlens=cu, logits="last")
    out, all_logits = [], [logits]
    for _ in range(steps):
        nxt = logits.argmax(axis=-1)
        out.append(nxt)
        logits = model.forward(nxt, cache=cache, seq_ids=seqs, cu_seqlens=np.arange(3), logits="last")
        all_logits.append(logits)
    return np.array(out), np.concatenate(all_logits)


def test_tiny_model_runs_on_the_quantized_path(tiny_quantized):
    q, f32, qtype = tiny_quantized
    assert q.weight_format == "quantized" and f32.weight_format == "float32"
    assert isinstance(q.layers[0].wqkv, QuantizedMatrix) and q.layers[0].wqkv.ggml_type == qtype
    assert isinstance(q.tok_embd, QuantizedMatrix) and q.dtype == np.float32
    assert q.nbytes < f32.nbytes / 3
    np.testing.assert_array_equal(q.layers[1].w_gate_up.dequantize(), f32.layers[1].w_gate_up)
    prompt = [np.arange(5, 30), np.arange(40, 52)]
    toks_q, logits_q = greedy(q, prompt, 12)
    toks_f, logits_f = greedy(f32, prompt, 12)
    # the same weights and float32 arithmetic, summed in another order: logits agree to float32 rounding
    scale = np.abs(logits_f).max()
    assert np.abs(logits_q - logits_f).max() <= 1e-5 * scale
    np.testing.assert_array_equal(toks_q, toks_f)


AVX2_CHECK = """
import gguf, numpy as np
from decoding._simd import AVX512_TABLE
from decoding.quantized import QuantizedMatrix, quantized_linear
assert not AVX512_TABLE
rng = np.random.default_rng(7)
for qtype in (gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q8_0):
    w = rng.normal(size=(9, 96)).astype(np.float32)
    qm = QuantizedMatrix.from_raw(gguf.quants.quantize(w, qtype), qtype, (9, 96))
    W = qm.dequantize()
    for T in (1, 3, 13):
        x = rng.normal(size=(T, 96)).astype(np.float32)
        err = np.abs(quantized_linear(x, qm) - x.astype(np.float64) @ W.T.astype(np.float64))
        assert np.all(err <= 96 * 2.0**-23 * (np.abs(x).astype(np.float64) @ np.abs(W).T)), T
    np.testing.assert_array_equal(quantized_linear(np.eye(96, dtype=np.float32), qm), W.T)
print("ok")
"""


def test_avx2_kernels_in_a_haswell_process(tmp_path):
    # The other tests run the AVX-512 table path where the CPU has it; this compiles the kernels
    # for an AVX2 CPU (numba's own CPU settings, a fresh cache) and checks the conversion path.
    import os
    import subprocess
    import sys

    env = dict(os.environ, NUMBA_CPU_NAME="haswell", NUMBA_CACHE_DIR=str(tmp_path))
    env["NUMBA_CPU_FEATURES"] = "+64bit,+avx,+avx2,+bmi,+bmi2,+cx16,+f16c,+fma,+lzcnt,+movbe,+popcnt,+sse4.2"
    out = subprocess.run(
        [sys.executable, "-c", AVX2_CHECK], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("ok")
