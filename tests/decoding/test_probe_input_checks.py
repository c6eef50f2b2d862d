"""A probe's findings: ids, counts and sizes that were truncated, wrapped or accepted silently, and
chat templates that hung or raised jinja2's own errors, now refused with a message naming them."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest

from decoding.cost_model import MAX_SKIP, CostModel, DraftBudget
from decoding.drafters import DraftModelDrafter, LLMADrafter, PromptLookupDrafter, make_drafter
from decoding.kv_cache import KVCache
from decoding.model import PackedBatch
from decoding.tokenizer import Tokenizer

MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def model(tiny64):
    return tiny64.model


@pytest.fixture(scope="module")
def tok(tiny64):
    return tiny64.tokenizer


def with_template(tok, template):
    return Tokenizer(
        tok._hf, bos_id=tok.bos_id, eos_id=tok.eos_id, add_bos=False, id_to_token=tok._id_to_token,
        chat_template=template,
    )  # fmt: skip


# -- 1. Tokenizer.decode / token_text ---------------------------------------------------------------
@pytest.mark.parametrize("ids", [[1.7], [True], ["a"], "abc", [np.float64(2.0)], np.array([1.0, 2.0])])
def test_decode_refuses_ids_that_are_not_integers(tok, ids):
    with pytest.raises(TypeError, match="ids"):
        tok.decode(ids)


@pytest.mark.parametrize("bad", [10**6, -1, 2**40])
def test_decode_refuses_ids_outside_the_vocabulary(tok, bad):
    with pytest.raises(ValueError, match=rf"\[0, {tok.vocab_size}\): {bad} at index 1"):
        tok.decode([72, bad])


def test_decode_takes_numpy_integers(tok):
    ids = tok.encode("Hi there")
    assert tok.decode(np.array(ids, dtype=np.int32)) == tok.decode(ids) == "Hi there"
    assert tok.decode([np.int64(i) for i in ids]) == "Hi there"
    assert tok.decode(tuple(ids)) == "Hi there"


def test_token_text_checks_the_id(tok):
    assert tok.token_text(np.int64(72)) == tok.token_text(72) == "H"
    for bad in (-1, tok.vocab_size):
        with pytest.raises(ValueError, match=f"token id {bad} .*{tok.vocab_size}"):
            tok.token_text(bad)
    for bad in (1.7, True, "1"):
        with pytest.raises(TypeError, match="token id"):
            tok.token_text(bad)
    with pytest.raises(TypeError, match="token id"):
        tok.is_special(1.7)
    assert tok.is_special(np.int64(tok.eos_id)) and not tok.is_special(-1)


# -- 2. low-level API: forward, PackedBatch, KVCache, truncated ------------------------------------
def test_forward_refuses_float_tokens_ids_offsets_and_positions(model):
    cache = model.new_cache(max_seqs=2, capacity=8)
    s = cache.allocate()
    cases = [
        ("tokens", dict(tokens=np.array([1.7, 2.2]), seq_ids=[s], cu_seqlens=[0, 2])),
        ("seq_ids", dict(tokens=[1], seq_ids=[0.9], cu_seqlens=[0, 1])),
        ("cu_seqlens", dict(tokens=[1], seq_ids=[s], cu_seqlens=[0.0, 1.0])),
        ("positions", dict(tokens=[1], seq_ids=[s], cu_seqlens=[0, 1], positions=[0.5])),
        ("tokens", dict(tokens=[True], seq_ids=[s], cu_seqlens=[0, 1])),
    ]
    for name, kw in cases:
        tokens = kw.pop("tokens")
        with pytest.raises(TypeError, match=name):
            model.forward(tokens, cache=cache, **kw)
    assert cache.lengths.tolist() == [0, 0]


def test_forward_refuses_positions_outside_the_context(model):
    # RoPE of position -5 or 10**12 (or of a token past the context, where the cache had room) gave
    # logits without a word
    ctx = model.config.context_length
    cache = model.new_cache(max_seqs=1, capacity=ctx + 4)
    s = cache.allocate()
    for positions in ([-5], [10**12], [ctx]):
        with pytest.raises(ValueError, match=rf"positions must lie in \[0, {ctx}\)"):
            model.forward([1], cache=cache, seq_ids=[s], cu_seqlens=[0, 1], positions=positions)
    assert cache.lengths.tolist() == [0]
    model.forward([1] * ctx, cache=cache, seq_ids=[s], cu_seqlens=[0, ctx])  # the whole context: fine
    with pytest.raises(
        ValueError, match="positions must lie in"
    ):  # one token more, though the cache has room
        model.forward([1], cache=cache, seq_ids=[s], cu_seqlens=[0, 1])
    assert cache.lengths.tolist() == [ctx]


def test_forward_refuses_sequences_the_cache_never_allocated(model):
    cache = model.new_cache(max_seqs=2, capacity=8)
    s = cache.allocate()
    with pytest.raises(ValueError, match="allocated"):
        model.forward([1], cache=cache, seq_ids=[1 - s], cu_seqlens=[0, 1])
    cache.release(s)
    with pytest.raises(ValueError, match="allocated"):  # released: its region is free for reuse
        model.forward([1], cache=cache, seq_ids=[s], cu_seqlens=[0, 1])
    with pytest.raises(ValueError, match="seq_ids"):
        model.forward([1], cache=cache, seq_ids=[-1], cu_seqlens=[0, 1])
    assert cache.lengths.tolist() == [0, 0]


def test_packed_batch_refuses_mismatched_or_empty_lists():
    # one list and two seq_ids had built a batch that forward refused for its cu_seqlens; no list at all
    # met NumPy's "need at least one array to concatenate"
    with pytest.raises(ValueError, match="2 seq_ids for 1 token lists"):
        PackedBatch.from_lists([[1, 2]], seq_ids=[0, 1])
    with pytest.raises(ValueError, match="1 start_positions for 2 token lists"):
        PackedBatch.from_lists([[1], [2]], seq_ids=[0, 1], start_positions=[3])
    with pytest.raises(ValueError, match="token_lists is empty"):
        PackedBatch.from_lists([], seq_ids=[])


def test_packed_batch_refuses_non_integer_tokens():
    with pytest.raises(TypeError, match=r"token_lists\[0\]"):
        PackedBatch.from_lists([[1.5, 2.5]], seq_ids=[0])
    with pytest.raises(TypeError, match=r"token_lists\[1\]"):
        PackedBatch.from_lists([[1], [True]], seq_ids=[0, 1])
    with pytest.raises(TypeError, match="seq_ids"):
        PackedBatch.from_lists([[1]], seq_ids=[0.5])
    with pytest.raises(TypeError, match=r"start_positions\[0\]"):
        PackedBatch.from_lists([[1]], seq_ids=[0], start_positions=[1.5])
    pb = PackedBatch.from_lists(
        [np.array([5, 6], np.int32), []], seq_ids=np.array([0, 1]), start_positions=[0, 3]
    )
    assert pb.tokens.tolist() == [5, 6] and pb.cu_seqlens.tolist() == [0, 2, 2]


@pytest.mark.parametrize(
    "kw, exc, name",
    [
        (dict(max_seqs=2.7, capacity=4), TypeError, "max_seqs"),
        (dict(max_seqs=2, capacity=3.9), TypeError, "capacity"),
        (dict(max_seqs="2", capacity=4), TypeError, "max_seqs"),
        (dict(max_seqs=True, capacity=4), TypeError, "max_seqs"),
        (dict(max_seqs=0, capacity=4), ValueError, "max_seqs"),
        (dict(max_seqs=2, capacity=4, head_dim=2.5), TypeError, "head_dim"),
    ],
)
def test_kv_cache_sizes_must_be_integers(kw, exc, name):
    head_dim = kw.pop("head_dim", 2)
    with pytest.raises(exc, match=name):
        KVCache(1, 1, head_dim, **kw)


def test_kv_cache_ids_and_lengths_must_be_integers_in_range():
    c = KVCache(2, 1, 2, max_seqs=2, capacity=4, dtype=np.float64)
    assert KVCache(1, 1, 2, max_seqs=np.int64(2), capacity=np.int32(3)).capacity == 3
    a, b = c.allocate(), c.allocate()
    c.append(a, np.ones((2, 3, 1, 2)), np.ones((2, 3, 1, 2)))
    with pytest.raises(TypeError, match="new_len"):
        c.truncate(a, 1.5)
    with pytest.raises(ValueError, match="new_len"):
        c.truncate(a, -1)
    with pytest.raises(TypeError, match="sequence id"):
        c.truncate(0.9, 1)
    assert c.lengths[a] == 3
    with pytest.raises(ValueError, match="sequence id"):  # -1 indexed the last sequence's region
        c.keys(0, -1)
    with pytest.raises(TypeError, match="sequence id"):
        c.keys(0, 0.5)
    with pytest.raises(ValueError, match="length"):
        c.keys(0, a, 5)
    with pytest.raises(ValueError, match="layer"):
        c.keys(2, a)
    with pytest.raises(TypeError, match="seq_ids"):
        c.prepare(np.array([0.5]), np.array([1]))
    assert c.keys(1, np.int64(a))[0].shape == (1, 3, 2) and c.keys(0, b, 2)[0].shape == (1, 2, 2)


def test_truncated_model_needs_an_integer_layer_count(model):
    with pytest.raises(TypeError, match="n_layers"):
        model.truncated(True)
    with pytest.raises(TypeError, match="n_layers"):
        model.truncated(1.5)
    assert model.truncated(np.int64(1)).n_layers == 1


# -- 3. cost model and draft budget ----------------------------------------------------------------
@pytest.mark.parametrize("ps", [math.nan, math.inf, -1.0, 1e7])
def test_cost_model_refuses_a_bad_per_sequence(ps):
    with pytest.raises(ValueError, match="per_sequence"):
        CostModel((1, 64), (0.01, 0.02), per_sequence=ps)


# subnormal seconds had been accepted, then failed part-way through a generation (OverflowError in
# the back-off's quotient); a cache file holding them is measured again (the constructor refuses it)
@pytest.mark.parametrize(
    "seconds", [(1e-320, 2e-320), (1e-12, 0.01), (0.01, 1e7), (0.0, 0.01), (0.01, math.inf)]
)
def test_cost_model_refuses_seconds_no_forward_takes(seconds):
    with pytest.raises(ValueError, match=r"seconds must lie in \[1e-09, 1e\+06\]"):
        CostModel((1, 64), seconds)


def test_scaled_curve_stays_in_range_and_the_back_off_stays_finite():
    cm = CostModel((1, 64), (1e-9, 1e-3))
    assert cm.scaled(1e-6).seconds == (1e-9, 1e-9) and cm.scaled(1e12).seconds == pytest.approx((1e3, 1e6))
    b = DraftBudget(cm)
    b._forward = 5e-324  # as small as a float gets: the quotient is infinite
    assert b._share_skip(0.001) == MAX_SKIP


def test_cost_model_checks_its_types_and_token_counts():
    with pytest.raises(TypeError, match="per_sequence"):
        CostModel((1, 64), (0.01, 0.02), per_sequence="0.1")
    with pytest.raises(TypeError, match="seconds"):
        CostModel((1, 64), ("0.01", "0.02"))
    with pytest.raises(ValueError, match="tokens"):
        CostModel((1, math.nan), (0.01, 0.02))
    cm = CostModel((1, 64), (0.01, 0.02), per_sequence=0.001)
    for bad in (math.nan, -1, math.inf, np.array([1.0, -2.0])):
        with pytest.raises(ValueError, match="n_tokens"):
            cm.cost(bad)
    with pytest.raises(ValueError, match="n_seqs"):
        cm.cost(1, math.nan)
    assert cm.cost(0) == cm.cost(1) == 0.01 and cm.cost(np.array([1, 64]), 2).tolist() == [0.011, 0.021]


def test_a_damaged_cost_cache_is_measured_again(model, tmp_path, monkeypatch):
    fresh = CostModel((1, 8), (0.5, 0.6), per_sequence=0.01)
    monkeypatch.setattr(CostModel, "measure", classmethod(lambda cls, m, **kw: fresh))
    path = CostModel.cache_path(model, tmp_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for ps in (math.nan, -1.0, math.inf):
        path.write_text(json.dumps({"tokens": [1, 8], "seconds": [0.1, 0.2], "per_sequence": ps}))
        assert CostModel.for_model(model, cache_dir=tmp_path) == fresh
    path.write_text(json.dumps({"tokens": [1, 8], "seconds": [0.1, float("nan")], "per_sequence": 0.0}))
    assert CostModel.for_model(model, cache_dir=tmp_path) == fresh
    path.write_text(json.dumps({"tokens": [1, 8], "seconds": [1e-320, 2e-320], "per_sequence": 0.0}))
    assert CostModel.for_model(model, cache_dir=tmp_path) == fresh
    path.write_text(json.dumps({"tokens": [1, 8], "seconds": [0.1, 0.2], "per_sequence": 0.0}))
    assert CostModel.for_model(model, cache_dir=tmp_path) == CostModel((1, 8), (0.1, 0.2))


def test_draft_budget_checks_its_arguments():
    cm = CostModel((1, 64), (0.01, 0.02))
    with pytest.raises(TypeError, match="target_cost"):
        DraftBudget("x")
    with pytest.raises(TypeError, match="draft_cost"):
        DraftBudget(cm, "x")
    with pytest.raises(TypeError, match="prior"):
        DraftBudget(cm, prior="0.5")
    with pytest.raises(TypeError, match="margin"):
        DraftBudget(cm, margin=None)
    with pytest.raises(TypeError, match="remeasure"):
        DraftBudget(cm, remeasure=1)
    b = DraftBudget(cm, remeasure=lambda: "x")
    with pytest.raises(TypeError, match="remeasure"):
        for _ in range(16):
            b.observe(1, 1, 1.0)  # drifted: the re-measurement is used
    assert DraftBudget(cm, cm, prior=np.float64(0.5)).draft_cost is cm


# -- 4. drafters -----------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [LLMADrafter, PromptLookupDrafter])
@pytest.mark.parametrize(
    "kw, exc, name",
    [
        (dict(match_len="2"), TypeError, "match_len"),
        (dict(copy_len=2.7), TypeError, "copy_len"),
        (dict(copy_len=True), TypeError, "copy_len"),
        (dict(match_len=0), ValueError, "match_len"),
    ],
)
def test_lookup_drafters_check_their_lengths(cls, kw, exc, name):
    with pytest.raises(exc, match=name):
        cls(**kw)
    assert cls(match_len=np.int64(3)).match_len == 3


def test_draft_model_drafter_checks_its_arguments(model):
    with pytest.raises(TypeError, match="model must be a Model"):
        DraftModelDrafter(None)
    with pytest.raises(TypeError, match="max_draft"):
        DraftModelDrafter(model, max_draft=2.5)
    with pytest.raises(ValueError, match="max_draft"):
        DraftModelDrafter(model, max_draft=0)
    with pytest.raises(TypeError, match="max_draft"):
        make_drafter("llma", max_draft=2.7)
    assert DraftModelDrafter(model, max_draft=np.int64(2)).max_draft == 2


# -- 5. chat templates -----------------------------------------------------------------------------
def test_a_broken_template_fails_at_the_first_chat_prompt(tok):
    # raw jinja2 errors before; the tokenizer still loads (plain prompts need no template)
    for template in ("{% for m in messages %}", "{{ messages|no_such_filter }}", "{{ 1 + }}"):
        broken = with_template(tok, template)
        assert broken.decode(broken.encode("plain text")) == "plain text"
        with pytest.raises(ValueError, match=r"tokenizer\.chat_template is not a valid jinja2 template"):
            broken.apply_chat_template([{"role": "user", "content": "Hi"}])


@pytest.mark.parametrize(
    "template, error",
    [
        ("{{ foo.bar }}", "UndefinedError"),
        ("{{ messages.append(1) }}", "SecurityError"),
        ("{{ 10.0 ** 400 }}", "OverflowError"),
        ("{{ 1 // 0 }}", "ZeroDivisionError"),
        ("{% include 'other' %}", "TypeError"),
        ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "RecursionError"),
    ],
)
def test_a_template_that_fails_to_render_names_the_key(tok, template, error):
    bad = with_template(tok, template)
    with pytest.raises(ValueError, match=rf"tokenizer\.chat_template failed to render.*{error}"):
        bad.apply_chat_template(MSG)


NESTED_RANGES = (
    "{% for i in range(2000) %}{% for j in range(2000) %}{% for k in range(2000) %}x{% endfor %}"
    "{% endfor %}{% endfor %}"
)


@pytest.mark.parametrize(
    "template, what",
    [
        (NESTED_RANGES, "steps"),
        ("{% set l = [0] * 1000 %}{% for i in l %}{% for j in l %}{% endfor %}{% endfor %}", "steps"),
        (
            "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(40) }}",
            "steps",
        ),
        ("{{ 'a' * 50000000 }}", "repeats a str"),
        ("{{ [0] * 50000000 }}", "repeats a list"),
        ("{{ (9 ** (9 ** 9)) % 7 }}", "power"),
        (
            "{% set ns = namespace(s='a') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
            "str",
        ),
        (
            "{% set ns = namespace(s=[1]) %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
            "join",
        ),
        (
            "{% macro d(s, n) %}{% if n %}{{ d(s ~ s, n - 1) }}{% endif %}{% endmacro %}{{ d('a', 60) }}",
            "str",
        ),
        ("{{ 'a'|center(1000000000) }}", "integer"),
        ("{{ 'a'.ljust(1000000000) }}", "integer"),
        ("{{ '%999999999s' % 'a' }}", "width"),
        ("{{ '{:>999999999}'.format(1) }}", "width"),
        ("{{ '%999999999s'|format('a') }}", "width"),
        ("{% set b = 'a' * 1000000 %}{{ b|replace('a', b) }}", "replace"),
        ("{% set b = 'a' * 1000000 %}{{ b.replace('a', b) }}", "replace"),
        ("{% set b = 'a' * 1000000 %}{{ ([b] * 1000)|join }}", "join"),
        ("{% set b = '\\n' * 1000000 %}{{ b|indent(1000) }}", "indent"),
        ("{% set x %}{% for i in range(10000) %}{{ 'a' * 1000 }}{% endfor %}{% endset %}", "characters"),
        ("{% for i in range(100000) %}" + "x" * 1000 + "{% endfor %}", "characters"),
        ("{{ range(10**30)|list }}", "integer"),
        ("{{ range(1000000)|list }}", "steps"),
    ],
)
def test_a_template_is_bounded(tok, template, what):
    bad = with_template(tok, template)
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=rf"tokenizer\.chat_template .*{what}"):
        bad.apply_chat_template(MSG)
    assert time.perf_counter() - t0 < 20  # each ran for hours, or took gigabytes, before


def test_the_bounds_scale_with_the_messages(tok):
    """Long content is rendered (the size bound allows the messages' text four times over)."""
    echo = with_template(tok, "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}")
    long = [{"role": "user", "content": "ab " * 1_000_000}]
    assert echo.apply_chat_template(long) == "<|im_start|>" + long[0]["content"] + "<|im_end|>"
    loops = with_template(tok, "{% for m in messages %}{{ loop.index }}/{{ loop.length }} {% endfor %}")
    assert loops.apply_chat_template(MSG * 3) == "1/3 2/3 3/3 "


@pytest.mark.parametrize("bad", [None, "float32x", np.int32])
def test_a_cache_dtype_that_is_not_a_float_is_refused(bad, tiny_path):
    # numpy.dtype(None) is float64: None gave a float64 cache (twice the bytes) without a word.
    from decoding import load_model

    error = TypeError if isinstance(bad, str) else ValueError
    with pytest.raises(error, match="dtype must be"):
        KVCache(1, 1, 2, max_seqs=1, capacity=2, dtype=bad)
    model, _ = load_model(tiny_path[0], dtype=np.float32)  # its own: the test sets an attribute
    with pytest.raises(error, match="kv_dtype must be"):
        model.kv_dtype = bad
    assert model.kv_dtype == np.float32 and model.new_cache(max_seqs=1, capacity=2).dtype == np.float32


# ------------------------------------------------------------------ a probe of 2026-12-07
def test_forward_refuses_another_models_cache(model, tmp_path):
    # The compiled store wrote this model's 2 KV heads into a 1-head cache's buffers (the process
    # aborted: "double free or corruption"); a 2-head cache under a 1-head model gave logits off by 7.
    from decoding.loading import load_model

    from .tiny_llama import write_tiny_llama

    write_tiny_llama(tmp_path / "kv1.gguf", n_kv_heads=1)
    one_head = load_model(tmp_path / "kv1.gguf", dtype=np.float64).model
    for m, other in ((model, one_head), (one_head, model)):
        cache = other.new_cache(max_seqs=1, capacity=20)
        s = cache.allocate()
        with pytest.raises(ValueError, match="cache holds .* KV heads"):
            m.forward([1, 2, 3, 4], cache=cache, seq_ids=[s], cu_seqlens=[0, 4])
        assert cache.lengths[s] == 0  # refused before anything was written
    cache = KVCache(
        model.n_layers, model.config.n_kv_heads, 2 * model.config.head_dim, max_seqs=1, capacity=8
    )
    with pytest.raises(ValueError, match="KV heads of size"):
        model.forward([1, 2], cache=cache, seq_ids=[cache.allocate()], cu_seqlens=[0, 2])


def test_forward_refuses_a_cache_on_another_device(model):
    xps = pytest.importorskip("array_api_strict")
    cache = KVCache.for_model(model.to_device(xps, xps.Device("device1")), max_seqs=1, capacity=8)
    with pytest.raises(ValueError, match="cache lives on .*the model on the CPU"):
        model.forward([1, 2], cache=cache, seq_ids=[cache.allocate()], cu_seqlens=[0, 2])
    # where the buffers are decides, not the device the cache was given: none is the default device
    dev = model.to_device(xps)
    cache = KVCache(dev.n_layers, dev.config.n_kv_heads, dev.config.head_dim, max_seqs=1, capacity=8,
                    dtype=np.float64, xp=xps)  # fmt: skip
    assert dev.forward([1, 2], cache=cache, seq_ids=[cache.allocate()], cu_seqlens=[0, 2]).shape[0] == 2


def test_tokens_that_see_no_key_get_nan_logits(model):
    # key_valid hiding every key of a token left it averaging the hidden ones: finite logits, off by
    # 22 from the unmasked ones, without a word. Its row is NaN now; the other rows are untouched.
    def run(valid, logits="all"):
        cache = model.new_cache(max_seqs=2, capacity=6)
        seqs = [cache.allocate(), cache.allocate()]
        return model.forward(
            [5, 6, 7, 8, 9], cache=cache, seq_ids=seqs, cu_seqlens=[0, 3, 5], key_valid=valid, logits=logits
        )

    valid = np.ones((2, 6), dtype=bool)
    valid[0, :2] = False  # sequence 0: its first two tokens see nothing, the third sees itself
    got, ref = run(valid), run(None)
    assert np.isnan(got[:2]).all() and np.isfinite(got[2:]).all()
    assert np.array_equal(got[3:], ref[3:])  # sequence 1 is untouched
    valid[0, :3] = False  # now the last token of sequence 0 is blind too
    last = run(valid, "last")
    assert np.isnan(last[0]).all() and np.array_equal(last[1], run(None, "last")[1])


def test_a_left_padded_prefill_keeps_its_logits(model, tok):
    # vanilla decoding left-pads prompts and hides the pads: they are blind, and their rows unread
    from decoding import generate

    prompts = ["the cat in the hat", "x y"]
    ref = generate(model, tok, prompts, max_new_tokens=6)
    res = generate(
        model, tok, prompts, max_new_tokens=6, method="vanilla", drafter="llma", references=prompts
    )
    assert res.tokens == ref.tokens


def test_a_draft_model_of_a_shorter_context_is_refused_up_front(model, tok, tmp_path):
    # Its forward refused position 16 several steps into the decoding, without naming the drafter.
    from decoding import generate
    from decoding.loading import load_model

    from .tiny_llama import write_tiny_llama

    write_tiny_llama(tmp_path / "ctx16.gguf", context=16, seed=1)
    draft = load_model(tmp_path / "ctx16.gguf", dtype=np.float64).model
    prompt = "the cat in the hat"
    n = len(tok.encode(prompt))
    with pytest.raises(ValueError, match="draft model's context is 16 tokens"):
        generate(model, tok, [prompt], max_new_tokens=30, method="ems", drafter=DraftModelDrafter(draft))
    res = generate(
        model, tok, [prompt], max_new_tokens=16 - n, method="ems", drafter=DraftModelDrafter(draft)
    )
    assert res.tokens == generate(model, tok, [prompt], max_new_tokens=16 - n).tokens  # the limit itself runs


def test_a_negative_memory_limit_is_refused(monkeypatch):
    from decoding import memory

    monkeypatch.setenv("DECODING_MEMORY_LIMIT", "-5")
    with pytest.raises(ValueError, match="DECODING_MEMORY_LIMIT must be a number of bytes >= 0, got '-5'"):
        memory.available_bytes()
    monkeypatch.setenv("DECODING_MEMORY_LIMIT", "0")
    assert memory.available_bytes() == (0, "DECODING_MEMORY_LIMIT")
