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
