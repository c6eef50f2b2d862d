"""Fixes from a probe of rsketch.bounds, rsketch.efficiency and rsketch.qr_pivoted: finite bounds where
none can hold, quantiles and means that left rank-deficient draws out, a rank check that depended on
the scale of X's columns, and a CQRRPT rank that depended on the sketch size."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

import rsketch
from rsketch.stats._bounds import PAPER, PAPER_SHAPE

KINDS = ["gaussian", "srht", "srdct", "countsketch", "sparse_sign", "leverage", "uniform"]


# --------------------------------------------------------------------------------------------- bounds
@pytest.mark.parametrize("kind", KINDS)
def test_no_finite_upper_bound_below_p_rows(kind):
    # r < p: S X has rank at most r < p on every draw, so no draw has a unique sketched fit and no
    # finite upper bound holds with any probability. The Gaussian form read 1022 at r = 9.
    n, p = 200, 10
    ell = np.full(n, p / n)
    for r in (1, p - 1):
        b = rsketch.bounds(kind, n=n, p=p, r=r, leverage=ell)
        uppers = [u for u in b.all if u.side == "upper"]
        assert uppers and all(math.isnan(u.value) for u in uppers), [(u.formula, u.value) for u in uppers]


def _first_finite(kind, n, p):
    b = [rsketch.bounds(kind, n=n, p=p, r=r) for r in range(1, 4 * p + 8)]
    return next(x.r for x in b if x.pe_upper.valid)


@pytest.mark.parametrize("kind", ["gaussian", "srht"])
def test_paper_forms_apply_from_p_log_p_rows_and_not_below_p_plus_two(kind):
    # The paper's forms rest on a subspace embedding, "r of order p log p": they apply from
    # r >= max(p + 2, p ln p). At r = p = 10 the Gaussian form read 924 (the sketched problem is square:
    # E[C_PE] is infinite up to r = p + 1, and for p = 200, r = 202 the median C_PE is above the form).
    for n, p in ((200, 10), (1000, 50), (300, 1), (300, 3)):
        r0 = max(p + 2, math.ceil(p * math.log(p)))
        assert _first_finite(kind, n, p) == r0
        for r in (p, r0 - 1, r0):
            paper = [u for u in rsketch.bounds(kind, n=n, p=p, r=r).all if u.source == PAPER]
            assert paper and all(u.valid == (r >= r0) for u in paper)
            assert all("p ln p" in u.condition for u in paper)


@pytest.mark.parametrize("kind", ["gaussian", "srht"])
@pytest.mark.parametrize("p", [1, 2, 4, 6])
def test_paper_forms_hold_at_the_first_size_they_apply(kind, p):
    # At the smallest r where the forms are now finite, the measured 90 % quantile lies below them
    # (at r = p = 1 the Gaussian's is about 63 (n - 1), above 44 (1 + n)).
    n = 256
    X = np.random.default_rng(p).standard_normal((n, p))
    r = max(p + 2, math.ceil(p * math.log(p)))
    res = rsketch.efficiency(X, sketch=kind, sketch_size=r, n_sketches=200, seed=p)
    b = rsketch.bounds(kind, n=n, p=p, r=r)
    assert res.n_rank_deficient == 0
    for u in (b.pe_upper, b.re_upper):
        assert u.valid and res.quantile(u.measure, 0.9) <= u.value, (u, res.quantile(u.measure, 0.9))


def test_leverage_shape_applies_from_p_log_p_rows():
    n, p = 200, 10
    ell = np.full(n, p / n)
    for r, finite in ((p, False), (23, False), (24, True)):
        shapes = [
            u for u in rsketch.bounds("leverage", n=n, p=p, r=r, leverage=ell).all if u.source == PAPER_SHAPE
        ]
        assert shapes and all(u.valid == finite for u in shapes)


# --------------------------------------------------------------------------------------------- efficiency
def _one_row_direction(n=120, p=6, seed=6):
    """A design whose last direction lives on row 17 only: uniform sampling misses it when it misses
    that row, and the draw is rank-deficient."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, p))
    X[:, -1] = 0.0
    X[17, -1] = 1.0
    y = X @ np.ones(p) + rng.standard_normal(n)
    return X, y


def test_quantiles_and_means_count_rank_deficient_draws_as_failures():
    X, y = _one_row_direction()
    res = rsketch.efficiency(X, sketch="uniform", sketch_size=120, y=y, n_sketches=40, seed=3)
    bad = res.rank_deficient
    k, m = res.n_sketches, int(bad.sum())
    assert 0 < m < k / 2
    for measure in ("pe", "re", "wc"):
        values = getattr(res, f"{measure}_draws")
        good = np.sort(values[~bad])
        # A (1 - delta)-quantile counts a failed draw as +inf: above the success fraction it is +inf.
        for q in (0.0, 0.25, 0.5, (k - m - 1) / (k - 1), 0.9, 1.0):
            h = q * (k - 1)  # the position among all draws, failures last
            expected = np.inf if h > k - m - 1 else float(np.quantile(good, min(1.0, h / (k - m - 1))))
            assert res.quantile(measure, q) == pytest.approx(expected, rel=1e-12), (measure, q)
        assert res.quantile(measure, 0.9) == np.inf
        # The mean over all draws is infinite (a failure has positive probability); the mean over the
        # full-rank draws is available by name, and the median counts the failures too.
        assert getattr(res, measure) == np.inf and getattr(res, f"{measure}_ci") == (np.inf, np.inf)
        assert res.mean_given_full_rank(measure) == pytest.approx(good.mean(), rel=1e-12)
        assert getattr(res, f"{measure}_median") == pytest.approx(res.quantile(measure, 0.5), rel=1e-12)
    text = str(res)
    assert "rank-deficient" in text and "inf" in text and "full-rank" in text


def test_quantile_with_most_draws_deficient_is_infinite_not_the_survivors():
    # 9 of 10 draws deficient: the 0.9-quantile read the one surviving draw's value (13.1).
    X, _ = _one_row_direction()
    res = rsketch.efficiency(X, sketch="uniform", sketch_size=12, n_sketches=10, seed=2)
    assert res.n_rank_deficient == 9
    assert res.quantile("pe", 0.9) == np.inf and res.pe_median == np.inf and res.pe == np.inf


def test_all_deficient_draws_give_infinite_summaries_not_nan():
    X, _ = _one_row_direction()
    res = rsketch.efficiency(X, sketch="gaussian", sketch_size=5, n_sketches=4, seed=0)  # r < p
    assert res.rank_deficient.all()
    assert res.pe == res.re == res.pe_median == res.quantile("pe", 0.0) == np.inf
    assert math.isnan(res.mean_given_full_rank("pe"))


def test_full_rank_results_are_unchanged_by_the_failure_rule():
    X = np.random.default_rng(0).standard_normal((300, 5))
    res = rsketch.efficiency(X, sketch="countsketch", sketch_size=60, n_sketches=25, seed=0)
    assert res.n_rank_deficient == 0
    assert res.pe == res.draws("pe").mean() == res.mean_given_full_rank("pe")
    assert res.pe_median == np.median(res.pe_draws)
    assert res.quantile("pe", 0.9) == np.quantile(res.pe_draws, 0.9)
    with pytest.raises(ValueError, match="measure"):
        res.mean_given_full_rank("xx")


@pytest.mark.parametrize("method", ["closed_form", "simulate"])
@pytest.mark.parametrize("kind", ["gaussian", "countsketch", "leverage"])
def test_efficiency_depends_on_range_of_x_not_the_scale_of_its_columns(kind, method):
    # X of full column rank scaled by columns has the same range, hence the same measures; the rank
    # check on X's singular values refused X * logspace(-150, 150) as "rank 1".
    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 10))
    y = X @ np.ones(10) + rng.standard_normal(200)
    args = dict(sketch=kind, sketch_size=50, y=y, n_sketches=6, seed=1, method=method)
    if method == "simulate":
        args["n_noise"] = 30
    X[:, 3] = np.round(8 * X[:, 3])  # integers: times 2**-1065 they are subnormal, and exact
    base = rsketch.efficiency(X, **args)
    subnormal = np.ones(10)
    subnormal[3] = 2.0**-1065
    scales = (
        np.logspace(-150, 150, 10),
        np.array([1e-300, 1, 1e300, 1e-200, 3, 1e250, 1e-5, 1e5, 2.0**-1000, 1e307]),
        subnormal,
    )
    for scale in scales:
        res = rsketch.efficiency(X * scale, **args)
        assert res.n_rank_deficient == 0
        for m in ("pe", "re", "wc"):
            rtol = 1e-9 if method == "closed_form" else 1e-7
            np.testing.assert_allclose(getattr(res, f"{m}_draws"), getattr(base, f"{m}_draws"), rtol=rtol)


def test_a_rank_deficient_x_is_still_refused_whatever_its_column_scales():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((100, 4))
    X[:, 3] = X[:, 0] + X[:, 1]  # exactly dependent
    for scale in (np.ones(4), np.array([1e-100, 1, 1e100, 1e-50])):
        with pytest.raises(ValueError, match="X must have full column rank.*rank 3 < p = 4"):
            rsketch.efficiency(X * scale, sketch="gaussian", sketch_size=20, n_sketches=2, seed=0)
    Z = rng.standard_normal((100, 3))
    Z[:, 1] = 0.0
    with pytest.raises(ValueError, match="rank 2 < p = 3"):
        rsketch.efficiency(Z, sketch="gaussian", sketch_size=20, n_sketches=2, seed=0)


# --------------------------------------------------------------------------------------------- CQRRPT
def _two_level(m=2000, n=30, k=10, small=1e-14, seed=0):
    rng = np.random.default_rng(seed)
    U, _ = np.linalg.qr(rng.standard_normal((m, n)))
    V, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return (U * np.array([1.0] * k + [small] * (n - k))) @ V.T


def test_qr_pivoted_rank_is_the_problems_not_the_sketchs():
    # Singular values [1] * 10 + [1e-14] * 20: the default sketch gave rank 18 and sketch_size=200
    # rank 10, as the threshold was max(d, n) eps with d the sketch size. NumPy's matrix_rank says 10.
    A = _two_level()
    assert np.linalg.matrix_rank(A) == 10
    for sketch in ("sparse_sign", "gaussian", "countsketch"):
        for size in (None, 30, 60, 200, 1000):
            res = rsketch.qr_pivoted(A, sketch=sketch, sketch_size=size, seed=0)
            assert res.rank == 10, (sketch, size, res.rank)
            # A truncated result's error is the part it dropped: of the order of the tolerance.
            err = np.linalg.norm(A[:, res.perm] - res.Q @ res.R, 2)
            assert err <= 10 * max(A.shape) * np.finfo(float).eps * np.linalg.norm(A, 2)
            assert np.linalg.norm(res.Q.T @ res.Q - np.eye(10), 2) <= 1e-13


def test_qr_pivoted_rank_matches_its_own_householder_path():
    # The direct path (d >= m: geqp3 of A itself) already used max(m, n) eps; the sketch now agrees.
    A = _two_level(m=50, n=30, k=10, small=1e-16)
    direct = rsketch.qr_pivoted(A, seed=0)  # m < 2n: the default sketch is no smaller than A
    sketched = rsketch.qr_pivoted(A, sketch_size=40, seed=0)
    assert direct.rank == sketched.rank == np.linalg.matrix_rank(A) == 10
    # Above the tolerance the small singular values count, whatever the sketch size.
    B = _two_level(small=1e-11)
    for size in (None, 60, 200):
        assert rsketch.qr_pivoted(B, sketch_size=size, seed=0).rank == 30 == np.linalg.matrix_rank(B)


def test_efficiency_checks_a_sparse_x_before_densifying_it_and_its_progress_flag():
    # a wide sparse X had been densified before being refused as wide, a tall one before its memory
    # was checked (NumPy's bare "Unable to allocate 37.3 GiB"); progress="no" had shown the bar
    tall = sp.csr_matrix((np.ones(50), (np.arange(50) * 1000, np.arange(50))), shape=(10**8, 50))
    with pytest.raises(MemoryError, match=r"efficiency's dense copy of the sparse X \(100,000,000 x 50\)"):
        rsketch.efficiency(tall, sketch="countsketch", sketch_size=100, n_sketches=2, seed=0)
    wide = sp.random(50, 10**6, density=1e-5, format="csr", random_state=0)
    with pytest.raises(ValueError, match=r"X must have more rows than columns .* got shape \(50, 1000000\)"):
        rsketch.efficiency(wide, sketch="countsketch", sketch_size=100, n_sketches=2, seed=0)
    X = np.random.default_rng(0).standard_normal((500, 5))
    with pytest.raises(TypeError, match="progress must be True or False"):
        rsketch.efficiency(X, sketch="countsketch", sketch_size=100, n_sketches=2, seed=0, progress="no")
    dense = rsketch.efficiency(X, sketch="countsketch", sketch_size=100, n_sketches=2, seed=0)
    sparse = rsketch.efficiency(sp.csr_matrix(X), sketch="countsketch", sketch_size=100, n_sketches=2, seed=0)
    assert sparse.pe == dense.pe and sparse.re == dense.re


def test_efficiency_offers_only_the_options_it_can_take():
    # leverage's scores "method" was listed as allowed, but efficiency's own method takes the name
    X = np.random.default_rng(0).standard_normal((500, 5))
    with pytest.raises(
        TypeError, match=r"unknown option\(s\) \['bogus'\] .* allowed: \['dtype', 'scores', 'uniform_mix'\]$"
    ):
        rsketch.efficiency(X, sketch="leverage", sketch_size=100, n_sketches=2, seed=0, bogus=1)


def test_efficiency_refuses_a_masked_x():
    # np.asarray dropped the mask: the hidden row of 1e6 was read as data (pe 6.5 for the clean 7.7),
    # where y, beta and every other entry point refuse masked entries.
    X = np.random.default_rng(0).standard_normal((200, 3))
    masked = np.ma.masked_array(X.copy(), mask=np.zeros_like(X, bool))
    masked.data[0] = [1e6, -1e6, 1e6]
    masked.mask[0] = True
    with pytest.raises(TypeError, match="X is a masked array with masked entries"):
        rsketch.efficiency(masked, sketch="leverage", sketch_size=30, n_sketches=2, seed=0)
    kw = dict(sketch="leverage", sketch_size=30, n_sketches=2, seed=0)
    same = rsketch.efficiency(np.ma.masked_array(X), **kw)  # nothing masked: the plain array's result
    np.testing.assert_array_equal(same.draws("pe"), rsketch.efficiency(X, **kw).draws("pe"))


def test_efficiency_without_progress_starts_no_thread():
    # tqdm(disable=True) still started tqdm's monitor thread, left for the life of the process.
    code = (
        "import threading, numpy as np, rsketch\n"
        "X = np.random.default_rng(0).standard_normal((200, 3))\n"
        "rsketch.efficiency(X, sketch='gaussian', sketch_size=30, n_sketches=3, seed=0)\n"
        "print(sorted(t.name for t in threading.enumerate()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['MainThread']"
