"""Error against passes of the randomized SVD: subspace iteration, block Krylov, scikit-learn (issue 21).

``python -m rsketch.experiments.lowrank --out docs/figures [--quick]`` builds ``A = U diag(s) V.T``
(``m = 2000``, ``n = 300``, Haar ``U`` and ``V``) with a fast decay ``s_i = exp(-i / 15)`` and a slow
one ``s_i = 1 / sqrt(i + 1)``, computes rank-``k = 20`` approximations (``oversample = 10``) with
:func:`rsketch.svd` (``method="subspace"`` and ``"block_krylov"``) and
:func:`sklearn.utils.extmath.randomized_svd` (``n_iter = q``, its LU-normalised power iterations),
and draws the excess spectral error over the optimum, ``||A - U diag(s) Vt||_2 / s_{k+1} - 1``,
against the range finder's passes over ``A`` (``2 q + 1``; every method then makes one more,
``Q.T A``), the median over 5 seeds. Output: ``lowrank_passes.png`` and ``lowrank_passes.csv``.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np
from sklearn.utils.extmath import randomized_svd

import rsketch

M, N, K, OVERSAMPLE = 2000, 300, 20, 10
SPECTRA = {
    "fast: exp(-i/15)": lambda n: np.exp(-np.arange(n) / 15),
    "slow: 1/sqrt(i+1)": lambda n: 1 / np.sqrt(np.arange(n) + 1),
}
PASSES = [1, 3, 5, 7, 9]


def test_matrix(s, seed=0):
    rng = np.random.default_rng(seed)
    U = np.linalg.qr(rng.standard_normal((M, len(s))))[0]
    V = np.linalg.qr(rng.standard_normal((N, len(s))))[0]
    return (U * s) @ V.T


def approximations(A, passes, seed):
    """``{method: (U, s, Vt)}`` at ``passes`` passes of the range finder."""
    out = {}
    for method in ("subspace", "block_krylov"):
        res = rsketch.svd(
            A, K, oversample=OVERSAMPLE, passes=passes, method=method, error_probes=False, seed=seed
        )
        out[f"rsketch {method}"] = (res.U, res.s, res.Vt)
    out["sklearn randomized_svd"] = randomized_svd(
        A, K, n_oversamples=OVERSAMPLE, n_iter=(passes - 1) // 2, random_state=seed
    )
    return out


def measure(passes=PASSES, seeds=(0, 1, 2, 3, 4)) -> list[dict]:
    rows = []
    for name, spectrum in SPECTRA.items():
        s = spectrum(N)
        A = test_matrix(s)
        for p in passes:
            errs = {}
            for seed in seeds:
                for method, (U, sv, Vt) in approximations(A, p, seed).items():
                    errs.setdefault(method, []).append(np.linalg.norm(A - (U * sv) @ Vt, 2) / s[K] - 1)
            rows += [
                {"spectrum": name, "method": method, "passes": p, "excess_error": float(np.median(e))}
                for method, e in errs.items()
            ]
    return rows


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(SPECTRA), figsize=(9, 3.8))
    styles = {
        "rsketch subspace": dict(color="C0", marker="o"),
        "rsketch block_krylov": dict(color="C2", marker="s"),
        "sklearn randomized_svd": dict(color="k", marker="x", linestyle="--"),
    }
    for ax, name in zip(axes, SPECTRA, strict=True):
        for method, style in styles.items():
            pts = sorted(
                (r["passes"], max(r["excess_error"], 1e-16))
                for r in rows
                if r["spectrum"] == name and r["method"] == method
            )
            ax.semilogy(*zip(*pts, strict=True), label=method, **style)
        ax.set_title(name)
        ax.set_xlabel("passes over A of the range finder (2q + 1)")
    axes[0].set_ylabel("||A - A_k||_2 / s_(k+1) - 1")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Randomized SVD, {M} x {N}, rank {K}, oversample {OVERSAMPLE}: median of 5 seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_rows(rows: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["spectrum", "method", "passes", "excess_error"])
        writer.writeheader()
        writer.writerows(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rsketch.experiments.lowrank", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("docs/figures"))
    parser.add_argument("--quick", action="store_true", help="two pass counts, one seed (a smoke run)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = measure(passes=[1, 3], seeds=(0,)) if args.quick else measure()
    write_rows(rows, args.out / "lowrank_passes.csv")
    plot(rows, args.out / "lowrank_passes.png")
    for r in rows:
        excess = r["excess_error"]
        print(
            f"{r['spectrum']:>18}  {r['method']:>22}  passes {r['passes']}  error / s_(k+1) - 1: {excess:.3g}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
