"""Conventions a scikit-learn user relies on beyond check_estimator."""

import warnings

import numpy as np
import pytest
import sklearn.exceptions
from sklearn.linear_model import LinearRegression

import rsketch


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    return rng.standard_normal((500, 5)), rng.standard_normal(500)


def test_convergence_warning_is_scikit_learns(data):
    # scikit-learn's filter did not catch ours: it subclassed UserWarning only
    X, y = data
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", category=sklearn.exceptions.ConvergenceWarning)
        rsketch.SketchedLinearRegression(method="sketch_and_solve", sketch_size=3, random_state=0).fit(X, y)
    with pytest.warns(sklearn.exceptions.ConvergenceWarning):
        rsketch.SketchedLinearRegression(method="sketch_and_solve", sketch_size=3, random_state=0).fit(X, y)


@pytest.mark.parametrize("Model", [rsketch.SketchedLinearRegression, rsketch.SketchedRidge])
def test_scalar_intercept_is_a_numpy_float(Model, data):
    # a Python float had no .shape or .item(), as LinearRegression's np.float64 has
    X, y = data
    ours, ref = Model(random_state=0).fit(X, y).intercept_, LinearRegression().fit(X, y).intercept_
    assert type(ours) is type(ref) is np.float64
