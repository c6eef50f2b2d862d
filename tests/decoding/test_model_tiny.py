"""The forward pass on tiny random float64 models: against a naive reference, and packed/cached/padded
layouts against each other, to 1e-10 relative to the largest logit."""

from __future__ import annotations

import numpy as np
import pytest

from decoding import KVCache, Model, PackedBatch

from .decoding_reference import reference_logits

TOL = 1e-10


def rel_err(a, b):
    return np.max(np.abs(a - b)) / np.max(np.abs(b))


def run_alone(model, tokens, *, chunks=None, capacity=80):
    """Logits of every token of one sequence, fed in the given chunk sizes (default: all at once)."""
    cache = model.new_cache(max_seqs=1, capacity=capacity)
    s = cache.allocate()
    chunks = chunks or [len(tokens)]
    out, a = [], 0
    for n in chunks:
        out.append(model.forward(tokens[a : a + n], cache=cache, seq_ids=[s], cu_seqlens=[0, n]))
        a += n
    return np.concatenate(out)


@pytest.fixture(scope="module")
def model(tiny64):
    return tiny64.model


@pytest.fixture(scope="module")
def seqs():
    rng = np.random.default_rng(1)
    return [rng.integers(0, 264, size=n) for n in (23, 9, 31, 1)]


def test_matches_naive_reference(model, tiny_path, seqs):
    weights = tiny_path[1]
    for toks in seqs[:3]:
        ours = run_alone(model, toks)
        ref = reference_logits(weights, model.config, toks)
        assert rel_err(ours, ref) < TOL


def test_reference_check_can_fail(model, tiny_path, seqs):
    """The comparison above is sensitive: rotating the other (half-split) RoPE layout is caught."""
    weights = dict(tiny_path[1])
    toks = seqs[0]
    ours = run_alone(model, toks)
    perm = np.concatenate([np.arange(0, 8, 2), np.arange(1, 8, 2)])  # head_dim 8
    for i in range(model.config.n_layers):
        for name, nh in (("attn_q", 4), ("attn_k", 2)):
            w = weights[f"blk.{i}.{name}.weight"].reshape(nh, 8, -1)
            weights[f"blk.{i}.{name}.weight"] = w[:, perm].reshape(nh * 8, -1)
    assert rel_err(ours, reference_logits(weights, model.config, toks)) > 1e-3


@pytest.mark.parametrize("chunks", [[1] * 23, [10, 1, 1, 5, 6], [22, 1]])
def test_cache_matches_recompute(model, seqs, chunks):
    toks = seqs[0]
    full = run_alone(model, toks)
    inc = run_alone(model, toks, chunks=chunks)
    assert rel_err(inc, full) < TOL


def test_packed_ragged_matches_each_alone(model, seqs):
    # different cached lengths and different numbers of new tokens (including zero) per sequence
    prefix = [seqs[0][:10], seqs[1][:3], seqs[2][:20], seqs[3][:1]]
    new = [seqs[0][10:17], seqs[1][3:4], seqs[2][20:31], np.array([], dtype=np.int64)]
    cache = model.new_cache(max_seqs=6, capacity=64)
    ids = [cache.allocate() for _ in range(6)][1:5]  # not starting at 0, to test the offsets
    pb = PackedBatch.from_lists(prefix, seq_ids=ids, start_positions=[0] * 4)
    model.forward(pb.tokens, cache=cache, seq_ids=ids, cu_seqlens=pb.cu_seqlens, positions=pb.positions)
    pb = PackedBatch.from_lists(new, seq_ids=ids, start_positions=[len(p) for p in prefix])
    out = model.forward(pb, cache=cache, logits="all")
    last = model.forward(  # one more token each, logits of the last only
        np.array([5, 6, 7, 8]), cache=cache, seq_ids=ids, cu_seqlens=np.arange(5), logits="last"
    )
    for b in range(4):
        alone = run_alone(model, np.concatenate([prefix[b], new[b], [5 + b]]))
        got = out[pb.cu_seqlens[b] : pb.cu_seqlens[b + 1]]
        assert got.shape[0] == len(new[b])
        if len(new[b]):
            assert rel_err(got, alone[len(prefix[b]) : -1]) < TOL
        assert rel_err(last[b], alone[-1]) < TOL
    assert cache.lengths[ids].tolist() == [18, 5, 32, 2]


def test_padded_layout_with_mask_matches_unpadded(model, seqs):
    """Vanilla speculative layout: pads in the cache and in the inputs, hidden by key_valid."""
    a, b = seqs[0][:12], seqs[2][:7]
    PAD = 0
    cache = model.new_cache(max_seqs=2, capacity=40)
    s0, s1 = cache.allocate(), cache.allocate()
    valid = np.zeros((2, 40), dtype=bool)
    # step 1: both prefixes padded (left) to 12 tokens; real positions restart at 0 after the pads
    pad_b = np.concatenate([np.full(5, PAD), b])
    valid[s0, :12] = True
    valid[s1, 5:12] = True
    pos = np.concatenate([np.arange(12), np.concatenate([np.zeros(5, int), np.arange(7)])])
    out1 = model.forward(
        np.concatenate([a, pad_b]),
        cache=cache,
        seq_ids=[s0, s1],
        cu_seqlens=[0, 12, 24],
        positions=pos,
        key_valid=valid,
    )
    # step 2: 4 tokens each; sequence 1 has 2 real tokens then 2 pads
    na, nb = seqs[0][12:16], seqs[2][7:9]
    valid[s0, 12:16] = True
    valid[s1, 12:14] = True
    pos = np.concatenate([np.arange(12, 16), [7, 8, 9, 10]])
    out2 = model.forward(
        np.concatenate([na, nb, [PAD, PAD]]),
        cache=cache,
        seq_ids=[s0, s1],
        cu_seqlens=[0, 4, 8],
        positions=pos,
        key_valid=valid,
    )
    # step 3: one token each (the unpadded reference sees the pad-free sequence)
    valid[s0, 16] = valid[s1, 16] = True
    out3 = model.forward(
        np.array([3, 4]),
        cache=cache,
        seq_ids=[s0, s1],
        cu_seqlens=[0, 1, 2],
        positions=[16, 9],
        key_valid=valid,
    )
    ra = run_alone(model, np.concatenate([a, na, [3]]))
    rb = run_alone(model, np.concatenate([b, nb, [4]]))
    assert rel_err(out1[:12], ra[:12]) < TOL
    assert rel_err(out1[17:24], rb[:7]) < TOL
    assert rel_err(out2[:4], ra[12:16]) < TOL
    assert rel_err(out2[4:6], rb[7:9]) < TOL
    assert rel_err(out3[0], ra[16]) < TOL
    assert rel_err(out3[1], rb[9]) < TOL
    # and without the mask the pads do leak in (the test can fail)
    cache2 = model.new_cache(max_seqs=1, capacity=40)
    s = cache2.allocate()
    pos_b = np.concatenate([np.zeros(5, int), np.arange(7)])
    leak = model.forward(pad_b, cache=cache2, seq_ids=[s], cu_seqlens=[0, 12], positions=pos_b)
    assert rel_err(leak[5:], rb[:7]) > 1e-6


def test_truncate_then_append_equals_never_appended(model, seqs):
    toks = seqs[2]
    cache = model.new_cache(max_seqs=1, capacity=64)
    s = cache.allocate()
    model.forward(toks[:15], cache=cache, seq_ids=[s], cu_seqlens=[0, 15])
    model.forward(np.array([1, 2, 3, 4, 5]), cache=cache, seq_ids=[s], cu_seqlens=[0, 5])  # rejected drafts
    cache.truncate(s, 15)
    got = model.forward(toks[15:20], cache=cache, seq_ids=[s], cu_seqlens=[0, 5])
    ref = run_alone(model, toks[:20])[15:]
    assert rel_err(got, ref) < TOL
    assert cache.lengths[s] == 20


def test_released_slot_is_reused_cleanly(model, seqs):
    cache = model.new_cache(max_seqs=1, capacity=64)
    s = cache.allocate()
    model.forward(seqs[0], cache=cache, seq_ids=[s], cu_seqlens=[0, len(seqs[0])])
    cache.release(s)
    s2 = cache.allocate()
    assert s2 == s and cache.lengths[s2] == 0
    got = model.forward(seqs[1], cache=cache, seq_ids=[s2], cu_seqlens=[0, len(seqs[1])])
    assert rel_err(got, run_alone(model, seqs[1])) < TOL


def test_truncated_model_matches_reference(model, tiny_path, seqs):
    small = model.truncated(1)
    assert small.n_layers == 1 and small.layers[0] is model.layers[0]
    toks = seqs[0][:12]
    cache = small.new_cache(max_seqs=1, capacity=32)
    got = small.forward(toks, cache=cache, seq_ids=[cache.allocate()], cu_seqlens=[0, 12])
    ref = reference_logits(tiny_path[1], model.config, toks, n_layers=1)
    assert rel_err(got, ref) < TOL
    assert rel_err(got, run_alone(model, toks)) > 1e-3
    with pytest.raises(ValueError, match="n_layers"):
        model.truncated(0)


def test_explicit_positions_shift_rope(model, seqs):
    """Positions are used: shifting them all by k changes nothing only in relative terms (RoPE)."""
    toks = seqs[0][:8]
    c1, c2 = model.new_cache(max_seqs=1, capacity=16), model.new_cache(max_seqs=1, capacity=16)
    a = model.forward(toks, cache=c1, seq_ids=[c1.allocate()], cu_seqlens=[0, 8], positions=np.arange(8))
    b = model.forward(toks, cache=c2, seq_ids=[c2.allocate()], cu_seqlens=[0, 8], positions=np.arange(8) + 7)
    assert rel_err(a, b) < 1e-9  # attention only sees relative positions


def test_forward_argument_errors(model):
    cache = model.new_cache(max_seqs=2, capacity=8)
    s = cache.allocate()
    with pytest.raises(ValueError, match="cu_seqlens"):
        model.forward([1, 2], cache=cache, seq_ids=[s], cu_seqlens=[0, 1])
    with pytest.raises(ValueError, match="token ids"):
        model.forward([1, 9999], cache=cache, seq_ids=[s], cu_seqlens=[0, 2])
    with pytest.raises(ValueError, match="capacity"):
        model.forward(np.ones(9, int), cache=cache, seq_ids=[s], cu_seqlens=[0, 9])
    with pytest.raises(ValueError, match="logits"):
        model.forward([1], cache=cache, seq_ids=[s], cu_seqlens=[0, 1], logits="first")
    with pytest.raises(ValueError, match="key_valid"):
        model.forward([1], cache=cache, seq_ids=[s], cu_seqlens=[0, 1], key_valid=np.ones((1, 8), bool))
    with pytest.raises(ValueError, match="distinct"):
        model.forward([1, 2], cache=cache, seq_ids=[s, s], cu_seqlens=[0, 1, 2])
    assert cache.lengths[s] == 0  # failed calls leave the cache untouched


def test_kv_cache_lifecycle():
    c = KVCache(1, 1, 2, max_seqs=2, capacity=4, dtype=np.float64)
    a, b = c.allocate(), c.allocate()
    with pytest.raises(RuntimeError, match="in use"):
        c.allocate()
    c.append(a, np.ones((1, 3, 1, 2)), 2 * np.ones((1, 3, 1, 2)))
    k, v = c.keys(0, a)
    assert k.shape == (1, 3, 2) and (v == 2).all()
    with pytest.raises(ValueError, match="new_len"):
        c.truncate(a, 4)
    c.truncate(a, 1)
    assert c.lengths[a] == 1
    with pytest.raises(ValueError, match="capacity"):
        c.append(a, np.ones((1, 4, 1, 2)), np.ones((1, 4, 1, 2)))
    c.reset(a)
    assert c.lengths[a] == 0
    c.release(b)
    assert c.allocate() == b
    with pytest.raises(ValueError, match="sequence id"):
        c.reset(7)
    assert c.nbytes == 2 * 1 * 1 * 8 * 2 * 8


def test_model_shares_weights_and_reports_bytes(model):
    assert model.nbytes > 0 and model.output_weight is model.tok_embd
    assert isinstance(model, Model)


@pytest.mark.parametrize("key_valid", [False, True])
def test_grouped_attention_equals_per_sequence_loop(key_valid):
    """The batched path for equal counts and the per-sequence loop agree (ragged cache lengths)."""
    from decoding.attention import packed_attention

    rng = np.random.default_rng(4)
    cache = KVCache(1, 2, 8, max_seqs=5, capacity=16, dtype=np.float64)
    cache.k[:] = rng.normal(size=cache.k.shape)
    cache.v[:] = rng.normal(size=cache.v.shape)
    valid = rng.random((5, 16)) < 0.8 if key_valid else None
    if valid is not None:
        valid[:, 0] = True
    for seq_ids in ([1, 2, 3], [4, 0, 2]):  # consecutive (a view) and not (a gather)
        old = np.array([3, 9, 0])
        n = 3
        q = rng.normal(size=(3 * n, 6, 8))  # 6 query heads on 2 KV heads
        cu = np.arange(4) * n
        a = packed_attention(q, cache, 0, np.array(seq_ids), cu, old, valid, grouped=True)
        b = packed_attention(q, cache, 0, np.array(seq_ids), cu, old, valid, grouped=False)
        assert np.max(np.abs(a - b)) < 1e-12


def test_prefetch_thread_changes_nothing(model, seqs):
    toks = seqs[2]
    ref = run_alone(model, toks, chunks=[20, 1, 10])
    model.prefetch = True
    try:
        got = run_alone(model, toks, chunks=[20, 1, 10])
    finally:
        model.prefetch = False
    assert model._prefetcher is not None and model._prefetcher._thread.is_alive()
    np.testing.assert_array_equal(got, ref)


def test_first_forwards_at_once_start_one_prefetch_thread(tiny_path, monkeypatch):
    # The prefetcher was made without a lock: four first forwards at once started three threads, two of
    # them never stopped. A slow start (0.2 s) holds the window open that the race needs.
    import threading
    import time

    import decoding
    import decoding.model as model_mod

    made, real = [], model_mod._Prefetcher

    def slow(layers):
        time.sleep(0.2)
        made.append(real(layers))
        return made[-1]

    monkeypatch.setattr(model_mod, "_Prefetcher", slow)
    model, _ = decoding.load_model(tiny_path[0], dtype=np.float64)
    model.prefetch = True
    ref = run_alone(model, np.arange(1, 6))
    model._prefetcher, made[:] = None, []
    start, out = threading.Barrier(4), []

    def first_forward():
        start.wait()
        out.append(run_alone(model, np.arange(1, 6)))

    threads = [threading.Thread(target=first_forward) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(made) == 1 and model._prefetcher is made[0]
    assert all(np.array_equal(o, ref) for o in out) and len(out) == 4
