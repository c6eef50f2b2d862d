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

    Examples
    --------
    >>> import numpy as np
    >>> from rsketch.experiments.designs import leverage_scores
    >>> round(float(leverage_scores(np.eye(4)[:, :2]).sum()), 6)
    2.0
    """
    U, _, _ = np.linalg.svd(np.asarray(X, dtype=np.float64), full_matrices=False)
    return np.einsum("ij,ij->i", U, U)
