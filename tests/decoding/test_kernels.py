"""The few-row product kernel against NumPy's matmul."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from decoding.kernels import FEW_ROWS, linear, rows_times_weights


@settings(max_examples=40, deadline=None)
@given(
    T=st.integers(1, 2 * FEW_ROWS),
    N=st.integers(1, 37),
    K=st.integers(1, 70),
    seed=st.integers(0, 2**31 - 1),
)
def test_rows_times_weights_matches_matmul_float64(T, N, K, seed):
    rng = np.random.default_rng(seed)
    x, w = rng.standard_normal((T, K)), rng.standard_normal((N, K))
    ref = x @ w.T
    out = rows_times_weights(x, w)
    assert out.shape == (T, N) and out.dtype == np.float64
    # Reassociated sums: each entry within a few ulps of the sum of |terms|.
    assert np.all(np.abs(out - ref) <= 8 * K * np.finfo(np.float64).eps * (np.abs(x) @ np.abs(w).T))
    assert np.array_equal(linear(x, w), out if T <= FEW_ROWS else ref)


@pytest.mark.parametrize("T", [1, 3, 4, 8, 16])
def test_rows_times_weights_float32_at_model_sizes(T):
    rng = np.random.default_rng(T)
    x = rng.standard_normal((T, 576)).astype(np.float32)
    w = rng.standard_normal((1729, 576)).astype(np.float32)  # odd row count: the last row alone
    out = rows_times_weights(x, w)
    assert out.dtype == np.float32
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    bound = 576 * 4 * np.finfo(np.float32).eps * (np.abs(x) @ np.abs(w).T)
    assert np.all(np.abs(out - ref) <= bound)


def test_linear_empty_and_wide_batches_use_matmul():
    w = np.ones((3, 2))
    assert linear(np.ones((0, 2)), w).shape == (0, 3)
    x = np.arange(2.0 * (FEW_ROWS + 1)).reshape(FEW_ROWS + 1, 2)
    assert np.array_equal(linear(x, w), x @ w.T)
