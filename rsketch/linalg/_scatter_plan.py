"""Sparse matrices that carry a plan for their scattered products, for calls that make many of them.

``A @ Y`` for a CSC ``A`` (``A.T @ Y`` for a CSR one) is a scatter: each nonzero adds its value
times a row of ``Y`` into the result row its index names, at random across the whole result
(the unplanned kernel keeps a few private copies of it and sums them). :func:`with_scatter_plan`
sorts the nonzeros once by panels of result rows, then by the row of ``Y`` they read
(:func:`rsketch.kernels.cpu.scatter_plan`), so a panel's sums stay in cache and each panel is a
task of its own. At 1,000,000 x 100,000 with 10^7 nonzeros (this machine, docs/lowrank.md) a
product took 0.03-0.04 s planned against 0.09-0.21 s unplanned with 8 columns, and 0.12-0.17 s
against 0.47-0.51 s with 30; building the plan took 0.14-0.22 s, the time of one or two unplanned
products, and holds ``nnz`` rows, columns and values (the matrix's size again).

The plan rides on the matrix: :func:`with_scatter_plan` returns a CSC (or CSR) array of a private
subclass that shares the matrix's arrays and has the plan as ``scatter_plan``; its transpose keeps
it, and anything derived from it (a copy, a scaled matrix) has none. Products through the plan
equal the unplanned scatter with one private sum bit for bit, on any thread count.
"""

from __future__ import annotations

import numba
import numpy as np
import scipy.sparse as sp

from rsketch._validation import available_memory
from rsketch.kernels import cpu

#: Plans are built for matrices with at least this many nonzeros: below, the result a scatter
#: adds into stays in cache anyway, and the plan's build would not pay.
PLAN_MIN_NNZ = 1 << 20
#: The result rows of a panel take at most this many bytes (``width x k`` values); there are at
#: least two panels per thread. From 4 to 13 panels of 100,000 rows were within 30% of each other.
PANEL_BYTES = 1 << 22
#: At least this many scattered products make a plan worth building.
PLAN_MIN_PRODUCTS = 3


class _PlannedCSC(sp.csc_array):
    """A CSC array whose products ``A @ Y`` (scatters) use :attr:`scatter_plan`."""

    scatter_plan = None


class _PlannedCSR(sp.csr_array):
    """A CSR array whose products ``A.T @ Y`` (scatters) use :attr:`scatter_plan`."""

    scatter_plan = None

    def transpose(self, axes=None, copy=False):
        return _planned(_PlannedCSC, super().transpose(axes=axes, copy=copy), self.scatter_plan)


def _planned(cls, A, plan):
    planned = cls((A.data, A.indices, A.indptr), shape=A.shape, copy=False)
    planned.scatter_plan = plan
    return planned


def with_scatter_plan(A, columns, products, dtype):
    """``A`` with a plan for its scattered products where one pays, else ``A`` itself.

    ``A`` is a CSR or CSC matrix; ``columns`` the width of the products to come (it sizes the
    panels), ``products`` how many scattered ones the caller will make, ``dtype`` their precision.
    A plan is built where ``A`` has at least ``PLAN_MIN_NNZ`` nonzeros, ``products`` is at least
    ``PLAN_MIN_PRODUCTS``, and the plan takes at most a quarter of the memory available (it is an
    optimisation: where it does not fit, the products scatter unplanned).
    """
    if not (sp.issparse(A) and A.format in ("csr", "csc")) or getattr(A, "scatter_plan", None) is not None:
        return A
    if A.nnz < PLAN_MIN_NNZ or products < PLAN_MIN_PRODUCTS:
        return A
    # the scatter's CSR: A.T for CSC A (its arrays as they are), A itself for CSR A
    n = A.shape[0] if A.format == "csc" else A.shape[1]
    index = np.dtype(cpu.scatter_plan_index(*A.shape)).itemsize
    avail = available_memory()
    if avail is not None and A.nnz * (2 * index + np.dtype(dtype).itemsize) > avail // 4:
        return A
    panels = max(2 * numba.get_num_threads(), -(-n * columns * np.dtype(dtype).itemsize // PANEL_BYTES))
    width = max(1, -(-n // panels))
    plan = cpu.scatter_plan(A.indptr, A.indices, A.data.astype(dtype, copy=False), n, width) + (width,)
    return _planned(_PlannedCSC if A.format == "csc" else _PlannedCSR, A, plan)


def planned_product(A, Y, out):
    """``A @ Y`` for a CSC ``A`` through its plan, into ``out`` (any order), or None without one."""
    plan = getattr(A, "scatter_plan", None)
    if plan is None or plan[3].dtype != Y.dtype:
        return None
    starts, rows, cols, vals, width = plan
    out = np.empty((A.shape[0], Y.shape[1]), dtype=Y.dtype) if out is None else out
    cpu.planned_scatter(starts, rows, cols, vals, width, Y, out)
    return out
