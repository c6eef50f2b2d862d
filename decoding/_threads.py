"""BLAS thread control for the engine.

Decode steps are matrix-vector products (memory-bound) and prefill matrices are small; on the
2 shared cores this project targets, OpenBLAS's threads spin-wait, and they collapse as soon as
another process (or numba's own threads) competes for a core (figures: ``docs/decoding.md``,
"Measurements"). The engine therefore runs BLAS single-threaded unless ``DECODING_BLAS_THREADS``
says otherwise.
"""

from __future__ import annotations

import contextlib
import os

_controller = None


def default_threads() -> int | None:
    """``DECODING_BLAS_THREADS`` (an integer, or ``"default"`` to leave BLAS alone); 1 when unset."""
    v = os.environ.get("DECODING_BLAS_THREADS", "1").strip().lower()
    if v in ("", "default", "none"):
        return None
    n = int(v)
    if n < 1:
        raise ValueError(f"DECODING_BLAS_THREADS must be >= 1 or 'default', got {v!r}")
    return n


def blas_threads(n: int | None = -1):
    """Context manager limiting BLAS to ``n`` threads (default: :func:`default_threads`; None: no limit)."""
    global _controller
    if n == -1:
        n = default_threads()
    if n is None:
        return contextlib.nullcontext()
    if _controller is None:  # threadpoolctl is imported (and scans the loaded BLAS) on first use only
        from threadpoolctl import ThreadpoolController

        _controller = ThreadpoolController()
    return _controller.limit(limits=n, user_api="blas")
