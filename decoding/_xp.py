"""The array namespace of the engine's device arrays: NumPy, or another library's (CuPy on a GPU).

Weights, activations and cache buffers live in ``xp``. NumPy arrays take the compiled kernels; any
other library takes the portable path, written against the Python array API standard (through
``array_api_compat``, which wraps CuPy), so that ``array_api_strict`` on a second device can check it
on a CPU. Host-side bookkeeping (offsets, positions, lengths, slot indices, sampling) stays in NumPy
and crosses over with :func:`on_device` / :func:`to_host`.
"""

from __future__ import annotations

import array_api_compat
import numpy as np

__all__ = ["device_of", "namespace", "on_device", "to_host", "xp_dtype"]


def namespace(a):
    """``numpy`` for NumPy arrays (and scalars); for another array library's arrays (CuPy on a GPU), its
    array-API namespace (``array_api_compat``'s wrapper of CuPy).

    Examples
    --------
    >>> namespace(np.zeros(2)).__name__
    'numpy'
    """
    if (
        isinstance(a, np.ndarray)
        or not array_api_compat.is_array_api_obj(a)
        or array_api_compat.is_numpy_array(a)
    ):
        return np
    return array_api_compat.array_namespace(a)


def device_of(a):
    """The device of ``a`` (``"cpu"`` for NumPy)."""
    return array_api_compat.device(a)


def to_host(a) -> np.ndarray:
    """A NumPy array with the values of ``a`` (a copy from the device for CuPy; DLPack for another library).

    Examples
    --------
    >>> to_host([1, 2])
    array([1, 2])
    """
    if isinstance(a, np.ndarray):
        return a
    if array_api_compat.is_cupy_array(a):
        return a.get()
    if array_api_compat.is_array_api_obj(a):
        return np.from_dlpack(a)
    return np.asarray(a)


def on_device(a, xp, device):
    """The host array ``a`` in namespace ``xp`` on ``device`` (``a`` itself for NumPy).

    Examples
    --------
    >>> on_device(np.ones(2), np, None).tolist()
    [1.0, 1.0]
    """
    return a if xp is np else xp.asarray(a, device=device)


def xp_dtype(xp, dtype):
    """``xp``'s dtype object for a NumPy ``dtype`` (``xp.float32`` for ``numpy.float32``, ...)."""
    return getattr(xp, np.dtype(dtype).name)
