"""Concurrent calls under numba's workqueue threading layer (the one numba falls back to where
neither OpenMP nor TBB loads): it aborted the process on two concurrent parallel launches; the
kernels now launch one at a time under it (rsketch._parallel), with the same results."""

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = r"""
import numpy as np, rsketch
from concurrent.futures import ThreadPoolExecutor
A = np.random.default_rng(0).standard_normal((40000, 100))
kinds = ["sparse_sign", "gaussian", "srht", "countsketch", "uniform", "srdct"]
ref = {k: rsketch.make_sketch(k, 40000, 200, seed=1) @ A for k in kinds}
def sketch(i):
    k = kinds[i % len(kinds)]
    return k, rsketch.make_sketch(k, 40000, 200, seed=1) @ A
with ThreadPoolExecutor(8) as ex:
    products = list(ex.map(sketch, range(36)))
assert all(np.array_equal(out, ref[k]) for k, out in products)
X = np.random.default_rng(1).standard_normal((20000, 30)); y = X @ np.arange(30.0)
serial = [rsketch.lstsq(X, y, seed=s).coef for s in range(6)]
with ThreadPoolExecutor(4) as ex:
    fits = list(ex.map(lambda s: rsketch.lstsq(X, y, seed=s).coef, range(6)))
assert all(np.array_equal(a, b) for a, b in zip(serial, fits))
import numba
print(numba.threading_layer())
"""


def test_concurrent_sketches_and_solves_under_workqueue():
    env = dict(os.environ, NUMBA_THREADING_LAYER="workqueue")
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600, env=env,
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "workqueue"
