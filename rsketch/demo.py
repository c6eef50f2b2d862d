"""``python -m rsketch.demo``: every sketch operator (SRHT and SRDCT both) on a 200,000 x 50 Gaussian design.

For each operator at r = 2,000 it prints the time to sketch ``[X, y]``, the subspace-embedding
distortion ``max_i |sigma_i(S U) - 1|`` of the column space of X (U from a QR of X), and the
residual of sketch-and-solve relative to ``numpy.linalg.lstsq``'s.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import rsketch


def operator_table(n: int = 200_000, p: int = 50, r: int = 2_000, seed: int = 0) -> str:
    """The operator comparison as printable text (see the module docstring).

    Examples
    --------
    >>> print(operator_table(n=2_000, p=5, r=100))  # doctest: +SKIP
    """
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p))
    y = X @ rng.standard_normal(p) + rng.standard_normal(n)
    Xy = np.column_stack([X, y])
    U = np.linalg.qr(X)[0]
    beta_ols = np.linalg.lstsq(X, y, rcond=None)[0]
    res_ols = np.linalg.norm(y - X @ beta_ols)
    lines = [
        f"Sketch-and-solve on a {n:,} x {p} Gaussian design, r = {r:,} (seed {seed})",
        f"{'operator':<14}{'sketch time (s)':>16}{'distortion':>12}{'residual / OLS':>16}",
    ]
    for kind in ("gaussian", "srht", "srdct", "countsketch", "sparse_sign", "leverage", "uniform"):
        S = rsketch.make_sketch(kind, n, r, seed=seed, A=X if kind == "leverage" else None)
        t0 = time.perf_counter()
        SXy = S @ Xy
        elapsed = time.perf_counter() - t0
        sv = np.linalg.svd(S @ U, compute_uv=False)
        distortion = float(np.max(np.abs(sv - 1)))
        beta_s = np.linalg.lstsq(SXy[:, :p], SXy[:, p], rcond=None)[0]
        ratio = np.linalg.norm(y - X @ beta_s) / res_ols
        lines.append(f"{kind:<14}{elapsed:>16.3f}{distortion:>12.3f}{ratio:>16.5f}")
    lines.append(
        "distortion: max |sigma_i(S U) - 1| over the column space of X; residual / OLS: "
        "||y - X b_S|| / ||y - X b_OLS|| (1 + O(p/r) expected)"
    )
    return "\n".join(lines)


def main(argv=None) -> None:
    """``python -m rsketch.demo``; it takes no options (``--help`` says so, anything else is refused
    before the demo runs: ``--bogus-flag`` had run the whole demo)."""
    argparse.ArgumentParser(prog="python -m rsketch.demo", description=__doc__).parse_args(argv)
    # Compile the kernels on a small problem first, so the timings show steady-state speed.
    operator_table(n=5_000, p=5, r=200)
    print(operator_table(), flush=True)
    try:
        from rsketch.experiments.raskutti_mahoney import demo_table
    except ImportError:  # the efficiency study is optional for this demo
        return
    print()
    print(demo_table(), flush=True)


if __name__ == "__main__":
    main()
