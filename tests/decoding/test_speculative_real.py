"""Speculative decoding on the real SmolLM2-135M (the default quantized engine, float32 logits): the
autoregressive tokens, up to true near-ties.

Greedy EMS-SD and vanilla must give the autoregressive tokens of every sample. In float32 a
different batch layout may flip the argmax where the top two logits are within rounding; the
test then finds the first differing position, recomputes the autoregressive logits there and
accepts the difference only if their top-2 gap is below 1e-4 of the largest logit (a true
near-tie), reporting it as a warning rather than hiding it.

Skips with the install command when the model package is absent.
"""

from __future__ import annotations

import inspect
import json
import textwrap
import warnings

import numpy as np
import pytest

from decoding import generate

pytestmark = [pytest.mark.slow, pytest.mark.model]
NEAR_TIE = 1e-4  # top-2 logit gap, relative to the largest logit
MAX_NEW = 24


@pytest.fixture(scope="module")
def workload(real_model):
    model, tok = real_model
    funcs = (json.dumps, textwrap.fill, textwrap.wrap, textwrap.shorten, json.loads, inspect.getdoc)
    docs = [" ".join(inspect.getdoc(f).split()[:40]) for f in funcs]
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": "Copy this text word for word:\n\n" + d}])
        for d in docs
    ]
    prompts += [
        tok.apply_chat_template([{"role": "user", "content": q}])
        for q in ("Why is the sky blue?", "Name three fruits.")
    ]
    refs = docs + docs[:2]
    ar = generate(model, tok, prompts, max_new_tokens=MAX_NEW)
    return prompts, refs, ar


def assert_same_up_to_near_ties(model, tok, prompts, got, ref):
    for i, (a, b) in enumerate(zip(got, ref, strict=True)):
        if a == b:
            continue
        t = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
        assert t < min(len(a), len(b)), (
            f"sample {i}: one output is a prefix of the other ({len(a)} vs {len(b)})"
        )
        ctx = tok.encode(prompts[i]) + b[:t]
        cache = model.new_cache(max_seqs=1, capacity=len(ctx) + 1)
        lg = model.forward(
            np.array(ctx), cache=cache, seq_ids=[cache.allocate()], cu_seqlens=[0, len(ctx)], logits="last"
        )[0]
        top2 = np.sort(lg)[-2:]
        gap = (top2[1] - top2[0]) / np.max(np.abs(lg))
        assert gap < NEAR_TIE, (
            f"sample {i} differs at token {t} where the top-2 gap is {gap:.2e} (no near-tie)"
        )
        warnings.warn(
            f"sample {i}: near-tie at token {t} (top-2 gap {gap:.1e} of the largest logit)", stacklevel=2
        )


@pytest.mark.parametrize(("B", "method"), [(4, "ems"), (8, "ems"), (8, "vanilla")])
def test_real_greedy_speculative_equals_autoregressive(real_model, workload, B, method):
    model, tok = real_model
    prompts, refs, ar = workload
    res = generate(
        model, tok, prompts[:B], max_new_tokens=MAX_NEW, method=method, drafter="llma", references=refs[:B],
        draft_budget=None,
    )  # fmt: skip
    assert_same_up_to_near_ties(model, tok, prompts[:B], res.tokens, ar.tokens[:B])
    # the copy prompts make LLMA drafts that are accepted: fewer forwards than tokens
    assert res.mean_accepted > 0.3
    assert res.target_forwards < 1 + MAX_NEW
    if method == "vanilla":
        assert res.padding_fraction > 0


def test_real_draft_model_drafter(real_model, workload):
    model, tok = real_model
    prompts, refs, ar = workload
    res = generate(
        model,
        tok,
        prompts[:4],
        max_new_tokens=12,
        method="ems",
        drafter="draft_model",
        max_draft=3,
        draft_budget=None,
    )
    ref = [t[:8] for t in ar.tokens[:4]]
    assert_same_up_to_near_ties(model, tok, prompts[:4], [t[:8] for t in res.tokens], ref)
    assert res.stats["draft_tokens"] > 0
