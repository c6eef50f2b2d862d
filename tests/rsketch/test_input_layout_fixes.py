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


@pytest.mark.parametrize("fn", [rsketch.eigh, rsketch.nystrom])
def test_symmetric_functions_leave_a_sparse_input_untouched(fn):
    # SciPy's sparse norm summed the caller's duplicates in place (nnz 3 -> 2) and sorted its
    # indices, and met read-only buffers with "WRITEBACKIFCOPY base is read-only"
    A = sp.csr_matrix(([1.0, 1.0, 2.0], [0, 0, 1], [0, 2, 3]), shape=(2, 2))
    for a in (A.data, A.indices, A.indptr):
        a.flags.writeable = False
    fn(A, 1, oversample=0, seed=0)
    assert A.nnz == 3 and A.data.tolist() == [1.0, 1.0, 2.0]


@pytest.mark.parametrize("fn", [rsketch.svd, rsketch.range_finder])
def test_low_rank_functions_never_write_into_an_operators_results(fn):
    # the basis was orthonormalised in the arrays rmatmat returned (2 of 3 overwritten), and
    # read-only ones met "output array is read-only"
    from scipy.sparse.linalg import LinearOperator

    X = np.random.default_rng(0).standard_normal((200, 60))
    handed = []

    def product(M, V):
        out = M @ V
        out.flags.writeable = False
        handed.append((out, out.copy()))
        return out

    L = LinearOperator(
        X.shape,
        matvec=lambda v: X @ v,
        rmatvec=lambda v: X.T @ v,
        matmat=lambda V: product(X, V),
        rmatmat=lambda V: product(X.T, V),
        dtype=np.float64,
    )
    fn(L, 3, seed=0)
    assert handed and all(np.array_equal(a, b) for a, b in handed)


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")  # the input, np.matrix
@pytest.mark.parametrize(
    "convert",
    [
        np.asmatrix,
        lambda X: X.astype(">f8"),
        lambda X: sp.lil_matrix(X),
        lambda X: sp.dok_matrix(X),
        lambda X: sp.dia_matrix(X),
        lambda X: sp.coo_array(X),
    ],  # fmt: skip
    ids=["matrix", "big-endian", "lil", "dok", "dia", "coo"],
)
def test_gram_operator_takes_every_layout(convert):
    # np.matrix gave (1, p) products or broadcast errors, lil and dok met errors, '>f8' was refused
    from rsketch.linalg import GramOperator

    rng = np.random.default_rng(0)
    X, w, v = rng.standard_normal((50, 4)), rng.uniform(size=50), rng.standard_normal(4)
    ref = GramOperator(X, center=X.mean(axis=0), sample_weight=w)
    G = GramOperator(convert(X), center=X.mean(axis=0), sample_weight=w)
    np.testing.assert_allclose(G @ v, ref @ v, rtol=1e-13)
    ones = np.ones(50)
    np.testing.assert_allclose(G.transpose_weighted(ones), ref.transpose_weighted(ones), rtol=1e-13)


def test_gram_operator_ignores_dia_padding():
    # a DIA matrix stores its diagonals padded; NaN in the padding is no entry of X
    from rsketch.linalg import GramOperator

    D = sp.dia_matrix((np.array([[1.0, 2.0, 3.0]]), [1]), shape=(3, 3))  # data[0, 0] is padding
    D.data[0, 0] = np.nan
    G = GramOperator(D)
    np.testing.assert_allclose(G @ np.ones(3), D.toarray().T @ D.toarray() @ np.ones(3))


def test_ihs_allocates_no_copy_of_X():
    # the design's scaling took its largest entry as max(|X|), a temporary the size of X
    import tracemalloc

    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((40_000, 50)), rng.standard_normal(40_000)
    rsketch.lstsq(X, y, method="ihs", seed=0)  # compiled and warm
    tracemalloc.start()
    try:
        rsketch.lstsq(X, y, method="ihs", seed=0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < X.nbytes / 4


def test_one_dimensional_sparse_arrays_are_vectors():
    # S @ coo_array(v) was refused as not 2-D (lstsq took the same y), and coo_array(z) @ S
    # said "Z must be 2-D", an operand the caller never wrote
    S = rsketch.make_sketch("sparse_sign", 200, 20, seed=0)
    v, z = np.arange(200.0), np.arange(20.0)
    np.testing.assert_array_equal(S @ sp.coo_array(v), S @ v)
    np.testing.assert_array_equal(sp.coo_array(z) @ S, z @ S)


def test_efficiency_names_a_sparse_y():
    # a sparse y became a 0-d object array: "y must hold real numbers, got dtype object"
    X = np.random.default_rng(0).standard_normal((500, 5))
    with pytest.raises(TypeError, match="y must be a dense 1-D array, got a sparse csr_matrix"):
        rsketch.efficiency(X, sketch="gaussian", sketch_size=50, y=sp.csr_matrix(np.ones((500, 1))))


@pytest.mark.parametrize("kind", ["sparse_sign", "countsketch"])
def test_sparse_kernels_count_the_copy_of_a_strided_operand(kind, monkeypatch):
    # a broadcast (8 bytes a row here) or strided view is copied whole for the kernels: the memory
    # check had left that copy out, and NumPy's "Unable to allocate" came after it
    import rsketch._validation as validation

    monkeypatch.setattr(validation, "available_memory", lambda: 1 << 30)
    S = rsketch.make_sketch(kind, 200_000, 20, seed=0)
    A = np.broadcast_to(np.ones((200_000, 1)), (200_000, 1000))  # 1.6 GB once copied
    with pytest.raises(MemoryError, match="@ A with sketch_size=20"):
        S @ A
    assert (S @ A[:, :1]).shape == (20, 1)  # a small strided operand is copied and computed


def test_uniform_test_matrix_does_not_depend_on_the_layout():
    # uniform sampling with replacement repeated columns: the basis' missing directions came from
    # rounding, and C- and Fortran-ordered X gave components 1.6e-3 apart
    X = np.random.default_rng(0).standard_normal((20_000, 20)) * np.geomspace(10, 1, 20)
    a = rsketch.SketchedPCA(n_components=3, sketch="uniform", random_state=0).fit(X)
    b = rsketch.SketchedPCA(n_components=3, sketch="uniform", random_state=0).fit(np.asfortranarray(X))
    np.testing.assert_allclose(a.components_, b.components_, atol=1e-12)
