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


def is_non_numpy_array(a) -> bool:
    """True for an array of an array-API library other than NumPy and Dask (CuPy, PyTorch,
    ``array_api_strict``): the solvers keep its ``n``-sized work in its own library.

    Examples
    --------
    >>> import numpy as np, array_api_strict as xps
    >>> is_non_numpy_array(np.ones(3)), is_non_numpy_array(xps.ones(3))
    (False, True)
    """
    return (
        array_api_compat.is_array_api_obj(a)
        and not array_api_compat.is_numpy_array(a)
        and not array_api_compat.is_dask_array(a)
    )


def numpy_dtype(dtype) -> np.dtype:
    """The NumPy dtype of a dtype of any array library (CuPy's are NumPy's; others by their name).

    Examples
    --------
    >>> import array_api_strict as xps
    >>> numpy_dtype(xps.float32), numpy_dtype(np.float64)
    (dtype('float32'), dtype('float64'))
    """
    try:
        return np.dtype(dtype)
    except TypeError:  # array_api_strict's dtypes, for one: "array_api_strict.float32"
        return np.dtype(str(dtype).rsplit(".", 1)[-1])


def to_host(a) -> np.ndarray:
    """``a`` on the host: copied from the device for CuPy, shared (DLPack) for another host library;
    NumPy arrays and SciPy matrices as they are.

    Examples
    --------
    >>> import array_api_strict as xps
    >>> to_host(xps.asarray([1.0, 2.0])).tolist()
    [1.0, 2.0]
    """
    if array_library(a) == "cupy":
        return a.get()
    return np.from_dlpack(a) if is_non_numpy_array(a) else a


def like(a: np.ndarray, ref):
    """The host array ``a`` moved to the library and device of ``ref`` (``a`` itself for NumPy ``ref``).

    Examples
    --------
    >>> import numpy as np, array_api_strict as xps
    >>> type(like(np.ones(2), xps.ones(3))).__module__.split(".")[0]
    'array_api_strict'
    """
    if not is_non_numpy_array(ref):
        return a
    xp = array_api_compat.array_namespace(ref)
    return xp.asarray(a, device=array_api_compat.device(ref))


def array_library(a) -> str:
    """The library holding ``a``'s data: ``"cupy"`` (device arrays, ``cupyx`` sparse matrices included),
    ``"dask"``, or ``"numpy"`` (NumPy arrays, SciPy sparse matrices, lists, scalars).

    Examples
    --------
    >>> import numpy as np
    >>> array_library(np.ones(3)), array_library([1.0, 2.0])
    ('numpy', 'numpy')
    """
    top = type(a).__module__.split(".")[0]
    if top in ("cupy", "cupyx"):
        return "cupy"
    if top == "dask":
        return "dask"
    return "numpy"


def check_same_library(**arrays) -> str:
    """The one library (see :func:`array_library`) of the named arrays; ``TypeError`` naming both when CuPy
    (device) and NumPy (host) arrays are mixed in one call. ``None`` values are skipped.

    Examples
    --------
    >>> import numpy as np
    >>> check_same_library(X=np.ones((3, 2)), y=np.ones(3))
    'numpy'
    """
    libs = {name: array_library(a) for name, a in arrays.items() if a is not None}
    device = [name for name, lib in libs.items() if lib == "cupy"]
    host = [name for name, lib in libs.items() if lib == "numpy"]
    if device and host:
        raise TypeError(
            f"{device[0]} is a CuPy (GPU) array but {host[0]} is a NumPy (host) array; pass both on the "
            f"same device: cupy.asarray({host[0]}) to compute on the GPU, or cupy.asnumpy({device[0]}) to "
            "compute on the CPU"
        )
    return next(iter(libs.values()), "numpy")


def is_device_sparse(a) -> bool:
    """True for a ``cupyx.scipy.sparse`` matrix (sparse data on the GPU); never imports CuPy.

    Examples
    --------
    >>> import scipy.sparse as sp
    >>> is_device_sparse(sp.eye(3, format="csr"))
    False
    """
    return type(a).__module__.startswith("cupyx.scipy.sparse")
