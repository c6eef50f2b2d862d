"""The GPU check's logic on a CPU: benchmarks/gpu.py with NumPy standing in for the device, and
benchmarks/gpu_check.sh's shape. No figure from here is a GPU figure, and none is recorded."""

import doctest
import pathlib
import subprocess

import numpy as np
import pytest

import benchmarks.gpu as gpu
from benchmarks.report import history_records, render

ROOT = pathlib.Path(__file__).resolve().parents[2]
MACHINE = {"cpu": "x", "logical_cpus": 2, "blas": "b", "python": "3", "numpy": "2", "scipy": "1"}


def test_docstring_examples():
    result = doctest.testmod(gpu, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 2 and result.failed == 0


def test_report_on_a_stand_in_device():
    report = gpu.run(device=gpu.host_device(), sizes=(3000, 4, 50))
    cases = [row["case"] for row in report.rows]
    assert cases[:2] == ["read pass A @ v (cuBLAS)", "dense Gaussian (cuBLAS GEMM)"]
    assert cases[2:] == [f"{kind} S @ A" for kind in gpu.KINDS]
    read = report.rows[0]["time_s"]
    for row in report.rows:
        assert row["time_s"] > 0 and row["vs read pass"] == pytest.approx(row["time_s"] / read)
    assert len(report.targets) == 3
    assert "logic check only" in report.notes[0]
    md = render(
        history_records(report, area="gpu", stamp="2026-12-05 00:00:00 UTC", quick=True, machine=MACHINE)
    )
    assert "## gpu" in md and "SRHT S @ A at least 5x faster" in md


def test_lstsq_report_on_a_stand_in_device():
    report = gpu.run_lstsq(device=gpu.host_device(), sizes=(4000, 10))
    assert [row["case"] for row in report.rows] == [
        "rsketch.lstsq (precondition, defaults)",
        "the library's lstsq (SVD)",
    ]
    assert all(row["time_s"] > 0 and row["backward error"] < 1e-15 for row in report.rows)
    assert report.rows[1]["speed-up"] == pytest.approx(1.0)
    assert len(report.targets) == 1 and "3x faster" in report.targets[0].description


def test_decoding_report_on_a_stand_in_device(tmp_path):
    xps = pytest.importorskip("array_api_strict")
    from decoding import load_model
    from tests.decoding.tiny_llama import write_tiny_llama

    write_tiny_llama(tmp_path / "tiny.gguf")
    model, tok = load_model(tmp_path / "tiny.gguf", dtype=np.float64)
    dev = model.to_device(xps, xps.Device("device1"))
    prompts = (["the cat in the hat", "the hat the hat the", "x y", "the the"], ["the hat the hat"] * 4)
    report = gpu.run_decoding(quick=True, loaded=(dev, tok), prompts=prompts, batches=(1, 4))
    assert [(r["batch"], r["method"]) for r in report.rows] == [
        (B, m) for B in (1, 4) for m in ("autoregressive", "vanilla", "ems")
    ]
    assert all(r["same tokens"] and r["tok/s"] > 0 for r in report.rows)
    assert report.rows[0]["x autoregressive"] == pytest.approx(1.0)
    assert report.targets == []  # no batch 8 in this run


def test_targets_follow_the_ratios():
    times = {"read": 1.0, "countsketch": 2.0, "sparse_sign": 2.01, "srht": 1.0, "dense_gaussian": 4.99}
    met = [t.met for t in gpu.targets(times)]
    assert met == [True, False, False]
    times["dense_gaussian"] = 5.0
    assert gpu.targets(times)[2].met


def test_dense_gaussian_peer_is_blocked_gemm():
    A = np.random.default_rng(0).standard_normal((25, 3))
    dev = gpu.host_device()
    got = gpu.dense_gaussian(dev, A, 4, block_entries=4 * 7)  # blocks of 7 columns
    rng = dev.rng(0)  # one generator for every block: a new one per block timed its set-up
    G = np.concatenate([rng.standard_normal((4, min(25, a + 7) - a)) for a in range(0, 25, 7)], axis=1)
    np.testing.assert_allclose(got, G @ A, rtol=1e-13)


def test_without_a_gpu_nothing_is_measured():
    try:
        import cupy  # noqa: F401

        pytest.skip("CuPy is installed here; the refusal is what machines without it see")
    except ImportError:
        pass
    with pytest.raises(ImportError, match=r"rsketch\[gpu\]"):
        gpu.main(["--quick", "--no-record"])


def test_gpu_check_script():
    script = ROOT / "benchmarks" / "gpu_check.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    assert subprocess.run(["bash", "-n", str(ROOT / "benchmarks" / "gpu_prepare.sh")]).returncode == 0
    text = script.read_text()
    assert "'.[gpu,test]'" in text  # installs the gpu extra where PyPI is reachable
    assert "--no-index" in text  # and only brought wheels where it is not
    assert "RSKETCH_REQUIRE_GPU=1" in text and "-m gpu" in text  # gpu tests, where a skip fails
    assert "-m benchmarks.gpu" in text  # the benchmarks, recorded through the harness


def test_gpu_check_refuses_unknown_arguments(tmp_path):
    script = str(ROOT / "benchmarks" / "gpu_check.sh")
    for args in (["--stage", "everything"], ["--fast"]):
        proc = subprocess.run(["bash", script, *args], capture_output=True, text=True)
        assert proc.returncode == 2 and "gpu_check.sh:" in proc.stderr


def test_gpu_check_stash_keeps_what_it_is_given(tmp_path):
    # The stage for a transfer that only brings a part of the model: nothing is run, nothing installed.
    env = {"PATH": "/usr/bin:/bin", "GPU_CHECK_DIR": str(tmp_path), "PYTHON": "false"}
    proc = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--stage", "stash"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"kept in {tmp_path}/parts" in proc.stdout and (tmp_path / "parts").is_dir()


def test_each_part_is_recorded_and_copied_as_soon_as_it_is_measured(tmp_path, monkeypatch):
    # A lent GPU may be taken back mid-run (a call's time limit kills the script): the sketch figures
    # were recorded, and copied to $OUT, only after every part had run. Now a part that fails (or is
    # cut short) leaves the parts before it recorded, under one stamp (one run of the area).
    from benchmarks._harness import Report

    history = tmp_path / "benchmarks" / "history"
    history.mkdir(parents=True)
    out = tmp_path / "out"
    out.mkdir()
    recorded = []

    def record(reports, *, quick, areas, stamp):
        recorded.append((areas, stamp))
        path = history / f"{areas[0]}.jsonl"
        path.write_text(reports[0].title)
        (tmp_path / "benchmarks" / "RESULTS.md").write_text("results")
        return [path]

    def cut_short(quick):
        raise KeyboardInterrupt("the call's time limit")

    monkeypatch.setattr(gpu, "append_results", record)
    monkeypatch.setattr(gpu, "RESULTS", tmp_path / "benchmarks" / "RESULTS.md")  # what record renders
    monkeypatch.setattr(gpu, "machine_description", lambda: "CPU: x")
    monkeypatch.setattr(gpu, "run", lambda quick: Report("sketch table"))
    monkeypatch.setattr(gpu, "run_lstsq", cut_short)
    with pytest.raises(KeyboardInterrupt):
        gpu.main(["--only", "sketch,lstsq", "--out", str(out)])
    assert [areas for areas, _ in recorded] == [["gpu"]]
    assert (out / "gpu.jsonl").read_text() == "sketch table" and (out / "RESULTS.md").read_text() == "results"
    monkeypatch.setattr(gpu, "run_lstsq", lambda quick: Report("lstsq table"))
    gpu.main(["--only", "sketch,lstsq", "--no-record"])  # nothing recorded
    gpu.main(["--only", "lstsq,sketch"])  # in PARTS' order, one stamp for both
    assert [areas for areas, _ in recorded[1:]] == [["gpu"], ["gpu"]] and recorded[1][1] == recorded[2][1]
    assert (history / "gpu.jsonl").read_text() == "lstsq table"


def test_gpu_check_keeps_each_recorded_part_in_out():
    text = (ROOT / "benchmarks" / "gpu_check.sh").read_text()
    assert text.count('${OUT:+--out "$OUT"}') == 2  # both benchmark steps


def test_only_takes_the_known_parts():
    with pytest.raises(SystemExit) as exc:
        gpu.main(["--only", "sketch,everything", "--no-record"])
    assert exc.value.code == 2


@pytest.mark.model
def test_model_checksum_is_the_pinned_package_file():
    # gpu_check.sh joins the model's parts on an offline machine and checks them against this file.
    import hashlib

    loading = pytest.importorskip("decoding.loading")
    try:
        path = loading.model_path()
    except ModuleNotFoundError as exc:
        pytest.skip(str(exc))
    digest, name = (ROOT / "benchmarks" / "gpu_model.sha256").read_text().split()
    assert name == path.name and digest == hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_gpu_speedup_figure_is_drawn_from_the_recorded_run(tmp_path):
    # the figure the issue asks for, beside the paper's: drawn here from the history the GPU run
    # brought back (the GPU machine need not have matplotlib)
    pytest.importorskip("matplotlib")
    from benchmarks._harness import Report
    from benchmarks.report import append_history

    with pytest.raises(ValueError, match="no gpu-decoding run"):
        gpu.figure_from_history(tmp_path, tmp_path / "f.png")
    rows = [
        {"batch": B, "method": m, "x autoregressive": x, "paper": 1.0, "same tokens": True, "tok/s": 1.0}
        for B in (1, 2, 8)
        for m, x in (("autoregressive", 1.0), ("vanilla", 1.1), ("ems", 1.4))
    ]
    report = Report("GPU decoding: greedy, copy task, LLMA, 32 new tokens per prompt", rows=rows)
    append_history(
        history_records(
            report, area="gpu-decoding", stamp="2026-12-08 00:00:00 UTC", quick=False, machine=MACHINE
        ),
        tmp_path,
    )
    path = gpu.figure_from_history(tmp_path, tmp_path / "f.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert gpu.PAPER_SPEEDUP["ems"][8] == 2.17 and gpu.PAPER_SPEEDUP["vanilla"][24] == 0.66  # Fig. 1
