"""The guard of every test that needs a GPU: skip, saying why, where the GPU stack is not usable, and fail
instead under ``RSKETCH_REQUIRE_GPU=1`` (set by ``benchmarks/gpu_check.sh``), so that a GPU check cannot
pass by skipping."""

import os

import pytest


def require_gpu_or_skip(check) -> None:
    """Run ``check()`` (it raises ``ImportError``/``RuntimeError`` without CuPy or a device); skip or fail."""
    try:
        check()
    except (ImportError, RuntimeError) as exc:
        if os.environ.get("RSKETCH_REQUIRE_GPU") == "1":
            pytest.fail(f"RSKETCH_REQUIRE_GPU=1 but the GPU stack is not usable: {exc}")
        pytest.skip(f"needs a CUDA GPU: {exc}")
