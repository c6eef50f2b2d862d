"""Array-namespace lookup: which library an input belongs to, and whether CPU kernels apply.

Operators, solvers and statistics are written once against the input's array namespace (the
Python array API, through ``array_api_compat``). Only NumPy arrays are sent to the compiled
kernels of :mod:`rsketch.kernels.cpu`; any other namespace (CuPy, or a chunk of a Dask array)
runs the same algorithm through the namespace-generic reference path until a kernel module
for it exists (``kernels/cuda`` is the planned one).
"""

from __future__ import annotations

import array_api_compat
import numpy as np


def array_namespace(*arrays):
    """The array-API namespace shared by ``arrays`` (``array_api_compat.numpy`` for NumPy)."""
    return array_api_compat.array_namespace(*arrays)


def is_numpy_namespace(xp) -> bool:
    """True where the fast CPU (numba) kernels may be used."""
    return array_api_compat.is_numpy_namespace(xp)


def numpy_namespace():
    """The NumPy namespace as the rest of the package sees it."""
    return array_api_compat.array_namespace(np.empty(0))
