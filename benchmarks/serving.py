"""Continuous batching: the copy workload served through a fixed number of slots.

The speculative benchmark (:mod:`benchmarks.speculative`) decodes ``B`` prompts in ``B`` slots
(a static batch): its end is set by its slowest sample, so a sample that copies its answer in a
few steps and leaves saves only what a smaller batch costs less. A server instead refills a
finished sample's slot with the next waiting prompt (``decoding.generate(..., max_batch=M)``),
and then every token a draft saves is a token of another prompt sooner.

Workload: the 16 prompts of the speculative benchmark's copy task (same docstrings, same
priming, LLMA with each docstring as reference, match 2, copy 7, 32 new tokens), served through
``M`` = 1, 2, 4, 8 slots (16 is the static batch of the speculative benchmark) by autoregressive
decoding, EMS-SD, and EMS-SD with the draft budget (which maximises each step's tokens per second
while prompts wait, and the remaining samples' finish time once none does). The padded baseline
cannot take part: its cache stays aligned from the first prefill on. Greedy; every run must give
the tokens of the static autoregressive run. Rates are medians of 3 runs taken in rounds.

- ``decode tok/s``: generated tokens (less each prompt's first, from its prefill) per second of
  decoding, the prefills of admitted prompts excluded (they run as their own forwards and are the
  same work for every method);
- ``end-to-end tok/s``: generated tokens per second of the whole call, prefills included.
"""

from __future__ import annotations

import time

import numpy as np

from benchmarks._harness import Report

SLOTS = (1, 2, 4, 8)
MAX_NEW = 32


def _served(generate, model, tok, prompts, refs, M, method, budget):
    kw = (
        {}
        if method == "autoregressive"
        else dict(drafter="llma", max_draft=7, references=refs, draft_budget=budget)
    )
    t0 = time.perf_counter()
    res = generate(model, tok, prompts, max_new_tokens=MAX_NEW, method=method, max_batch=M, **kw)
    wall = time.perf_counter() - t0
    return {
        "tokens": res.tokens,
        "decode": res.decode_tokens_per_s,
        "e2e": res.n_generated / wall,
        "accepted": res.mean_accepted if method != "autoregressive" else float("nan"),
    }


def run(quick: bool = False) -> Report:
    import decoding
    from benchmarks.speculative import build_workload

    model, tok = decoding.load_model()
    prompts, refs = build_workload(tok)["tasks"]["copy"]
    slots = (2,) if quick else SLOTS
    if quick:
        prompts, refs = prompts[:4], refs[:4]
    repeats = 1 if quick else 3
    methods = (("autoregressive", None), ("ems", None), ("ems", "auto"))
    report = Report(
        f"Continuous batching: {len(prompts)} copy-task prompts through M slots; SmolLM2-135M, greedy, LLMA"
    )
    reference = decoding.generate(model, tok, prompts, max_new_tokens=MAX_NEW).tokens  # static AR
    t_all = time.perf_counter()
    for M in slots:
        runs = {m: [] for m in methods}
        for _ in range(repeats):  # in rounds: the machine's drift touches every method alike
            for m in methods:
                runs[m].append(_served(decoding.generate, model, tok, prompts, refs, M, *m))
        med = {
            m: {k: float(np.median([r[k] for r in rs])) for k in ("decode", "e2e", "accepted")}
            for m, rs in runs.items()
        }
        ar = med[methods[0]]
        for m in methods:
            same = all(r["tokens"] == reference for r in runs[m])
            label = m[0] if m[1] is None else "ems+budget"
            report.rows.append(
                {
                    "M": M,
                    "method": label,
                    "decode tok/s": med[m]["decode"],
                    "decode speedup": med[m]["decode"] / ar["decode"],
                    "end-to-end tok/s": med[m]["e2e"],
                    "end-to-end speedup": med[m]["e2e"] / ar["e2e"],
                    "accepted": "" if m[0] == "autoregressive" else med[m]["accepted"],
                    "same": same,
                }
            )
            print(f"  M={M} {label}: decode {med[m]['decode'] / ar['decode']:.2f}x, same={same}", flush=True)
    report.notes += [
        f"{len(prompts)} prompts of the speculative benchmark's copy task, {MAX_NEW} new tokens each; "
        f"medians of {repeats} runs in rounds; same: every run gave the static autoregressive tokens.",
        "decode tok/s excludes the prefills of admitted prompts (their own forwards, the same work "
        "for every method); end-to-end tok/s includes them.",
        f"Benchmark time: {time.perf_counter() - t_all:.0f} s.",
    ]
    return report
