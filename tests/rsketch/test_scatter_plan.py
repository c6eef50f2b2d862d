"""The scatter plan (rsketch/linalg/_scatter_plan.py): products through it equal the unplanned
scatter with one private sum bit for bit, whatever the panels, the threads or ``out``'s order, and
the low-rank functions give the same decompositions with it as without."""

import numba
import numpy as np
import pytest
import scipy.sparse as sp

import rsketch
from rsketch.kernels import cpu
from rsketch.linalg import _scatter_plan
from rsketch.linalg._lowrank import _matmat, _rmatmat
from rsketch.linalg._results import ConvergenceWarning
from rsketch.linalg._scatter_plan import planned_product, with_scatter_plan


def _awkward_csr(m, n, density, dtype, seed):
    """A CSR matrix with an empty row, an empty column, an unsorted row and a duplicate entry."""
    rng = np.random.default_rng(seed)
    A = sp.random(m, n, density=density, format="csr", random_state=rng, dtype=dtype).tolil()
    A[3, :] = 0
    A[:, 7] = 0
    A = A.tocsr()
    lo, hi = A.indptr[1], A.indptr[2]
    A.indices[lo:hi] = A.indices[lo:hi][::-1].copy()
    A.data[lo:hi] = A.data[lo:hi][::-1].copy()
    assert A.indptr[1] > 0  # row 0 has an entry to duplicate
    dup = sp.csr_array(  # a duplicate of the first entry of row 0, stored beside it (not summed)
        (np.r_[A.data[:1], A.data], np.r_[A.indices[:1], A.indices], np.r_[0, A.indptr[1:] + 1]), shape=(m, n)
    )
    assert dup.nnz == A.nnz + 1 and not dup.has_canonical_format
    return dup


def _unplanned_one_sum(A, Z):
    """``A.T @ Z`` by the unplanned scatter with a single private sum: rows in order."""
    acc = np.zeros((1, A.shape[1], Z.shape[1]), dtype=Z.dtype)
    cpu.csr_transpose_times_dense(A.indptr, A.indices, A.data, Z, acc)
    return acc[0]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("k", [1, 3, 8, 13])
@pytest.mark.parametrize("width", [1, 5, 64, 1000])
def test_planned_scatter_equals_the_rows_in_order(dtype, k, width):
    A = _awkward_csr(600, 150, 0.05, dtype, seed=k)
    Z = np.random.default_rng(1).standard_normal((600, k)).astype(dtype)
    want = _unplanned_one_sum(A, Z)
    starts, rows, cols, vals = cpu.scatter_plan(A.indptr, A.indices, A.data, 150, width)
    assert starts[-1] == A.nnz and vals.dtype == dtype and rows.dtype == np.int32
    for order in "CF":
        out = np.full((150, k), np.nan, dtype=dtype, order=order)  # every entry written
        cpu.planned_scatter(starts, rows, cols, vals, width, Z, out)
        np.testing.assert_array_equal(out, want)
    np.testing.assert_allclose(want, A.T @ Z, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-5)


def test_planned_scatter_does_not_depend_on_the_thread_count():
    A = _awkward_csr(40_000, 3_000, 0.01, np.float64, seed=4)  # enough work for the parallel kernel
    Z = np.random.default_rng(2).standard_normal((40_000, 8))
    plan = cpu.scatter_plan(A.indptr, A.indices, A.data, 3_000, 97)
    results = []
    before = numba.get_num_threads()
    try:
        for threads in sorted({1, before}):
            numba.set_num_threads(threads)
            out = np.empty((3_000, 8))
            cpu.planned_scatter(*plan, 97, Z, out)
            results.append(out)
    finally:
        numba.set_num_threads(before)
    for out in results:
        np.testing.assert_array_equal(out, _unplanned_one_sum(A, Z))


@pytest.mark.parametrize("fmt", ["csr", "csc"])
def test_a_planned_matrix_carries_its_plan_through_the_products(fmt, monkeypatch):
    monkeypatch.setattr(_scatter_plan, "PLAN_MIN_NNZ", 0)
    A = _awkward_csr(500, 120, 0.05, np.float64, seed=9).asformat(fmt)
    P = with_scatter_plan(A, 4, 3, np.float64)
    assert P is not A and P.scatter_plan is not None and P.format == fmt
    assert sp.issparse(P) and P.shape == A.shape
    scatter_side = P if fmt == "csc" else P.T  # the CSC whose A @ Y scatters
    assert scatter_side.format == "csc" and scatter_side.scatter_plan is P.scatter_plan
    assert with_scatter_plan(P, 4, 3, np.float64) is P  # planned once
    assert getattr(P.copy(), "scatter_plan", None) is None and getattr(2 * P, "scatter_plan", None) is None
    rng = np.random.default_rng(5)
    Y, Z = rng.standard_normal((120, 4)), rng.standard_normal((500, 4))
    for got, want in ((_matmat(P, Y), A @ Y), (_rmatmat(P, Z), A.T @ Z)):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    # the planned product is the one that ran (into out, in place)
    out = np.empty((scatter_side.shape[0], 4), order="F")
    source = Y if fmt == "csc" else Z
    assert planned_product(scatter_side, source, out) is out
    assert planned_product(scatter_side, source.astype(np.float32), None) is None  # another dtype: unplanned


def test_a_plan_is_built_only_where_it_pays_and_fits(monkeypatch):
    A = sp.random(300, 200, density=0.1, format="csc", random_state=np.random.default_rng(0))
    assert with_scatter_plan(A, 8, 50, np.float64) is A  # few nonzeros
    monkeypatch.setattr(_scatter_plan, "PLAN_MIN_NNZ", 0)
    assert with_scatter_plan(A, 8, 2, np.float64) is A  # too few products to repay the build
    dense = A.toarray()
    assert with_scatter_plan(dense, 8, 50, np.float64) is dense  # dense: left alone
    assert with_scatter_plan(A.tocoo(), 8, 50, np.float64).format == "coo"
    monkeypatch.setattr(_scatter_plan, "available_memory", lambda: 4 * A.nnz * 16 - 1)
    assert with_scatter_plan(A, 8, 50, np.float64) is A  # the plan would take over a quarter
    monkeypatch.setattr(_scatter_plan, "available_memory", lambda: None)
    assert with_scatter_plan(A, 8, 50, np.float64).scatter_plan is not None


@pytest.mark.parametrize("shape", [(3_000, 400), (400, 3_000)])
@pytest.mark.parametrize("fmt", ["csr", "csc"])
def test_low_rank_results_are_the_same_with_the_plan(shape, fmt, monkeypatch):
    # a decaying spectrum (a diagonal from 50 to 1) under sparse noise: well separated singular vectors
    noise = sp.random(*shape, density=0.02, format="csr", random_state=np.random.default_rng(3))
    A = (sp.diags_array(np.linspace(50, 1, 400), shape=shape) + noise).asformat(fmt)
    kwargs = {"seed": 1, "block_size": 5, "passes": 9}
    plain_svd, plain_range = rsketch.svd(A, 6, **kwargs), rsketch.range_finder(A, 6, seed=1, passes=7)
    plain_tol = rsketch.range_finder(A, 100, seed=1, tol=4e3, passes=3)
    built = []
    monkeypatch.setattr(_scatter_plan, "PLAN_MIN_NNZ", 0)
    build = cpu.scatter_plan
    monkeypatch.setattr(cpu, "scatter_plan", lambda *a: built.append(a[-1]) or build(*a))
    planned_svd, planned_range = rsketch.svd(A, 6, **kwargs), rsketch.range_finder(A, 6, seed=1, passes=7)
    planned_tol = rsketch.range_finder(A, 100, seed=1, tol=4e3, passes=3)
    assert len(built) == 3  # one plan a call
    np.testing.assert_allclose(planned_svd.s, plain_svd.s, rtol=1e-12)
    np.testing.assert_allclose(planned_svd.U * planned_svd.s, plain_svd.U * plain_svd.s, atol=1e-10)
    np.testing.assert_allclose(planned_svd.Vt, plain_svd.Vt, atol=1e-10)
    assert planned_svd.passes == plain_svd.passes
    for planned, plain in ((planned_range, plain_range), (planned_tol, plain_tol)):
        assert planned.Q.shape == plain.Q.shape
        np.testing.assert_allclose(np.abs(planned.Q.T @ plain.Q).diagonal(), 1, atol=1e-10)


def _counting_builds(monkeypatch):
    monkeypatch.setattr(_scatter_plan, "PLAN_MIN_NNZ", 0)
    built, build = [], cpu.scatter_plan
    monkeypatch.setattr(cpu, "scatter_plan", lambda *a: built.append(a[-1]) or build(*a))
    return built


def test_spare_storage_past_the_entries_is_not_planned(monkeypatch):
    # SciPy allows indices and data longer than indptr[-1]; the plan had counted the spare slots,
    # left them unwritten, and the product read them as indices (a segmentation fault)
    built = _counting_builds(monkeypatch)
    B = sp.random(50, 40, density=0.2, format="csc", random_state=np.random.default_rng(0))
    A = B.copy()
    A.data = np.r_[B.data, np.ones(5)]
    A.indices = np.r_[B.indices, np.full(5, 70, B.indices.dtype)]  # out of range, as spare slots may be
    got, want = rsketch.range_finder(A, 5, seed=0, passes=7), rsketch.range_finder(B, 5, seed=0, passes=7)
    assert len(built) == 2
    np.testing.assert_array_equal(got.Q, want.Q)
    starts, rows, cols, vals = cpu.scatter_plan(A.indptr, A.indices, A.data, 50, 7)
    assert starts[-1] == vals.size == B.nnz


def test_no_plan_is_built_for_a_call_that_its_arguments_refuse(monkeypatch):
    built = _counting_builds(monkeypatch)
    A = sp.random(300, 200, density=0.1, format="csc", random_state=np.random.default_rng(0))
    # each call would build a plan with a valid sketch (checked last)
    with pytest.raises(ValueError, match="sketch must be one of"):
        rsketch.range_finder(A, 5, sketch="bogus", passes=7)
    with pytest.raises(ValueError, match="sketch must be one of"):
        rsketch.svd(A, 5, sketch="bogus")
    with pytest.raises(ValueError, match="sketch must be one of"):
        rsketch.range_finder(A, 30, sketch="bogus", tol=1e-3, block_size=5, passes=3)
    with pytest.raises(ValueError, match=r"sketch must have shape \(15, 200\)"):
        rsketch.svd(A, 5, sketch=rsketch.make_sketch("gaussian", 7, 15, seed=0))
    assert built == []
    rsketch.range_finder(A, 5, passes=7)
    rsketch.svd(A, 5)
    with pytest.warns(ConvergenceWarning):
        rsketch.range_finder(A, 30, tol=1e-3, block_size=5, passes=3)
    rsketch.svd(A, 5, sketch=rsketch.make_sketch("gaussian", 200, 15, seed=0))
    assert len(built) == 4


@pytest.mark.parametrize(("fmt", "passes", "plans"), [("csc", 5, 1), ("csr", 5, 0), ("csr", 7, 1)])
def test_a_plan_counts_the_scatters_of_the_format(fmt, passes, plans, monkeypatch):
    # CSC A scatters in A @ Y (3 of 5 products), CSR A in A.T @ Y (2 of 5: too few to pay)
    built = _counting_builds(monkeypatch)
    A = sp.random(300, 200, density=0.1, format=fmt, random_state=np.random.default_rng(0))
    rsketch.range_finder(A, 5, passes=passes, seed=0)
    assert len(built) == plans
    with pytest.warns(ConvergenceWarning):  # a random A: 30 columns leave far more than tol
        rsketch.range_finder(A, 30, passes=1, tol=1e-3, block_size=5, seed=0)  # 6 blocks; CSR: no scatter
    assert len(built) == plans + (fmt == "csc")


@pytest.mark.parametrize("passes", [5, 7])
@pytest.mark.parametrize("fmt", ["csr", "csc"])
def test_svd_finishes_through_the_range_finders_plan(fmt, passes, monkeypatch):
    # a wide CSR A and a tall CSC A keep their side, and their finish (B = Q.T A, through the Gram
    # or exactly) scatters: through the plan the range finder built, not unplanned
    _counting_builds(monkeypatch)
    unplanned = []
    scatter = cpu.csr_transpose_times_dense
    monkeypatch.setattr(cpu, "csr_transpose_times_dense", lambda *a: unplanned.append(1) or scatter(*a))
    shape = (400, 3_000) if fmt == "csr" else (3_000, 400)
    noise = sp.random(*shape, density=0.02, format="csr", random_state=np.random.default_rng(3))
    A = (sp.diags_array(50 * 0.5 ** np.arange(400), shape=shape) + 0.01 * noise).asformat(fmt)  # fast decay
    res = rsketch.svd(A, 6, seed=1, passes=passes)  # 5, the default: 4 scatters, 2 of them the finish's
    assert unplanned == []
    np.testing.assert_allclose(res.s, np.linalg.svd(A.toarray(), compute_uv=False)[:6], rtol=1e-6)
