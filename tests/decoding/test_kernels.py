"""The engine's compiled kernels against NumPy: few-row products, RMS norm, packed attention."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from decoding._simd import HALF_CONVERSION
from decoding.kernels import FEW_ROWS, linear, rms_norm, rows_times_weights, varlen_attention

#: The float16 cache's tests: a CPU without F16C keeps a float32 cache instead.
needs_f16c = pytest.mark.skipif(
    not HALF_CONVERSION, reason="this CPU has no F16C: the engine keeps a float32 cache"
)


@settings(max_examples=40, deadline=None)
@given(
    T=st.integers(1, 2 * FEW_ROWS),
    N=st.integers(1, 37),
    K=st.integers(1, 70),
    seed=st.integers(0, 2**31 - 1),
)
def test_rows_times_weights_matches_matmul_float64(T, N, K, seed):
    rng = np.random.default_rng(seed)
    x, w = rng.standard_normal((T, K)), rng.standard_normal((N, K))
    ref = x @ w.T
    out = rows_times_weights(x, w)
    assert out.shape == (T, N) and out.dtype == np.float64
    # Reassociated sums: each entry within a few ulps of the sum of |terms|.
    assert np.all(np.abs(out - ref) <= 8 * K * np.finfo(np.float64).eps * (np.abs(x) @ np.abs(w).T))
    lin = linear(x, w)  # in blocks of FEW_ROWS rows: the kernel's sums, block by block
    assert np.array_equal(lin[:FEW_ROWS], out[:FEW_ROWS])
    assert np.all(np.abs(lin - ref) <= 8 * K * np.finfo(np.float64).eps * (np.abs(x) @ np.abs(w).T))


@pytest.mark.parametrize("T", [1, 3, 4, 8, 11, 16, 33])
def test_rows_times_weights_float32_at_model_sizes(T):
    rng = np.random.default_rng(T)
    x = rng.standard_normal((T, 576)).astype(np.float32)
    w = rng.standard_normal((1729, 576)).astype(np.float32)  # odd row count: the last row alone
    out = rows_times_weights(x, w)
    assert out.dtype == np.float32
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    bound = 576 * 4 * np.finfo(np.float32).eps * (np.abs(x) @ np.abs(w).T)
    assert np.all(np.abs(out - ref) <= bound)


@pytest.mark.parametrize("dtype, K", [(np.float32, 1536), (np.float64, 600)])
@pytest.mark.parametrize("N", [1, 2, 3, 5, 1023])
@pytest.mark.parametrize("T", [1, 3, 4, 7, 8])
def test_rows_times_weights_long_rows(dtype, K, N, T):
    """Rows over 4 KB take the four-weight-row kernel (the MLP's down projection): row counts
    that are not a multiple of four, token counts that are not either."""
    assert K * np.dtype(dtype).itemsize > 4096
    rng = np.random.default_rng(N * 100 + T)
    x = rng.standard_normal((T, K)).astype(dtype)
    w = rng.standard_normal((N, K)).astype(dtype)
    out = rows_times_weights(x, w)
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    bound = 4 * K * np.finfo(dtype).eps * (np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64).T)
    assert out.dtype == dtype and np.all(np.abs(out - ref) <= bound)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_rms_norm_compiled_matches_the_formula(dtype):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((5, 576)) * 3).astype(dtype)
    w = rng.standard_normal(576).astype(dtype)
    xd, wd = x.astype(np.float64), w.astype(np.float64)
    ref = xd / np.sqrt(np.mean(xd * xd, axis=-1, keepdims=True) + 1e-5) * wd
    out = rms_norm(x, w, 1e-5)
    assert out.dtype == dtype
    assert np.max(np.abs(out - ref)) <= 64 * np.finfo(dtype).eps * np.max(np.abs(ref))


def test_linear_empty_and_wide_batches_use_matmul():
    w = np.ones((3, 2))
    assert linear(np.ones((0, 2)), w).shape == (0, 3)
    x = np.arange(2.0 * (FEW_ROWS + 1)).reshape(FEW_ROWS + 1, 2)
    assert np.array_equal(linear(x, w), x @ w.T)


@pytest.mark.parametrize("with_mask", [False, True])
def test_varlen_attention_matches_the_per_sequence_reference(with_mask):
    # A ragged batch (1, 4 and 2 new tokens on caches of 3, 0 and 5) in float64, against the
    # per-sequence NumPy path of decoding.attention (grouped=False), with and without pad slots.
    from decoding.attention import packed_attention
    from decoding.kv_cache import KVCache

    rng = np.random.default_rng(0)
    Hkv, G, D = 2, 3, 8
    cache = KVCache(1, Hkv, D, max_seqs=3, capacity=12, dtype=np.float64)
    ids = [cache.allocate() for _ in range(3)]
    old, new = np.array([3, 0, 5]), np.array([1, 4, 2])
    for s, n in zip(ids, old, strict=True):
        if n:
            slots = cache.prepare([s], [n])
            cache.write(0, slots, rng.standard_normal((n, Hkv, D)), rng.standard_normal((n, Hkv, D)))
            cache.advance([s], [n])
    slots = cache.prepare(ids, new)
    cache.write(0, slots, rng.standard_normal((new.sum(), Hkv, D)), rng.standard_normal((new.sum(), Hkv, D)))
    q = rng.standard_normal((new.sum(), Hkv * G, D))
    cu = np.concatenate([[0], np.cumsum(new)])
    valid = rng.random((3, 12)) < 0.7 if with_mask else None
    if valid is not None:
        valid[:, 0] = True  # every query keeps at least one key
    args = (q, cache, 0, np.array(ids), cu, old, valid)
    fast = packed_attention(*args)  # the kernel
    ref = packed_attention(*args, grouped=False)  # one NumPy product per sequence
    assert np.abs(fast - ref).max() <= 1e-13


def test_varlen_attention_fully_masked_row_stays_finite():
    # A pad query whose every key is hidden (a padded layout's left pads) must not produce NaN:
    # its output is ignored, but its keys and values enter the cache.
    rng = np.random.default_rng(0)
    k = rng.standard_normal((1, 4, 8)).astype(np.float32)
    q = rng.standard_normal((2, 1, 8)).astype(np.float32)
    valid = np.array([[False, False, True, True]])
    out = varlen_attention(q, k, k, [0, 0], [1, 4], [0, 0], valid)
    assert np.isfinite(out).all()


def test_varlen_attention_mask_needs_sequences():
    k = np.zeros((1, 2, 2))
    with pytest.raises(ValueError, match="seq"):
        varlen_attention(np.ones((1, 1, 2)), k, k, [0], [1], key_valid=np.ones((1, 2), dtype=bool))


@pytest.mark.parametrize("fastmath", [False, {"reassoc", "contract"}])  # plain, and as the kernels compile it
def test_exp_float32_within_one_ulp_and_its_limits(fastmath):
    # decoding._simd.exp, the vectorizable float32 exp of softmax and SwiGLU: float32 arguments
    # across the whole range against float64's exp (1.01 ulp measured; the docs promise 2), exact
    # 0 below -87.34, infinity where float32 overflows, NaN kept. Reassociation must not undo the
    # two-part reduction by ln 2 (it would cost tens of ulp at large arguments).
    from numba import njit

    from decoding._simd import exp

    @njit(fastmath=fastmath, error_model="numpy")
    def apply(x, out):
        for i in range(x.size):
            out[i] = exp(x[i])

    x = np.concatenate([np.linspace(-88, 89, 2_000_003), np.array([np.nan, np.inf, -np.inf, 0.0, -1e30])])
    x = x.astype(np.float32)
    out = np.empty_like(x)
    apply(x, out)
    with np.errstate(over="ignore"):
        ref = np.exp(x.astype(np.float64))
        ref32 = ref.astype(np.float32)
    normal = (x >= -87.33654) & np.isfinite(ref32)
    ulps = np.abs(out[normal] - ref[normal]) / np.spacing(ref32[normal]).astype(np.float64)
    assert ulps.max() <= 2.0
    assert (out[x < -87.33654] == 0).all()
    assert np.array_equal(np.isinf(out), np.isinf(ref32))
    assert np.isnan(out[-5]) and out[-2] == 1.0 and out[-1] == 0.0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("T", [1, 8, 64])  # 64 rows: the threaded kernel
def test_swiglu_matches_the_formula(dtype, T):
    from decoding.kernels import swiglu

    rng = np.random.default_rng(T)
    gu = (rng.standard_normal((T, 2 * 1536)) * 6).astype(dtype)
    g, u = gu[:, :1536].astype(np.float64), gu[:, 1536:].astype(np.float64)
    ref = g / (1 + np.exp(-g)) * u
    out = swiglu(gu)
    assert out.dtype == dtype and out.shape == (T, 1536)
    # a few roundings and exp's 1 ulp per value: relative, value by value
    assert np.all(np.abs(out - ref) <= 8 * np.finfo(dtype).eps * np.abs(ref))
    assert np.array_equal(swiglu(gu[:1]), out[:1])  # a row does not depend on the others


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_swiglu_at_the_extremes(dtype):
    # Gates where exp(-g) overflows or underflows, infinities and NaN: what NumPy computes in the
    # same dtype (silu(g) -> -0 as g -> -inf, g as g -> +inf; -inf / inf is NaN), value by value
    # within a few roundings, or within the dtype's smallest normal number of it near zero.
    from decoding.kernels import swiglu

    g = np.array([-88.8, -100.0, -1e30, -3e38, -np.inf, 88.8, 1e30, 3e38, np.inf, np.nan, -87.0, 87.0])
    gu = np.concatenate([g, np.full(g.size, 2.0)]).astype(dtype)[None, :]
    gate, up = gu[:, : g.size], gu[:, g.size :]
    with np.errstate(over="ignore", invalid="ignore"):
        ref = (gate / (1 + np.exp(-gate)) * up)[0]
    out = swiglu(gu)[0]
    assert np.array_equal(np.isnan(out), np.isnan(ref))
    assert np.array_equal(out[np.isinf(ref)], ref[np.isinf(ref)])
    finite = np.isfinite(ref)
    tiny = np.finfo(dtype).tiny
    assert np.all(np.abs(out[finite] - ref[finite]) <= 8 * np.finfo(dtype).eps * np.abs(ref[finite]) + tiny)
    with pytest.raises(ValueError, match="gate_up"):
        swiglu(np.ones((2, 5), dtype))
    with pytest.raises(ValueError, match="gate_up"):
        swiglu(np.ones(4, dtype))


def _half_cases():
    """float32 values that exercise float16's rounding: ties (to even), subnormals, overflow, NaN."""
    rng = np.random.default_rng(3)
    edges = np.float32([0.0, -0.0, 1.0, 65504.0, 65520.0, 65519.99, 1e6, -1e6, 6e-8, 3e-8, 2.98e-8, 1e-10])
    ties = (np.arange(2048, 4096, dtype=np.float32) + np.float32(0.5)) * np.float32(2.0**-11)  # halfway
    specials = np.float32([np.inf, -np.inf, np.nan])
    return np.concatenate([edges, -edges, ties, specials, rng.standard_normal(4000).astype(np.float32) * 30])


@needs_f16c
def test_float16_stores_and_loads_are_numpys():
    # A float16 cache's keys and values are rounded as NumPy's astype(np.float16) rounds (to
    # nearest, ties to even; overflow to infinity) and read back exactly.
    from numba import njit

    from decoding._simd import as_float, as_stored

    @njit
    def store(x, out):
        for i in range(x.size):
            out[i] = as_stored(out, x[i])

    @njit
    def load(bits, out):
        for i in range(bits.size):
            out[i] = as_float(bits[i])

    x = _half_cases()
    bits = np.empty(x.size, dtype=np.uint16)
    with np.errstate(over="ignore"):
        expect = x.astype(np.float16)
    store(x, bits)
    np.testing.assert_array_equal(bits, expect.view(np.uint16))
    back = np.empty(x.size, dtype=np.float32)
    load(bits, back)
    np.testing.assert_array_equal(back, expect.astype(np.float32))  # NaN where NaN


@needs_f16c
def test_float16_cache_is_the_float32_cache_of_rounded_values():
    # RoPE writes rounded keys and values; the attention reads them back exactly, so a float16
    # cache gives what a float32 cache holding the rounded values gives (to float32 rounding:
    # LLVM may order the vector sums differently for the two element types).
    from decoding.kernels import rope_and_store

    rng = np.random.default_rng(5)
    T, H, Hkv, D, slots_n = 7, 6, 2, 16, 12
    qkv = rng.standard_normal((T, (H + 2 * Hkv) * D)).astype(np.float32) * 4
    ang = rng.random((T, D // 2))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    slots = rng.permutation(slots_n)[:T]
    k16, v16 = np.zeros((Hkv, slots_n, D), np.float16), np.zeros((Hkv, slots_n, D), np.float16)
    k32, v32 = np.zeros((Hkv, slots_n, D), np.float32), np.zeros((Hkv, slots_n, D), np.float32)
    q16 = rope_and_store(qkv, cos, sin, H, Hkv, slots, k16, v16)
    q32 = rope_and_store(qkv, cos, sin, H, Hkv, slots, k32, v32)
    np.testing.assert_array_equal(q16, q32)
    np.testing.assert_array_equal(k16, k32.astype(np.float16))
    np.testing.assert_array_equal(v16, v32.astype(np.float16))
    start, length = np.zeros(T, np.int64), np.arange(1, T + 1) + 4
    out16 = varlen_attention(q16, k16, v16, start, length)
    out32 = varlen_attention(q16, k16.astype(np.float32), v16.astype(np.float32), start, length)
    assert out16.dtype == np.float32
    np.testing.assert_allclose(out16, out32, rtol=2e-6, atol=2e-6 * np.abs(out32).max())


def test_float16_cache_needs_float32_activations():
    from decoding.kernels import rope_and_store

    k = np.zeros((1, 2, 2), np.float16)
    with pytest.raises(TypeError, match="float32 activations"):
        rope_and_store(np.ones((1, 6)), np.ones((1, 1)), np.zeros((1, 1)), 1, 1, [0], k, k.copy())
    with pytest.raises(TypeError, match="float32 or float64"):
        varlen_attention(np.ones((1, 1, 2), np.float16), k, k, [0], [1])
