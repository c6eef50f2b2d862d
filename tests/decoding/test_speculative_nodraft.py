"""When the draft budget verifies nothing, the speculative step is the autoregressive step itself."""

from __future__ import annotations

import numpy as np
import pytest

import decoding.autoregressive as ar_mod
import decoding.speculative as spec_mod
from decoding._threads import blas_threads
from decoding.autoregressive import autoregressive_generate
from decoding.cost_model import CostModel, DraftBudget
from decoding.drafters import Drafter, Proposal
from decoding.sampling import SamplingParams, TokenNoise


@pytest.fixture(autouse=True)
def _engine_setting(tmp_path, monkeypatch):
    monkeypatch.setenv("DECODING_CACHE_DIR", str(tmp_path / "cost"))
    with blas_threads():
        yield


def _counting(monkeypatch, module, name):
    calls = []
    fn = getattr(module, name)

    def wrapped(*a, **kw):
        calls.append(len(a[2]) if len(a) > 2 else None)
        return fn(*a, **kw)

    monkeypatch.setattr(module, name, wrapped)
    return calls


class AlwaysDrafter(Drafter):
    """Proposes as many 7s as allowed: there is always something for the budget to trim."""

    name = "always"

    def propose(self, contexts, max_lens, samples):
        return Proposal([np.full(int(k), 7, dtype=np.int64) for k in max_lens])


@pytest.mark.parametrize("B", [1, 5])
def test_no_draft_step_is_the_autoregressive_step(tiny64, monkeypatch, B):
    model, tok = tiny64
    rng = np.random.default_rng(B)
    ids = [[int(t) for t in rng.integers(0, 264, size=int(n))] for n in rng.integers(1, 9, size=B)]
    assert spec_mod.decode_step is ar_mod.decode_step  # one step function for both loops
    ar_calls = _counting(monkeypatch, ar_mod, "decode_step")
    ref = autoregressive_generate(
        model, tok, ids, max_new_tokens=10, sampling=SamplingParams(), stop=[], noise=TokenNoise(0)
    )
    spec_calls = _counting(monkeypatch, spec_mod, "decode_step")
    packed = _counting(monkeypatch, spec_mod, "packed_step")
    steep = DraftBudget(CostModel((1, 2), (1.0, 2.0)))  # a second token costs as much as the first
    res = spec_mod.speculative_generate(
        model, tok, ids, max_new_tokens=10, sampling=SamplingParams(), stop=[], noise=TokenNoise(0),
        drafter=AlwaysDrafter(), max_draft=4, budget=steep,
    )  # fmt: skip
    assert res.tokens == ref.tokens
    assert res.stats["draft_tokens"] == 0 and res.stats["budget_trimmed"] > 0
    assert packed == []  # no verification step at all
    assert spec_calls == ar_calls == [B] * 9  # the same step, as often, on as many sequences
    assert res.stats["budget_shadow_checks"] > 0  # trimmed drafts still teach the budget


def test_drafting_steps_still_verify(tiny64, monkeypatch):
    model, tok = tiny64
    packed = _counting(monkeypatch, spec_mod, "packed_step")
    res = spec_mod.speculative_generate(
        model, tok, [[3, 4, 5]], max_new_tokens=8, sampling=SamplingParams(), stop=[],
        noise=TokenNoise(0), drafter=AlwaysDrafter(), max_draft=4, budget=None,
    )  # fmt: skip
    # every step with a draft is verified; the last step, with one token left, has no room for one
    assert res.stats["draft_tokens"] > 0 and len(packed) == res.stats["target_forwards"] - 2
