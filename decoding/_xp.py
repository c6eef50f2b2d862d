"""The array namespace of the engine's device arrays: NumPy, or CuPy for a later GPU path.

The engine is one code path: weights, activations and cache buffers live in ``xp`` (the module
that created them), and every device operation is spelled ``xp.<function>`` or as an array
method; CuPy mirrors these NumPy functions. Host-side bookkeeping (offsets, positions, lengths,
slot indices, sampling) stays in NumPy and crosses over with :func:`asarray` / :func:`to_host`.
"""

from __future__ import annotations

import numpy as np

__all__ = ["namespace", "to_host"]


def namespace(a):
    """``cupy`` for a CuPy array, else ``numpy``.

    Examples
    --------
    >>> namespace(np.zeros(2)).__name__
    'numpy'
    """
    if type(a).__module__.split(".")[0] == "cupy":
        import cupy  # optional (a GPU path): imported only when a CuPy array is already there

        return cupy
    return np


def to_host(a) -> np.ndarray:
    """A NumPy array with the values of ``a`` (a copy from the device for CuPy).

    Examples
    --------
    >>> to_host([1, 2])
    array([1, 2])
    """
    get = getattr(a, "get", None)
    return get() if callable(get) and not isinstance(a, np.ndarray) else np.asarray(a)
