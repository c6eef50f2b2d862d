"""The same seed gives the same leverage sample however the operator is built."""

import numpy as np

import rsketch
from rsketch.operators.sampling import exact_leverage


def test_constructor_from_scores_and_from_matrix_sample_the_same_rows():
    A = np.random.default_rng(0).standard_normal((2000, 6))
    scores = exact_leverage(A)
    built = [
        rsketch.LeverageSampling(2000, 50, scores=scores, seed=3),
        rsketch.LeverageSampling.from_scores(scores, 50, seed=3),
        rsketch.LeverageSampling.from_matrix(A, 50, seed=3),
        rsketch.make_sketch("leverage", 2000, 50, seed=3, scores=scores),
        rsketch.make_sketch("leverage", 2000, 50, seed=3, A=A),
    ]
    for S in built[1:]:
        assert S.key == built[0].key
        np.testing.assert_array_equal(S.indices(), built[0].indices())
        np.testing.assert_array_equal(S @ A, built[0] @ A)


def test_a_generator_seed_is_drawn_from_once():
    A = np.random.default_rng(1).standard_normal((500, 3))
    g1, g2 = np.random.default_rng(7), np.random.default_rng(7)
    S = rsketch.LeverageSampling.from_matrix(A, 40, method="approx", seed=g1)
    g2.integers(0, 2**32, size=2, dtype=np.uint64)  # one key's draw
    assert g1.integers(0, 2**62) == g2.integers(0, 2**62)
    assert S.seed is g1
