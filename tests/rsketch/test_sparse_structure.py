"""Sparse input whose index arrays point outside the matrix (SciPy checks them when a matrix is
built, not after): a ValueError naming the argument, before any kernel reads out of bounds (a column
index of 10**6 had crashed the process, a negative one given the decomposition of another matrix)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import rsketch
from rsketch._validation import check_sparse_structure


def _csr():
    return sp.random(200, 40, density=0.2, random_state=1, format="csr")


def _bad_column(A):
    A.indices[5] = 10**6


def _negative_row(A):
    A = A.tocsc()
    A.indices[5] = -3
    return A


def _past_the_indices(A):
    A.indptr[-1] = 10**6


def _decreasing(A):
    A.indptr[3] = A.indptr[4] + 1


def _coo_row(A):
    A = A.tocoo()
    A.row[2] = 200
    return A


MALFORMED = {
    "column 10**6": (_bad_column, r"X has column index 1000000 \(stored entry 5\) outside \[0, 40\)"),
    "row -3 (CSC)": (_negative_row, r"X has row index -3 \(stored entry 5\) outside \[0, 200\)"),
    "indptr past the indices": (_past_the_indices, r"X's indptr is not that of a CSR matrix of shape"),
    "indptr decreasing": (_decreasing, r"X's indptr is not that of a CSR matrix of shape"),
    "COO row 200": (_coo_row, r"X has row index 200 \(stored entry 2\) outside \[0, 200\)"),
}

CALLS = {
    "range_finder": lambda X, y: rsketch.range_finder(X, 5, seed=0),
    "svd": lambda X, y: rsketch.svd(X, 5, seed=0),
    "S @ X": lambda X, y: rsketch.make_sketch("sparse_sign", 200, 20, seed=0) @ X,
    "lstsq": lambda X, y: rsketch.lstsq(X, y, seed=0),
    "SketchedPCA": lambda X, y: rsketch.SketchedPCA(3, random_state=0).fit(X),
    "SketchedRidge": lambda X, y: rsketch.SketchedRidge(random_state=0).fit(X, y),
    "SketchedLinearRegression": lambda X, y: rsketch.SketchedLinearRegression(random_state=0).fit(X, y),
}


@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize("malformed", sorted(MALFORMED))
def test_malformed_sparse_input_is_refused_by_name(call, malformed):
    mutate, message = MALFORMED[malformed]
    A = _csr()
    X = mutate(A)
    X = A if X is None else X
    y = np.ones(200)
    name = "X" if call in ("lstsq",) or call.startswith("Sketched") else "A"
    with pytest.raises(ValueError, match=message.replace("X", name, 1)):
        CALLS[call](X, y)


@pytest.mark.parametrize("method", ["transform", "score_samples"])
def test_a_fitted_pca_checks_what_it_is_given(method):
    pca = rsketch.SketchedPCA(3, random_state=0).fit(_csr())
    X = _csr()
    _bad_column(X)
    with pytest.raises(ValueError, match=r"X has column index 1000000"):
        getattr(pca, method)(X)


def test_spare_storage_past_indptr_is_not_read():
    # SciPy allows index and data arrays longer than indptr[-1]; what lies past it is not the matrix
    A = _csr()
    stored = A.indptr[-1]
    B = A.copy()
    B.indices = np.concatenate([A.indices, np.array([10**6, -5], dtype=A.indices.dtype)])
    B.data = np.concatenate([A.data, [np.nan, np.inf]])
    assert B.indices.size == stored + 2
    check_sparse_structure(B)
    np.testing.assert_array_equal(rsketch.svd(B, 5, seed=0).s, rsketch.svd(A, 5, seed=0).s)


def test_block_sparse_indices_count_blocks():
    A = sp.random(8, 6, density=0.5, random_state=0, format="csr").tobsr(blocksize=(2, 3))
    check_sparse_structure(A)  # block columns 0 and 1 of 2
    A.indices[0] = 2
    with pytest.raises(ValueError, match=r"A has column index 2 \(stored entry 0\) outside \[0, 2\)"):
        check_sparse_structure(A)


@pytest.mark.parametrize("fmt", ["coo", "csc"])
@pytest.mark.parametrize("kind", ["countsketch", "gaussian", "uniform"])
def test_a_sparse_operand_of_absurdly_many_rows_is_refused_before_its_csr_copy(fmt, kind):
    # four nonzeros, 2**36 rows: the kernels' CSR form needs 512 GiB of row pointers, which SciPy's
    # conversion had gone on to allocate (a process with 16 GiB of them was killed for memory)
    n = 2**36
    rows = np.array([0, 5, n - 3, n - 1])
    A = sp.coo_matrix((np.ones(4), (rows, np.zeros(4, dtype=np.int64))), shape=(n, 1))
    A = A.tocsc() if fmt == "csc" else A
    with pytest.raises(
        MemoryError, match=rf"A \({fmt.upper()}, 68,719,476,736 x 1\) as CSR, with its row pointers"
    ):
        rsketch.make_sketch(kind, n, 16, seed=1) @ A
