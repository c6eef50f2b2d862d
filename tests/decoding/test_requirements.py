"""Without the "decoding" extra, importing decoding says which extra to install."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("absent", ["gguf", "tokenizers", "jinja2"])
def test_import_without_the_extra_names_it(absent):
    # A None entry in sys.modules makes find_spec fail as for a package that is not installed.
    code = f"import sys; sys.modules[{absent!r}] = None\nimport decoding"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "ImportError" in proc.stderr and "rsketch[decoding]" in proc.stderr and absent in proc.stderr


def test_rsketch_imports_without_the_decoding_extra():
    code = "import sys\nfor m in ('gguf', 'tokenizers', 'jinja2'): sys.modules[m] = None\nimport rsketch"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
