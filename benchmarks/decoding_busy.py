"""The decoding engine beside a busy process: decode rates at batch 1 and 8, idle and loaded.

The load is one ``while True: pass`` process (a subprocess of this benchmark) for the length of the
loaded measurements, on a machine whose other jobs are whatever they are (the 1-minute load average
is reported). Decoding goes through :func:`decoding.generate`, so the engine's thread policy
(``decoding._threads.ThreadPolicy``: numba threads for the cores the other processes leave free)
decides the thread count, as it does for a user. For comparison: the engine with numba's threads
fixed at the machine's core count (``DECODING_THREADS``, the behaviour before the policy; its calls
alternate with the policy's, idle and loaded, at both batch sizes), and
llama.cpp through ``llama-cpp-python`` under the same load when ``make parity`` has built
``.venv-parity``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import numpy as np

from benchmarks._harness import Report, Target
from decoding._threads import CARRY_OVER


@contextlib.contextmanager
def busy_process():
    """One process spinning in a Python loop beside us for the block's duration."""
    p = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)  # started and scheduled
        yield p
    finally:
        p.kill()
        p.wait()
        # the next idle measurement must not start from the loaded machine's thread count
        time.sleep(CARRY_OVER + 0.5)


@contextlib.contextmanager
def thread_setting(value: str | None):
    """``DECODING_THREADS`` for the block (this benchmark's own process; restored after)."""
    old = os.environ.get("DECODING_THREADS")
    if value is not None:
        os.environ["DECODING_THREADS"] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("DECODING_THREADS", None)
        else:
            os.environ["DECODING_THREADS"] = old


def _rate(model, tok, prompt, B, n_new):
    """Decode tokens/s of one greedy generate() call of ``B`` copies of ``prompt``."""
    from decoding import generate

    res = generate(model, tok, [prompt] * B, max_new_tokens=n_new, seed=0)
    return res.decode_tokens_per_s


def _interleaved_rates(model, tok, prompt, B, n_new, repeats, settings):
    """``(setting, median rate)`` for each ``DECODING_THREADS`` setting, the calls in alternation."""
    runs = {setting: [] for setting in settings}
    for _ in range(repeats):
        for setting in settings:
            with thread_setting(setting):
                runs[setting].append(_rate(model, tok, prompt, B, n_new))
    return [(setting, float(np.median(r))) for setting, r in runs.items()]


def run(quick: bool = False) -> Report:
    from benchmarks.decoding_engine import _llamacpp_figures
    from decoding import load_model
    from decoding.api import model_path

    ncpu = os.cpu_count() or 1
    report = Report(
        f"Decoding beside a busy process: SmolLM2-135M, batch 1 and 8, idle and with one busy-loop "
        f"process ({ncpu} logical CPUs)"
    )
    model, tok = load_model()
    text = " ".join(["The engine packs the new tokens of every sequence into one array."] * 20)
    prompt = tok.encode(text)[:64]
    n_new = 8 if quick else 32
    repeats = 1 if quick else 3
    _rate(model, tok, prompt, 1, 4)  # compiled and warm
    _rate(model, tok, prompt, 8, 4)
    # Idle, then beside the busy loop, each time the policy ("auto") and the fixed count in alternation,
    # call by call: the fixed row measured after the policy's ran on a warmer process (17-20% apart idle,
    # where interleaved calls were within 3%: docs/decoding.md, "Threading").
    settings = ("auto", str(ncpu))
    rates = {}
    for load in ("idle", "busy"):
        with busy_process() if load == "busy" else contextlib.nullcontext():
            for B in (1, 8):
                for setting, rate in _interleaved_rates(model, tok, prompt, B, n_new, repeats, settings):
                    rates[setting, B, load] = rate
    for setting in settings:
        for B in (1, 8):
            engine = (
                "ours (thread policy: auto)" if setting == "auto" else f"ours, numba threads fixed at {ncpu}"
            )
            idle, busy = rates[setting, B, "idle"], rates[setting, B, "busy"]
            report.rows.append(
                {
                    "engine": engine,
                    "batch": B,
                    "idle tok/s": idle,
                    "busy tok/s": busy,
                    "busy / idle": busy / idle,
                }
            )
    figures = {}
    for load in ("idle", "busy"):
        with busy_process() if load == "busy" else contextlib.nullcontext():
            figures[load] = _llamacpp_figures(model_path(), [int(i) for i in prompt], n_new)
    if any(f is None or "error" in f for f in figures.values()):
        bad = next(f for f in figures.values() if f is None or "error" in f)
        why = "not measured: .venv-parity absent (run `make parity`)" if bad is None else bad["error"]
        report.rows.append({"engine": f"llama.cpp: {why}", "batch": 1})
    else:
        for idle, busy in zip(figures["idle"]["runs"], figures["busy"]["runs"], strict=True):
            report.rows.append(
                {
                    "engine": f"llama.cpp (llama-cpp-python), {idle['threads']} thread(s)",
                    "batch": 1,
                    "idle tok/s": idle["decode_tok_s"],
                    "busy tok/s": busy["decode_tok_s"],
                    "busy / idle": busy["decode_tok_s"] / idle["decode_tok_s"],
                }
            )
    for B in (1, 8):
        idle, busy = rates["auto", B, "idle"], rates["auto", B, "busy"]
        report.targets.append(
            Target(
                f"decode at batch {B} beside one busy-loop process >= 50% of the idle rate",
                f"{busy:.1f} / {idle:.1f} tok/s = {100 * busy / idle:.0f}%",
                busy >= 0.5 * idle,
            )
        )
    for B in (1, 8):
        auto, fixed = rates["auto", B, "idle"], rates[str(ncpu), B, "idle"]
        report.targets.append(
            Target(
                f"idle decode at batch {B} with the thread policy at most 10% below numba's threads fixed "
                f"at {ncpu} (the behaviour before the policy)",
                f"{auto:.1f} / {fixed:.1f} tok/s = {100 * auto / fixed:.0f}%",
                auto >= 0.9 * fixed,
            )
        )
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    report.notes.append(
        f"{n_new} new tokens after a {len(prompt)}-token prompt, medians of {repeats} calls, the policy's "
        f"and the fixed count's calls in alternation; 1-minute load average at the end {load:.2f} (the "
        "busy process counts 1 while it runs)"
    )
    return report


if __name__ == "__main__":
    print(run(quick="--quick" in sys.argv).to_markdown())
