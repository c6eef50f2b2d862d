"""The draft budget's cost model: drift detection, re-measurement, the cache key, the quick measurement."""

from __future__ import annotations

import json
import logging
import time

import numpy as np
import pytest

from decoding import cost_model
from decoding.cost_model import MAX_SKIP, CostModel, DraftBudget, DriftCheck, weight_format
from decoding.sampling import TokenNoise

CURVE = CostModel((1, 8, 64), (0.010, 0.012, 0.050))


def test_drift_triggers_one_remeasure_then_rescales():
    fresh = CostModel((1, 8, 64), (0.020, 0.024, 0.100))
    calls = []

    def remeasure():
        calls.append(1)
        return fresh

    b = DraftBudget(CURVE, remeasure=remeasure)
    rng = np.random.default_rng(0)
    for _ in range(15):  # live forwards twice as slow as measured (small noise): no verdict before 16
        b.observe(8, 1, 0.024 * rng.uniform(0.95, 1.05))
    assert calls == [] and b.target_cost is CURVE
    b.observe(8, 1, 0.024)
    assert calls == [1] and b.target_cost is fresh and b.remeasured == 1
    for _ in range(32):  # agrees with the new curve: nothing more
        b.observe(8, 1, 0.024 * rng.uniform(0.9, 1.1))
    assert calls == [1] and b.rescaled == 0
    for _ in range(16):  # drifts again (3x): not re-measured twice in a call, the curve is rescaled
        b.observe(1, 1, 0.060)
    assert calls == [1] and b.rescaled == 1
    assert b.target_cost.cost(1) == pytest.approx(0.060, rel=1e-9)


def test_outliers_and_small_drift_do_not_remeasure():
    calls = []
    b = DraftBudget(CURVE, remeasure=lambda: calls.append(1) or CURVE)
    for i in range(64):  # one step in eight is 10x slow (a neighbour's burst), the rest 20% slow
        b.observe(1, 1, 0.10 if i % 8 == 0 else 0.012)
    assert calls == [] and b.rescaled == 0
    check = DriftCheck(CURVE, window=4)
    assert [check.observe(1, 1, 0.0070) for _ in range(4)] == [False] * 3 + [True]  # 30% fast: 1/0.7 > 1.3
    with pytest.raises(ValueError, match="window"):
        DriftCheck(CURVE, window=0)


class FakeModel:
    def __init__(self, dtype="float32", fmt=None):
        self.dtype = np.dtype(dtype)
        if fmt is not None:
            self.weight_format = fmt
        self.n_layers = 2

        class Cfg:
            d_model, n_heads, n_kv_heads, d_ff, vocab_size = 64, 4, 2, 128, 264

        self.config = Cfg()


def test_cache_key_has_version_and_weight_format(tmp_path, monkeypatch):
    f32 = CostModel.cache_path(FakeModel("float32"), tmp_path)
    f64 = CostModel.cache_path(FakeModel("float64"), tmp_path)
    q = CostModel.cache_path(FakeModel("float32", fmt="q4_1+q8_0"), tmp_path)
    assert len({f32, f64, q}) == 3
    assert weight_format(FakeModel("float32", fmt="q4_1+q8_0")) == "q4_1+q8_0"
    assert json.loads(cost_model._key(FakeModel("float64")))[-4] == "float64"
    half_cache = FakeModel("float32", fmt="q4_1+q8_0")
    half_cache.kv_dtype = np.dtype(np.float16)  # the attention reads half the bytes: its own calibration
    assert CostModel.cache_path(half_cache, tmp_path) != q
    on_gpu = FakeModel("float32")
    on_gpu.device = "cuda:0"  # a device's forward costs nothing like the CPU's: its own calibration
    assert CostModel.cache_path(on_gpu, tmp_path) != f32
    assert cost_model.engine_version() in cost_model._key(FakeModel())
    monkeypatch.setattr(cost_model, "COST_MODEL_VERSION", cost_model.COST_MODEL_VERSION + 1)
    assert CostModel.cache_path(FakeModel("float32"), tmp_path) != f32


def test_quick_calibration_is_quick_and_announced_once(tiny64, tmp_path, caplog):
    model, _ = tiny64
    CostModel.measure(model, quick=True)  # compiled and warm
    with caplog.at_level(logging.WARNING, logger="decoding"):
        t0 = time.perf_counter()
        cm = CostModel.for_model(model, cache_dir=tmp_path)
        took = time.perf_counter() - t0
        CostModel.for_model(model, cache_dir=tmp_path, refresh=True)  # the same file: not announced again
    assert took < 2.0
    assert cm.tokens == tuple(float(t) for t in cost_model.QUICK["grid"])
    said = [r.getMessage() for r in caplog.records if "cost per forward" in r.getMessage()]
    assert len(said) == 1 and str(CostModel.cache_path(model, tmp_path)) in said[0]
    stored = json.loads(CostModel.cache_path(model, tmp_path).read_text())
    assert stored["weight_format"] == "float64" and stored["engine_version"] == cost_model.engine_version()


def test_the_loop_feeds_live_timings_to_the_budget(tiny64):
    from decoding.drafters import make_drafter
    from decoding.sampling import SamplingParams
    from decoding.speculative import speculative_generate

    model, tok = tiny64
    calls = []
    wrong = CostModel((1, 64), (100.0, 200.0))  # a curve measured on a machine 10^5 times slower
    budget = DraftBudget(wrong, remeasure=lambda: calls.append(1) or wrong.scaled(1e-5))
    res = speculative_generate(
        model, tok, [[1, 2, 3]], max_new_tokens=24, sampling=SamplingParams(), stop=[],
        noise=TokenNoise(0), drafter=make_drafter("prompt_lookup", model, max_draft=4),
        budget=budget,
    )  # fmt: skip
    assert calls == [1] and res.stats["budget_remeasured"] == 1


def test_a_remeasurement_is_a_pause_not_decoding(tiny64):
    import time

    from decoding.drafters import make_drafter
    from decoding.sampling import SamplingParams
    from decoding.speculative import speculative_generate

    model, tok = tiny64
    wrong = CostModel((1, 64), (100.0, 200.0))

    def slow_remeasure():  # what a quick calibration costs on the real model: about a second
        time.sleep(0.5)
        return wrong.scaled(1e-5)

    t0 = time.perf_counter()
    res = speculative_generate(
        model, tok, [[1, 2, 3]], max_new_tokens=24, sampling=SamplingParams(), stop=[],
        noise=TokenNoise(0), drafter=make_drafter("prompt_lookup", model, max_draft=4),
        budget=DraftBudget(wrong, remeasure=slow_remeasure),
    )  # fmt: skip
    wall = time.perf_counter() - t0
    assert res.stats["budget_remeasured"] == 1 and res.stats["budget_calibration_s"] >= 0.5
    assert res.decode_time <= wall - 0.5 and max(res.step_times) < 0.5  # reported apart


def test_remeasured_once_per_process_and_file(tiny64, tmp_path, monkeypatch):
    model, _ = tiny64
    first = CostModel.for_model(model, cache_dir=tmp_path)
    calls = []
    real = CostModel.measure.__func__

    def counting(cls, m, **kw):
        calls.append(kw)
        return real(cls, m, **kw)

    monkeypatch.setattr(CostModel, "measure", classmethod(counting))
    again = CostModel.remeasured(model, cache_dir=tmp_path)
    assert len(calls) == 1 and again.tokens == first.tokens
    assert CostModel.remeasured(model, cache_dir=tmp_path) == again and len(calls) == 1  # read back
    b = DraftBudget(again, remeasure=lambda: again)  # a re-measurement that gives the curve in use
    for _ in range(16):
        b.observe(1, 1, 3 * again.cost(1))
    assert b.remeasured == 1 and b.rescaled == 1


def test_step_overhead_is_charged_to_drafting_steps():
    from decoding.cost_model import CostModel, DraftBudget

    # a forward of 4 tokens costs 10 ms, of 8 tokens 12 ms: four draft tokens accepted with
    # probability 0.9 give 1.9 tokens a sample for 12 ms against 1 for 10 ms, unless every drafting
    # step also costs the loop 10 ms more (1.9 for 22 ms)
    budget = DraftBudget(CostModel((1, 4, 8), (0.010, 0.010, 0.012)))
    alphas, lengths = np.full(4, 0.9), np.full(4, 1)
    remaining = np.full(4, 32)
    assert budget.allocate(alphas, lengths, remaining=remaining).sum() == 4
    for _ in range(20):  # drafting steps spend 11 ms outside the forward, plain steps 1 ms
        budget.observe_step(True, 0.011)
        budget.observe_step(False, 0.001)
    assert budget.step_overhead == pytest.approx(0.010, rel=1e-3)
    assert budget.allocate(alphas, lengths, remaining=remaining).sum() == 0
    assert budget.allocate(alphas, lengths).sum() == 0  # the rate objective charges it too


def test_quiet_budget_backs_off_and_one_draft_resets_it():
    budget = DraftBudget(CostModel((1, 2), (0.01, 0.02)))
    assert budget.should_propose()
    asked = []
    for _ in range(40):  # the budget keeps cutting every draft: asked at steps 0, 2, 5, 10, 19, ...
        go = budget.should_propose()
        asked.append(go)
        if go:
            budget.record_decision(False)
    gaps = np.diff(np.flatnonzero(asked))
    assert gaps.tolist()[:4] == [2, 3, 5, 9] and gaps.max() <= 17  # skips 1, 2, 4, 8, ... 16 at most
    budget.record_decision(True)
    assert budget.should_propose() and budget.should_propose()  # drafting again: asked every step


def test_cut_asks_are_kept_under_their_share_of_the_time():
    budget = DraftBudget(CostModel((1, 2), (0.01, 0.02)), ask_share=0.01)
    for _ in range(3):
        budget.observe(1, 1, 0.01)  # forwards of 10 ms, as the model says
    budget.record_decision(False, seconds=0.002)
    assert budget._skip == 1  # the first cut: one step, whatever the ask cost
    budget.record_decision(False, seconds=0.002)
    assert budget._skip == 20  # 2 ms an ask is 1% of 20 forwards
    budget.record_decision(False, seconds=0.00001)
    assert budget._skip == 4  # a cheap ask: the doubling
    budget.record_decision(False, seconds=1.0)
    assert budget._skip == MAX_SKIP
    budget.record_decision(True)
    assert budget.should_propose()
    idle = DraftBudget(CostModel((1, 2), (0.01, 0.02)), ask_share=0.01)
    idle.observe(1, 1, 0.01)
    idle.record_nothing_proposed(seconds=0.002)
    assert idle._skip == 1  # the first step without any draft: one step
    idle.record_nothing_proposed(seconds=0.002)
    assert idle._skip == 20  # then the share
    idle.record_decision(False, seconds=0.002)  # a draft was proposed (and cut): idle count reset
    idle.record_nothing_proposed(seconds=0.002)
    assert idle._skip == 1
    with pytest.raises(ValueError, match="ask_share"):
        DraftBudget(CostModel((1, 2), (0.01, 0.02)), ask_share=1.0)


def test_makespan_counts_on_a_sample_the_drafter_rarely_serves():
    from decoding.cost_model import CostModel, DraftBudget

    # this CPU's curve (7 ms for 1 token, 11 for 4, 63 for 32): four samples that accept 97% of
    # their draft tokens, 12 tokens left each. Drafting for all pays when every sample has a draft
    # most steps; when the drafter finds one for sample 1 in one step of ten, it lags anyway and
    # the others' drafts only make them wait for it at a higher cost per step.
    cost = CostModel((1, 2, 4, 8, 16, 32), (0.007, 0.009, 0.011, 0.018, 0.033, 0.063))
    budget = DraftBudget(cost)
    alphas, lengths, remaining = np.full(4, 0.97), np.full(4, 7), np.full(4, 12)
    assert budget.allocate(alphas, lengths, remaining=remaining).sum() >= 16
    often = np.full(4, 0.9)
    assert budget.allocate(alphas, lengths, remaining=remaining, offers=often).sum() >= 16
    rarely = np.array([0.9, 0.1, 0.9, 0.9])
    assert budget.allocate(alphas, lengths, remaining=remaining, offers=rarely).sum() == 0
    # the prediction itself: sample 1 then runs 12 / (1 + 0.1 * 6.2) steps against 1.8 for the others
    t0 = budget.finish_time(alphas, np.zeros(4), remaining, offers=rarely)
    t7 = budget.finish_time(alphas, lengths, remaining, offers=rarely)
    assert t0 == pytest.approx(12 * cost.cost(4)) and t7 > t0
    # the rate objective (one step) does not look ahead: offers do not enter it
    assert budget.allocate(alphas, lengths, offers=rarely).sum() > 0


def test_offer_rates_are_each_samples_own():
    from decoding.cost_model import DraftBudget

    q = DraftBudget.offer_rates(np.array([0, 9, 30]), np.array([0, 9, 30]))
    assert q.tolist() == [0.5, 10 / 11, 31 / 32]  # Laplace: no history is an even chance
    assert DraftBudget.offer_rates(np.array([0, 9]), np.array([9, 9])).tolist() == [1 / 11, 10 / 11]


def test_each_timed_forward_waits_for_its_logits_on_the_host(tiny64, monkeypatch):
    # On a GPU a forward returns before its kernels run: the clock alone read the launches. Every
    # timed forward now ends with its logits on the host, as a decoding step's do.
    import decoding.cost_model

    model = tiny64.model
    timed = []
    real = decoding.cost_model.to_host
    monkeypatch.setattr(decoding.cost_model, "to_host", lambda a: timed.append(a.shape) or real(a))
    CostModel.measure(model, grid=(1, 4), context=8, repeats=2, sequences=3)
    # the warm-up and the rounds: (T = 1, T = 4, 3 tokens on one sequence, 3 sequences) each time
    assert len(timed) >= 2 * 4 and all(s[-1] == model.config.vocab_size for s in timed)
