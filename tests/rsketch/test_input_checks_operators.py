"""Bad input to the operators and their Dask path is refused up front, with an error naming the argument."""

import numpy as np
import pytest

import rsketch
from rsketch.operators.factory import SKETCH_KINDS

OTHER_KINDS = [kind for kind in SKETCH_KINDS if kind != "leverage"]


# ------------------------------------------------------------------------- make_sketch's kind-specific A
@pytest.mark.parametrize("kind", OTHER_KINDS)
def test_make_sketch_refuses_A_for_kinds_that_ignore_it(kind):
    with pytest.raises(TypeError, match=r"A is used only by kind='leverage' without scores.*got kind="):
        rsketch.make_sketch(kind, 100, 10, seed=0, A=np.ones((7, 2)))


def test_make_sketch_refuses_A_next_to_scores():
    # A is not even looked at when scores are given: junk must not pass for a matrix
    for A in ("junk", np.ones((100, 2))):
        with pytest.raises(TypeError, match=r"A is used only by kind='leverage' without scores.*not both"):
            rsketch.make_sketch("leverage", 100, 10, seed=0, A=A, scores=np.ones(100))


def test_make_sketch_refuses_method_next_to_scores():
    # method picks how scores are computed from A: with scores given it would be ignored
    with pytest.raises(TypeError, match=r"method is used only by kind='leverage' without scores"):
        rsketch.make_sketch("leverage", 100, 10, seed=0, scores=np.ones(100), method="approx")


@pytest.mark.parametrize("kind", list(SKETCH_KINDS))
def test_make_sketch_still_takes_A_none_and_leverage_from_A(kind):
    # A=None means "no A" for every kind (rsketch.demo passes it so)
    options = {"scores": np.ones(100)} if kind == "leverage" else {}
    S = rsketch.make_sketch(kind, 100, 10, seed=0, A=None, **options)
    assert S.shape == (10, 100)
    X = np.random.default_rng(0).standard_normal((100, 3))
    S = rsketch.make_sketch("leverage", 100, 10, seed=0, A=X, method="approx")
    assert S.shape == (10, 100)


# ------------------------------------------------------------------- Dask arrays of non-NumPy chunks
def _sparse_chunked(n=4000, p=3):
    import dask.array as da
    import scipy.sparse as sp

    M = sp.random(n, p, density=0.2, format="csr", random_state=0)
    return da.from_array(M, chunks=(n // 4, p), asarray=False), M


def _sketch(kind, n):
    options = {"scores": np.ones(n)} if kind == "leverage" else {}
    return rsketch.make_sketch(kind, n, 40, seed=0, **options)


@pytest.mark.parametrize("kind", list(SKETCH_KINDS))
def test_sketch_refuses_dask_array_of_sparse_chunks_before_compute(kind):
    # The chunk kernels failed only at compute time ("setting an array element with a sequence")
    A, _ = _sparse_chunked()
    with pytest.raises(TypeError, match=r"A is a Dask array of scipy\.sparse.*map_blocks"):
        _sketch(kind, A.shape[0]) @ A


def test_dask_functions_refuse_sparse_chunks_naming_the_argument():
    import rsketch.dask as rdask

    A, _ = _sparse_chunked()
    calls = [
        ("X", lambda: rsketch.lstsq(A, np.ones(A.shape[0]), seed=0)),
        ("A", lambda: rsketch.range_finder(A, 2, seed=0)),
        ("A", lambda: rsketch.svd(A, 2, seed=0)),
        ("A", lambda: rsketch.qr_pivoted(A, seed=0)),
        ("A", lambda: rdask.leverage_sampling(A, 40, seed=0)),
        ("A", lambda: rdask.approximate_leverage(A, (1, 2))),
    ]
    for name, call in calls:
        with pytest.raises(TypeError, match=rf"^{name} is a Dask array of scipy\.sparse"):
            call()
    X = A.map_blocks(lambda b: b.toarray(), dtype=A.dtype)
    with pytest.raises(TypeError, match=r"^y is a Dask array of scipy\.sparse"):
        rsketch.lstsq(X, A[:, :1], seed=0)


def test_the_suggested_dense_chunks_give_the_in_memory_sketch():
    A, M = _sparse_chunked()
    S = rsketch.make_sketch("sparse_sign", A.shape[0], 40, seed=0)
    dense = (S @ A.map_blocks(lambda b: b.toarray(), dtype=A.dtype)).compute()
    np.testing.assert_allclose(dense, S @ M.toarray(), rtol=1e-12, atol=1e-12)


def test_sketch_refuses_dask_array_of_masked_chunks():
    # The kernels read the data under the mask; in memory a masked A with masked entries is refused
    import dask.array as da

    X = np.random.default_rng(0).standard_normal((400, 3))
    A = da.ma.masked_greater(da.from_array(X, chunks=100), 1.0)
    with pytest.raises(TypeError, match=r"A is a Dask array of masked.*getdata"):
        rsketch.make_sketch("gaussian", 400, 20, seed=0) @ A


class _DeviceChunk:
    """A chunk of another array library (as CuPy's): array-like, but not a NumPy array."""

    def __init__(self, a):
        self.a = np.asarray(a)
        self.shape, self.ndim, self.dtype = self.a.shape, self.a.ndim, self.a.dtype

    def __getitem__(self, index):
        return _DeviceChunk(self.a[index])

    def astype(self, dtype, **kwargs):
        return _DeviceChunk(self.a.astype(dtype))


@pytest.mark.parametrize("module, fix", [("cupy", "cupy.asnumpy"), (__name__, "np.asarray")])
def test_sketch_refuses_dask_array_of_other_libraries_chunks(module, fix, monkeypatch):
    import dask.array as da

    monkeypatch.setattr(_DeviceChunk, "__module__", module)
    A = da.from_array(np.ones((400, 3)), chunks=100).map_blocks(
        _DeviceChunk, meta=_DeviceChunk(np.ones((0, 0)))
    )
    with pytest.raises(TypeError, match=rf"A is a Dask array of {module}\._DeviceChunk.*{fix}"):
        rsketch.make_sketch("gaussian", 400, 20, seed=0) @ A


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix
@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.bool_, np.float16, np.float32, np.float64])
def test_dask_arrays_of_numpy_chunks_still_sketch(dtype):
    import dask.array as da

    X = (np.random.default_rng(0).standard_normal((400, 3)) * 3).astype(dtype)
    for meta_kind in (X, np.asmatrix(X)):  # an ndarray subclass without a mask is still NumPy data
        A = da.from_array(meta_kind, chunks=(100, 3))
        S = rsketch.make_sketch("countsketch", 400, 20, seed=0)
        np.testing.assert_allclose((S @ A).compute(), S @ np.asarray(X), rtol=1e-5, atol=1e-5)


def test_leverage_scores_none_is_no_scores():
    A = np.random.default_rng(2).standard_normal((300, 4))
    S = rsketch.make_sketch("leverage", 300, 30, seed=1, A=A, scores=None)
    np.testing.assert_array_equal(
        S.indices(), rsketch.make_sketch("leverage", 300, 30, seed=1, A=A).indices()
    )
    with pytest.raises(ValueError, match="needs either scores"):
        rsketch.make_sketch("leverage", 300, 30, seed=1, scores=None)
