"""The engine on a device: the portable (array-API) path against the CPU's kernels, on tiny models.

``array_api_strict`` on its second device stands in for a GPU: its arrays refuse NumPy's implicit
conversion (as CuPy's do) and any arithmetic with another device's arrays, so a forward that runs on
them keeps every step on the device, with only the host bookkeeping (positions, slots, masks built
once per forward) and the logits crossing. Greedy float64 decoding must give the CPU's tokens with
every method and drafter; float32 the same up to near-ties. The same checks on a real GPU (CuPy) are
in ``test_gpu`` below, marked ``gpu``.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from decoding import generate, load_model
from tests.gpu_guard import require_gpu_or_skip

from .tiny_llama import write_tiny_llama

xps = pytest.importorskip("array_api_strict", reason="install the test extra: array-api-strict")
DEVICE = xps.Device("device1")
PROMPTS = ["the cat in the hat", "the hat the hat the hat the", "x y"]
REFERENCES = ["the hat the hat", "the hat sat", "y"]
SHORT_FIRST, SHORT_FIRST_REFERENCES = [PROMPTS[i] for i in (2, 0, 1)], [REFERENCES[i] for i in (2, 0, 1)]


@pytest.fixture(scope="module")
def on_device(tiny64):
    model, tok = tiny64
    return model.to_device(xps, DEVICE), tok


def test_weights_cache_and_logits_live_on_the_device(tiny64, on_device):
    model, _ = tiny64
    dev, _ = on_device
    assert dev.device == DEVICE and dev.tok_embd.device == DEVICE and dev.layers[0].wqkv.device == DEVICE
    cache = dev.new_cache(max_seqs=2, capacity=40)
    assert cache.k.device == DEVICE and cache.dtype == np.float64
    assert dev.nbytes == model.nbytes


def forward_both(model, dev, token_lists, logits="all"):
    out = []
    for m in (model, dev):
        cache = m.new_cache(max_seqs=len(token_lists), capacity=64)
        seqs = [cache.allocate() for _ in token_lists]
        cu = np.concatenate([[0], np.cumsum([len(t) for t in token_lists])])
        toks = np.concatenate(token_lists)
        first = m.forward(toks, cache=cache, seq_ids=seqs, cu_seqlens=cu, logits=logits)
        # a decode step after the prefill: one token each, against the cached keys
        step = m.forward(
            np.array([1] * len(seqs)), cache=cache, seq_ids=seqs, cu_seqlens=np.arange(len(seqs) + 1)
        )
        out.append((np.from_dlpack(first) if m is dev else first, np.from_dlpack(step) if m is dev else step))
    return out


@pytest.mark.parametrize(
    "lengths", [(5,), (7, 3, 11), (4, 4, 4)], ids=["one", "ragged", "uniform"]
)  # one sequence; ragged counts (queries gathered into rows); equal counts (no gather)
def test_forward_matches_the_cpu_kernels(tiny64, on_device, lengths):
    model, _ = tiny64
    dev, _ = on_device
    rng = np.random.default_rng(len(lengths))
    token_lists = [rng.integers(0, model.config.vocab_size, size=n) for n in lengths]
    (cpu_first, cpu_step), (dev_first, dev_step) = forward_both(model, dev, token_lists)
    for got, ref in ((dev_first, cpu_first), (dev_step, cpu_step)):
        assert np.max(np.abs(got - ref)) <= 1e-12 * np.max(np.abs(ref))


@pytest.mark.parametrize(
    ("prefill", "step_ids", "step"),
    [
        ([0, 4, 6, 9], [2, 0], [0, 1, 2]),  # equal counts on seq_ids not a range: the regions gathered
        ([0, 5, 13, 15], [0, 1, 2], [0, 3, 4, 8]),  # 3, 1 and 4 new tokens: a verification-like step
    ],
    ids=["uniform-out-of-order", "ragged"],
)
def test_a_step_after_a_prefill_matches_the_cpu(tiny64, on_device, prefill, step_ids, step):
    model, _ = tiny64
    dev, _ = on_device
    out = []
    for m in (model, dev):
        cache = m.new_cache(max_seqs=3, capacity=32)
        ids = [cache.allocate() for _ in range(3)]
        m.forward(np.arange(prefill[-1]) % 50, cache=cache, seq_ids=ids, cu_seqlens=prefill)
        logits = m.forward(np.arange(step[-1]) % 7 + 3, cache=cache, seq_ids=step_ids, cu_seqlens=step)
        out.append(np.from_dlpack(logits) if m is dev else logits)
    assert np.max(np.abs(out[1] - out[0])) <= 1e-12 * np.max(np.abs(out[0]))


def _ragged_attention_case(key_valid):
    """A cache on the stand-in device with random keys, and ragged new tokens: counts 3, 0, 1, 5 on
    sequences 4, 1, 0, 2 (not a range), cached lengths 6, 2, 0, 9."""
    from decoding.kv_cache import KVCache

    rng = np.random.default_rng(7)
    host = KVCache(1, 2, 8, max_seqs=5, capacity=16, dtype=np.float64)
    host.k[:] = rng.normal(size=host.k.shape)
    host.v[:] = rng.normal(size=host.v.shape)
    dev = KVCache(1, 2, 8, max_seqs=5, capacity=16, dtype=np.float64, xp=xps, device=DEVICE)
    dev.k, dev.v = xps.asarray(host.k, device=DEVICE), xps.asarray(host.v, device=DEVICE)
    valid = None
    if key_valid:
        valid = rng.random((5, 16)) < 0.8
        valid[:, 0] = True
    seq_ids, cu, old = np.array([4, 1, 0, 2]), np.array([0, 3, 3, 4, 9]), np.array([6, 2, 0, 9])
    q = rng.normal(size=(9, 6, 8))  # 6 query heads on 2 KV heads
    return host, dev, (seq_ids, cu, old, valid), q


@pytest.mark.parametrize("key_valid", [False, True])
def test_ragged_attention_is_one_batched_product_on_a_device(key_valid):
    # A verification step's counts differ between sequences. A loop over them cost a dozen launches per
    # sequence and layer on a GPU; the batched layout costs the same for any batch, with the CPU's values.
    from decoding.attention import AttentionPlan, packed_attention

    host, dev, (seq_ids, cu, old, valid), q = _ragged_attention_case(key_valid)
    plan = AttentionPlan.build(dev, seq_ids, cu, old, valid, n_heads=6)
    assert plan.batched is not None and plan.pieces == []
    ref = packed_attention(q, host, 0, seq_ids, cu, old, valid)  # the CPU kernel
    got = packed_attention(xps.asarray(q, device=DEVICE), dev, 0, seq_ids, cu, old, valid)
    loop = packed_attention(xps.asarray(q, device=DEVICE), dev, 0, seq_ids, cu, old, valid, grouped=False)
    for out in (got, loop):
        assert out.device == DEVICE and np.max(np.abs(np.from_dlpack(out) - ref)) < 1e-12


def test_ragged_attention_past_the_score_budget_runs_per_sequence(monkeypatch):
    import decoding.attention
    from decoding.attention import AttentionPlan, attend, packed_attention

    host, dev, (seq_ids, cu, old, valid), q = _ragged_attention_case(True)
    monkeypatch.setattr(
        decoding.attention, "BATCHED_SCORES", 3 * 6 * 5 * 14 - 1
    )  # B H n S (3 with tokens), less one
    plan = AttentionPlan.build(dev, seq_ids, cu, old, valid, n_heads=6)
    assert plan.batched is None and len(plan.pieces) == 3
    got = attend(xps.asarray(q, device=DEVICE), dev, 0, plan)  # the plan's own per-sequence loop
    assert AttentionPlan.build(dev, seq_ids, cu, old, valid).batched is not None  # KV heads: 3x fewer
    per_sequence, real = [], decoding.attention.attend
    monkeypatch.setattr(
        decoding.attention, "attend", lambda *a: per_sequence.append(a[3].batched is None) or real(*a)
    )
    packed_attention(xps.asarray(q, device=DEVICE), dev, 0, seq_ids, cu, old, valid)
    assert per_sequence == [True]  # packed_attention sizes the scores by the query heads too
    ref = packed_attention(q, host, 0, seq_ids, cu, old, valid)
    assert np.max(np.abs(np.from_dlpack(got) - ref)) < 1e-12


def test_cache_writes_by_index_array_where_the_library_takes_one():
    # CuPy takes an index array in an assignment: one per layer and forward, not one per sequence.
    # array_api_compat's NumPy namespace stands in for it here (a namespace other than numpy that
    # scatters); array_api_strict, which refuses, keeps the runs of slots.
    import array_api_compat.numpy as xnp

    from decoding.kv_cache import KVCache

    rng = np.random.default_rng(3)
    caches = [
        KVCache(2, 2, 4, max_seqs=3, capacity=8, dtype=np.float64, **kw)
        for kw in ({}, {"xp": xnp, "device": "cpu"}, {"xp": xps, "device": DEVICE})
    ]
    assert [c._scatters for c in caches] == [False, True, False]
    for seq_ids, counts in (([0, 1, 2], [3, 1, 2]), ([2, 0], [1, 4])):
        kv = rng.normal(size=(2, 2, sum(counts), 2, 4))  # [k/v, layer, T, Hkv, D]
        for c in caches:
            slots = c.prepare(np.array(seq_ids), np.array(counts))
            for layer in range(2):
                k, v = kv[0, layer], kv[1, layer]
                if c.xp is xps:
                    k, v = xps.asarray(k, device=DEVICE), xps.asarray(v, device=DEVICE)
                c.write(layer, slots, k, v)
            c.advance(np.array(seq_ids), np.array(counts))
    for c in caches[1:]:
        assert np.array_equal(np.from_dlpack(c.k), caches[0].k) and np.array_equal(
            np.from_dlpack(c.v), caches[0].v
        )


@pytest.mark.parametrize("method", ["autoregressive", "ems", "vanilla"])
def test_greedy_tokens_are_the_cpus(tiny64, on_device, method):
    model, tok = tiny64
    dev, _ = on_device
    ref = generate(model, tok, PROMPTS, max_new_tokens=12)
    drafters = ["llma"] if method == "autoregressive" else ["llma", "prompt_lookup", "draft_model"]
    for drafter in drafters:
        kwargs = {} if method == "autoregressive" else {"drafter": drafter, "references": REFERENCES}
        res = generate(dev, tok, PROMPTS, max_new_tokens=12, method=method, **kwargs)
        assert res.tokens == ref.tokens, (method, drafter)
    if method != "vanilla":  # continuous batching: "x y" ends first, and the next prompt joins a running step
        ref = generate(model, tok, SHORT_FIRST, max_new_tokens=12, max_batch=2)
        kwargs = {} if method == "autoregressive" else {"references": SHORT_FIRST_REFERENCES}
        res = generate(dev, tok, SHORT_FIRST, max_new_tokens=12, method=method, max_batch=2, **kwargs)
        assert res.tokens == ref.tokens, (method, "max_batch=2")


def test_float32_greedy_tokens_up_to_near_ties(tiny_path):
    model, tok = load_model(tiny_path[0], dtype=np.float32)
    dev = model.to_device(xps, DEVICE)
    ref = generate(model, tok, PROMPTS, max_new_tokens=12)
    res = generate(dev, tok, PROMPTS, max_new_tokens=12, method="ems", references=REFERENCES)
    for a, b in zip(res.tokens, ref.tokens, strict=True):
        if a == b:
            continue
        t = next(j for j in range(min(len(a), len(b))) if a[j] != b[j])
        ctx = tok.encode(PROMPTS[res.tokens.index(a)]) + b[:t]
        cache = model.new_cache(max_seqs=1, capacity=len(ctx) + 1)
        lg = model.forward(np.array(ctx), cache=cache, seq_ids=[cache.allocate()], cu_seqlens=[0, len(ctx)])[
            -1
        ]
        top2 = np.sort(lg)[-2:]
        assert (top2[1] - top2[0]) / np.max(np.abs(lg)) < 1e-4  # a true near-tie, as on the CPU's layouts


def test_device_arguments_are_checked(tiny_path, tmp_path, monkeypatch):
    import decoding.loading

    with pytest.raises(ValueError, match="device must be"):
        load_model(tiny_path[0], dtype=np.float64, device="gpu")
    monkeypatch.setattr(decoding.loading, "cuda_namespace", lambda: xps)  # as if CuPy and a device were there
    with pytest.raises(ValueError, match="quantized"):
        load_model(tiny_path[0], device="cuda")
    monkeypatch.undo()
    path = tmp_path / "tiny_q.gguf"
    write_tiny_llama(path, tensor_type=gguf.GGMLQuantizationType.Q8_0, d=64, n_heads=4, n_kv_heads=2, d_ff=96)
    quantized, _ = load_model(path)
    with pytest.raises(ValueError, match="quantized weights have CPU kernels only"):
        quantized.to_device(xps, DEVICE)


def test_cuda_without_cupy_says_to_install_the_gpu_extra(tiny_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "cupy", None)  # as if CuPy were not installed
    with pytest.raises(ImportError, match=r"rsketch\[gpu\]"):
        load_model(tiny_path[0], dtype=np.float64, device="cuda")
    with pytest.raises(ImportError, match=r"rsketch\[gpu\]"):  # before the dtype (docs/gpu.md)
        load_model(tiny_path[0], device="cuda")


@pytest.mark.gpu
def test_gpu(tiny_path):
    from decoding.loading import cuda_namespace

    require_gpu_or_skip(cuda_namespace)
    model, tok = load_model(tiny_path[0], dtype=np.float64)
    dev, _ = load_model(tiny_path[0], dtype=np.float64, device="cuda")
    ref = generate(model, tok, PROMPTS, max_new_tokens=12)
    for method in ("autoregressive", "ems", "vanilla"):
        kwargs = {} if method == "autoregressive" else {"references": REFERENCES}
        assert generate(dev, tok, PROMPTS, max_new_tokens=12, method=method, **kwargs).tokens == ref.tokens
        if method != "vanilla":  # continuous batching, as in test_greedy_tokens_are_the_cpus
            kwargs = {} if method == "autoregressive" else {"references": SHORT_FIRST_REFERENCES}
            short_ref = generate(model, tok, SHORT_FIRST, max_new_tokens=12, max_batch=2).tokens
            res = generate(dev, tok, SHORT_FIRST, max_new_tokens=12, method=method, max_batch=2, **kwargs)
            assert res.tokens == short_ref


def test_no_prefetch_thread_on_a_device(tiny64, monkeypatch):
    # The prefetch streams host weights into the CPU's cache; on a device it would launch array work
    # from a second thread.
    import decoding.model as model_module

    model, tok = tiny64
    ref = generate(model, tok, PROMPTS, max_new_tokens=4)  # before the spy (DECODING_PREFETCH may be set)
    made = []
    monkeypatch.setattr(model_module._Prefetcher, "__init__", lambda self, *a, **k: made.append(self))
    dev = model.to_device(xps, DEVICE)
    dev.prefetch = True
    assert generate(dev, tok, PROMPTS, max_new_tokens=4).tokens == ref.tokens and made == []
