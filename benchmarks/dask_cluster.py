"""rsketch on Dask (issue 19): ``S @ X``, ``lstsq``, ``efficiency`` on a LocalCluster (2 workers x 1 thread).

``X`` (10,000,000 x 50 float64, 4 GB; ``--quick``: 200,000 x 50) is written once to a Zarr store in
``$RSKETCH_BENCH_DIR`` (default ``~/.cache/rsketch-bench``) in chunks of 250,000 rows and kept between
runs. Peers, measured in the same run on the same cluster: one full read of the store
(``X.sum().compute()``) and ``dask.array.linalg.lstsq``; for ``efficiency``, the serial run in this
process. Each worker runs one BLAS and one numba thread (the serial run uses this process's, 2 of
each); the spread draws are bitwise the serial ones all the same (docs/dask.md). Targets: ``S @ X``
within 2 reads;
``lstsq`` at least 3x faster than Dask's, residual within ``1 + 1e-10`` of Dask's; peak resident memory of
every worker and of the client at most 1.5 GB; ``efficiency`` (200 draws, n = 200,000, p = 50,
r = 2,000) at least 1.6x the serial speed with identical numbers.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

import numpy as np

import rsketch
from benchmarks._harness import Report, Target, timed

CHUNK_ROWS = 250_000
MEMORY_LIMIT = "1.5GB"
PEAK_LIMIT = 1.5e9


def _store(n: int, p: int, rows: int) -> tuple[str, str]:
    """Paths of the Zarr stores of X and y (written once, in chunks, never whole in memory)."""
    import dask.array as da

    root = Path(os.environ.get("RSKETCH_BENCH_DIR", Path.home() / ".cache" / "rsketch-bench"))
    xpath, ypath = root / f"X_{n}x{p}_{rows}.zarr", root / f"y_{n}_{rows}.zarr"
    if not (xpath.exists() and ypath.exists()):
        root.mkdir(parents=True, exist_ok=True)
        X = da.random.default_rng(0).standard_normal((n, p), chunks=(rows, p))
        y = X @ np.linspace(-1, 1, p) + da.random.default_rng(1).standard_normal(n, chunks=rows)
        da.to_zarr(X, str(xpath), overwrite=True)
        da.to_zarr(y, str(ypath), overwrite=True)
    return str(xpath), str(ypath)


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def run(quick: bool = False) -> Report:
    import dask
    import dask.array as da
    from distributed import Client, LocalCluster

    n, p, r = (200_000, 50, 2_000) if quick else (10_000_000, 50, 2_000)
    eff_n, eff_draws = (20_000, 8) if quick else (200_000, 200)
    rows = CHUNK_ROWS // 10 if quick else CHUNK_ROWS
    xpath, ypath = _store(n, p, rows)
    report = Report(f"rsketch on Dask: n={n:,}, p={p}, chunks of {rows:,} rows, 2 workers x 1 thread")
    # One thread per worker means one for everything in it: Dask's nanny already gives BLAS one, and
    # numba's kernels must get one too, or each worker's pool spins on both cores (measured: 2 BLAS and
    # 2 numba threads per worker made the efficiency draws 0.80x serial, one each 1.80x, numbers identical).
    environ = {name: "1" for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    environ["NUMBA_NUM_THREADS"] = "1"
    with (
        dask.config.set({"distributed.nanny.pre-spawn-environ": environ}),
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            memory_limit=MEMORY_LIMIT,
            dashboard_address=None,
        ) as cluster,
        Client(cluster) as client,
    ):
        X, y = da.from_zarr(xpath), da.from_zarr(ypath)
        X.sum().compute()  # warm the page cache and the workers
        # Warm every worker's compiled kernels (loaded from numba's cache on first use in a process).
        Xw, yw = X[: 4 * rows], y[: 4 * rows]
        (rsketch.SparseSign(4 * rows, 100, seed=0) @ Xw).compute()
        rsketch.lstsq(Xw, yw, seed=0)
        Xs = np.random.default_rng(0).standard_normal((2000, 5))
        rsketch.efficiency(
            Xs, sketch="sparse_sign", sketch_size=100, y=Xs[:, 0] + 1, n_sketches=8, executor=client
        )
        _, t_read = timed(lambda: X.sum().compute())
        S = rsketch.SparseSign(n, r, seed=0)
        _, t_sketch = timed(lambda: (S @ X).compute())
        report.rows.append({"what": "X.sum() (one read)", "seconds": t_read, "reads": 1.0})
        report.rows.append(
            {"what": f"S @ X (sparse sign, r={r})", "seconds": t_sketch, "reads": t_sketch / t_read}
        )
        report.targets.append(
            Target(
                "S @ X within 2 reads of the store", f"{t_sketch / t_read:.2f} reads", t_sketch <= 2 * t_read
            )
        )
        ref, t_dask = timed(lambda: da.linalg.lstsq(X, y[:, None])[0].compute()[:, 0])
        for kappa in (1.0, 1e8):
            scale = np.logspace(0, -np.log10(kappa), p)
            Xk = X * scale if kappa > 1 else X
            res, t_ours = timed(lambda Xk=Xk: rsketch.lstsq(Xk, y, seed=0))
            ours_rss = float(np.linalg.norm((y - Xk @ res.coef).compute()))
            row = {"what": f"rsketch.lstsq, kappa={kappa:.0e}", "seconds": t_ours, "reads": t_ours / t_read}
            row.update(passes=res.log.passes, inner=res.log.inner, converged=res.converged)
            if kappa == 1.0:
                dask_rss = float(np.linalg.norm((y - X @ ref).compute()))
                row.update(vs_dask=t_dask / t_ours, residual_ratio=ours_rss / dask_rss)
                row["coef_rel_diff"] = float(np.linalg.norm(res.coef - ref) / np.linalg.norm(ref))
                report.targets.append(
                    Target(
                        "lstsq at least 3x faster than dask.array.linalg.lstsq",
                        f"{t_dask / t_ours:.2f}x",
                        t_dask >= 3 * t_ours,
                    )
                )
                report.targets.append(
                    Target(
                        "lstsq residual within 1 + 1e-10 of Dask's",
                        f"{ours_rss / dask_rss - 1:.2e}",
                        ours_rss <= (1 + 1e-10) * dask_rss,
                    )
                )
            report.rows.append(row)
        report.rows.append({"what": "dask.array.linalg.lstsq", "seconds": t_dask, "reads": t_dask / t_read})
        rng = np.random.default_rng(2)
        Xe = rng.standard_normal((eff_n, p))
        ye = Xe @ np.ones(p) + rng.standard_normal(eff_n)
        kw = dict(
            sketch="sparse_sign", sketch_size=r if not quick else 500, y=ye, n_sketches=eff_draws, seed=3
        )
        spread, t_spread = timed(lambda: rsketch.efficiency(Xe, executor=client, **kw))
        serial, t_serial = timed(lambda: rsketch.efficiency(Xe, **kw))
        same = np.array_equal(spread.pe_draws, serial.pe_draws) and np.array_equal(
            spread.wc_draws, serial.wc_draws
        )
        report.rows.append(
            {"what": f"efficiency, {eff_draws} draws, serial (this process)", "seconds": t_serial}
        )
        report.rows.append(
            {
                "what": f"efficiency, {eff_draws} draws, executor=client",
                "seconds": t_spread,
                "speedup": t_serial / t_spread,
                "identical": same,
            }
        )
        report.targets.append(
            Target(
                "efficiency on 2 workers at least 1.6x serial, identical numbers",
                f"{t_serial / t_spread:.2f}x, identical={same}",
                same and t_serial >= 1.6 * t_spread,
            )
        )
        peaks = client.run(_peak_rss)
        peaks["client"] = _peak_rss()
        worst = max(peaks.values())
        report.targets.append(
            Target(
                "peak RSS of every worker and the client at most 1.5 GB",
                f"{worst / 1e9:.2f} GB",
                worst <= PEAK_LIMIT,
            )
        )
    report.notes.append(
        "lstsq passes: the sketch, X.T X (Gram inner solves) or one per CG iteration, one per refinement "
        "step's gradient (docs/dask.md). Workers run one BLAS and one numba thread each; the serial "
        "efficiency run uses this process's threads (2 of each)."
    )
    columns = {key: "" for row in report.rows for key in row}  # every row shows every column
    report.rows = [{**columns, **row} for row in report.rows]
    return report
