"""Sizes that cannot fit (issue 17, item 3, the decoding part).

- ``max_draft`` is bounded by what is left of ``max_new_tokens`` (hence by the context): the
  caches do not grow with it, and the tokens stay the autoregressive ones;
- every buffer that grows with the batch, ``max_new_tokens`` or ``max_draft`` is estimated
  before anything is allocated, and a call that cannot fit raises ``MemoryError`` with the bytes
  it would need and the bytes available; the estimate bounds what a call really allocates;
- the buffers that grew with the batch squared (the draft budget's search) or with the batch
  times the vocabulary (sampling) are computed in blocks, with the same results.
"""

from __future__ import annotations

import os
import tracemalloc

import numpy as np
import pytest

from decoding import autoregressive, generate, kv_cache, memory, scheduling, speculative
from decoding.cost_model import CostModel, DraftBudget
from decoding.kv_cache import KVCache
from decoding.sampling import SamplingParams, TokenNoise, sample
from decoding.speculative import speculative_sizes

PROMPTS = ["the cat in the hat", "the hat the hat the hat the", "x y"]


@pytest.fixture
def caches(monkeypatch):
    """``(max_seqs, capacity, n_layers)`` of every KV cache made (target's and drafter's)."""
    made = []
    init = KVCache.__init__

    def spy(self, n_layers, n_kv_heads, head_dim, *, max_seqs, capacity, **kw):
        made.append((max_seqs, capacity, n_layers))
        init(self, n_layers, n_kv_heads, head_dim, max_seqs=max_seqs, capacity=capacity, **kw)

    monkeypatch.setattr(KVCache, "__init__", spy)
    return made


@pytest.mark.parametrize("method", ["ems", "vanilla"])
@pytest.mark.parametrize("drafter", ["llma", "draft_model"])
def test_a_huge_max_draft_costs_nothing_more(tiny64, caches, method, drafter):
    model, tok = tiny64
    ar = generate(model, tok, PROMPTS, max_new_tokens=10)
    kw = dict(max_new_tokens=10, method=method, drafter=drafter, draft_budget=None)
    caches.clear()
    used = generate(model, tok, PROMPTS, max_draft=8, **kw)  # 8 = max_new_tokens - 2: all usable
    small = list(caches)
    caches.clear()
    huge = generate(model, tok, PROMPTS, max_draft=10**6, **kw)
    assert caches == small  # the same caches, not a million slots
    assert huge.tokens == used.tokens == ar.tokens
    assert huge.stats["max_draft"] == 8
    longest = max(len(tok.encode(p)) for p in PROMPTS)
    if method == "ems":  # the prompt and max_new_tokens, nothing for the drafts
        assert all(cap == longest + 10 for _, cap, _ in caches)


def test_draft_length_is_bounded_by_the_context(tiny64):
    model, tok = tiny64
    ctx = model.config.context_length
    k, cap = speculative_sizes([5], max_new_tokens=ctx - 5, max_draft=10**9, layout="ems", slots=1)
    assert k == ctx - 7 and cap == ctx  # a draft never reaches past the context
    k, cap = speculative_sizes([5], max_new_tokens=1, max_draft=10**9, layout="vanilla", slots=4)
    assert k == 0 and cap == 6


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"temperature": 1.0},
        {"max_batch": 2},
        {"method": "ems", "draft_budget": None},
        {"method": "vanilla", "draft_budget": None},
        {"method": "ems", "drafter": "draft_model", "draft_budget": None, "temperature": 1.0},
    ],
)
def test_a_call_that_cannot_fit_is_refused_before_allocating(tiny64, caches, monkeypatch, kwargs):
    model, tok = tiny64
    monkeypatch.setenv("DECODING_MEMORY_LIMIT", str(200_000))
    caches.clear()
    with pytest.raises(
        MemoryError, match=r"^generate\(3 prompts.* would need .* bytes\); .* available \(DECODING"
    ):
        generate(model, tok, PROMPTS, max_new_tokens=40, **kwargs)
    assert caches == []  # nothing was allocated
    monkeypatch.setenv("DECODING_MEMORY_LIMIT", str(50_000_000))
    assert len(generate(model, tok, PROMPTS, max_new_tokens=40, **kwargs).tokens) == 3


def test_a_cache_larger_than_the_machine_is_refused():
    n, source = memory.available_bytes()
    if n is None:
        pytest.skip("this platform reports no available memory")
    need = KVCache.bytes_for(30, 3, 64, max_seqs=10**4, capacity=10**6)
    assert need > n
    with pytest.raises(
        MemoryError,
        match=r"^a KV cache of 10000 sequences x 1000000 slots would need 419\.10 TiB \(4608\d{11} bytes\)",
    ):
        KVCache(30, 3, 64, max_seqs=10**4, capacity=10**6)
    assert KVCache.bytes_for(30, 3, 64, max_seqs=1, capacity=1) == 46080


def test_available_memory_reads_meminfo_and_cgroups(tmp_path, monkeypatch):
    info = tmp_path / "meminfo"
    info.write_text("MemTotal:  2048 kB\nMemFree:  100 kB\nMemAvailable:  1000 kB\n")
    assert memory._meminfo_available(info) == 1_024_000
    info.write_text("MemTotal:  2048 kB\n")
    assert memory._meminfo_available(info) is None
    assert memory._meminfo_available(tmp_path / "absent") is None
    (tmp_path / "memory.max").write_text("5000\n")
    (tmp_path / "memory.current").write_text("1200\n")
    assert memory._cgroup_available(tmp_path) == 3800
    (tmp_path / "memory.max").write_text("max\n")
    assert memory._cgroup_available(tmp_path) is None
    monkeypatch.setenv("DECODING_MEMORY_LIMIT", "12345")
    assert memory.available_bytes() == (12345, "DECODING_MEMORY_LIMIT")
    monkeypatch.setenv("DECODING_MEMORY_LIMIT", "lots")
    with pytest.raises(ValueError, match="DECODING_MEMORY_LIMIT"):
        memory.available_bytes()
    monkeypatch.delenv("DECODING_MEMORY_LIMIT")
    monkeypatch.setattr(memory, "_meminfo_available", lambda: None)  # the fallback: os.sysconf's pages
    n, source = memory.available_bytes()
    expected = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    # a fallback returning nothing had passed "n is None or n > 0"
    assert n is not None and 0 < n <= 1.2 * expected
    assert source in ("free physical pages (os.sysconf)", "the cgroup's memory.max less memory.current")


def test_prompts_over_the_context_are_refused_first(tiny64, caches):
    model, tok = tiny64
    ctx = model.config.context_length
    caches.clear()
    for kw in ({}, {"method": "ems", "max_draft": 10**6}):
        with pytest.raises(ValueError, match=f"exceeds the model's context of {ctx} tokens"):
            generate(model, tok, "the cat", max_new_tokens=10**12, **kw)
        with pytest.raises(ValueError, match="context"):
            generate(model, tok, [[1] * ctx], max_new_tokens=1, **kw)
    assert caches == []


@pytest.fixture
def estimates(monkeypatch):
    """The total of every memory estimate the loops check."""
    seen = []
    check = scheduling.check_memory

    def spy(parts, what):
        seen.append(check(parts, what))
        return seen[-1]

    monkeypatch.setattr(autoregressive, "check_memory", spy)
    monkeypatch.setattr(speculative, "check_memory", spy)
    return seen


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": 1.0, "top_p": 0.9},
        {"method": "ems", "draft_budget": None, "temperature": 1.0},
        {"method": "vanilla", "draft_budget": None},
        {"method": "ems", "drafter": "draft_model", "draft_budget": None},
    ],
)
def test_the_estimate_bounds_what_a_call_allocates(real_model, estimates, kwargs):
    """The estimate is above the traced peak of a call (NumPy reports its buffers to tracemalloc),
    and not far above it."""
    model, tok = real_model
    prompt = tok.apply_chat_template([{"role": "user", "content": "Write a long story about the sea."}])
    generate(model, tok, prompt, max_new_tokens=2, **kwargs)  # one-time allocations (first calls)
    estimates.clear()
    tracemalloc.start()
    try:
        generate(model, tok, [prompt] * 8, max_new_tokens=12, **kwargs)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    estimate = max(estimates)
    assert peak <= estimate <= 4 * peak, (peak, estimate)


# -- blocks: bounded memory, the same results -------------------------------------------------------
def test_budget_search_in_blocks_gives_the_same_allocation(monkeypatch):
    rng = np.random.default_rng(3)
    budget = DraftBudget(CostModel((1, 8, 64, 512), (1.0, 1.2, 2.5, 12.0)))
    cases = []
    for _ in range(20):
        B = int(rng.integers(1, 12))
        cases.append((rng.uniform(0.05, 0.95, B), rng.integers(0, 8, B), rng.integers(1, 40, B)))
    for padded in (False, True):
        want = [budget.allocate(a, n, remaining=r, padded=padded) for a, n, r in cases]
        for block in (1, 3, 17):
            monkeypatch.setattr("decoding.cost_model._ALLOCATE_ELEMENTS", block)
            got = [budget.allocate(a, n, remaining=r, padded=padded) for a, n, r in cases]
            assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))


def test_sampling_in_blocks_draws_the_same_tokens(monkeypatch):
    logits = np.random.default_rng(0).standard_normal((50, 300))
    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.9)
    samples, positions = np.arange(50) % 7, np.arange(50) // 7
    want = sample(logits, params, TokenNoise(1), samples, positions)
    for rows in (1, 7, 64):
        monkeypatch.setattr("decoding.sampling.SAMPLE_ROWS", rows)
        assert np.array_equal(sample(logits, params, TokenNoise(1), samples, positions), want)


def test_kv_cache_module_checks_before_zeros(monkeypatch):
    """The check comes before the buffers: np.zeros is never called for a cache that cannot fit."""
    calls = []
    monkeypatch.setattr(kv_cache.np, "zeros", lambda *a, **k: calls.append(a) or np.empty(0))
    monkeypatch.setenv("DECODING_MEMORY_LIMIT", "1000")
    with pytest.raises(MemoryError, match=r"would need 1\.88 KiB \(1920 bytes\); 1000 bytes are available"):
        KVCache(1, 1, 4, max_seqs=2, capacity=30)
    assert calls == []


def test_cli_reports_a_call_that_cannot_fit(tiny_path, monkeypatch, capsys):
    from decoding import cli

    monkeypatch.setenv("DECODING_MEMORY_LIMIT", "100000")
    args = ["generate", "the cat", "--model", str(tiny_path[0]), "--batch", "8", "--max-new-tokens", "40"]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: generate(8 prompts") and "would need" in err and "available" in err


def test_max_new_tokens_past_the_context_is_said_plainly(tiny64):
    # "prompts[0] is 2 bytes, more than 0 tokens hold at 13 bytes a token" (a probe, 2026-12-07)
    model, tok = tiny64
    ctx = model.config.context_length
    for max_new in (ctx, 10**12):
        with pytest.raises(ValueError, match=rf"max_new_tokens={max_new} exceeds .* no room for the prompt"):
            generate(model, tok, ["hi"], max_new_tokens=max_new)
