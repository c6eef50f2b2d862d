"""Tests of rsketch.efficiency: closed form against brute force and noise simulation, exact limits,
Gaussian (Wishart) expectations, rank-deficient draws, determinism and input checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

import rsketch
from rsketch import _validation
from rsketch.experiments.designs import leverage_scores, make_design
from rsketch.stats import _efficiency
from rsketch.stats._efficiency import bca_interval

FAMILIES = ["gaussian", "srht", "countsketch", "sparse_sign", "leverage", "uniform"]


def _options(kind, X):
    # Leverage sampling gets its scores explicitly so a test can rebuild each draw's operator.
    return {"scores": leverage_scores(X)} if kind == "leverage" else {}


def _problem(n, p, seed, design="gaussian"):
    rng = np.random.default_rng(seed)
    X = make_design(design, n, p, seed=rng)
    y = X @ rng.standard_normal(p) + rng.standard_normal(n)
    return X, y


def _paired_z(a, b):
    d = np.asarray(a) - np.asarray(b)
    return abs(d.mean()) / (d.std(ddof=1) / math.sqrt(d.size))


@pytest.mark.parametrize("kind", FAMILIES)
def test_closed_form_matches_brute_force_per_draw(kind):
    """Each draw's PE, RE and WC equal their definitions computed with dense n x n matrices."""
    n, p, r, k, seed = 40, 4, 16, 6, 11
    X, y = _problem(n, p, 0)
    opts = _options(kind, X)
    res = rsketch.efficiency(X, sketch=kind, sketch_size=r, y=y, n_sketches=k, seed=seed, **opts)
    U = np.linalg.svd(X, full_matrices=False)[0]
    children = np.random.SeedSequence(seed).spawn(k)
    for i in range(k):
        S = rsketch.make_sketch(kind, n, r, seed=children[i], **opts).to_dense()
        SU = S @ U
        if np.linalg.matrix_rank(SU) < p:
            assert res.rank_deficient[i]
            continue
        M = np.linalg.solve(SU.T @ SU, SU.T @ S)  # p x n
        pe = np.sum(M**2) / p  # E||U M eps||^2 / (sigma^2 p)
        re = np.sum((np.eye(n) - U @ M) ** 2) / (n - p)  # E||(I - U M) eps||^2 / (sigma^2 (n - p))
        beta_s = np.linalg.lstsq(S @ X, S @ y, rcond=None)[0]
        beta_o = np.linalg.lstsq(X, y, rcond=None)[0]
        wc = np.sum((y - X @ beta_s) ** 2) / np.sum((y - X @ beta_o) ** 2)
        assert res.pe_draws[i] == pytest.approx(pe, rel=1e-9)
        assert res.re_draws[i] == pytest.approx(re, rel=1e-9)
        assert res.wc_draws[i] == pytest.approx(wc, rel=1e-9)
        # The identity C_RE = 1 + p (C_PE - 1) / (n - p), checked on the independent brute-force values.
        assert re == pytest.approx(1 + p * (pe - 1) / (n - p), rel=1e-11)
        assert pe >= 1 - 1e-12  # M U = I forces ||M||_F^2 >= p
    good = ~res.rank_deficient
    np.testing.assert_allclose(res.re_draws[good], 1 + p * (res.pe_draws[good] - 1) / (n - p), rtol=1e-13)


@pytest.mark.parametrize("kind", FAMILIES)
def test_closed_form_agrees_with_noise_simulation(kind):
    n, p, r = 300, 5, 40
    X, y = _problem(n, p, 1, design="t3")
    opts = _options(kind, X)
    common = dict(sketch=kind, sketch_size=r, y=y, n_sketches=30, seed=5, **opts)
    closed = rsketch.efficiency(X, **common)
    sim = rsketch.efficiency(
        X, method="simulate", n_noise=200, sigma=2.5, beta=np.arange(p, dtype=float), **common
    )
    assert closed.n_rank_deficient == sim.n_rank_deficient == 0
    # Same sketches, so the means differ by noise-simulation error only: inside each other's interval ...
    assert sim.pe_ci[0] <= closed.pe <= sim.pe_ci[1]
    assert sim.re_ci[0] <= closed.re <= sim.re_ci[1]
    assert closed.pe_ci[0] <= sim.pe <= closed.pe_ci[1]
    # ... and, sharper, per draw: the paired differences have mean zero (|z| < 4).
    assert _paired_z(sim.pe_draws, closed.pe_draws) < 4
    assert _paired_z(sim.re_draws, closed.re_draws) < 4
    # The noise simulation error per draw is small: PE relative error ~ sqrt(2 / (p n_noise)) ~ 0.045.
    assert np.max(np.abs(sim.pe_draws / closed.pe_draws - 1)) < 0.25
    # WC involves no noise: both methods compute the same number.
    np.testing.assert_allclose(sim.wc_draws, closed.wc_draws, rtol=1e-8)


@pytest.mark.parametrize(
    ("kind", "n", "opts"),
    [
        ("uniform", 50, {"replace": False}),
        ("srht", 64, {}),
        ("srdct", 60, {}),
    ],
)
def test_isometric_sketch_at_r_equals_n_is_exactly_efficient(kind, n, opts):
    """S^T S = I (every row kept once, or an SRHT keeping all rows of its transform): PE = RE = WC = 1."""
    X, y = _problem(n, 5, 2)
    res = rsketch.efficiency(X, sketch=kind, sketch_size=n, y=y, n_sketches=5, seed=0, **opts)
    np.testing.assert_allclose(res.pe_draws, 1.0, atol=1e-12)
    np.testing.assert_allclose(res.re_draws, 1.0, atol=1e-12)
    np.testing.assert_allclose(res.wc_draws, 1.0, atol=1e-12)
    assert res.pe_ci[1] - res.pe_ci[0] < 1e-12


def test_gaussian_means_match_inverse_wishart_moments():
    """For Gaussian S: E[C_PE] = 1 + (n-p)/(r-p-1), E[C_RE] = E[C_WC] = 1 + p/(r-p-1) (any fixed y)."""
    n, p, r, k = 300, 6, 30, 400
    X, y = _problem(n, p, 3)
    res = rsketch.efficiency(X, sketch="gaussian", sketch_size=r, y=y, n_sketches=k, seed=7)
    e_pe, e_re = 1 + (n - p) / (r - p - 1), 1 + p / (r - p - 1)
    for draws, expected in ((res.pe_draws, e_pe), (res.re_draws, e_re), (res.wc_draws, e_re)):
        se = draws.std(ddof=1) / math.sqrt(k)
        assert abs(draws.mean() - expected) < 4 * se, (draws.mean(), expected, se)
    b = rsketch.bounds("gaussian", n=n, p=p, r=r)
    assert b.select("pe", "expectation")[0].value == pytest.approx(e_pe)


def test_gaussian_means_are_infinite_up_to_r_equals_p_plus_one():
    """E[C] is infinite for a Gaussian S with r <= p + 1 (the inverse Wishart's mean): every draw has
    full rank, and the sample mean grew with the draws (88, 218, 1340 for 100, 1,000, 10,000 at
    p = 2, r = 3) behind a 95 % interval that never held the truth. The medians stay finite."""
    X, y = _problem(40, 2, 11)
    for r in (2, 3):
        res = rsketch.efficiency(X, sketch="gaussian", sketch_size=r, y=y, n_sketches=50, seed=1)
        assert res.n_rank_deficient == 0
        assert res.pe == res.re == res.wc == math.inf and res.pe_ci == res.wc_ci == (math.inf, math.inf)
        assert math.isfinite(res.pe_median) and math.isfinite(res.mean_given_full_rank("pe"))
        assert "infinite for r <= p + 1 = 3" in str(res)
    res = rsketch.efficiency(X, sketch="gaussian", sketch_size=4, y=y, n_sketches=50, seed=1)
    assert math.isfinite(res.pe) and math.isfinite(res.pe_ci[1])
    # the discrete sketches take finitely many values: their means stay finite at r = p + 1
    assert math.isfinite(rsketch.efficiency(X, sketch="srht", sketch_size=3, n_sketches=20, seed=1).pe)


def test_gaussian_at_r_equals_n_tends_to_two_not_one():
    """A Gaussian sketch with r = n is not an isometry: E[C_PE] = 1 + (n-p)/(n-p-1), about 2."""
    n, p, k = 60, 4, 300
    X, _ = _problem(n, p, 4)
    res = rsketch.efficiency(X, sketch="gaussian", sketch_size=n, n_sketches=k, seed=8)
    expected = 1 + (n - p) / (n - p - 1)
    se = res.pe_draws.std(ddof=1) / math.sqrt(k)
    assert abs(res.pe - expected) < 4 * se
    assert res.pe_ci[0] > 1.5


@pytest.mark.parametrize(("kind", "opts"), [("uniform", {"replace": True}), ("countsketch", {})])
def test_other_families_at_r_equals_n_stay_above_one(kind, opts):
    """Sampling with replacement and CountSketch at r = n keep their own limit above 1 (collisions,
    repeated rows): their mean PE exceeds 1 clearly and is at least the derived lower bound."""
    n, p = 200, 5
    X, _ = _problem(n, p, 5)
    res = rsketch.efficiency(X, sketch=kind, sketch_size=n, n_sketches=60, seed=9, **opts)
    assert res.pe_ci[0] > 1.2
    lower = rsketch.bounds(kind, n=n, p=p, r=n, leverage=leverage_scores(X), **opts).pe_lower
    assert res.pe_ci[1] >= lower.value > 1


def test_rank_deficient_draws_are_reported_and_count_as_failures():
    # a rank-deficient draw is a failed sketch: the means are +inf (they were NaN, or the mean of
    # the full-rank draws alone, which hid the failures); mean_given_full_rank is that old mean
    n, p = 120, 6
    X, y = _problem(n, p, 6)
    res = rsketch.efficiency(X, sketch="gaussian", sketch_size=p - 1, y=y, n_sketches=4, seed=0)
    assert res.n_rank_deficient == 4 and res.rank_deficient.all()
    assert res.pe == res.wc == math.inf and np.isnan(res.pe_draws).all()
    # A direction carried by one row only: uniform sampling misses it whenever it misses that row.
    X2 = X.copy()
    X2[:, -1] = 0.0
    X2[17, -1] = 1.0
    k, r = 40, 30
    res = rsketch.efficiency(X2, sketch="uniform", sketch_size=r, n_sketches=k, seed=3)
    children = np.random.SeedSequence(3).spawn(k)
    missed = np.array([17 not in rsketch.make_sketch("uniform", n, r, seed=c).indices() for c in children])
    assert 0 < missed.sum() < k
    np.testing.assert_array_equal(res.rank_deficient, missed)
    assert res.pe == math.inf
    assert res.mean_given_full_rank("pe") == pytest.approx(np.nanmean(res.pe_draws))
    assert res.draws("pe").size == k - missed.sum()


def test_same_seed_same_result_and_progress_bar(capsys):
    X, y = _problem(100, 3, 7)
    a = rsketch.efficiency(X, sketch="sparse_sign", sketch_size=20, y=y, n_sketches=5, seed=42)
    b = rsketch.efficiency(X, sketch="sparse_sign", sketch_size=20, y=y, n_sketches=5, seed=42, progress=True)
    c = rsketch.efficiency(X, sketch="sparse_sign", sketch_size=20, y=y, n_sketches=5, seed=43)
    np.testing.assert_array_equal(a.pe_draws, b.pe_draws)
    np.testing.assert_array_equal(a.wc_draws, b.wc_draws)
    assert a.pe_ci == b.pe_ci
    assert not np.array_equal(a.pe_draws, c.pe_draws)
    assert "efficiency[sparse_sign" in capsys.readouterr().err
    assert "PE: mean" in str(a) and a.n_sketches == 5


@pytest.mark.parametrize("kind", ["countsketch", "uniform", "gaussian"])
def test_draws_in_phase_blocks_equal_draws_one_by_one(monkeypatch, kind):
    # Closed-form draws run in phases (all products, all SVDs, all adjoints) over blocks of draws;
    # blocks of 1, of 3 (the last one short) and one block give the same numbers, rank-deficient
    # draws included (uniform sampling that misses the one row carrying a direction).
    from rsketch.stats import _efficiency

    X, y = _problem(120, 6, 8)
    X[:, -1] = 0.0
    X[17, -1] = 1.0
    runs = []
    for block_bytes, block in ((1, 1), (8 * 30 * 13 * 3, 3), (2**30, 10)):
        monkeypatch.setattr(_efficiency, "_PHASE_BYTES", block_bytes)
        assert min(_efficiency._phase_block(30, 6), 10) == block  # r = 30, p = 6: 8 r (2 p + 1) bytes a draw
        runs.append(rsketch.efficiency(X, sketch=kind, sketch_size=30, y=y, n_sketches=10, seed=5))
    if kind == "uniform":
        assert 0 < runs[0].n_rank_deficient < 10
    for other in runs[1:]:
        np.testing.assert_array_equal(other.pe_draws, runs[0].pe_draws)
        np.testing.assert_array_equal(other.wc_draws, runs[0].wc_draws)
        np.testing.assert_array_equal(other.rank_deficient, runs[0].rank_deficient)


def test_leverage_sampling_beats_uniform_on_heavy_tailed_design():
    """On t_1 rows (a few rows carry most of the leverage) uniform sampling loses them; leverage does not."""
    X = make_design("t1", 1000, 10, seed=0)
    uni = rsketch.efficiency(X, sketch="uniform", sketch_size=100, n_sketches=60, seed=1)
    lev = rsketch.efficiency(X, sketch="leverage", sketch_size=100, n_sketches=60, seed=1)
    assert lev.pe_ci[1] < uni.pe_ci[0] / 10
    assert lev.re_ci[1] < uni.re_ci[0]
    assert lev.pe_median < uni.pe_median / 10


def test_bca_interval_edge_cases():
    assert bca_interval([3.0, 3.0, 3.0]) == (3.0, 3.0)
    assert all(math.isnan(v) for v in bca_interval([1.0]))
    x = np.random.default_rng(0).lognormal(sigma=1.0, size=400)
    lo, hi = bca_interval(x, rng=1)
    assert lo < x.mean() < hi
    assert hi - x.mean() > x.mean() - lo  # right-skewed data: a longer upper arm


@pytest.mark.parametrize(
    ("kwargs", "exc", "word"),
    [
        ({"sketch_size": 0}, ValueError, "sketch_size"),
        ({"sketch_size": 2.5}, TypeError, "sketch_size"),
        ({"sketch": "hadamard"}, ValueError, "sketch"),
        ({"sigma": 0.0, "method": "simulate"}, ValueError, "sigma"),
        ({"sigma": -1.0}, ValueError, "sigma"),
        ({"beta": np.ones(4)}, ValueError, "beta"),
        ({"y": np.ones(49)}, ValueError, "y"),
        ({"n_sketches": 0}, ValueError, "n_sketches"),
        ({"n_noise": 1, "method": "simulate"}, ValueError, "n_noise"),
        ({"method": "exact"}, ValueError, "method"),
        ({"seed": -1}, ValueError, "seed"),
        ({"seed": "abc"}, TypeError, "seed"),
        ({"nnz_per_column": 2}, TypeError, "nnz_per_column"),
        ({"sketch": "srht", "sketch_size": 60}, ValueError, "sketch_size"),
    ],
)
def test_bad_inputs_raise_clear_errors(kwargs, exc, word):
    X, _ = _problem(50, 3, 8)
    args = {"sketch": "gaussian", "sketch_size": 10, "n_sketches": 2, "seed": 0, **kwargs}
    with pytest.raises(exc, match=word):
        rsketch.efficiency(X, **args)


def test_bad_designs_and_responses():
    X, _ = _problem(50, 3, 9)
    with pytest.raises(ValueError, match="full column rank"):
        rsketch.efficiency(np.column_stack([X, X[:, 0]]), sketch="gaussian", sketch_size=10)
    with pytest.raises(ValueError, match="more rows"):
        rsketch.efficiency(X[:3], sketch="gaussian", sketch_size=10)
    with pytest.raises(ValueError, match="column space"):
        rsketch.efficiency(X, sketch="gaussian", sketch_size=10, y=X @ np.ones(3))
    with pytest.raises(ValueError, match="NaN"):
        rsketch.efficiency(np.where(X > 1, np.nan, X), sketch="gaussian", sketch_size=10)
    res = rsketch.efficiency(X, sketch="gaussian", sketch_size=10, n_sketches=3, seed=0)
    with pytest.raises(ValueError, match="needs y"):
        res.draws("wc")
    with pytest.raises(ValueError, match="q must"):
        res.quantile("pe", 1.5)


@pytest.mark.parametrize("method", ["closed_form", "simulate"])
def test_worst_case_does_not_depend_on_the_scale_of_y(method):
    # C_WC is scale-free; its sums of squares overflowed at |y| ~ 1e155 (a false "column space"
    # error) and lost digits to subnormals at 1e-160.
    X, y = _problem(300, 5, 11)
    args = {"sketch": "gaussian", "sketch_size": 50, "n_sketches": 4, "seed": 0, "method": method}
    if method == "simulate":
        args["n_noise"] = 20
    base = rsketch.efficiency(X, y=y, **args).wc_draws
    for scale in (1e-300, 1e-170, 1e-160, 1e-20, 1e20, 1e155, 1e300):
        wc = rsketch.efficiency(X, y=y * scale, **args).wc_draws
        np.testing.assert_allclose(wc, base, rtol=1e-12, err_msg=f"scale {scale:g}")


def test_too_many_sketches_fail_before_any_draw(monkeypatch):
    # n_sketches=10**12 spawned seeds for hours before a bare MemoryError.
    X, _ = _problem(50, 3, 12)
    monkeypatch.setattr(_validation, "available_memory", lambda: 16 * 2**30)
    monkeypatch.setattr(_efficiency, "orthonormal_basis", lambda X: pytest.fail("went on to the draws"))
    with pytest.raises(MemoryError, match="n_sketches"):
        rsketch.efficiency(X, sketch="gaussian", sketch_size=10, n_sketches=10**12, seed=0)
