"""Sketch operators against their peers, at n = 500,000, k = 100, r = 2,000, float64.

Peers, each measured in the same run:
- ``scipy.linalg.clarkson_woodruff_transform(A, r)`` for CountSketch;
- one read pass over A (``A.T @ v``), the floor for any sketch that reads A once;
- the dense Gaussian sketch ``numpy.random.default_rng(0).standard_normal((r, n)) @ A``, generated
  and multiplied by blocks of columns (512 MB of ``G`` at a time), timed as a whole, for SRHT and
  GaussianSketch.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg

import rsketch
from benchmarks._harness import Report, Target, median_time, median_times_interleaved, peak_memory


def run(quick: bool = False) -> Report:
    n, k, r = (50_000, 100, 2_000) if quick else (500_000, 100, 2_000)
    repeats = 3 if quick else 5
    A = np.random.default_rng(0).standard_normal((n, k))
    v = np.ones(n)
    report = Report(f"Sketch operators: S @ A, n={n:,}, k={k}, r={r:,}, float64")

    S_cs = rsketch.CountSketch(n, r, seed=1)
    # The one-pass contenders are timed in alternation: their ratios are the targets.
    fast = median_times_interleaved(
        {
            "read": lambda: A.T @ v,
            "cw": lambda: scipy.linalg.clarkson_woodruff_transform(A, r, seed=0),
            "countsketch": lambda: S_cs @ A,
        },
        repeats=3 * repeats,
    )
    t_read, t_cw = fast["read"], fast["cw"]

    def dense_gaussian(block=1 << 26):  # the peer as a careful user writes it: G by blocks of columns
        # (512 MB each), not the whole r x n G at once (7.6 GB, which had flattered our ratio)
        rng, out = np.random.default_rng(0), np.zeros((r, A.shape[1]))
        step = max(1, block // r)
        for a in range(0, n, step):
            out += rng.standard_normal((r, min(step, n - a))) @ A[a : a + step]
        return out

    t_dense = median_time(dense_gaussian, repeats=max(1, repeats // 2), warmup=1)
    m_dense = peak_memory(dense_gaussian)
    peers = {
        "read pass A.T@v": t_read,
        "clarkson_woodruff_transform": t_cw,
        "dense Gaussian (numpy)": t_dense,
    }
    for name, t in peers.items():
        report.rows.append({"case": name, "time_s": t, "vs read pass": t / t_read, "peak_MB": ""})
    report.rows[-1]["peak_MB"] = m_dense / 2**20

    times = {}
    for kind in ("countsketch", "sparse_sign", "srht", "gaussian", "uniform", "leverage"):
        opts = {"scores": np.ones(n)} if kind == "leverage" else {}
        S = rsketch.make_sketch(kind, n, r, seed=1, **opts)
        reps = max(1, repeats // 2) if kind == "gaussian" else repeats
        t = fast["countsketch"] if kind == "countsketch" else median_time(lambda S=S: S @ A, repeats=reps)
        times[kind] = t
        mem = peak_memory(lambda S=S: S @ A)
        report.rows.append(
            {"case": f"{kind} S @ A", "time_s": t, "vs read pass": t / t_read, "peak_MB": mem / 2**20}
        )
    S = rsketch.make_sketch("srdct", n, r, seed=1)
    t = median_time(lambda: S @ A, repeats=repeats)
    report.rows.append(
        {
            "case": "srdct S @ A",
            "time_s": t,
            "vs read pass": t / t_read,
            "peak_MB": peak_memory(lambda: S @ A) / 2**20,
        }
    )

    normals_per_s = r * n / times["gaussian"]
    report.notes.append(
        f"GaussianSketch generates {normals_per_s / 1e6:.0f} M normals/s including the product."
    )
    report.targets += [
        Target(
            "CountSketch @ A >= 1.5x faster than scipy.linalg.clarkson_woodruff_transform",
            f"{t_cw / times['countsketch']:.2f}x",
            t_cw / times["countsketch"] >= 1.5,
        ),
        Target(
            "CountSketch @ A within 2x of one read pass over A",
            f"{times['countsketch'] / t_read:.2f}x the read pass",
            times["countsketch"] <= 2 * t_read,
        ),
        Target(
            "SRHT @ A >= 10x faster than the dense Gaussian peer",
            f"{t_dense / times['srht']:.1f}x",
            t_dense / times["srht"] >= 10,
        ),
        Target(
            "GaussianSketch @ A within 1.5x of the dense Gaussian peer",
            f"{times['gaussian'] / t_dense:.2f}x the peer's time",
            times["gaussian"] <= 1.5 * t_dense,
        ),
    ]
    return report
