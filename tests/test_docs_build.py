"""The documentation site builds without a warning, and its API pages list every public name."""

import pathlib
import re
import subprocess
import sys

import pytest

import decoding
import rsketch

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"


def listed_names(page: str) -> set[str]:
    text = (DOCS / "api" / page).read_text()
    return set(re.findall(r"^   ([A-Za-z_][\w.]*)$", text, flags=re.M))


@pytest.mark.parametrize("package, page", [(rsketch, "rsketch.rst"), (decoding, "decoding.rst")])
def test_api_pages_list_every_public_name(package, page):
    public = {name for name in package.__all__ if callable(getattr(package, name))}
    assert public - listed_names(page) == set()


@pytest.mark.slow
def test_sphinx_builds_with_warnings_as_errors(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "sphinx",
        "-b",
        "html",
        "-W",
        "--keep-going",
        "-q",
        "-d",
        str(tmp_path / "doctrees"),
    ]
    proc = subprocess.run(
        cmd + [str(DOCS), str(tmp_path / "html")], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (tmp_path / "html" / "api" / "generated" / "rsketch.lstsq.html").exists()
