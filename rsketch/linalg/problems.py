"""Test problems with a known minimiser, from a known SVD (the habit of PARLA's tests).

``make_problem`` returns ``X`` and ``y = X coef + e`` with ``X.T e = 0``, so ``coef`` is the exact
(minimum-norm) minimiser and ``||e||`` the optimal residual, for any condition number.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg
import scipy.sparse as sp

from rsketch._validation import check_int, check_option

KINDS = ("inconsistent", "consistent", "low_rank", "clustered")


@dataclass
class Problem:
    """A least-squares problem with its answer.

    Attributes
    ----------
    X : ndarray or scipy.sparse.csr_matrix of shape (n, p)
    y : ndarray of shape (n,) or (n, k)
    coef : ndarray of shape (p,) or (p, k)
        The minimum-norm minimiser of ``||X coef - y||``.
    residual : ndarray like ``y``
        ``y - X coef`` (orthogonal to ``range(X)``).
    singular_values : ndarray of shape (p,)
        The singular values built in (exact for ``exact=True``; for the fast dense and the sparse
        constructions they are those of the factor, within a few percent of ``X``'s).
    rank : int

    Examples
    --------
    >>> import numpy as np
    >>> from rsketch.linalg.problems import make_problem
    >>> P = make_problem(1000, 10, cond=1e3, seed=0)
    >>> bool(np.allclose(P.X.T @ (P.y - P.X @ P.coef), 0, atol=1e-10))
    True
    """

    X: object
    y: np.ndarray
    coef: np.ndarray
    residual: np.ndarray
    singular_values: np.ndarray
    rank: int


def _spectrum(kind, p, cond, rank):
    if kind == "clustered":
        # Two clusters at 1 and 1/cond (half the values each): CG's best case, and a stress test of
        # rank decisions at large cond.
        s = np.ones(p)
        s[p // 2 :] = 1.0 / cond
        return s
    s = np.logspace(0, -np.log10(cond), p)
    if kind == "low_rank":
        s[rank:] = 0.0
    return s


def _orth_complement(B, g):
    """``g - B (B.T B)^{-1} B.T g`` for well-conditioned ``B``, projected twice ("twice is enough")."""
    G = np.asarray((B.T @ B).todense()) if sp.issparse(B) else B.T @ B
    c = scipy.linalg.cho_factor(G)
    for _ in range(2):
        g = g - B @ scipy.linalg.cho_solve(c, B.T @ g)
    return g


def make_problem(
    n,
    p,
    *,
    cond=1e2,
    kind="inconsistent",
    rank=None,
    residual_size=1e-1,
    n_rhs=None,
    density=None,
    exact=None,
    seed=0,
):
    """Build a least-squares problem with a known minimiser.

    Parameters
    ----------
    n, p : int
        Shape of ``X`` (``n >= p``).
    cond : float >= 1
        Ratio of the largest to the smallest nonzero singular value.
    kind : {"inconsistent", "consistent", "low_rank", "clustered"}
        Log-spaced singular values with a residual of relative size ``residual_size``;
        the same with ``y`` in ``range(X)``; log-spaced with the last ``p - rank`` set to zero;
        two clusters at ``1`` and ``1/cond``.
    rank : int, optional
        For ``"low_rank"`` (default ``p // 2``).
    residual_size : float
        ``||e|| / ||X coef||`` (not for ``"consistent"``).
    n_rhs : int, optional
        ``y`` of shape ``(n, n_rhs)`` instead of ``(n,)``.
    density : float in (0, 1], optional
        Sparse ``X = B diag(s)`` with ``B`` a random CSR matrix of this density (entries
        ``N(0, 1/(n density))``), so that the condition number comes from the column scaling.
    exact : bool, optional
        Dense only. ``True``: ``X = U diag(s) V.T`` with ``U`` from a QR (``O(n p^2)``, exact SVD).
        ``False``: ``X = G diag(s) V.T / sqrt(n)`` with ``G`` Gaussian (singular values within
        ``1 +- sqrt(p/n)`` of ``s``), ``e`` projected with one cached Cholesky of ``G.T G``; the
        cheap construction for benchmarks. Default: exact when ``n <= 20,000``.
    seed : int

    Returns
    -------
    Problem

    Examples
    --------
    >>> import numpy as np
    >>> P = make_problem(500, 10, cond=1e6, seed=0)
    >>> bool(np.linalg.cond(P.X) > 0.99e6), bool(abs(P.X.T @ P.residual).max() < 1e-13)
    (True, True)
    """
    n = check_int(n, "n", minimum=1)
    p = check_int(p, "p", minimum=1, maximum=n)
    check_option(kind, "kind", KINDS)
    if not cond >= 1:
        raise ValueError(f"cond must be >= 1, got {cond!r}")
    if rank is None:
        rank = p // 2 if kind == "low_rank" else p
    rank = check_int(rank, "rank", minimum=1, maximum=p)
    rng = np.random.default_rng(seed)
    s = _spectrum(kind, p, cond, rank)
    k = 1 if n_rhs is None else check_int(n_rhs, "n_rhs", minimum=1)
    if density is not None:
        B = sp.random(n, p, density=density, format="csr", random_state=rng, data_rvs=rng.standard_normal)
        B = B * (1.0 / np.sqrt(n * density))
        X = (B @ sp.diags(s)).tocsr()
        basis = B
        V = np.eye(p)
    else:
        if exact is None:
            exact = n <= 20_000
        V = np.linalg.qr(rng.standard_normal((p, p)))[0]
        G = rng.standard_normal((n, p))
        if exact:
            U = np.linalg.qr(G)[0]
            X = (U * s) @ V.T
            basis = U
        else:
            G /= np.sqrt(n)
            X = (G * s) @ V.T
            basis = G
    nz = s > 0
    # Minimum-norm coefficient: in the row space, i.e. V[:, nz] @ c.
    c = rng.standard_normal((int(nz.sum()), k))
    coef = V[:, nz] @ c
    coef /= np.linalg.norm(coef, axis=0)
    Xc = np.asarray(X @ coef)
    if kind == "consistent":
        e = np.zeros((n, k))
    else:
        g = rng.standard_normal((n, k))
        # range(X) is spanned by the columns of the factor whose singular value is nonzero.
        basis = basis[:, nz]
        e = _orth_complement(basis, g)
        e *= residual_size * np.linalg.norm(Xc, axis=0) / np.linalg.norm(e, axis=0)
    y = Xc + e
    if n_rhs is None:
        y, coef, e = y[:, 0], coef[:, 0], e[:, 0]
    return Problem(X=X, y=y, coef=coef, residual=e, singular_values=s, rank=int(nz.sum()))


def stability_problem(n, p, *, kappa, residual_norm, n_rhs=None, seed=0):
    """The stability test family of Epperly, Meier & Nakatsukasa (2024) and Meier et al. (2023).

    ``X = U diag(s) V.T`` with ``s`` log-spaced from 1 to ``1 / kappa`` (so ``||X|| = 1`` and
    ``cond(X) = kappa``), a unit solution ``coef`` and ``y = X coef + r`` with ``r`` orthogonal to
    ``range(U)`` and ``||r|| = residual_norm``. ``X`` and ``y`` are rounded when stored, so ``coef`` is
    the minimiser of the exact data; for the stored data it is off by about
    ``kappa^2 u residual_norm`` (compare forward errors against a solver's, not against ``coef``).

    Parameters
    ----------
    n, p : int
        Shape of ``X`` (``n > p``).
    kappa : float >= 1
    residual_norm : float >= 0
    n_rhs : int, optional
        ``y`` of shape ``(n, n_rhs)``.
    seed : int

    Returns
    -------
    Problem

    Examples
    --------
    >>> import numpy as np
    >>> P = stability_problem(500, 10, kappa=1e8, residual_norm=1e-3, seed=0)
    >>> round(float(np.linalg.cond(P.X)) / 1e8, 3), round(float(np.linalg.norm(P.residual)), 6)
    (1.0, 0.001)
    """
    n = check_int(n, "n", minimum=2)
    p = check_int(p, "p", minimum=1, maximum=n - 1)
    k = 1 if n_rhs is None else check_int(n_rhs, "n_rhs", minimum=1)
    if not kappa >= 1:
        raise ValueError(f"kappa must be >= 1, got {kappa!r}")
    if not residual_norm >= 0:
        raise ValueError(f"residual_norm must be >= 0, got {residual_norm!r}")
    rng = np.random.default_rng(seed)
    Q = np.linalg.qr(rng.standard_normal((n, min(n, p + k))))[0]
    V = np.linalg.qr(rng.standard_normal((p, p)))[0]
    s = np.logspace(0, -np.log10(kappa), p)
    X = (Q[:, :p] * s) @ V.T
    coef = rng.standard_normal((p, k))
    coef /= np.linalg.norm(coef, axis=0)
    e = Q[:, p : p + k] * residual_norm  # orthonormal columns beyond range(X)
    y = X @ coef + e
    if n_rhs is None:
        y, coef, e = y[:, 0], coef[:, 0], e[:, 0]
    return Problem(X=X, y=y, coef=coef, residual=e, singular_values=s, rank=p)
