"""The benchmark history (benchmarks/history/*.jsonl) and the RESULTS.md rendered from it; no timing."""

import doctest
import importlib
import json
from dataclasses import dataclass, field

import numpy as np
import pytest

import benchmarks.__main__ as bench_main
from benchmarks import report as rp
from benchmarks._log_converter import parse_cell, parse_log

MACHINE = {"cpu": "Test CPU", "simd": ["avx2"], "logical_cpus": 2, "blas": "openblas 0.3.30 (2 threads)"}
MACHINE |= {"python": "3.11.7", "numpy": "2.4.6", "scipy": "1.17.1", "load_avg": 0.5}


def _records(area, stamp, speedup, *, quick=False):
    rep = rp.Report(
        f"{area} table",
        rows=[{"case": "n=10", "speedup": speedup}],
        targets=[rp.Target(">= 2x faster", f"{speedup:.2f}x", speedup >= 2)],
        notes=[f"note of {stamp}"],
    )
    return rp.history_records(rep, area=area, stamp=stamp, quick=quick, machine=MACHINE)


@pytest.mark.parametrize(
    "module", ["benchmarks.report", "benchmarks._log_converter", "benchmarks._harness", "benchmarks.gpu"]
)
def test_docstring_examples(module):
    res = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert res.attempted > 0 and res.failed == 0


def test_render_shows_the_latest_run_of_each_area():
    records = (
        _records("solvers", "2026-12-03 09:00 UTC", 3.0)
        + _records("operators", "2026-12-03 09:30:00 UTC", 1.5)
        + _records("solvers", "2026-12-03 10:00:05 UTC", 1.25)
        + _records("solvers", "2026-12-03 11:00:00 UTC", 9.0, quick=True)  # a smoke run does not count
    )
    md = rp.render(records)
    assert "| solvers | >= 2x faster | 1.25x | **missed** | 2026-12-03 10:00:05 UTC |" in md
    assert "| operators | >= 2x faster | 1.50x | **missed** | 2026-12-03 09:30:00 UTC |" in md
    assert "| n=10 | 1.25 |" in md and "note of 2026-12-03 10:00:05 UTC" in md
    for old in ("| n=10 | 3 |", "note of 2026-12-03 09:00 UTC", "| n=10 | 9 |"):
        assert old not in md
    assert md.index("## operators") < md.index("## solvers")  # benchmarks.AREAS order
    assert "3 run(s) in [history/solvers.jsonl](history/solvers.jsonl)" in md
    assert rp.machine_line(MACHINE) in md


def test_render_marks_met_targets_and_areas_without_one():
    met = _records("efficiency", "2026-12-03 09:00 UTC", 2.5)
    bare = rp.Report("serving table", rows=[{"M": 2}])
    bare = rp.history_records(bare, area="serving", stamp="s", quick=False, machine=MACHINE)
    md = rp.render(met + bare)
    assert "| efficiency | >= 2x faster | 2.50x | met |" in md
    assert "| serving | (no stated target) |" in md


def test_quick_run_stands_only_without_a_full_run():
    latest = rp.latest_runs(_records("serving", "2026-12-03 09:00 UTC", 1.0, quick=True))
    assert latest["serving"].quick
    assert "Run of 2026-12-03 09:00 UTC (--quick)" in rp.render(
        _records("serving", "2026-12-03 09:00 UTC", 1.0, quick=True)
    )


@dataclass
class _Tables(rp.Report):  # as benchmarks/solvers.py returns: a report with further tables
    parts: list = field(default_factory=list)


def test_history_round_trip(tmp_path):
    part = rp.Report("Second table", rows=[{"case": "b", "iters": np.int64(7), "ok": np.bool_(True)}])
    first = _Tables(
        "First table", rows=[{"case": "a", "time_s": np.float64(0.5), "gap": float("nan")}], parts=[part]
    )
    results = tmp_path / "RESULTS.md"
    paths = rp.record_run(
        [("demo", first)],
        quick=False,
        machine=MACHINE,
        stamp="2026-12-03 09:01:00 UTC",
        history=tmp_path,
        results=results,
    )
    assert paths == [tmp_path / "demo.jsonl"]
    lines = paths[0].read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(line)["machine"] == MACHINE for line in lines)
    back = rp.read_history(tmp_path)
    assert back[1]["row"] == {"case": "b", "iters": 7, "ok": True} and back[1]["table"] == "Second table"
    md = results.read_text()
    assert "| a | 0.5 | nan |" in md and "| b | 7 | True |" in md
    assert md.index("### First table") < md.index("### Second table")
    rp.record_run(
        [("demo", first)],
        quick=True,
        machine=MACHINE,
        stamp="2026-12-03 09:05:00 UTC",
        history=tmp_path,
        results=results,
    )
    assert len(rp.read_history(tmp_path)) == 4  # appended, never rewritten


def test_unknown_values_and_lines_fail_clearly(tmp_path):
    rep = rp.Report("T", rows=[{"x": object()}])
    with pytest.raises(TypeError, match="a benchmark row holds object"):
        rp.record_run(
            [("demo", rep)],
            quick=False,
            machine=MACHINE,
            stamp="s",
            history=tmp_path,
            results=tmp_path / "R.md",
        )
    (tmp_path / "demo.jsonl").write_text("{not json\n")
    with pytest.raises(ValueError, match=r"demo.jsonl:1: not a JSON object"):
        rp.read_history(tmp_path)
    with pytest.raises(ValueError, match="no benchmark area"):
        rp.area_of("Something else")


def test_committed_results_are_rendered_from_the_committed_history():
    assert rp.RESULTS.read_text(encoding="utf-8") == rp.render(rp.read_history()), (
        "benchmarks/RESULTS.md is not what the history renders: run `python -m benchmarks --report`"
    )


def test_log_converter_recovers_what_append_results_wrote():
    rep = rp.Report(
        "Sketch operators: demo",
        rows=[
            {"case": "a | b".replace("|", "/"), "time_s": 1.581e4, "peak_MB": ""},
            {"case": "c", "time_s": 2e-7},
        ],
        targets=[rp.Target("fast (really)", "1.2x (of 2)", False)],
        notes=["first note", "MET: not a target, a note after the targets"],
    )
    machine = "CPU: AMD EPYC; logical CPUs: 2; BLAS: openblas 0.3.30 (2 threads); "
    machine += "Python 3.11.7, NumPy 2.4.6, SciPy 1.17.1"
    log = "# Benchmark results\n\n## Run of 2026-12-03 09:01 UTC (--quick)\n\n"
    log += f"{machine}\n\n{rep.to_markdown()}\n"
    records = parse_log(log)
    assert [r["kind"] for r in records] == ["row", "row", "target", "note", "note"]
    assert records[0]["row"] == {"case": "a / b", "time_s": 15810.0, "peak_MB": ""}
    assert records[2]["target"] == "fast (really)" and records[2]["measured"] == "1.2x (of 2)"
    assert records[0]["quick"] and records[0]["source"] == "log" and records[0]["area"] == "operators"
    assert rp.machine_line(records[0]["machine"]) == machine
    assert rep.to_markdown().rstrip("\n") in rp.render(records)
    with pytest.raises(ValueError, match="unreadable line"):
        parse_log(log.replace("- first note", "first note"))
    assert parse_cell("-2.220e-16") == -2.22e-16 and parse_cell("False") is False


def test_main_records_and_reports(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(rp, "HISTORY", tmp_path / "history")
    monkeypatch.setattr(rp, "RESULTS", tmp_path / "RESULTS.md")
    monkeypatch.setattr(bench_main, "AREAS", {"fake": "tests.benchmarks.fake_area"})
    assert bench_main.main(["--quick", "--no-record"]) == 0
    assert not (tmp_path / "history").exists() and not (tmp_path / "RESULTS.md").exists()
    assert bench_main.main(["--quick"]) == 0
    (record,) = [r for r in rp.read_history() if r["kind"] == "row"]
    assert record["area"] == "fake" and record["quick"] and record["row"] == {"case": "a", "quick": True}
    assert record["machine"]["load_avg"] is None or record["machine"]["load_avg"] >= 0
    rendered = (tmp_path / "RESULTS.md").read_text()
    (tmp_path / "RESULTS.md").write_text("stale")
    assert bench_main.main(["--report"]) == 0
    assert (tmp_path / "RESULTS.md").read_text() == rendered
    with pytest.raises(SystemExit):
        bench_main.main(["--report", "--quick"])


def test_gpu_check_records_its_three_reports(monkeypatch):
    # append_results was given one area name for three reports: a GPU run measured everything,
    # then raised "3 reports but 1 area names" and recorded nothing
    import benchmarks._harness as harness
    import benchmarks.gpu as gpu

    calls = []
    for name in ("run", "run_lstsq", "run_decoding"):
        report = rp.Report(name, rows=[{"case": "a"}])
        monkeypatch.setattr(gpu, name, lambda quick, name=name, r=report, **kw: calls.append((name, kw)) or r)
    recorded, stamps = [], []
    record = lambda pairs, **kw: recorded.append([a for a, _ in pairs]) or stamps.append(kw["stamp"]) or []  # noqa: E731
    monkeypatch.setattr(harness, "record_run", record)
    # each part as soon as it is measured (a GPU call cut short keeps the parts before), one stamp
    assert gpu.main([]) == 0 and recorded == [["gpu"], ["gpu"], ["gpu-decoding"]] and len(set(stamps)) == 1
    # --only runs the parts asked for (a stage of gpu_check.sh); --model reaches the decoding run
    calls.clear()
    assert gpu.main(["--only", "decoding", "--model", "m.gguf"]) == 0 and recorded[-1] == ["gpu-decoding"]
    assert calls == [("run_decoding", {"model": "m.gguf"})]
