"""Smoke tests of the Raskutti-Mahoney study driver: rows, CSV, figures and the demo table."""

from __future__ import annotations

import csv
import re

import numpy as np
import pytest

from rsketch.experiments import raskutti_mahoney as rm


def test_tiny_study_writes_csv_and_figures(tmp_path):
    config = rm.StudyConfig(n=128, p=4, sizes=(16, 128), designs=("t3",), n_sketches=4)
    rows = rm.run_study(config, progress=False)
    assert len(rows) == len(rm.FAMILIES) * 2
    for row in rows:
        assert row["pe_mean"] >= 1 and row["re_mean"] >= 1 and row["wc_mean"] >= 1
        # the identity holds for the means as well (it is linear)
        assert np.isclose(row["re_mean"], 1 + 4 * (row["pe_mean"] - 1) / 124)
    srht_full = [r for r in rows if r["family"] == "srht" and r["r"] == 128][0]
    assert np.isclose(srht_full["pe_mean"], 1.0)  # n = 128 is a power of two: S^T S = I at r = n
    rm.write_csv(rows, tmp_path / "out.csv")
    with (tmp_path / "out.csv").open() as f:
        back = list(csv.DictReader(f))
    assert len(back) == len(rows) and "pe_upper_paper" in back[0]
    rm.plot_overview(rows, "t3", tmp_path / "o.png", config.delta)
    rm.plot_bounds(rows, "t3", tmp_path / "b.png", config.delta)
    assert (tmp_path / "o.png").stat().st_size > 10_000 and (tmp_path / "b.png").stat().st_size > 10_000


def test_demo_table_lists_four_families_with_bounds():
    text = rm.demo_table(n=300, p=5, r=40, n_sketches=5)
    for family in ("gaussian", "srht", "uniform", "leverage"):
        assert f"\n{family}" in text
    assert "C_PE" in text and "bound" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seed", "-1"], "--seed must be >= 0, got -1"),
        (["--n-sketches", "0"], "--n-sketches must be >= 1, got 0"),
        (["--out", "FILE"], "--out .*: File exists"),
    ],
)
def test_the_study_cli_checks_its_arguments_before_it_runs(tmp_path, capsys, monkeypatch, args, message):
    # a --out that is a file had failed after the whole study ran, a negative --seed in NumPy's words
    monkeypatch.setattr(rm, "run_study", lambda config: pytest.fail("the study ran"))
    (tmp_path / "file").touch()
    args = [str(tmp_path / "file") if a == "FILE" else a for a in args]
    with pytest.raises(SystemExit) as exc:
        rm.main(["--quick", *args])
    assert exc.value.code == 2
    assert re.search(message, capsys.readouterr().err)
