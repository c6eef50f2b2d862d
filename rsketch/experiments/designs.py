"""The designs of the simulation studies: Gaussian and multivariate-t rows with AR(1)-type covariance.

Following Ma, Mahoney & Yu (JMLR 2015, "A statistical perspective on algorithmic leveraging"), whose designs
Raskutti & Mahoney's study is believed to reuse (unconfirmed, see ``docs/efficiency.md``): rows
``x_i ~ N(0, Sigma)`` ("gaussian"), or multivariate t with 3 ("t3") or 1 ("t1") degrees of freedom,
``x_i = z_i / sqrt(w_i / nu)`` with ``z_i ~ N(0, Sigma)``, ``w_i ~ chi^2_nu``, and
``Sigma_jk = 2 * 0.5^|j - k|``.
Heavier tails give more non-uniform leverage scores.
"""

from __future__ import annotations

import numpy as np

from rsketch._validation import check_int, check_option
from rsketch.operators.sampling import exact_leverage

DESIGNS = {"gaussian": None, "t3": 3.0, "t1": 1.0}


def make_design(kind: str, n: int, p: int, *, seed=None) -> np.ndarray:
    """An ``n x p`` design with rows drawn from the named distribution.

    Parameters
    ----------
    kind : {"gaussian", "t3", "t1"}
    n, p : int
    seed : None, int, SeedSequence or Generator
        Passed to :func:`numpy.random.default_rng`.

    Examples
    --------
    >>> from rsketch.experiments.designs import make_design
    >>> make_design("t1", 100, 5, seed=0).shape
    (100, 5)
    """
    check_option(kind, "kind", set(DESIGNS))
    n = check_int(n, "n", minimum=1)
    p = check_int(p, "p", minimum=1)
    rng = np.random.default_rng(seed)
    idx = np.arange(p)
    sigma = 2.0 * 0.5 ** np.abs(idx[:, None] - idx[None, :])
    Z = rng.standard_normal((n, p)) @ np.linalg.cholesky(sigma).T
    nu = DESIGNS[kind]
    if nu is None:
        return Z
    w = rng.chisquare(nu, size=n)
    return Z / np.sqrt(w / nu)[:, None]


def leverage_scores(X: np.ndarray) -> np.ndarray:
    """Exact leverage scores: squared row norms of an orthonormal basis of ``range(X)``.

    The basis is the left singular vectors whose singular values exceed ``max(n, p) eps`` times the
    largest (NumPy's ``matrix_rank`` rule), so the scores sum to ``rank(X)``: all of ``U`` gave a
    rank-one ``ones((5, 2))`` the scores ``[1, 0.25, 0.25, 0.25, 0.25]`` where the hat matrix's diagonal
    is ``0.2`` throughout.

    Examples
    --------
    >>> import numpy as np
    >>> from rsketch.experiments.designs import leverage_scores
    >>> round(float(leverage_scores(np.eye(4)[:, :2]).sum()), 6)
    2.0
    >>> leverage_scores(np.ones((5, 2))).round(12).tolist()
    [0.2, 0.2, 0.2, 0.2, 0.2]
    """
    X = np.asarray(X, dtype=np.float64)
    if not X.any():  # no range: every score is 0 (exact_leverage refuses it, as sampling must)
        return np.zeros(X.shape[0])
    return exact_leverage(X)
