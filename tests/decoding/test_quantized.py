"""Quantized weights (Q4_1, Q8_0 blocks in memory): the kernels against NumPy references of the same sums.

The references are independent of the kernels: gguf's own quantizer and dequantizer,
``reference_product`` (NumPy's quantization of the activations, int64 block sums, and the
kernels' float32 operations in their order), and a float64 product of the dequantized weights,
which the kernels' products differ from by the activations' int8 rounding (at most half a step
``dx / 2`` per value) and float32 rounding.
"""

from __future__ import annotations

import gguf
import numba
import numpy as np
import pytest

from decoding import Model, load_model
from decoding._simd import HALF_CONVERSION
from decoding.gguf_reader import dequantize, read_gguf
from decoding.kernels import linear
from decoding.kv_cache import KVCache
from decoding.quantized import QuantizedMatrix, quantize_activations, quantized_linear, reference_product

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
    group_bytes = 384 if qtype == Q.Q4_1 else 576
    assert qm.blocks.shape == (1, 4 * group_bytes)  # 12 rows in one group of 16, four blocks a row
    np.testing.assert_array_equal(qm.file_blocks(), raw)
    np.testing.assert_array_equal(qm.file_blocks([3, 0, 11]), raw[[3, 0, 11]])
    # the documented layout: word w (4 bytes) of row r's block b at words (b, w, r % 16) of group r // 16
    d = qm.blocks.reshape(4, -1, 16, 4)[:, 0].copy().view("<f4")[..., 0]  # [block, row] first scale
    np.testing.assert_array_equal(
        d[:, :12].T, raw.reshape(12, 4, -1)[..., :2].copy().view("<f2")[..., 0].astype(np.float32)
    )
    assert not qm.blocks.reshape(4, -1, 16, 4)[:, :, 12:].any()  # the rows past N are zero
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
    x = np.random.default_rng(6).normal(size=(3, 128)).astype(np.float32)
    np.testing.assert_array_equal(quantized_linear(x, qm), reference_product(x, qm))


def test_activations_are_quantized_as_llama_cpp_does():
    # per 32 values: d = max|x| / 127, q = rint(x / d); a block of zeros gives d = 0 and q = 0
    x = np.zeros((2, 64), dtype=np.float32)
    x[0, :32] = np.linspace(-2.0, 1.0, 32)
    x[1, 32:] = 0.5
    qx, dx = quantize_activations(x)
    assert qx.dtype == np.int8 and dx.dtype == np.float32 and dx.shape == (2, 2)
    np.testing.assert_array_equal(dx, np.float32([[2 / 127, 0], [0, 0.5 / 127]]))
    np.testing.assert_array_equal(qx[0, :32], np.rint(x[0, :32] * np.float32(1 / dx[0, 0])).astype(np.int8))
    assert qx[0, 0] == -127 and not qx[0, 32:].any() and (qx[1, 32:] == 127).all()
    assert np.all(np.abs(dx.repeat(32, axis=1) * qx - x) <= dx.repeat(32, axis=1) / 2)


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0])
@pytest.mark.parametrize(("N", "K"), [(1, 32), (7, 64), (33, 576), (130, 1536)])
@pytest.mark.parametrize("T", [1, 2, 3, 4, 5, 6, 7, 8, 13, 16, 17, 33])
def test_product_within_float32_rounding(qtype, N, K, T):
    rng = np.random.default_rng(N * 1000 + K + T)
    qm, _ = quantized(rng, (N, K), qtype)
    x = rng.normal(size=(T, K)).astype(np.float32)
    got = quantized_linear(x, qm)
    assert got.dtype == np.float32 and got.shape == (T, N)
    np.testing.assert_array_equal(linear(x, qm), got)  # the engine's dispatch
    # the reference of the same arithmetic: equal but for the double rounding of its emulated
    # fused multiply-adds (float64, then float32), a rounding a block at most
    W = qm.dequantize().astype(np.float64)
    ref = reference_product(x, qm)
    bound = K * EPS32 * (np.abs(x).astype(np.float64) @ np.abs(W).T)
    assert np.all(np.abs(got - ref) <= bound)
    # against the float64 product: the activations' rounding (half a step dx a value) and float32's
    _, dx = quantize_activations(x)
    half_step = (dx.repeat(32, axis=1) / 2).astype(np.float64)
    exact = x.astype(np.float64) @ W.T
    assert np.all(np.abs(got - exact) <= half_step @ np.abs(W).T + 2 * bound)


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0])
def test_a_tokens_products_do_not_depend_on_the_others(qtype):
    # each token's sums alone, in a fixed order: a row of x gives the same bits in any company
    # (the speculative steps reproduce the autoregressive tokens because of this)
    rng = np.random.default_rng(1)
    qm, _ = quantized(rng, (40, 96), qtype)
    x = rng.normal(size=(40, 96)).astype(np.float32)  # passes of up to PASS_TOKENS tokens: several
    whole = quantized_linear(x, qm)
    for t in (0, 5, 12, 16, 39):
        np.testing.assert_array_equal(quantized_linear(x[t : t + 1], qm)[0], whole[t])
    np.testing.assert_array_equal(quantized_linear(x[3:11], qm), whole[3:11])
    np.testing.assert_array_equal(quantized_linear(x[7:24], qm), whole[7:24])


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0])
def test_a_non_finite_activation_makes_its_tokens_products_nan(qtype):
    # int8 codes cannot hold NaN or infinity: the block's scale becomes NaN instead, so the
    # token's products are NaN, as float products would be, and the other tokens' stay finite
    rng = np.random.default_rng(8)
    qm, _ = quantized(rng, (20, 64), qtype)
    x = rng.normal(size=(4, 64)).astype(np.float32)
    x[1, 40], x[2, 3] = np.nan, np.inf
    got = quantized_linear(x, qm)
    assert np.isnan(got[1:3]).all() and np.isfinite(got[[0, 3]]).all()
    np.testing.assert_array_equal(got, reference_product(x, qm))  # NaN where NaN
    _, dx = quantize_activations(x)
    assert np.isnan(dx[1, 1]) and np.isnan(dx[2, 0]) and np.isfinite(dx[[0, 3]]).all()


def test_q8_0_codes_of_minus_128_are_exact():
    # gguf's quantizer writes codes in -127..127, a file may hold -128: |q| = 128 is the one code
    # whose offset (VNNI) or magnitude (AVX2) reaches the byte's edge
    rng = np.random.default_rng(4)
    raw = gguf.quants.quantize(rng.normal(size=(3, 64)).astype(np.float32), Q.Q8_0).reshape(3, 2, 34).copy()
    raw[:, :, 2:] = np.int8(-128).view(np.uint8)
    raw[1, 0, 2:10] = np.int8(127).view(np.uint8)
    qm = QuantizedMatrix.from_raw(raw, Q.Q8_0, (3, 64))
    x = rng.normal(size=(5, 64)).astype(np.float32)
    x[0] = 127.0  # every activation code 127: the largest products
    np.testing.assert_array_equal(quantized_linear(x, qm), reference_product(x, qm))


def test_long_inputs_go_in_blocks_and_thread_count_changes_nothing():
    rng = np.random.default_rng(2)
    qm, _ = quantized(rng, (70, 96), Q.Q4_1)
    x = rng.normal(size=(300, 96)).astype(np.float32)
    whole = quantized_linear(x, qm)
    np.testing.assert_array_equal(quantized_linear(x, qm, max_rows=8), whole)
    np.testing.assert_array_equal(quantized_linear(x, qm, max_rows=7), whole)
    threads = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = quantized_linear(x, qm)
    finally:
        numba.set_num_threads(threads)
    np.testing.assert_array_equal(one, whole)  # fixed group chunks: bitwise the same on any thread count


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


def test_tiny_model_runs_on_the_quantized_path(tiny_quantized, monkeypatch):
    q, f32, qtype = tiny_quantized
    assert q.weight_format == "quantized" and f32.weight_format == "float32"
    assert isinstance(q.layers[0].wqkv, QuantizedMatrix) and q.layers[0].wqkv.ggml_type == qtype
    assert isinstance(q.tok_embd, QuantizedMatrix) and q.dtype == np.float32
    assert q.nbytes < f32.nbytes / 3
    np.testing.assert_array_equal(q.layers[1].w_gate_up.dequantize(), f32.layers[1].w_gate_up)
    prompt = [np.arange(5, 30), np.arange(40, 52)]
    toks_q, logits_q = greedy(q, prompt, 12)
    # the same model with every quantized product computed by NumPy's reference of the arithmetic
    import decoding.model

    def reference_linear(x, w):
        return reference_product(x, w) if isinstance(w, QuantizedMatrix) else linear(x, w)

    monkeypatch.setattr(decoding.model, "linear", reference_linear)
    toks_r, logits_r = greedy(q, prompt, 12)
    scale = np.abs(logits_r).max()
    assert np.abs(logits_q - logits_r).max() <= 1e-5 * scale
    np.testing.assert_array_equal(toks_q, toks_r)


PATH_CHECK = """
import sys, gguf, numpy as np
from decoding._simd import DOT_PATH, HALF_CONVERSION
from decoding.quantized import QuantizedMatrix, quantized_linear
assert DOT_PATH == sys.argv[1], DOT_PATH
assert HALF_CONVERSION == (sys.argv[3] == "f16c"), HALF_CONVERSION  # else a float32 KV cache
rng = np.random.default_rng(7)
out = []
for qtype in (gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q8_0):
    raw = gguf.quants.quantize(rng.normal(size=(19, 96)).astype(np.float32), qtype).reshape(19, 3, -1)
    if qtype == gguf.GGMLQuantizationType.Q8_0:
        raw[0, :, 2:] = np.int8(-128).view(np.uint8)
    else:  # the largest Q4_1 sums (codes 15 against activations of +-127: AVX2 adds them in int16)
        raw[0, :, 4:] = 0xFF
    qm = QuantizedMatrix.from_raw(raw, qtype, (19, 96))
    for T in (1, 3, 13):
        x = rng.normal(size=(T, 96)).astype(np.float32) * 3
        x[0], x[-1] = 2.0, -2.0 if T > 1 else 2.0
        out.append(quantized_linear(x, qm))
np.savez(sys.argv[2], *out)
print("ok")
"""


@pytest.mark.parametrize(
    ("path", "cpu", "features"),
    [
        ("avx2", "haswell", "+64bit,+avx,+avx2,+bmi,+bmi2,+cx16,+f16c,+fma,+lzcnt,+movbe,+popcnt,+sse4.2"),
        ("generic", "x86-64", "+64bit,+sse,+sse2"),
    ],
)
def test_every_instruction_set_gives_the_same_bits(tmp_path, path, cpu, features):
    # The integer sums are exact on every path (VNNI, AVX2's byte and word products, LLVM's
    # generic widening), and the float32 steps are the same: the products are bit for bit equal.
    # This process runs the host's path; the other compiles the kernels for another CPU (numba's
    # own CPU settings, a fresh cache).
    import os
    import subprocess
    import sys

    def run(env, name, half):
        done = subprocess.run(
            [sys.executable, "-c", PATH_CHECK, env.get("EXPECT", path), str(tmp_path / name), half],
            env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        return np.load(tmp_path / name)

    from decoding._simd import DOT_PATH, HALF_CONVERSION

    here = run(dict(os.environ, EXPECT=DOT_PATH), "here.npz", "f16c" if HALF_CONVERSION else "none")
    env = dict(os.environ, NUMBA_CPU_NAME=cpu, NUMBA_CPU_FEATURES=features, NUMBA_CACHE_DIR=str(tmp_path))
    there = run(env, "there.npz", "f16c" if "+f16c" in features else "none")
    assert len(here.files) == len(there.files) == 6
    for name in here.files:
        np.testing.assert_array_equal(here[name], there[name])


def test_the_quantized_engine_keeps_a_float16_cache(tiny_quantized):
    # As llama.cpp by default: half the bytes of a float32 cache, half the attention's reads.
    q, f32, _ = tiny_quantized
    if not HALF_CONVERSION:
        pytest.skip("this CPU has no F16C: the engine keeps a float32 cache")
    assert q.kv_dtype == np.float16 and f32.kv_dtype == np.float32
    assert q.truncated(1).kv_dtype == np.float16
    half, full = q.new_cache(max_seqs=2, capacity=8), f32.new_cache(max_seqs=2, capacity=8)
    assert half.k.dtype == np.float16 and 2 * half.nbytes == full.nbytes
    # The float weights with a float16 cache against a float32 one: the same greedy tokens, and
    # logits within a few float16 roundings (each key and value is rounded to 2**-11 relative;
    # 3-7 of them are measured here). On the quantized path the difference is larger (int8
    # activations move by whole steps), so the float path isolates the cache's rounding.
    prompt = [np.arange(5, 30), np.arange(40, 52)]
    toks_full, logits_full = greedy(f32, prompt, 12)
    f32.kv_dtype = np.dtype(np.float16)
    try:
        toks_half, logits_half = greedy(f32, prompt, 12)
    finally:
        f32.kv_dtype = np.dtype(np.float32)
    np.testing.assert_array_equal(toks_half, toks_full)
    assert np.abs(logits_half - logits_full).max() <= 16 * 2.0**-11 * np.abs(logits_full).max()


def test_a_float16_cache_needs_f16c(monkeypatch):
    import decoding.kv_cache

    monkeypatch.setattr(decoding.kv_cache, "HALF_CONVERSION", False)
    with pytest.raises(ValueError, match="F16C"):
        KVCache(1, 1, 2, max_seqs=1, capacity=2, dtype=np.float16)
    with pytest.raises(ValueError, match="dtype must be float16, float32 or float64"):
        KVCache(1, 1, 2, max_seqs=1, capacity=2, dtype=np.int32)


def test_a_float16_cache_is_the_cpu_engines():
    xps = pytest.importorskip("array_api_strict", reason="install the test extra: array-api-strict")
    with pytest.raises(ValueError, match="on a device use dtype float32 or float64"):
        KVCache(1, 1, 2, max_seqs=1, capacity=2, dtype=np.float16, xp=xps)


def test_a_tokens_logits_are_the_same_bits_in_any_forward(tiny_quantized):
    """docs/speculative.md, "Which engine is bitwise": on the quantized engine a token's logits do not
    depend on what else a forward holds, so a verification forward (EMS-SD's packed drafts, vanilla's
    padded ones) gives each token the bits an autoregressive step gives it, and speculative decoding
    the autoregressive tokens with no near-tie exception. Three sequences: autoregressive steps one
    token at a time, then the same tokens as packed drafts of unequal lengths, then padded to the
    longest with the pads masked (the float32 engine orders its sums by the forward's size: it differs)."""
    from decoding.model import PackedBatch

    q, _, _ = tiny_quantized
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 200, size=n) for n in (9, 4, 13)]
    drafts = [rng.integers(0, 200, size=n) for n in (5, 1, 3)]
    seqs = np.arange(3)
    capacity = 13 + 6 + 6

    def prefilled():
        cache = q.new_cache(max_seqs=3, capacity=capacity)
        for _ in seqs:
            cache.allocate()
        q.forward(PackedBatch.from_lists(prompts, seq_ids=seqs), cache=cache, logits=None)
        return cache

    cache = prefilled()  # autoregressive: each sequence's tokens one step at a time
    steps = []
    for t in range(max(map(len, drafts))):
        rows = [s for s in seqs if t < len(drafts[s])]
        batch = PackedBatch.from_lists([drafts[s][t : t + 1] for s in rows], seq_ids=np.array(rows))
        out = q.forward(batch, cache=cache, logits="all")
        steps.append(dict(zip(rows, out, strict=True)))
    ar = [np.stack([steps[t][s] for t in range(len(drafts[s]))]) for s in seqs]

    packed = q.forward(PackedBatch.from_lists(drafts, seq_ids=seqs), cache=prefilled(), logits="all")
    cu = np.cumsum([0] + [len(d) for d in drafts])
    for s in seqs:
        np.testing.assert_array_equal(packed[cu[s] : cu[s + 1]], ar[s])

    W, lens = max(map(len, drafts)), np.array([len(p) for p in prompts])
    toks = np.zeros((3, W), dtype=np.int64)
    for s in seqs:
        toks[s, : len(drafts[s])] = drafts[s]
    key_valid = np.ones((3, capacity), dtype=bool)
    for s in seqs:  # each sequence's pads after its drafts, hidden from every query
        key_valid[s, lens[s] + len(drafts[s]) : lens[s] + W] = False
    batch = PackedBatch.from_lists(toks, seq_ids=seqs, start_positions=lens)
    padded = q.forward(batch, cache=prefilled(), logits="all", key_valid=key_valid)
    for s in seqs:
        np.testing.assert_array_equal(padded[s * W : s * W + len(drafts[s])], ar[s])
