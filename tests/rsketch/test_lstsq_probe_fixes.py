"""rsketch.lstsq: findings of a probe (Dask's tiny data, IHS's divergence and its convergence claim).

Each test failed on the code before its fix; the comment over it says what it used to return.
"""

from __future__ import annotations

import warnings

import dask.array as da
import numpy as np
import pytest

import rsketch
from rsketch.linalg import backward_error

from .array_api_standin import host, on_device

EPS = np.finfo(np.float64).eps
METHODS = ["precondition", "sketch_and_solve", "ihs"]


def _optimal_residual(X, y):
    return np.linalg.norm(y - X @ np.linalg.lstsq(X, y, rcond=None)[0])


# ----------------------------------------------------------------------------------- Dask, tiny data
@pytest.mark.parametrize("method", METHODS)
def test_tiny_dask_data_is_solved_directly_as_in_memory(method):
    # A 2 x 1 column of ones in chunks of one row gave coef 0, rank 0 and converged=True
    # (sketch_and_solve, ihs): the direct-solve guard looked at in-memory X only.
    X, y = np.ones((2, 1)), np.array([1.0, 3.0])
    res = rsketch.lstsq(da.from_array(X, chunks=1), da.from_array(y, chunks=1), method=method, seed=0)
    assert res.log.finish == "direct" and res.sketch is None and res.converged
    assert res.coef[0] == pytest.approx(2.0, rel=1e-14) and res.rank == 1 and res.iterations == 0
    assert isinstance(res.coef, np.ndarray) and res.log.passes == 1  # one read of X's chunks
    mem = rsketch.lstsq(X, y, method=method, seed=0)
    np.testing.assert_array_equal(res.coef, mem.coef)


@pytest.mark.parametrize("method", METHODS)
def test_tiny_dask_problems_agree_with_memory(method):
    # Of 60 random tiny Dask problems, sketch_and_solve returned non-optimal answers marked
    # converged=True (at 3 x 3 a residual of 2.8 where the optimum is 0); ihs and precondition
    # were wrong with converged=False.
    for seed in range(60):
        rng = np.random.default_rng(seed)
        n = int(rng.integers(1, 6))
        X, y = rng.standard_normal((n, int(rng.integers(1, n + 1)))), rng.standard_normal(n)
        Xd, yd = da.from_array(X, chunks=1), da.from_array(y, chunks=2)
        res, mem = (
            rsketch.lstsq(Xd, yd, method=method, seed=seed),
            rsketch.lstsq(X, y, method=method, seed=seed),
        )
        np.testing.assert_array_equal(res.coef, mem.coef)
        assert res.converged and res.log.finish == "direct"
        assert res.residual_norm <= (1 + 1e-10) * _optimal_residual(X, y) + 1e-14 * np.linalg.norm(y)


@pytest.mark.parametrize("method", METHODS)
def test_tiny_device_data_is_solved_directly_too(method):
    # The same guard was missing for an X of another array library (CuPy; array_api_strict on a
    # second device stands in): sketch_and_solve gave coef 0, rank 0, converged=True.
    X, y = np.ones((2, 1)), np.array([1.0, 3.0])
    res = rsketch.lstsq(on_device(X), on_device(y), method=method, seed=0)
    assert res.log.finish == "direct" and res.converged and res.rank == 1
    np.testing.assert_array_equal(host(res.coef), rsketch.lstsq(X, y, method=method, seed=0).coef)


def test_dask_data_a_sketch_can_shrink_is_still_sketched():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((2000, 5))
    y = X @ np.ones(5) + rng.standard_normal(2000)
    Xd = da.from_array(X, chunks=(500, 5))
    for method in METHODS:
        assert rsketch.lstsq(Xd, y, method=method, seed=0).log.finish != "direct"
    # a size given is the caller's, for Dask input as in memory
    small = da.from_array(X[:40], chunks=10)
    assert rsketch.lstsq(small, y[:40], sketch_size=40, method="ihs", seed=0).sketch is not None


# ----------------------------------------------------------------------------------- IHS
def _coherent_problem():
    rng = np.random.default_rng(0)
    X = np.vstack([np.eye(20), 1e-6 * rng.standard_normal((3980, 20))])
    return X, rng.standard_normal(4000)


def test_ihs_that_diverges_returns_its_best_iterate():
    # 40 uniformly sampled rows of a coherent X miss its identity block: the iteration diverges.
    # It warned and said converged=False but returned the last iterate, a relative error of 1e44,
    # where its start, coef = 0, has error 1.
    X, y = _coherent_problem()
    with pytest.warns(rsketch.ConvergenceWarning, match="method='ihs'"):
        res = rsketch.lstsq(X, y, method="ihs", sketch="uniform", sketch_size=40, seed=0)
    assert not res.converged
    rnorm = np.linalg.norm(y - X @ res.coef)
    assert rnorm <= np.linalg.norm(y)  # no worse than coef = 0
    assert res.residual_norm == pytest.approx(rnorm, rel=1e-12)  # the returned coef's
    ref = np.linalg.lstsq(X, y, rcond=None)[0]
    assert np.linalg.norm(res.coef - ref) <= np.linalg.norm(ref)


def test_ihs_best_iterate_per_column():
    # Two right-hand sides, each with its own iteration: each column keeps its own best.
    X, y = _coherent_problem()
    Y = np.column_stack([y, 3 * y[::-1]])
    with pytest.warns(rsketch.ConvergenceWarning):
        res = rsketch.lstsq(X, Y, method="ihs", sketch="uniform", sketch_size=40, seed=0)
    rnorm = np.linalg.norm(Y - X @ res.coef, axis=0)
    assert np.all(rnorm <= np.linalg.norm(Y, axis=0))
    np.testing.assert_allclose(res.residual_norm, rnorm, rtol=1e-12)


@pytest.mark.parametrize("seed", [1, 2])
def test_ihs_that_stalls_returns_its_last_iterate(seed):
    # Near a stall the residual norms of the iterates differ by a few eps, at random: picking the
    # smallest of those returned backward errors of 5e-10 where the last iterate has 1.4e-12.
    from rsketch.linalg.problems import stability_problem

    P = stability_problem(3000, 30, kappa=1e8, residual_norm=1, seed=seed)
    with pytest.warns(rsketch.ConvergenceWarning, match="method='ihs'"):
        res = rsketch.lstsq(P.X, P.y, method="ihs", seed=seed)
    assert not res.converged and backward_error(P.X, P.y, res.coef) <= 1e-11
    assert res.log.backward_error == pytest.approx(backward_error(P.X, P.y, res.coef), rel=0.5)


def _column_scaled(n, p, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p))
    y = X @ rng.standard_normal(p) + 1e-3 * rng.standard_normal(n)
    return X * np.logspace(-150, 150, p), y


@pytest.mark.parametrize("shape", [(2000, 20), (2000, 5), (300, 20)])
def test_ihs_converged_means_backward_stable_as_documented(shape):
    # Columns scaled 1e-150 .. 1e150: IHS stopped on its gradient measure (4.9e-13 < tol = 1e-12)
    # and said converged=True at a backward error of 1.8e-13, where a stalled run must reach
    # 10 sqrt(p) eps to say so and "precondition" gives 6e-17.
    X, y = _column_scaled(*shape)
    p = shape[1]
    res = rsketch.lstsq(X, y, method="ihs", seed=0)
    assert res.converged
    assert backward_error(X, y, res.coef) <= 10 * np.sqrt(p) * EPS
    assert res.log.backward_error <= 10 * np.sqrt(p) * EPS
    # The residual is the one a backward-stable solver gives: X is of numerical rank 1 (its other
    # columns lie below 8 u ||X||), for "precondition" as for LAPACK's gelsy.
    pre = rsketch.lstsq(X, y, seed=0)
    assert res.rank == pre.rank == 1
    assert res.residual_norm == pytest.approx(pre.residual_norm, rel=1e-9)


def test_ihs_converged_means_backward_stable_unscaled():
    # The same held for plain Gaussian data: converged=True at a backward error of 1.5e-13.
    rng = np.random.default_rng(0)
    X = rng.standard_normal((2000, 20))
    y = X @ rng.standard_normal(20) + 1e-3 * rng.standard_normal(2000)
    res = rsketch.lstsq(X, y, method="ihs", seed=0)
    assert res.converged and backward_error(X, y, res.coef) <= 10 * np.sqrt(20) * EPS


def test_ihs_loose_tol_is_still_honoured():
    # A tol the caller loosens stops the run early: the backward error asked for is then tol's.
    rng = np.random.default_rng(0)
    X = rng.standard_normal((2000, 20))
    y = X @ rng.standard_normal(20) + 1e-3 * rng.standard_normal(2000)
    default = rsketch.lstsq(X, y, method="ihs", seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loose = rsketch.lstsq(X, y, method="ihs", seed=0, tol=1e-6)
    assert loose.converged and loose.iterations < default.iterations
    assert backward_error(X, y, loose.coef) <= 1e-6


def test_a_direct_solve_too_large_for_memory_is_refused_before_densifying(monkeypatch):
    # A wide sparse X takes the direct solve (the default sketch would have n rows or more), which
    # densified it unchecked: a raw "Unable to allocate 29.8 GiB" from scipy's toarray
    import scipy.sparse as sp

    import rsketch._validation

    monkeypatch.setattr(rsketch._validation, "available_memory", lambda: 2**30)  # 1 GiB: 512 MiB allowed
    X, y = sp.eye(40_000, 1_000, format="csr"), np.ones(40_000)  # densified: 320 MB, three copies
    with pytest.raises(MemoryError, match=r"lstsq's direct solve of a 40000 x 1000 X .*sketch_size between"):
        rsketch.lstsq(X, y)
    with pytest.raises(MemoryError, match=r"SketchedLinearRegression.s direct solve of a 40000 x 1001"):
        rsketch.SketchedLinearRegression().fit(X, y)
    res = rsketch.lstsq(X, y, sketch_size=4_000, seed=0)  # the hint's way: sketched, in memory
    assert res.converged and np.allclose(res.coef, 1.0)


# ------------------------------------------------------------------ rank when S X's rounding hides a zero
def test_a_numerically_rank_deficient_x_gets_the_minimum_norm_answer_whatever_the_sketch_s_rounding():
    # S X sums up to n products per entry: a zero singular value of X showed above the rank rule's
    # 8 u s_1 (8.2 u at n = 400,000; 22-30 u in IHS's sketches), its direction was kept, and
    # "precondition" and "ihs" returned coefficients 1e13 to 1e17 times the minimum-norm ones, with a
    # residual up to 26 times the optimum, and converged=True (found by probing, 2026-12-06).
    rng = np.random.default_rng(0)
    n = 400_000
    X = rng.standard_normal((n, 1)) @ rng.standard_normal((1, 2))  # rank 1: sigma_2 = 2.5 u sigma_1
    y = X @ rng.standard_normal(2) + 0.1 * rng.standard_normal(n)
    ref = np.linalg.lstsq(X, y, rcond=None)[0]
    for method in ("precondition", "ihs"):
        res = rsketch.lstsq(X, y, seed=1, method=method)
        assert res.converged and res.rank == 1
        np.testing.assert_allclose(res.coef, ref, rtol=1e-8)
    # A column that duplicates another to 1e-13 (sigma_min 9e-17 sigma_1) under a Gaussian sketch,
    # and a rank-4 X of 20,000 rows under IHS.
    X = rng.standard_normal((2000, 20))
    X[:, 7] = X[:, 2] * (1 + 1e-13)
    y = X @ rng.standard_normal(20) + 1e-2 * rng.standard_normal(2000)
    ref = np.linalg.lstsq(X, y, rcond=None)[0]
    for seed in range(3):
        res = rsketch.lstsq(X, y, sketch="gaussian", seed=seed)
        assert res.converged and res.rank == 19
        np.testing.assert_allclose(res.coef, ref, rtol=1e-6)
    X = rng.standard_normal((20_000, 4)) @ rng.standard_normal((4, 5))
    y = X @ rng.standard_normal(5) + 0.1 * rng.standard_normal(20_000)
    ref = np.linalg.lstsq(X, y, rcond=None)[0]
    for seed in range(3):
        res = rsketch.lstsq(X, y, method="ihs", seed=seed)
        assert res.converged and res.rank == 4
        np.testing.assert_allclose(res.coef, ref, rtol=1e-8)


def test_sketch_and_solve_with_a_sketch_that_misses_range_x_has_not_converged():
    # A given sketch_size is taken as asked; a sketch that maps a direction of range(X) to zero had
    # given coef 0, rank 0, residual 1.41 for 0, converged=True (a 2 x 1 column of ones, sketch_size 2).
    with pytest.warns(rsketch.ConvergenceWarning, match="maps a direction of range\\(X\\) to zero"):
        res = rsketch.lstsq(np.ones((2, 1)), np.ones(2), method="sketch_and_solve", sketch_size=2, seed=0)
    assert not res.converged and res.rank == 0
    X = np.random.default_rng(1).standard_normal((20, 20))
    with pytest.warns(rsketch.ConvergenceWarning):
        res = rsketch.lstsq(
            X, np.ones(20), method="sketch_and_solve", sketch="countsketch", sketch_size=20, seed=0
        )
    assert not res.converged
    # fewer sketch rows than columns: p - r directions of range(X) go to zero (a review's find)
    X = np.random.default_rng(3).standard_normal((200, 10))
    with pytest.warns(rsketch.ConvergenceWarning):
        assert not rsketch.lstsq(X, np.ones(200), method="sketch_and_solve", sketch_size=5, seed=0).converged
    # a sketch that embeds range(X): converged, no warning
    X = np.random.default_rng(2).standard_normal((5000, 5))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert rsketch.lstsq(X, X @ np.ones(5), method="sketch_and_solve", seed=0).converged
