"""One lock for numba's parallel kernels under its ``workqueue`` threading layer.

numba runs parallel kernels on one of three threading layers: OpenMP, TBB, or, where neither can
be loaded (a pip install on macOS without ``libomp``, say), its own ``workqueue``. That one is not
thread-safe: a parallel kernel launched from one Python thread while another runs aborts the
process ("Numba workqueue threading layer is terminating: Concurrent access has been detected").
The two packages launch their parallel kernels inside :func:`parallel_launch`, which holds one
process-wide lock while the layer is ``workqueue``, or not yet known (numba chooses it at the first
parallel launch), and nothing under OpenMP or TBB, which take concurrent launches. The layer is a
numba setting of the process (``NUMBA_THREADING_LAYER``); a library only reads it.
"""

from __future__ import annotations

import functools
import threading
from contextlib import nullcontext

import numba

__all__ = ["parallel_launch", "serialized_launches"]

_LOCK = threading.RLock()
_NO_LOCK = nullcontext()
_layer: str | None = None  # numba's threading layer, once a parallel kernel has run


def parallel_launch():
    """The lock to hold around a parallel kernel's launch (re-entrant), or a context that does nothing.

    Examples
    --------
    >>> with parallel_launch():
    ...     pass
    """
    global _layer
    if _layer is None:
        try:
            _layer = numba.threading_layer()
        except ValueError:  # no parallel kernel has run: the layer is not chosen yet
            return _LOCK
    return _LOCK if _layer == "workqueue" else _NO_LOCK


def serialized_launches(function):
    """``function`` run inside :func:`parallel_launch`: one lock per call for a function that launches
    many parallel kernels (a model's forward), not one per kernel.

    Examples
    --------
    >>> @serialized_launches
    ... def twice(x):
    ...     return 2 * x
    >>> twice(3)
    6
    """

    @functools.wraps(function)
    def launched(*args, **kwargs):
        with parallel_launch():
            return function(*args, **kwargs)

    return launched
