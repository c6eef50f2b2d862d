"""Backward error of least-squares solvers over the stability family (issue 16's figure).

``python -m rsketch.experiments.stability --out docs/figures [--quick]`` solves
:func:`rsketch.linalg.problems.stability_problem` (``n = 2000``, ``p = 50``) over a grid of condition
numbers and residual norms with ``rsketch.lstsq``'s default (sketch-and-precondition with
refinement), Householder QR and sketch-and-solve, measures each answer's Karlson-Walden backward
error with :func:`rsketch.linalg.backward_error`, and draws it against ``kappa``, one panel per
residual norm. The previous finish (the rounds of preconditioned CG that stopped on a rounding floor,
before issue 16) is no longer in the library; its curve comes from
``docs/figures/stability_previous_finish.csv``, measured with that code on the same problems.
"""

from __future__ import annotations

import argparse
import csv
import sys
import warnings
from pathlib import Path

import numpy as np
import scipy.linalg

import rsketch
from rsketch.linalg import backward_error
from rsketch.linalg.problems import stability_problem

N, P = 2000, 50
KAPPAS = [10.0**e for e in np.arange(0.0, 15.0, 1.0)] + [9e14]
RESIDUALS = [1e-15, 1e-10, 1e-5, 1.0]
U = np.finfo(np.float64).eps / 2


def householder(X, y):
    """Householder QR (LAPACK ``geqrf``), the backward-stable reference."""
    Q, R = scipy.linalg.qr(X, mode="economic")
    return scipy.linalg.solve_triangular(R, Q.T @ y)


SOLVERS = {
    "rsketch.lstsq (default)": lambda X, y: rsketch.lstsq(X, y, seed=0).coef,
    "Householder QR": householder,
    "sketch-and-solve": lambda X, y: rsketch.lstsq(X, y, method="sketch_and_solve", seed=0).coef,
}


def measure(kappas=KAPPAS, residuals=RESIDUALS) -> list[dict]:
    """One row per (solver, kappa, residual norm): the relative backward error.

    Examples
    --------
    >>> rows = measure(kappas=[1e4], residuals=[1e-3])
    >>> sorted({r["solver"] for r in rows}) == sorted(SOLVERS)
    True
    """
    rows = []
    for residual in residuals:
        for kappa in kappas:
            prob = stability_problem(N, P, kappa=kappa, residual_norm=residual, seed=1)
            for name, solve in SOLVERS.items():
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # a non-converged run is a point on the plot
                    coef = solve(prob.X, prob.y)
                be = backward_error(prob.X, prob.y, coef)
                rows.append({"solver": name, "kappa": kappa, "residual_norm": residual, "backward_error": be})
    return rows


def plot(rows: list[dict], previous: list[dict], path: Path) -> None:
    """Backward error against kappa, one panel per residual norm, every solver a line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    residuals = sorted({r["residual_norm"] for r in rows})
    fig, axes = plt.subplots(1, len(residuals), figsize=(4.2 * len(residuals), 3.8), sharey=True)
    styles = {
        "rsketch.lstsq (default)": dict(color="C0", marker="o"),
        "Householder QR": dict(color="k", marker="s", linestyle="--"),
        "sketch-and-solve": dict(color="C3", marker="^"),
        "previous finish": dict(color="C1", marker="x", linestyle=":"),
    }
    for ax, res in zip(np.atleast_1d(axes), residuals, strict=True):
        for name in list(SOLVERS) + ["previous finish"]:
            src = previous if name == "previous finish" else rows
            pts = sorted(
                (r["kappa"], r["backward_error"])
                for r in src
                if r["solver"] == name and r["residual_norm"] == res
            )
            if pts:
                ax.loglog(*zip(*pts, strict=True), label=name, markersize=4, **styles[name])
        ax.axhline(10 * U, color="0.6", linewidth=0.8)
        ax.set_title(f"||r|| = {res:g}")
        ax.set_xlabel("cond(X)")
        ax.set_ylim(1e-19, 1)
    np.atleast_1d(axes)[0].set_ylabel("backward error / ||X||_F  (grey: 10 u)")
    np.atleast_1d(axes)[0].legend(fontsize=8, loc="upper left")
    fig.suptitle(f"Karlson-Walden backward error, n = {N}, p = {P}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def read_rows(path: Path) -> list[dict]:
    """Rows of a CSV written by :func:`write_rows` (numbers as floats)."""
    with open(path, newline="") as fh:
        return [
            {"solver": r["solver"], **{k: float(r[k]) for k in ("kappa", "residual_norm", "backward_error")}}
            for r in csv.DictReader(fh)
        ]


def write_rows(rows: list[dict], path: Path) -> None:
    """The rows as CSV, one per (solver, kappa, residual norm)."""
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["solver", "kappa", "residual_norm", "backward_error"])
        writer.writeheader()
        writer.writerows(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rsketch.experiments.stability", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("docs/figures"))
    parser.add_argument("--quick", action="store_true", help="a coarse grid (a smoke run)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    kappas = [1.0, 1e8, 1e14] if args.quick else KAPPAS
    rows = measure(kappas=kappas)
    write_rows(rows, args.out / "stability.csv")
    prev_path = args.out / "stability_previous_finish.csv"
    previous = read_rows(prev_path) if prev_path.exists() else []
    plot(rows, previous, args.out / "stability_backward_error.png")
    by_problem = {(r["solver"], r["kappa"], r["residual_norm"]): r["backward_error"] for r in rows}
    worst = max(
        be / max(by_problem[("Householder QR", kappa, res)], 10 * U)
        for (solver, kappa, res), be in by_problem.items()
        if solver == "rsketch.lstsq (default)"
    )
    print(f"worst ratio of the default's backward error to max(QR's, 10 u): {worst:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
