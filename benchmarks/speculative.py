"""Multi-sample speculative decoding (EMS-SD) against the padded baseline and autoregressive decoding.

Model: SmolLM2-135M-Instruct (Q4_1 GGUF held quantized). Workload, built at run
time from text every Python installation has: docstrings of standard-library functions and
classes (the first 45 words of each docstring that is at least 45 words long and mostly prose,
from a fixed list of modules; 16 of them, evenly spaced). Two tasks:

- ``copy``: "Copy this text word for word" + the docstring, the docstring as LLMA reference
  (copy-heavy: LLMA's best case). Every other prompt has the answer opened by the docstring's
  first three words: SmolLM2-135M then quotes the text (mean accepted draft length 6.3 of 7 on the
  first 8 prompts primed this way), while unprimed it rewrites it, starts a code block or
  paraphrases (2.4). A batch thus mixes samples that copy long spans with samples that copy
  little, as a summarisation batch does (the paper's CNN/DailyMail workload with OPT-6.7B);
- ``chat``: 16 general questions, a docstring as (unrelated) reference (low overlap: the worst case).

For batch sizes 1, 2, 4, 8, 16 (the first ``B`` prompts), greedy: autoregressive decoding, then
with the LLMA drafter (match 2, copy 7) and the draft-model drafter (the target's first 7 of
30 layers, self-speculative, 2 draft steps): vanilla (padded), EMS-SD without the budget, and
EMS-SD with the draft budget. Every speculative run must give the autoregressive tokens
("same" column). Batch sizes 1, 2 and 4 all decode the first 4 prompts (in 4, 2 and 1 batches), 8
and 16 the first 8 and 16; rates are medians of 8 runs taken in rounds (autoregressive and the three
LLMA methods in turn, so that the machine's drift touches all alike; each round starts one method later,
so that each takes each place in a round twice: an autoregressive run at a round's end measured 0.977x
the one at its start), one run for the draft model.
The targets take the median over the rounds of each round's ratio (paired runs).

Speed is tokens per wall second of the decode phase, on an otherwise idle machine (the engine's
kernels run on two numba threads, and spin-waiting threads count as CPU time, so CPU time would
not weigh the methods equally). Tokens per CPU second is reported beside it. Speedup =
tokens/s over the autoregressive run with the same prompts.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import platform
import time
from pathlib import Path

import numpy as np

from benchmarks._harness import Report, Target

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "figures"

MODULES = (
    "json collections string textwrap csv heapq bisect random statistics fractions shutil tempfile glob "
    "fnmatch difflib pprint calendar functools itertools operator contextlib queue sched os.path "
    "urllib.parse email.utils html"
).split()

QUESTIONS = [
    "Write one sentence about the sea.",
    "What is the capital of France?",
    "Give me a short tip for staying healthy.",
    "Name three primary colors.",
    "Why is the sky blue?",
    "Suggest a name for a pet cat.",
    "What is a good breakfast?",
    "Describe a rainy day in two sentences.",
    "What do bees make?",
    "How many legs does a spider have?",
    "Tell me a fun fact about the Moon.",
    "What is seven times eight?",
    "Write a haiku about autumn.",
    "What should I pack for a picnic?",
    "Give one reason to learn music.",
    "What is the opposite of cold?",
]

# The paper's Fig. 1 (OPT-6.7B, LLMA, one GPU): speedup over greedy autoregressive decoding.
SMALL_GROUP = 4  # batch sizes 1, 2, 4 all decode the same first 4 prompts (in 4, 2, 1 batches)
DM_DRAFT = 2  # draft-model steps per proposal
ROUND_METHODS = 4  # autoregressive and the three LLMA methods, the runs of a round
PAPER_BATCH = [1, 2, 4, 8, 12, 16, 20, 24]
PAPER_VANILLA = [3.94, 3.21, 2.26, 1.37, 0.99, 0.83, 0.70, 0.66]
PAPER_EMS = [3.94, 3.50, 2.83, 2.17, 1.81, 1.63, 1.46, 1.41]


def stdlib_documents(n: int = 16, words: int = 45) -> list[str]:
    """``n`` prose docstrings of the standard library (deterministic for a Python version)."""
    docs = []
    for mod_name in MODULES:
        mod = importlib.import_module(mod_name)
        for name in sorted(dir(mod)):
            obj = getattr(mod, name)
            if name.startswith("_") or not callable(obj) or getattr(obj, "__module__", None) != mod.__name__:
                continue
            d = inspect.getdoc(obj)
            w = d.split() if d else []
            if len(w) < words:
                continue
            text = " ".join(w[:words])
            if sum(c.isalpha() or c == " " for c in text) / len(text) > 0.9:
                docs.append(text)
    if len(docs) < n:
        raise RuntimeError(f"only {len(docs)} standard-library docstrings qualify, {n} needed")
    idx = np.linspace(0, len(docs) - 1, n).round().astype(int)
    return [docs[i] for i in idx]


def _first_words(text: str, n: int) -> str:
    return " ".join(text.split()[:n])


def build_workload(tok, n: int = 16) -> dict:
    docs = stdlib_documents(n)

    def chat(q):
        return tok.apply_chat_template([{"role": "user", "content": q}])

    tasks = {
        "copy": (
            [
                chat("Copy this text word for word:\n\n" + d) + (_first_words(d, 3) if i % 2 == 0 else "")
                for i, d in enumerate(docs)
            ],
            docs,
        ),
        "chat": ([chat(q) for q in QUESTIONS[:n]], docs),
    }
    h = hashlib.sha256("\x00".join(p for ps, _ in tasks.values() for p in ps).encode()).hexdigest()[:16]
    return {"tasks": tasks, "hash": h, "n_docs": len(docs)}


def _measure_groups(fn, model, tok, groups, **kwargs) -> dict:
    """Run ``fn`` once on each group of prompts; decode tokens per wall and per CPU second.

    Decode CPU time of a call = its CPU time times the decode share of its wall time.
    """
    n = cpu_dec = wall_dec = steps = acc = computed = pads = forwards = 0.0
    tokens = []
    spec = "method" in kwargs
    for ps, rs in groups:
        extra = {"references": rs} if spec else {}
        c0 = time.process_time()
        res = fn(model, tok, ps, **kwargs, **extra)
        cpu = time.process_time() - c0
        tokens += res.tokens
        n += res.n_generated - sum(1 for t in res.tokens if t)  # the first token comes from the prefill
        cpu_dec += cpu * res.decode_time / max(res.total_time, 1e-12)
        wall_dec += res.decode_time
        if spec:
            st = res.stats
            steps += st["sample_steps"]
            acc += st["accepted_tokens"]
            f = st["verify_forwards"]
            forwards += f
            computed += res.tokens_per_forward * f if f else 0.0
            pads += res.padding_fraction * res.tokens_per_forward * f if f else 0.0
    return {
        "tokens": tokens,
        "cpu_rate": n / cpu_dec,
        "wall_rate": n / wall_dec,
        "accepted": acc / steps if steps else float("nan"),
        "tok/fwd": computed / forwards if forwards else float("nan"),
        "pad": pads / computed if computed else 0.0,
    }


def _median_run(runs: list[dict]) -> dict:
    """The first run's tokens and statistics with the median rates of all (greedy runs repeat exactly)."""
    if any(r["tokens"] != runs[0]["tokens"] for r in runs):
        raise RuntimeError("a repeated greedy run gave different tokens")
    return {
        **runs[0],
        "cpu_rate": float(np.median([r["cpu_rate"] for r in runs])),
        "wall_rate": float(np.median([r["wall_rate"] for r in runs])),
    }


def run(quick: bool = False) -> Report:
    import decoding
    from decoding._threads import blas_threads
    from decoding.cost_model import CostModel
    from decoding.drafters import DraftModelDrafter, LLMADrafter

    model, tok = decoding.load_model()
    batches = [2, 4] if quick else [1, 2, 4, 8, 16]
    max_new = {"copy": 8, "chat": 6} if quick else {"copy": 32, "chat": 16}
    repeats = 1 if quick else 2 * ROUND_METHODS  # every method twice in every place of a round
    work = build_workload(tok)
    t_cost = time.perf_counter()
    with blas_threads():
        target_cost = CostModel.for_model(model, refresh=True)  # measured in this run, like the rates
        draft_model = model.truncated(7)
        CostModel.for_model(draft_model, refresh=True)
    t_cost = time.perf_counter() - t_cost

    report = Report(
        "Speculative decoding: EMS-SD vs vanilla (padded) vs autoregressive; SmolLM2-135M, greedy"
    )
    rows, results, paired = [], {}, {}
    t_all = time.perf_counter()
    for task, (prompts, refs) in work["tasks"].items():
        for B in batches:
            # batch sizes below SMALL_GROUP run the first SMALL_GROUP prompts in batches of B
            groups = [
                (prompts[g * B : (g + 1) * B], refs[g * B : (g + 1) * B])
                for g in range(max(1, SMALL_GROUP // B))
            ]
            kw = dict(max_new_tokens=max_new[task])
            methods = (("vanilla", None), ("ems", None), ("ems", "auto"))

            def measure(dname, method, budget, groups=groups, kw=kw):
                if dname == "-":
                    return _measure_groups(decoding.generate, model, tok, groups, **kw)
                if dname == "llma":
                    drafter, k = LLMADrafter(match_len=2, copy_len=7), 7
                else:
                    drafter, k = DraftModelDrafter(draft_model, max_draft=DM_DRAFT), DM_DRAFT
                return _measure_groups(
                    decoding.generate, model, tok, groups, method=method, drafter=drafter, max_draft=k,
                    draft_budget=budget, **kw,
                )  # fmt: skip

            # Autoregressive and the three LLMA runs (the targets) in rounds, so that the machine's
            # drift over a few minutes touches all of them alike; medians over the rounds. The
            # draft model, far from every target, runs once.
            timed = [("-", "autoregressive", None)] + [("llma", m, b) for m, b in methods]
            assert len(timed) == ROUND_METHODS
            runs = {c: [] for c in timed}
            for r in range(repeats):
                for c in timed[r % len(timed) :] + timed[: r % len(timed)]:  # each round one method later
                    runs[c].append(measure(*c))
            res_of = {c: _median_run(rs) for c, rs in runs.items()}
            for m, b in methods:
                res_of[("draft_model", m, b)] = measure("draft_model", m, b)
            ar = res_of[timed[0]]
            rows.append(_row(task, B, "-", "autoregressive", ar, ar, True))
            results[(task, B, "-", "autoregressive")] = 1.0
            for c in timed[1:]:  # each round's ratio to the autoregressive run of the same round
                label = c[1] if c[2] is None else "ems+budget"
                paired[(task, B, label)] = _ratios(runs[c], runs[timed[0]])
            paired[(task, B, "ems/vanilla")] = _ratios(runs[timed[2]], runs[timed[1]])
            for dname in ("llma", "draft_model"):
                for method, budget in methods:
                    res = res_of[(dname, method, budget)]
                    label = method if budget is None else "ems+budget"
                    same = res["tokens"] == ar["tokens"]
                    rows.append(_row(task, B, dname, label, res, ar, same))
                    results[(task, B, dname, label)] = res["wall_rate"] / ar["wall_rate"]
                    if dname == "llma":
                        rows[-1]["paired"] = float(np.median(paired[(task, B, label)]))
                    x = results[(task, B, dname, label)]
                    print(f"  {task} B={B} {dname} {label}: {x:.2f}x, same={same}", flush=True)
    t_all = time.perf_counter() - t_all
    report.rows = rows

    def sp(task, B, d, m):
        return results.get((task, B, d, m), float("nan"))

    # Targets: the median over the rounds of each round's ratio (both runs of a round a second or
    # two apart, so that the machine's slow spells, minutes long, touch both); the ratio of the
    # median rates (the table's speedup column) beside it.
    def med(task, B, what):  # NaN for a batch size not run (a quick run)
        return float(np.median(paired.get((task, B, what), [np.nan])))

    def rounds(task, B, what):
        return ", ".join(f"{r:.2f}" for r in paired.get((task, B, what), []))

    ems1 = med("copy", 1, "ems")
    report.targets.append(
        Target(
            "copy task, LLMA, batch 1: EMS-SD >= 2x autoregressive",
            f"{ems1:.3f}x (ratio of median rates {sp('copy', 1, 'llma', 'ems'):.3f}x)",
            ems1 >= 2.0,
        )
    )
    ratios = {B: med("copy", B, "ems/vanilla") for B in batches if B > 1}
    report.targets.append(
        Target(
            "copy task, LLMA: EMS-SD faster than vanilla at every batch size > 1",
            ", ".join(f"B={B}: {r:.3f}x" for B, r in ratios.items()),
            all(r > 1.0 for r in ratios.values()),
        )
    )
    if 8 in ratios:
        of_medians = sp("copy", 8, "llma", "ems") / sp("copy", 8, "llma", "vanilla")
        report.targets.append(
            Target(
                "copy task, LLMA, batch 8: EMS-SD >= 1.3x vanilla",
                f"{ratios[8]:.3f}x (rounds {rounds('copy', 8, 'ems/vanilla')}; ratio of median rates "
                f"{of_medians:.3f}x)",
                ratios[8] >= 1.3,
            )
        )
    bud = {B: med("copy", B, "ems+budget") for B in batches}
    report.targets.append(
        Target(
            "copy task, LLMA, budget on: EMS-SD never below 1.0x autoregressive (B <= 16)",
            ", ".join(f"B={B}: {r:.3f}x" for B, r in bud.items())
            + "; ratios of median rates "
            + ", ".join(f"{sp('copy', B, 'llma', 'ems+budget'):.3f}x" for B in batches),
            all(r >= 1.0 for r in bud.values()),
        )
    )
    report.notes.append(
        "Rounds of the budget target (copy, LLMA, EMS-SD + budget over autoregressive, each round's "
        "ratio): " + "; ".join(f"B={B}: {rounds('copy', B, 'ems+budget')}" for B in batches) + "."
    )
    all_same = all(r["same"] for r in rows)
    report.targets.append(
        Target("every speculative run gives the autoregressive tokens", str(all_same), all_same)
    )
    report.notes += [
        f"Workload: {work['n_docs']} standard-library docstrings (45 words each) of Python "
        f"{platform.python_version()}, sha256/16 of the prompts {work['hash']}; max_new_tokens "
        f"{max_new['copy']} (copy), {max_new['chat']} (chat); batch sizes 1, 2, 4 decode "
        "the first 4 prompts (in 4, 2, 1 batches), 8 and 16 the first 8 and 16; rates are medians of "
        f"{repeats} runs taken in rounds (autoregressive and the three LLMA methods in turn, each round "
        "starting one method later, so that each takes every place in a round equally often); one run "
        "for the draft model.",
        "tok/s wall: generated tokens (less the first, from the prefill) per wall second of the decode "
        "phase; speedup is its ratio to autoregressive at the same B (run on an otherwise idle machine). "
        "tok/s cpu: the same per CPU second, for information (the engine's kernels run on two threads, "
        "whose spin-waits count as CPU time, so CPU time is not a fair common measure).",
        "speedup: the median rate over the autoregressive median rate; paired: the median over the "
        "rounds of each round's ratio to the autoregressive run of the same round (the targets use "
        "it; the two runs of a round are a second or two apart, while the machine's slow spells last "
        "minutes).",
        "accepted: mean accepted draft tokens per sample per step (each step adds one more token); "
        "tok/fwd: tokens computed per verification forward, pads included; pad: the fraction of them "
        "that were pads.",
        "Cost per target forward (this machine, measured once and cached): "
        + ", ".join(
            f"{int(t)}: {1e3 * s:.0f} ms"
            for t, s in zip(target_cost.tokens, target_cost.seconds, strict=True)
        )
        + f"; +{1e3 * target_cost.per_sequence:.1f} ms per extra sequence "
        f"(cost-model measurement: {t_cost:.0f} s).",
        f"Benchmark time: {t_all:.0f} s.",
    ]
    if not quick:
        try:
            _figures(results, batches, target_cost)
            report.notes.append(
                "Figures: docs/figures/speculative_speedup.png, docs/figures/speculative_cost.png."
            )
        except ImportError:
            report.notes.append("Figures not drawn: matplotlib is not installed.")
    return report


def _ratios(runs: list[dict], base: list[dict]) -> list[float]:
    """Each round's rate of ``runs`` over the same round's rate of ``base``."""
    return [r["wall_rate"] / b["wall_rate"] for r, b in zip(runs, base, strict=True)]


def _row(task, B, drafter, method, res, ar, same):
    spec = method != "autoregressive"
    return {
        "task": task,
        "B": B,
        "drafter": drafter,
        "method": method,
        "tok/s cpu": res["cpu_rate"],
        "tok/s wall": res["wall_rate"],
        "speedup": res["wall_rate"] / ar["wall_rate"],
        "paired": "",
        "accepted": res["accepted"] if spec else "",
        "tok/fwd": res["tok/fwd"] if spec else "",
        "pad": res["pad"] if spec else "",
        "same": same,
    }


def _figures(results, batches, cost):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    FIGURES.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4), sharey=False)
    ax = axes[0]
    ax.plot(PAPER_BATCH, PAPER_VANILLA, "s--", color="tab:red", label="vanilla (padded)")
    ax.plot(PAPER_BATCH, PAPER_EMS, "o-", color="tab:blue", label="EMS-SD")
    ax.set_title("paper: OPT-6.7B, LLMA, one GPU")
    for ax, task in zip(axes[1:], ("copy", "chat"), strict=True):
        styles = {
            ("llma", "vanilla"): ("s--", "tab:red", "LLMA vanilla"),
            ("llma", "ems"): ("o-", "tab:blue", "LLMA EMS-SD"),
            ("llma", "ems+budget"): ("^-", "tab:green", "LLMA EMS-SD + budget"),
            ("draft_model", "vanilla"): ("s:", "salmon", "draft model vanilla"),
            ("draft_model", "ems"): ("o:", "lightskyblue", "draft model EMS-SD"),
            ("draft_model", "ems+budget"): ("^:", "lightgreen", "draft model EMS-SD + budget"),
        }
        for (d, m), (fmt, color, label) in styles.items():
            ax.plot(batches, [results[(task, B, d, m)] for B in batches], fmt, color=color, label=label)
        ax.set_title(f"ours: SmolLM2-135M, CPU, {task} task")
    for ax in axes:
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xlabel("batch size")
        ax.set_ylabel("speedup over autoregressive")
        ax.set_xscale("log", base=2)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(FIGURES / "speculative_speedup.png", dpi=110)
    plt.close(fig)

    t = np.array(cost.tokens)
    s = np.array(cost.seconds)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    axes[0].plot(t, 1e3 * s, "o-")
    axes[0].set_xlabel("tokens per forward")
    axes[0].set_ylabel("ms per forward")
    axes[0].set_xscale("log", base=2)
    axes[0].set_title("cost of one target forward (this CPU)")
    axes[1].plot(t, s[0] * t / s, "o-", label="tokens per forward / relative cost")
    axes[1].plot(t, t, "--", color="gray", label="ideal (GPU-like: flat cost)")
    axes[1].set_xscale("log", base=2)
    axes[1].set_yscale("log", base=2)
    axes[1].set_xlabel("tokens per forward")
    axes[1].set_ylabel("throughput gain over 1 token")
    axes[1].set_title("what a perfectly accepted draft could gain")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(FIGURES / "speculative_cost.png", dpi=110)
    plt.close(fig)
