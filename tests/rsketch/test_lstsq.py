"""rsketch.lstsq: the accuracy contract, preconditioner quality, IHS, sketch-and-solve, rank, bad input.

Problems come from a known SVD (rsketch.linalg.problems) over a fixed list of seeds, as PARLA's tests
do; every tolerance is the issue's contract or a bound derived in the comment next to it.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.linalg
import scipy.sparse as sp

import rsketch
from rsketch.linalg._common import build_sketch
from rsketch.linalg._precondition import predicted_rate, sketched_factor
from rsketch.linalg.problems import make_problem

SEEDS = [0, 1, 2]
N, P = 2000, 20


def _scipy(X, y):
    Xd = X.toarray() if sp.issparse(X) else X
    return scipy.linalg.lstsq(Xd, y, lapack_driver="gelsy")[0]


def _rnorm(X, y, coef):
    return np.linalg.norm(y - X @ coef, axis=0)


def _ferr(coef, ref):
    return np.linalg.norm(coef - ref, axis=0) / np.linalg.norm(ref, axis=0)


# ----------------------------------------------------------------------------------- accuracy contract
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("cond", [1e2, 1e6, 1e10])
@pytest.mark.parametrize("density", [None, 0.2])
@pytest.mark.parametrize("n_rhs", [None, 3])
def test_precondition_contract_inconsistent(seed, cond, density, n_rhs):
    Pb = make_problem(N, P, cond=cond, density=density, n_rhs=n_rhs, seed=seed)
    res = rsketch.lstsq(Pb.X, Pb.y, seed=seed)
    assert res.converged and res.method == "precondition" and res.rank == P
    ref = _scipy(Pb.X, Pb.y)
    # Residual within a factor 1 + 1e-10 of scipy's (the contract), for every column.
    assert np.all(_rnorm(Pb.X, Pb.y, res.coef) <= (1 + 1e-10) * _rnorm(Pb.X, Pb.y, ref))
    np.testing.assert_allclose(res.residual_norm, _rnorm(Pb.X, Pb.y, res.coef), rtol=1e-12)
    if cond <= 1e8:
        # Forward error within 10x scipy's, against the known minimiser.
        assert np.all(_ferr(res.coef, Pb.coef) <= 10 * _ferr(ref, Pb.coef))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("cond", [1e2, 1e6, 1e8])
@pytest.mark.parametrize("kind", ["consistent", "clustered"])
def test_precondition_contract_other_spectra(seed, cond, kind):
    Pb = make_problem(N, P, cond=cond, kind=kind, seed=seed)
    res = rsketch.lstsq(Pb.X, Pb.y, seed=seed)
    ref = _scipy(Pb.X, Pb.y)
    assert res.converged
    assert _ferr(res.coef, Pb.coef) <= 10 * _ferr(ref, Pb.coef)
    if kind == "consistent":
        # Both residuals are rounding: at most a backward-stable solver's eps * ||X|| ||coef|| * sqrt(n).
        assert res.residual_norm <= np.sqrt(N) * np.finfo(float).eps * np.linalg.norm(Pb.y)
    else:
        assert res.residual_norm <= (1 + 1e-10) * _rnorm(Pb.X, Pb.y, ref)


@pytest.mark.parametrize("layout", ["C", "F", "int", "float32", "list"])
def test_layouts_and_dtypes_agree(layout):
    Pb = make_problem(N, P, cond=1e3, seed=4)
    base = rsketch.lstsq(Pb.X, Pb.y, seed=0).coef
    X, y = Pb.X, Pb.y
    if layout == "F":
        X = np.asfortranarray(X)
    elif layout == "int":
        X, y = np.round(100 * X).astype(np.int64), np.round(100 * y).astype(np.int32)
        base = scipy.linalg.lstsq(X.astype(float), y.astype(float))[0]
    elif layout == "float32":
        X = X.astype(np.float32)
        base = scipy.linalg.lstsq(X.astype(float), y)[0]
    elif layout == "list":
        X, y = X.tolist(), y.tolist()
    coef = rsketch.lstsq(X, y, seed=0).coef
    np.testing.assert_allclose(coef, base, rtol=1e-9, atol=1e-9 * np.abs(base).max())


def test_sparse_formats_agree_with_dense():
    Pb = make_problem(N, P, cond=1e4, density=0.1, seed=3)
    dense = rsketch.lstsq(Pb.X.toarray(), Pb.y, seed=0).coef
    for fmt in ("csr", "csc", "coo"):
        coef = rsketch.lstsq(Pb.X.asformat(fmt), Pb.y, seed=0).coef
        np.testing.assert_allclose(coef, dense, rtol=1e-8, atol=1e-12)


def test_deterministic_and_seed_types():
    Pb = make_problem(N, P, cond=1e3, seed=5)
    a = rsketch.lstsq(Pb.X, Pb.y, seed=7)
    b = rsketch.lstsq(Pb.X, Pb.y, seed=7)
    assert np.array_equal(a.coef, b.coef) and a.iterations == b.iterations
    for seed in (np.random.SeedSequence(7), np.random.default_rng(7), None):
        res = rsketch.lstsq(Pb.X, Pb.y, seed=seed)
        np.testing.assert_allclose(res.coef, a.coef, rtol=1e-10)


@pytest.mark.parametrize("kind", sorted(rsketch.SKETCH_KINDS))
def test_every_sketch_kind_preconditions(kind):
    Pb = make_problem(N, P, cond=1e6, seed=6)
    # CountSketch needs r of order p^2 to embed; sampling needs a coherence factor. Give them room.
    r = {"countsketch": 1000, "uniform": 800, "leverage": 400}.get(kind, 200)
    res = rsketch.lstsq(Pb.X, Pb.y, sketch=kind, sketch_size=r, seed=1)
    ref = _scipy(Pb.X, Pb.y)
    assert res.converged and res.sketch.kind == kind and res.sketch_size == r
    assert res.residual_norm <= (1 + 1e-10) * _rnorm(Pb.X, Pb.y, ref)
    assert _ferr(res.coef, Pb.coef) <= 10 * _ferr(ref, Pb.coef)


def test_operator_as_sketch():
    Pb = make_problem(N, P, cond=1e2, seed=8)
    S = rsketch.make_sketch("gaussian", N, 100, seed=3)
    res = rsketch.lstsq(Pb.X, Pb.y, sketch=S)
    assert res.sketch is S and res.sketch_size == 100 and res.converged
    np.testing.assert_allclose(res.coef, _scipy(Pb.X, Pb.y), rtol=1e-12, atol=1e-13)


# ----------------------------------------------------------------------------------- preconditioner
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("r_factor", [4, 20])
def test_preconditioned_condition_number_and_rate(seed, r_factor):
    """kappa(X M) and the CG rate are what the sketch size predicts.

    Gaussian S (r x n, N(0, 1/r)) restricted to range(X) is an r x p Gaussian: its singular values lie
    in 1 +- (sqrt(p/r) + t) with probability >= 1 - 2 exp(-r t^2 / 2) (Davidson & Szarek); t = 3/sqrt(r)
    gives failure probability 2e-2 per draw, and the seeds are fixed. The singular values of X M are the
    reciprocals, so kappa(X M) <= (1 + e)/(1 - e), e = sqrt(p/r) + t. CG on the normal equations then
    contracts the A-norm error by (kappa - 1)/(kappa + 1) per step; the residual (our logged measure)
    may lag by the factor 2 kappa^2 (CG's bound with the norm change), which we allow.
    """
    Pb = make_problem(N, P, cond=1e2, seed=seed)
    r = r_factor * P
    S = rsketch.make_sketch("gaussian", N, r, seed=seed)
    M = sketched_factor(S @ Pb.X).M
    kappa = np.linalg.cond(Pb.X @ M)
    e = predicted_rate(P, r) + 3 / np.sqrt(r)
    assert kappa <= (1 + e) / (1 - e)
    res = rsketch.lstsq(Pb.X, Pb.y, sketch=S, tol=1e-15, inner_solver="cg")
    h = np.asarray(res.log.gradient_norms)
    rho = (kappa - 1) / (kappa + 1)
    k = 8
    assert h[k] / h[0] <= 2 * kappa**2 * rho**k
    # And the observed rate is no worse than the prediction sqrt(p / r) with the same margin.
    assert (h[k] / h[0]) ** (1 / k) <= e * (2 * kappa**2) ** (1 / k)


@pytest.mark.parametrize("factor, method", [(20, "sketch_and_solve"), (40, "precondition")])
def test_sparse_sign_embeds_like_gaussian(factor, method):
    # The sketches lstsq builds by default (8 nonzeros per column at r = 20 p for sketch-and-solve,
    # 2 at r = 40 p for preconditioning): kappa(X M) within the Gaussian bound of the test above.
    r = factor * P
    for seed in SEEDS:
        Pb = make_problem(N, P, cond=1e8, seed=seed)
        S = build_sketch("sparse_sign", N, r, seed, Pb.X, method)
        assert S.nnz_per_column == (2 if method == "precondition" else 8)
        M = sketched_factor(S @ Pb.X).M
        e = predicted_rate(P, r) + 3 / np.sqrt(r)
        assert np.linalg.cond(Pb.X @ M) <= (1 + e) / (1 - e)


# ----------------------------------------------------------------------------------- IHS
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("cond", [1e2, 1e6])
def test_ihs_converges_to_the_same_answer(seed, cond):
    Pb = make_problem(1000, 10, cond=cond, seed=seed)
    # SRHT: the cheapest sketch at this size, and IHS draws one per iteration.
    res = rsketch.lstsq(Pb.X, Pb.y, method="ihs", sketch="srht", seed=seed, tol=1e-15)
    ref = _scipy(Pb.X, Pb.y)
    assert res.method == "ihs" and res.converged and res.iterations > 1
    assert res.residual_norm <= (1 + 1e-10) * _rnorm(Pb.X, Pb.y, ref)
    assert _ferr(res.coef, Pb.coef) <= 10 * _ferr(ref, Pb.coef)


def test_ihs_matrix_rhs_and_sparse():
    Pb = make_problem(1000, 10, cond=1e3, density=0.3, n_rhs=2, seed=3)
    res = rsketch.lstsq(Pb.X, Pb.y, method="ihs", sketch="srht", seed=0, tol=1e-14)
    np.testing.assert_allclose(res.coef, _scipy(Pb.X, Pb.y), rtol=1e-9)


def test_ihs_draws_fresh_sketches():
    from rsketch.linalg._ihs import fresh_sketch

    S0 = rsketch.make_sketch("srht", 64, 16, seed=0)
    S1, S2 = fresh_sketch(S0, 1), fresh_sketch(S0, 2)
    assert not np.array_equal(S1.to_dense(), S0.to_dense())
    assert not np.array_equal(S1.to_dense(), S2.to_dense())
    assert np.array_equal(fresh_sketch(S0, 1).to_dense(), S1.to_dense())


# ----------------------------------------------------------------------------------- sketch-and-solve
@pytest.mark.parametrize("kind", sorted(rsketch.SKETCH_KINDS))
@pytest.mark.parametrize("seed", SEEDS)
def test_sketch_and_solve_within_embedding_guarantee(kind, seed):
    """||y - X b_S|| <= (1 + e)/(1 - e) ||r_opt||, e = distortion of S on span(X, y).

    Deterministic given S: ||S v|| in [(1-e), (1+e)] ||v|| on span(X, y), so
    (1-e)||y - X b_S|| <= ||S(y - X b_S)|| <= ||S r_opt|| <= (1+e)||r_opt||. The distortion is measured
    from the singular values of S Q, Q an orthonormal basis of span(X, y).
    """
    Pb = make_problem(N, P, cond=1e4, seed=seed)
    r = 400
    opts = {"sketch": kind, "sketch_size": r, "seed": seed, "method": "sketch_and_solve"}
    res = rsketch.lstsq(Pb.X, Pb.y, **opts)
    assert res.iterations == 0 and res.converged and res.method == "sketch_and_solve"
    Q = np.linalg.qr(np.column_stack([Pb.X, Pb.y]))[0]
    sv = np.linalg.svd(res.sketch @ Q, compute_uv=False)
    e = max(sv.max() - 1, 1 - sv.min())
    assert e < 1
    opt = np.linalg.norm(Pb.residual)
    assert res.residual_norm <= (1 + e) / (1 - e) * opt * (1 + 1e-12)
    assert res.residual_norm >= opt * (1 - 1e-12)
    if kind in ("gaussian", "sparse_sign", "srht"):
        # A priori for these sizes: e <= sqrt((p+1)/r) + 3/sqrt(r) (the Gaussian bound above).
        assert e <= np.sqrt((P + 1) / r) + 3 / np.sqrt(r)


def test_sketch_and_solve_equals_solving_the_sketched_problem():
    Pb = make_problem(N, P, cond=1e3, seed=9)
    S = rsketch.make_sketch("gaussian", N, 100, seed=0)
    res = rsketch.lstsq(Pb.X, Pb.y, sketch=S, method="sketch_and_solve")
    direct = np.linalg.lstsq(S @ Pb.X, S @ Pb.y, rcond=None)[0]
    np.testing.assert_allclose(res.coef, direct, rtol=1e-10)


# ----------------------------------------------------------------------------------- rank deficiency
@pytest.mark.parametrize("method", ["precondition", "ihs"])
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("density", [None, 0.3])
def test_rank_deficient_gives_minimum_norm(method, seed, density):
    Pb = make_problem(1000, 12, kind="low_rank", rank=7, cond=1e3, density=density, seed=seed)
    res = rsketch.lstsq(Pb.X, Pb.y, method=method, sketch="srht", seed=seed, tol=1e-14)
    assert res.rank == 7
    pinv = np.linalg.pinv(Pb.X.toarray() if density else Pb.X) @ Pb.y
    np.testing.assert_allclose(res.coef, pinv, rtol=0, atol=1e-9 * np.linalg.norm(pinv))
    np.testing.assert_allclose(res.coef, Pb.coef, rtol=0, atol=1e-9 * np.linalg.norm(Pb.coef))


def test_duplicated_column_rank_and_sketch_and_solve_row_space():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((1500, 6))
    X = np.column_stack([X, X[:, 0]])  # exactly rank 6
    y = rng.standard_normal(1500)
    for method in ("precondition", "sketch_and_solve"):
        res = rsketch.lstsq(X, y, method=method, seed=0)
        assert res.rank == 6
        # Minimum norm puts equal weight on the duplicated pair.
        assert abs(res.coef[0] - res.coef[6]) <= 1e-10 * np.abs(res.coef).max()
    np.testing.assert_allclose(rsketch.lstsq(X, y, seed=0).coef, np.linalg.pinv(X) @ y, rtol=1e-10)


def test_zero_rhs_and_zero_matrix():
    X = np.random.default_rng(0).standard_normal((500, 5))
    res = rsketch.lstsq(X, np.zeros(500), seed=0)
    assert np.array_equal(res.coef, np.zeros(5)) and res.residual_norm == 0 and res.converged
    res = rsketch.lstsq(np.zeros((500, 5)), np.ones(500), seed=0)
    assert res.rank == 0 and np.array_equal(res.coef, np.zeros(5))
    assert res.residual_norm == pytest.approx(np.sqrt(500))


# ----------------------------------------------------------------------------------- result and log
@pytest.mark.parametrize("method", ["precondition", "sketch_and_solve", "ihs"])
def test_a_design_no_sketch_can_shrink_is_solved_directly(method):
    # With n at most the default sketch size, a sketch only mixes the rows, and a square sparse sign
    # of +-1 entries can be singular on range(X): a 2 x 1 column of ones came out rank 0, coef 0,
    # converged=True (sketch_and_solve, ihs). Such X is solved by LAPACK (gelsy), sketch None.
    rng = np.random.default_rng(3)
    for X in (np.ones((2, 1)), rng.standard_normal((5, 2)), rng.standard_normal((20, 3)), np.ones((4, 2))):
        y = X @ np.arange(1.0, X.shape[1] + 1) + 0.1 * rng.standard_normal(X.shape[0])
        for A in (X, sp.csr_matrix(X)):
            res = rsketch.lstsq(A, y, method=method, seed=0)
            assert res.sketch is None and res.log.finish == "direct" and res.converged
            assert "sketch=None," in repr(res)  # it read "sketch=NoneType(r=2)"
            np.testing.assert_allclose(res.coef, np.linalg.lstsq(X, y, rcond=None)[0], rtol=1e-12, atol=1e-14)
            assert res.rank == np.linalg.matrix_rank(X) and res.sketch_size == X.shape[0]
    # a size or an operator given is the caller's: sketched as asked
    X = rng.standard_normal((60, 3))
    assert rsketch.lstsq(X, X @ np.ones(3), sketch_size=30, method=method, seed=0).sketch is not None
    with pytest.raises(ValueError, match="X contains NaN"):
        rsketch.lstsq(np.where(X > 2, np.nan, X), X[:, 0], method=method, seed=0)


def test_result_fields_and_log():
    Pb = make_problem(N, P, cond=1e2, n_rhs=2, seed=0)
    res = rsketch.lstsq(Pb.X, Pb.y, seed=0)
    assert res.coef.shape == (P, 2) and res.residual_norm.shape == (2,)
    assert isinstance(res.sketch, rsketch.SparseSign) and res.sketch_size == 40 * P
    assert res.sketch.nnz_per_column == 2  # a preconditioning sketch (build_sketch)
    log = res.log
    assert log.finish == "refine" and min(log.sketch, log.factor, log.presolve, log.iterate) >= 0
    assert log.total >= log.sketch + log.factor + log.presolve + log.iterate - 1e-9
    assert len(log.gradient_norms) == res.iterations  # one CG measure per pass
    # One backward-error estimate per refinement step, the last one the result's, at the stable level.
    assert log.backward_errors and log.backward_error.shape == (2,)
    assert log.backward_error.max() <= min(log.backward_errors) + 1e-30
    assert log.backward_error.max() <= 10 * np.finfo(float).eps / 2
    assert "precondition" in repr(res)
    assert rsketch.linalg.default_sketch_size("ihs", 10**6, 30) == 300


def test_non_convergence_warns():
    Pb = make_problem(N, P, cond=1e6, seed=0)
    with pytest.warns(rsketch.ConvergenceWarning, match="converged=False"):
        res = rsketch.lstsq(Pb.X, Pb.y, seed=0, max_iter=2, inner_solver="cg")
    assert not res.converged and res.iterations == 2
    with pytest.warns(rsketch.ConvergenceWarning):
        res = rsketch.lstsq(Pb.X, Pb.y, seed=0, method="ihs", sketch="srht", max_iter=2)
    assert not res.converged


def test_converged_runs_do_not_warn():
    Pb = make_problem(N, P, cond=1e10, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert rsketch.lstsq(Pb.X, Pb.y, seed=0).converged


# ----------------------------------------------------------------------------------- bad input
def _xy(n=200, p=5):
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, p)), rng.standard_normal(n)


def _poke(X, value):
    X = X.copy()
    X[7, 2] = value
    return X


@pytest.mark.parametrize(
    "change, exc, match",
    [
        (lambda X, y: (X[:4], y[:4]), ValueError, "n >= p"),
        (lambda X, y: (_poke(X, np.nan), y), ValueError, "X contains"),
        (lambda X, y: (_poke(X, -np.inf), y), ValueError, "X contains"),
        (lambda X, y: (X, np.where(np.arange(y.size) == 3, np.inf, y)), ValueError, "y contains"),
        (lambda X, y: (X, y[:-1]), ValueError, "y must have shape"),
        (lambda X, y: (X[:, 0], y), ValueError, "X must be 2-D"),
        (lambda X, y: (X[None], y), ValueError, "X must be 2-D"),
        (lambda X, y: (X + 1j, y), TypeError, "X must be real"),
        (lambda X, y: (np.full(X.shape, "a"), y), TypeError, "X must be a numeric"),
        (lambda X, y: (X, y[:, None, None]), ValueError, "y must have shape"),
    ],
)
def test_bad_arrays(change, exc, match):
    X, y = change(*_xy())
    with pytest.raises(exc, match=match):
        rsketch.lstsq(X, y)


def test_nan_in_sparse_and_in_sampling_sketch():
    X, y = _xy()
    Xs = sp.csr_matrix(X)
    Xs.data[5] = np.nan
    with pytest.raises(ValueError, match="X contains"):
        rsketch.lstsq(Xs, y)
    X[3, 1] = np.nan
    with pytest.raises(ValueError, match="X contains"):
        rsketch.lstsq(X, y, sketch="uniform", sketch_size=50)


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        ({"sketch_size": 4}, ValueError, "sketch_size must be >= p"),
        ({"sketch_size": 4, "method": "ihs"}, ValueError, "sketch_size must be >= p"),
        ({"sketch_size": 0, "method": "sketch_and_solve"}, ValueError, "sketch_size"),
        ({"sketch_size": 2.5}, TypeError, "sketch_size must be an integer"),
        ({"method": "qr"}, ValueError, "method must be one of"),
        ({"sketch": "hadamard"}, ValueError, "sketch must be one of"),
        ({"sketch": 3}, TypeError, "sketch must be a kind name"),
        ({"tol": 0.0}, ValueError, "tol must lie in"),
        ({"tol": 2.0}, ValueError, "tol must lie in"),
        ({"tol": "small"}, TypeError, "tol must be a real"),
        ({"max_iter": 0}, ValueError, "max_iter must be >= 1"),
        ({"max_iter": 1.5}, TypeError, "max_iter must be an integer"),
        ({"seed": -1}, ValueError, "seed"),
        ({"seed": "abc"}, TypeError, "seed"),
    ],
)
def test_bad_options(kwargs, exc, match):
    X, y = _xy()
    with pytest.raises(exc, match=match):
        rsketch.lstsq(X, y, **kwargs)


def test_bad_operator():
    X, y = _xy()
    with pytest.raises(ValueError, match="input_dim=100 but X has 200 rows"):
        rsketch.lstsq(X, y, sketch=rsketch.make_sketch("gaussian", 100, 20, seed=0))
    with pytest.raises(ValueError, match="contradicts"):
        rsketch.lstsq(X, y, sketch=rsketch.make_sketch("gaussian", 200, 20, seed=0), sketch_size=30)
    with pytest.raises(ValueError, match="sketch_size must be >= p"):
        rsketch.lstsq(X, y, sketch=rsketch.make_sketch("gaussian", 200, 3, seed=0))
