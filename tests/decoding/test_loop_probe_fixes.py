"""Found by a probe of the generation loops: prefetch threads that never ended, a DraftBudget that
carried one call's back-off and counts into the next, stop strings that could never match, and
references of the wrong kind refused with the wrong error class."""

from __future__ import annotations

import gc
import threading
import time
import weakref

import numpy as np
import pytest

import decoding.model as model_module
from decoding import generate, load_model
from decoding.cost_model import CostModel, DraftBudget
from decoding.drafters import Drafter, Proposal


@pytest.fixture
def prefetch_threads(monkeypatch):
    """``DECODING_PREFETCH=1`` for the models made in the test; the prefetch threads they start."""
    monkeypatch.setenv("DECODING_PREFETCH", "1")
    made = []
    init = model_module._Prefetcher.__init__

    def spy(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self._thread)

    monkeypatch.setattr(model_module._Prefetcher, "__init__", spy)
    return made


def _ended(threads) -> bool:
    gc.collect()
    for t in threads:
        t.join(10)
    return not any(t.is_alive() for t in threads)


def test_a_draft_model_call_leaves_no_prefetch_thread(tiny_path, prefetch_threads):
    # each call truncates the target anew; its prefetch thread waited for requests forever: 20 calls
    # with the real model, 20 threads left
    model, tok = load_model(tiny_path[0], dtype=np.float64)  # prefetch on, and on its draft models
    kw = dict(max_new_tokens=4, method="ems", drafter="draft_model", draft_budget=None)
    for _ in range(3):
        generate(model, tok, [[1, 2, 3]], **kw)
    assert len(prefetch_threads) == 4  # the target's and one per draft model
    gc.collect()
    deadline = time.monotonic() + 10
    while sum(t.is_alive() for t in prefetch_threads) > 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sum(t.is_alive() for t in prefetch_threads) == 1  # the target's only, while it lives
    del model, tok
    assert _ended(prefetch_threads)


def test_a_dropped_model_frees_its_weights_with_prefetch_on(tiny_path, prefetch_threads):
    # the thread held views of the weights: 4 loads of the real model, RSS 303 -> 559 MB
    model, tok = load_model(tiny_path[0], dtype=np.float64)
    assert model.prefetch
    generate(model, tok, [[1, 2, 3]], max_new_tokens=2)
    weights = weakref.ref(model.layers[0].wqkv)
    del model, tok
    assert len(prefetch_threads) == 1 and _ended(prefetch_threads)
    assert weights() is None


class _Counting(Drafter):
    """Proposes token 1 as often as allowed; counts the steps it is asked."""

    name = "counting"

    def __init__(self):
        self.asked = 0

    def propose(self, contexts, max_lens, samples):
        self.asked += 1
        return Proposal([np.ones(int(k), dtype=np.int64) for k in max_lens])


def test_a_reused_draft_budget_starts_each_call_afresh(tiny64):
    # A budget kept the back-off its last call ended with: on the real model's repetitive prompt
    # the first of three calls drafted 5 tokens, the next two none; and its counters were running
    # totals, reported as each call's own.
    model, tok = tiny64
    steep = DraftBudget(CostModel((1, 2), (1.0, 2.0)), ask_share=0)  # cuts every draft; 1 s a forward
    drafter, asked, before = _Counting(), [], []
    for _ in range(3):
        drafter.asked = 0
        before.append(steep.rescaled)
        res = generate(model, tok, [[1, 2, 3, 1, 2, 3]], max_new_tokens=20, method="ems", drafter=drafter,
                       draft_budget=steep)  # fmt: skip
        asked.append(drafter.asked)
        assert res.stats["draft_tokens"] == 0
        assert res.stats["budget_rescaled"] == steep.rescaled - before[-1]
        assert res.stats["budget_remeasured"] == 0
    assert before[1] >= 1  # the first call rescaled the curve (1 s against the live forwards' < 0.1 s)
    assert asked[0] > 1 and asked == [asked[0]] * 3  # each call's back-off is its own


class _Waiting(Drafter):
    """Proposes nothing; its first proposal waits until ``go`` is set (signalling ``inside`` first)."""

    name = "waiting"

    def __init__(self):
        self.inside, self.go = threading.Event(), threading.Event()

    def propose(self, contexts, max_lens, samples):
        self.inside.set()
        assert self.go.wait(30)
        return Proposal([np.zeros(0, dtype=np.int64) for _ in samples])


def test_a_draft_budget_serves_one_call_at_a_time(tiny64):
    # as a Drafter object does: two calls at once would interleave their back-offs and counters
    model, tok = tiny64
    budget = DraftBudget(CostModel((1, 128), (25, 27)))
    drafter, results = _Waiting(), []
    kw = dict(max_new_tokens=6, method="ems", draft_budget=budget)
    first = threading.Thread(
        target=lambda: results.append(generate(model, tok, [[1, 2, 3]], drafter=drafter, **kw))
    )
    first.start()
    assert drafter.inside.wait(30)
    try:
        with pytest.raises(RuntimeError, match="draft_budget is in use by another generate call"):
            generate(model, tok, [[4, 5]], drafter="llma", **kw)
    finally:
        drafter.go.set()
        first.join(30)
    ref = generate(model, tok, [[4, 5]], max_new_tokens=6)
    assert len(results) == 1
    assert generate(model, tok, [[4, 5]], drafter="llma", **kw).tokens == ref.tokens  # free again


@pytest.mark.parametrize(
    ("stop", "match"),
    [
        (["\ud800"], r"^stop\[0\] is not valid text: character 0 is a lone surrogate U\+D800"),
        (["ok", "a\udcff"], r"^stop\[1\] is not valid UTF-8: .*byte 0xff"),
        ("\udc80", r"^stop\[0\] is not valid UTF-8"),
    ],
)
def test_a_stop_string_is_checked_as_text(tiny64, stop, match):
    # decoded text never holds a lone surrogate, so such a stop string could never match
    model, tok = tiny64
    with pytest.raises(ValueError, match=match):
        generate(model, tok, [[1, 2, 3]], max_new_tokens=3, stop=stop)


def test_an_empty_float_array_is_an_empty_reference(tiny64):
    # np.array([]) is float64: it was "must hold integer token ids", while [] and "" were accepted
    model, tok = tiny64
    ref = generate(model, tok, [[1, 2, 3], [4, 5]], max_new_tokens=4)
    for empty in (np.array([]), np.zeros(0, dtype=np.float32)):
        res = generate(model, tok, [[1, 2, 3], [4, 5]], max_new_tokens=4, method="ems",
                       references=[empty, [4, 5]], draft_budget=None)  # fmt: skip
        assert res.tokens == ref.tokens
    with pytest.raises(TypeError, match=r"^references\[0\] must hold integer token ids, got dtype float64"):
        generate(model, tok, [[1, 2, 3]], max_new_tokens=2, method="ems", references=[np.array([1.0])])


@pytest.mark.parametrize(
    ("references", "match"),
    [
        ("the cat", r"^references must be a list with one entry per prompt \(1\), got str .*\[text\]"),
        (np.array([[1, 2, 3]]), r"^references must be a list with one entry per prompt \(1\), got ndarray"),
        (5, r"^references must be a list with one entry per prompt \(1\), got int"),
    ],
)
def test_references_that_are_not_a_list_are_a_type_error(tiny64, references, match):
    model, tok = tiny64
    with pytest.raises(TypeError, match=match):
        generate(model, tok, [[1, 2, 3]], max_new_tokens=2, method="ems", references=references)
    wrong_length = r"^references must be a list with one entry per prompt \(1\), got 2"
    with pytest.raises(ValueError, match=wrong_length):
        generate(model, tok, [[1, 2, 3]], max_new_tokens=2, method="ems", references=["a", "b"])


@pytest.mark.parametrize("setting", [True, False])
def test_a_truncated_model_keeps_its_parents_prefetch_setting(tiny64, monkeypatch, setting):
    # truncated() read DECODING_PREFETCH afresh: a draft model prefetched where its target did not
    model, _ = tiny64
    monkeypatch.setenv("DECODING_PREFETCH", "0" if setting else "1")
    old = model.prefetch
    model.prefetch = setting
    try:
        assert model.truncated(1).prefetch is setting
    finally:
        model.prefetch = old
