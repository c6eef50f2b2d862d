"""A benchmark area that measures nothing, for the tests of ``python -m benchmarks``."""

from benchmarks.report import Report, Target


def run(quick: bool = False) -> Report:
    return Report("Fake area", rows=[{"case": "a", "quick": quick}], targets=[Target("none", "0", True)])
