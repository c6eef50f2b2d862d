"""rsketch on Dask: lazy sketches of chunked arrays, out-of-core data and the solvers' passes over chunks.

``S @ A`` with ``A`` a ``dask.array.Array`` is lazy and chunk by chunk (:mod:`rsketch.dask._sketch`);
this package adds what a Dask user needs besides: memory-mapped ``.npy`` files as Dask arrays
(:func:`from_npy`) and leverage-score sampling with scores computed in passes over the chunks
(:func:`leverage_sampling`). See ``docs/dask.md``.
"""

from rsketch.dask._design import DaskDesign, validate_dask_problem
from rsketch.dask._io import from_npy
from rsketch.dask._leverage import approximate_leverage, leverage_sampling
from rsketch.dask._sketch import SPLIT_EVERY, check_dask_operand, is_dask_array

__all__ = [
    "DaskDesign",
    "validate_dask_problem",
    "SPLIT_EVERY",
    "approximate_leverage",
    "check_dask_operand",
    "from_npy",
    "is_dask_array",
    "leverage_sampling",
]
