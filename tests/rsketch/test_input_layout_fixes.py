"""Inputs of unusual layouts, dtypes and validity that a probe of the public API found mishandled."""

import numpy as np
import pytest
import scipy.sparse as sp

import rsketch
from rsketch.linalg import backward_error


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((50, 3)), rng.standard_normal(50)
    return X, y, np.linalg.lstsq(X, y, rcond=None)[0]


@pytest.mark.parametrize(
    "change, error, match",
    [
        (lambda X, y, c: (X + 1j, y, c), TypeError, "X must be real"),  # had given the real part's value
        (lambda X, y, c: (X.astype(str), y, c), TypeError, "X must be a numeric"),  # had been parsed
        (lambda X, y, c: (X, y[:, None], c), ValueError, "coef must have shape"),  # an IndexError
        (lambda X, y, c: (X, y[:5], c), ValueError, "y must have 50 rows"),  # a broadcast error
        (lambda X, y, c: (X, y, np.full(3, np.inf)), ValueError, "coef contains NaN"),  # nan
        (lambda X, y, c: (np.zeros_like(X), y, 0 * c), ValueError, "X is zero"),  # ZeroDivisionError
    ],
)
def test_backward_error_checks_its_inputs(problem, change, error, match):
    with pytest.raises(error, match=match):
        backward_error(*change(*problem))


def test_backward_error_multiple_right_hand_sides(problem):
    X, y, c = problem
    single = backward_error(X, y, c)
    assert np.array_equal(backward_error(X, np.c_[y, y], np.c_[c, c]), [single, single])


@pytest.mark.parametrize("dtype, value", [(np.int8, 100), (np.bool_, True)])
def test_sparse_duplicates_summed_in_floating_point_whatever_the_format(dtype, value):
    # COO was converted to CSR before the cast: duplicates summed in int8 (100 + 100 wrapped to -56)
    # or OR'd as bools, while CSR was cast first; the same matrix gave two S @ A
    rows, cols = np.array([0, 0, 1, 2, 3]), np.array([0, 0, 1, 0, 1])
    data = np.array([value, value, 1, 1, 1], dtype=dtype)
    coo = sp.coo_matrix((data, (rows, cols)), shape=(4, 2))
    csr = sp.csr_matrix((data, cols, [0, 2, 3, 4, 5]), shape=(4, 2))  # (0, 0) stored twice
    dense = sp.coo_matrix((data.astype(np.float64), (rows, cols)), shape=(4, 2)).toarray()
    S = rsketch.make_sketch("gaussian", 4, 2, seed=0)
    expected = S @ dense
    for A in (coo, csr, sp.coo_array(coo), sp.csr_array(csr)):
        np.testing.assert_allclose(S @ A, expected, rtol=1e-14)
