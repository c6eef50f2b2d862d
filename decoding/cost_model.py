"""The draft budget: a measured cost per forward against tokens per forward, and the rule that uses it.

On a GPU a forward of 1 or 64 tokens costs about the same (the weights are read once either way),
which is why speculative decoding pays. On a CPU the matrix products become compute-bound after
a few tokens, so verifying many drafts for many samples can cost more than the tokens it saves.
:class:`CostModel` measures seconds per target forward for ``T`` packed tokens once per machine
and model shape (cached as JSON), and :class:`DraftBudget` chooses, each step, how many draft
tokens to verify so that the expected rate (tokens per second) is the best available, and never
below the autoregressive rate the same cost model predicts: at worst it drafts nothing.

The rule (see :meth:`DraftBudget.allocate`): sample ``i`` accepts each next draft token with an
estimated probability ``alpha_i`` (a running estimate of its own acceptance), so its ``j``-th draft
token adds ``alpha_i ** j`` expected tokens. Sorting all candidate draft tokens by that value and
taking the best ``N`` (prefixes of each draft, so the least promising tails go first), the budget
picks the ``N`` that finishes the batch soonest by the cost model (:meth:`DraftBudget.finish_time`;
or, as an option, the ``N`` with the most tokens per second in this step). ``N = 0`` is exactly the
autoregressive step.

The estimates learn from every step, drafted or not: when the budget trims a cheap drafter's
proposal, the loop checks the trimmed tokens, one a step, against the tokens the target chooses
there (*shadow checks*, free), so a sample whose drafts would pay is found even where the prior
alone would never let it draft.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import math
import numbers
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import kernels
from ._threads import blas_threads, engine_threads
from ._xp import to_host

__all__ = ["CostModel", "DraftBudget", "DriftCheck", "cost_cache_dir", "weight_format", "engine_version"]

_log = logging.getLogger("decoding")

#: Bumped whenever the engine's cost per forward changes shape (a new kernel, a new routing), so
#: that cost models measured on the old engine are not reused.
#: 8: quantized weights (passes of eight tokens), points at 9 and 17; 9: float32 block scales,
#: vectorized exp and SwiGLU (a decode step at batch 1 about 15% faster, at batch 8 about 12%);
#: 10: int8 products (VNNI), the fused attention heads, a float16 KV cache and prefetched weight
#: blocks (batch 8 about 2x faster than version 9).
COST_MODEL_VERSION = 10

#: The quick measurement (:meth:`CostModel.measure` with ``quick=True``): what the first speculative
#: call and every re-measurement run, a few seconds on SmolLM2-135M. The grid has points at 9 and
#: 17: the quantized products take passes of up to eight tokens, so the cost steps up by one pass
#: after 8 and 16 tokens, which interpolating from 8 to 16 would miss.
QUICK = dict(  # the order measure() unpacks
    grid=(1, 2, 4, 8, 9, 16, 17, 32, 64), context=32, repeats=3, sequences=8
)

_announced: set = set()  # cache files whose measurement was announced in this process
_remeasured: set = set()  # cache files re-measured after a drift in this process


# DraftBudget.allocate's makespan search evaluates the candidate allocations in blocks of this
# many [candidates, samples] entries (about 8 float64 temporaries each: a few MB at most)
_ALLOCATE_ELEMENTS = 1 << 16

#: The most steps the budget's back-off skips (:meth:`DraftBudget.record_decision`).
MAX_SKIP = 64

#: The seconds a cost model may give a forward: a nanosecond to eleven days. A curve of subnormal
#: seconds (``1e-320``) had been accepted and then made the back-off's quotient infinite, an
#: ``OverflowError`` part-way through a generation.
MIN_SECONDS, MAX_SECONDS = 1e-9, 1e6


def cost_cache_dir() -> Path:
    """``$DECODING_CACHE_DIR`` or ``~/.cache/decoding``: where measured cost models are kept.

    Examples
    --------
    >>> isinstance(cost_cache_dir(), Path)
    True
    """
    return Path(os.environ.get("DECODING_CACHE_DIR", Path.home() / ".cache" / "decoding"))


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def engine_version() -> str:
    """The installed package's version and :data:`COST_MODEL_VERSION`: what a cached cost model
    must have been measured with.

    Examples
    --------
    >>> engine_version().startswith("rsketch ")
    True
    """
    try:
        from importlib.metadata import version

        v = version("rsketch")
    except Exception:  # not installed (a source checkout on the path): the cost-model version decides
        v = "unknown"
    return f"rsketch {v}, cost model {COST_MODEL_VERSION}"


def weight_format(model) -> str:
    """How ``model`` holds its weights: its ``weight_format`` string where it has one (quantized
    engines), else its dtype.

    Examples
    --------
    >>> class M: dtype = np.dtype("float32")
    >>> weight_format(M())
    'float32'
    """
    fmt = getattr(model, "weight_format", None)
    return str(fmt) if fmt is not None else str(np.dtype(getattr(model, "dtype", "float32")))


@dataclass(frozen=True)
class CostModel:
    """Seconds of one forward as a function of its packed tokens (and of its sequences).

    ``cost(T, B) = interp(T) + (B - 1) * per_sequence``, with ``interp`` the piecewise-linear
    interpolation of the measured ``seconds`` at ``tokens`` (made non-decreasing; linear
    extrapolation beyond the last point) and ``per_sequence`` the measured extra cost of each
    further sequence in a forward (attention and bookkeeping per sequence).

    Examples
    --------
    >>> cm = CostModel(tokens=(1, 8, 64), seconds=(0.01, 0.012, 0.05))
    >>> round(cm.cost(4), 5), round(cm.cost(128), 5)
    (0.01086, 0.09343)
    """

    tokens: tuple
    seconds: tuple
    per_sequence: float = 0.0

    def __post_init__(self):
        for name in ("tokens", "seconds"):  # numbers: a float() of "0.01" would pass silently
            kind = np.asarray(getattr(self, name)).dtype.kind
            if kind not in "iuf":
                raise TypeError(f"{name} must be a sequence of numbers, got {getattr(self, name)!r}")
        t = np.asarray(self.tokens, dtype=float)
        s = np.asarray(self.seconds, dtype=float)
        if (
            t.ndim != 1 or t.size < 2 or t.size != s.size or not np.isfinite(t).all()
            or (np.diff(t) <= 0).any() or t[0] < 1
        ):  # fmt: skip
            raise ValueError("tokens must be >= 2 increasing counts from 1 up, with one seconds value each")
        if not ((s >= MIN_SECONDS) & (s <= MAX_SECONDS)).all():  # False for NaN too
            raise ValueError(
                f"seconds must lie in [{MIN_SECONDS:g}, {MAX_SECONDS:g}] (a forward's time), got {s.tolist()}"
            )
        # a NaN or infinite cost per sequence made every later prediction NaN (a draft budget then
        # failed mid-generation), a negative one made more sequences cheaper
        ps = self.per_sequence
        if isinstance(ps, (bool, np.bool_)) or not isinstance(ps, numbers.Real):
            raise TypeError(f"per_sequence must be a number of seconds, got {type(ps).__name__} {ps!r}")
        if not 0 <= ps <= MAX_SECONDS:
            raise ValueError(f"per_sequence must lie in [0, {MAX_SECONDS:g}] seconds, got {ps}")
        object.__setattr__(self, "tokens", tuple(float(x) for x in t))
        object.__setattr__(self, "seconds", tuple(float(x) for x in np.maximum.accumulate(s)))
        object.__setattr__(self, "per_sequence", float(ps))

    def cost(self, n_tokens, n_seqs=1):
        """Predicted seconds of a forward of ``n_tokens`` packed tokens in ``n_seqs`` sequences.

        Both are numbers or arrays of numbers, finite and >= 0 (``ValueError`` otherwise: the
        curve is clamped below its first point, so ``-1`` tokens would cost as much as one).
        """
        if type(n_tokens) in (int, float) and type(n_seqs) in (int, float):
            return self._scalar_cost(n_tokens, n_seqs)  # the allocation's tens of calls a step
        for name, a in (("n_tokens", n_tokens), ("n_seqs", n_seqs)):  # O(size), as the prediction
            a = np.asarray(a)
            if a.dtype.kind not in "iuf":
                raise TypeError(f"{name} must be a number or an array of numbers, got {a.dtype}")
            ok = (a >= 0) & (a < np.inf)  # False for NaN too
            if not ok.all():
                raise ValueError(f"{name} must be finite and >= 0, got {a[~ok].flat[0]}")
        t = np.asarray(self.tokens)
        s = np.asarray(self.seconds)
        n = np.asarray(n_tokens, dtype=float)
        slope = (s[-1] - s[-2]) / (t[-1] - t[-2])
        out = np.where(n <= t[-1], np.interp(n, t, s), s[-1] + slope * (n - t[-1]))
        out = out + np.maximum(np.asarray(n_seqs, dtype=float) - 1, 0) * self.per_sequence
        return float(out) if out.ndim == 0 else out

    def _scalar_cost(self, n_tokens, n_seqs) -> float:
        """:meth:`cost` of two Python numbers in Python (the arrays' checks and ``np.interp`` cost
        14 us a call, a millisecond a step of the draft model's allocation), the same arithmetic."""
        for name, a in (("n_tokens", n_tokens), ("n_seqs", n_seqs)):
            if not 0 <= a < math.inf:  # False for NaN too
                raise ValueError(f"{name} must be finite and >= 0, got {a}")
        t, s, n = self.tokens, self.seconds, float(n_tokens)
        if n > t[-1]:
            out = s[-1] + (s[-1] - s[-2]) / (t[-1] - t[-2]) * (n - t[-1])
        elif n <= t[0]:
            out = s[0]
        else:
            j = bisect.bisect_right(t, n) - 1
            out = s[j] if n == t[j] else (s[j + 1] - s[j]) / (t[j + 1] - t[j]) * (n - t[j]) + s[j]
        return out + max(float(n_seqs) - 1, 0.0) * self.per_sequence

    # -- measurement ------------------------------------------------------------------------------
    @classmethod
    def measure(
        cls, model, *, grid=(1, 2, 4, 8, 9, 16, 17, 32, 64, 128), context=128, repeats=7, sequences=16,
        quick: bool = False,
    ) -> CostModel:  # fmt: skip
        """Time ``model.forward`` (logits for every token) for each token count in ``grid``.

        One sequence holding ``context`` tokens receives ``T`` new ones (then rolled back); the
        median of ``repeats`` rounds (each timing every point once) is kept. ``per_sequence``:
        (forward of ``sequences`` sequences of one token) minus (one sequence of as many tokens),
        over ``sequences - 1``. ``quick=True`` uses :data:`QUICK` (tokens up to 64, context 32,
        three rounds, 8 sequences, a warm-up of the largest cases only) instead.
        """
        if quick:
            grid, context, repeats, sequences = QUICK.values()
        V = model.config.vocab_size
        rng = np.random.default_rng(0)
        nseq = int(sequences)
        with blas_threads(), engine_threads() as threads:  # the threads the loops would use
            cache = model.new_cache(max_seqs=nseq, capacity=context + max(*grid, nseq) + 1)
            seqs = np.array([cache.allocate() for _ in range(nseq)])
            prompt = rng.integers(0, V, size=context)
            model.forward(
                np.tile(prompt, nseq),
                cache=cache,
                seq_ids=seqs,
                cu_seqlens=np.arange(nseq + 1) * context,
                logits=None,
            )

            def once(tokens, ids, cu):
                t0 = time.perf_counter()
                # to the host, as the loops take every forward's logits: on a GPU the forward is
                # asynchronous, and the clock alone would have read its launches
                to_host(model.forward(tokens, cache=cache, seq_ids=ids, cu_seqlens=cu, logits="all"))
                dt = time.perf_counter() - t0
                for s in ids:
                    cache.truncate(int(s), context)
                return dt

            # Every point in each round, rounds repeated: drift on a shared machine then moves the
            # whole curve, not single points (the budget's decisions depend on the curve's shape).
            cases = [(rng.integers(0, V, size=T), seqs[:1], np.array([0, T])) for T in grid]
            cases.append((rng.integers(0, V, size=nseq), seqs[:1], np.array([0, nseq])))
            cases.append((rng.integers(0, V, size=nseq), seqs, np.arange(nseq + 1)))
            # warm-up (compilation, first touch of the cache regions): the largest cases touch it all
            for c in cases[-3:] if quick else cases:
                once(*c)
            times = np.array([[once(*c) for c in cases] for _ in range(repeats) if threads.update()])
            med = np.median(times, axis=0)
            secs, one_seq, many = list(med[: len(grid)]), med[-2], med[-1]
        per_seq = max(0.0, (many - one_seq) / (nseq - 1))
        return cls(tuple(grid), tuple(secs), per_seq)

    def scaled(self, factor: float) -> CostModel:
        """The same curve times ``factor`` (what the live steps say the machine runs at now), kept
        within ``[MIN_SECONDS, MAX_SECONDS]``.

        Examples
        --------
        >>> CostModel((1, 2), (0.01, 0.02)).scaled(2.0).seconds
        (0.02, 0.04)
        """
        seconds = np.clip(factor * np.asarray(self.seconds), MIN_SECONDS, MAX_SECONDS)
        return CostModel(self.tokens, tuple(seconds.tolist()), min(factor * self.per_sequence, MAX_SECONDS))

    @staticmethod
    def cache_path(model, cache_dir=None) -> Path:
        """The cache file of ``model``'s cost model on this machine (:meth:`for_model`).

        The key: :func:`engine_version` (the package and :data:`COST_MODEL_VERSION`), the
        product routing (:data:`decoding.kernels.FEW_ROWS`), CPU model, logical CPUs, BLAS thread
        setting, the model's shape (layers, width, heads, vocabulary), :func:`weight_format`, the
        bytes of the weights as held (``model.nbytes``) and the KV cache's dtype.
        The file also records them in plain text.
        """
        return Path(cache_dir or cost_cache_dir()) / f"cost-{_key_hash(_key(model))}.json"

    @classmethod
    def for_model(cls, model, *, refresh: bool = False, cache_dir=None, quick: bool = True) -> CostModel:
        """The cached cost model of ``model`` on this machine, measured when absent (or ``refresh``).

        The first measurement is announced once per process (a ``logging`` warning on the
        ``"decoding"`` logger, which Python prints to stderr when logging is not configured),
        with where it is stored (:meth:`cache_path`). ``quick`` (the default) measures with
        :data:`QUICK`: about 1 s on SmolLM2-135M on an otherwise idle machine (0.8 s, 2026-12-07).
        """
        key = _key(model)
        path = cls.cache_path(model, cache_dir)
        if not refresh and path.is_file():
            try:
                d = json.loads(path.read_text())
                # the constructor refuses a NaN, infinite or negative value (json reads NaN)
                return cls(tuple(d["tokens"]), tuple(d["seconds"]), d["per_sequence"])
            except (ValueError, KeyError, TypeError, OSError):
                pass  # a damaged (or unreadable) cache file is measured again
        if str(path) not in _announced:
            _announced.add(str(path))
            _log.warning(
                "decoding: %s the cost per forward for the draft budget (%s, a few seconds); stored in %s",
                "re-measuring" if refresh else "measuring",
                "quick" if quick else "full",
                path,
            )
        cm = cls.measure(model, quick=quick)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            d = {
                "key": key,
                "engine_version": engine_version(),
                "weight_format": weight_format(model),
                "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "tokens": cm.tokens,
                "seconds": cm.seconds,
                "per_sequence": cm.per_sequence,
            }
            path.write_text(json.dumps(d))
        except OSError:
            pass  # an unwritable cache directory only costs a new measurement next time
        return cm

    @classmethod
    def remeasured(cls, model, *, cache_dir=None) -> CostModel:
        """Re-measured (and re-cached) the first time per process and cache file; the cached one after.

        What the speculative loop calls when live forwards drift from the curve: once re-measured,
        a drift that persists comes from the work (longer contexts than the measurement's, say),
        not from the machine, and measuring again every call would only cost time.
        """
        path = str(cls.cache_path(model, cache_dir))
        refresh = path not in _remeasured
        _remeasured.add(path)
        return cls.for_model(model, refresh=refresh, cache_dir=cache_dir)


def _key(model) -> str:
    cfg = model.config
    return json.dumps(
        [
            engine_version(),
            kernels.FEW_ROWS,
            _cpu_name(),
            os.cpu_count(),
            os.environ.get("DECODING_BLAS_THREADS", "default"),
            model.n_layers,
            cfg.d_model,
            cfg.n_heads,
            cfg.n_kv_heads,
            cfg.d_ff,
            cfg.vocab_size,
            weight_format(model),
            getattr(model, "nbytes", None),  # the weights as held: differs for any other format
            str(getattr(model, "kv_dtype", None)),  # a float16 cache's attention reads half the bytes
            str(getattr(model, "device", None)),  # a GPU's forward costs nothing like the CPU's
        ]
    )


def _key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:16]


class DriftCheck:
    """Compares live forward timings with a :class:`CostModel` and says when they drifted.

    Each :meth:`observe` adds the ratio of a forward's measured seconds to the model's
    prediction; once ``window`` ratios are in, their median (one slow step, a page fault or a
    neighbour's burst, moves it not at all) outside ``[1 / (1 + tolerance), 1 + tolerance]`` is a
    drift, and the ratios are cleared (the next verdict comes from ``window`` new steps).

    Parameters
    ----------
    cost : CostModel
    window : int
        Steps per verdict.
    tolerance : float
        Relative drift allowed (0.3: 30%).

    Examples
    --------
    >>> check = DriftCheck(CostModel((1, 2), (0.01, 0.02)), window=3)
    >>> [check.observe(1, 1, 0.02) for _ in range(3)]  # twice as slow as measured
    [False, False, True]
    >>> round(check.last_ratio, 2)
    2.0
    """

    def __init__(self, cost: CostModel, *, window: int = 16, tolerance: float = 0.3):
        if window < 1 or not tolerance > 0:
            raise ValueError(f"window must be >= 1 and tolerance > 0, got {window} and {tolerance}")
        self.cost, self.window, self.tolerance = cost, int(window), float(tolerance)
        self.ratios: list[float] = []
        self.last_ratio = float("nan")
        self.last_predicted = 0.0  # the model's seconds for the latest forward observed
        self._predicted: dict = {}  # (tokens, seqs) -> seconds: a step's sizes repeat

    def observe(self, tokens: int, seqs: int, seconds: float) -> bool:
        """Add one forward of ``tokens`` packed tokens in ``seqs`` sequences that took ``seconds``."""
        predicted = self._predicted.get((tokens, seqs))
        if predicted is None:
            predicted = self._predicted[tokens, seqs] = self.cost.cost(tokens, seqs)
        self.last_predicted = predicted
        if not (seconds > 0 and predicted > 0):
            return False
        self.ratios.append(seconds / predicted)
        if len(self.ratios) < self.window:
            return False
        self.last_ratio = float(np.median(self.ratios))
        self.ratios.clear()
        return not 1 / (1 + self.tolerance) <= self.last_ratio <= 1 + self.tolerance


class DraftBudget:
    """Caps the draft tokens verified per step using a :class:`CostModel` (see the module docstring).

    Parameters
    ----------
    target_cost : CostModel
        Cost of a target forward.
    draft_cost : CostModel, optional
        Cost of a draft-model forward (for drafters that run a model); drafting is otherwise free.
    prior : float
        Acceptance probability assumed before a sample has any history (pseudo-counts: 2).
    objective : {"makespan", "rate"}
        What :meth:`allocate` minimises or maximises when the loop passes each sample's
        remaining tokens: the predicted time to finish the batch (static batches, as
        :func:`decoding.generate` runs them) or this step's tokens per second (right where
        finished samples are replaced at once).
    remeasure : callable, optional
        ``remeasure() -> CostModel``, called when the live forwards drift from ``target_cost``
        by more than 30% (:meth:`observe`, :class:`DriftCheck`); at most once per budget; a
        drift that persists after it, or a re-measurement that returns the curve in use, scales
        the curve by the live median ratio instead. Without it, every drift scales the curve.
    margin : float, default 0.05
        Drafting must be predicted faster than the autoregressive step by this fraction, or the
        step drafts nothing: the cost model's own error on a shared machine is several percent,
        and a gain inside it is as likely a loss (the autoregressive step is then exactly what
        autoregressive decoding does, so "never slower than autoregressive" holds where the
        prediction is uncertain).
    ask_share : float, default 0.005
        From the second cut in a row on, the back-off skips enough steps that the asks it cuts
        (the drafter's proposal and the allocation, then no draft) cost at most this share of the
        forwards' time (:meth:`record_decision`); 0 leaves the back-off to its doubling alone.

    Attributes
    ----------
    remeasured, rescaled : int
        How often the target's cost model was re-measured, and rescaled, over the budget's life
        (a call's ``stats`` report its own counts).
    step_overhead : float
        Seconds a step that verifies drafts costs beyond its forward, over a step that drafts
        nothing (the loop's bookkeeping of acceptance, the verification, the cache rollback),
        learnt from live steps (:meth:`observe_step`) and charged to every drafting step by
        :meth:`allocate`. The cost model times forwards only; where a forward is cheap (a fast
        engine, a small batch), this fixed cost decides whether drafting pays.

    Notes
    -----
    One budget may serve many :func:`decoding.generate` calls, one at a time (a second call
    given it while the first runs gets a ``RuntimeError``, as a :class:`~decoding.drafters.Drafter`
    object does). What it learns about the machine carries over from call to call: the target's
    cost curve (re-measured at most once per budget, or rescaled), the drift check's live
    ratios and :attr:`step_overhead`. What belongs to a call is reset when the next one begins
    (:meth:`begin`): the back-off (SmolLM2-135M on a repetitive prompt, a curve 1000x too fast:
    the first of three calls drafted 5 tokens and ended with 53 steps to skip, and the next two
    drafted none; now 17 and 16) and the live forwards' mean cost (of that call's batch).

    Examples
    --------
    A flat cost (GPU-like) verifies every draft; a steep one (compute-bound) verifies none:

    >>> flat = DraftBudget(CostModel((1, 64), (0.010, 0.011)))
    >>> flat.allocate(np.array([0.8, 0.8]), np.array([7, 7])).tolist()
    [7, 7]
    >>> steep = DraftBudget(CostModel((1, 64), (0.010, 0.640)))
    >>> steep.allocate(np.array([0.8, 0.8]), np.array([7, 7])).tolist()
    [0, 0]
    """

    def __init__(
        self,
        target_cost: CostModel,
        draft_cost: CostModel | None = None,
        prior: float = 0.5,
        objective: str = "makespan",
        remeasure=None,
        margin: float = 0.05,
        ask_share: float = 0.005,
    ):
        # checked here, not at the first step that uses them (a string failed mid-generation)
        if not isinstance(target_cost, CostModel):
            raise TypeError(f"target_cost must be a CostModel, got {type(target_cost).__name__}")
        if draft_cost is not None and not isinstance(draft_cost, CostModel):
            raise TypeError(f"draft_cost must be a CostModel or None, got {type(draft_cost).__name__}")
        if remeasure is not None and not callable(remeasure):
            raise TypeError(f"remeasure must be callable or None, got {type(remeasure).__name__}")
        for name, v in (("prior", prior), ("margin", margin), ("ask_share", ask_share)):
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
                raise TypeError(f"{name} must be a number, got {type(v).__name__} {v!r}")
        if not 0.0 < prior < 1.0:
            raise ValueError(f"prior must be in (0, 1), got {prior}")
        if objective not in ("makespan", "rate"):
            raise ValueError(f"objective must be 'makespan' or 'rate', got {objective!r}")
        self.target_cost, self.draft_cost, self.prior = target_cost, draft_cost, float(prior)
        self.objective = objective
        if not 0.0 <= margin < 1.0:
            raise ValueError(f"margin must be in [0, 1), got {margin}")
        self.margin = float(margin)
        if not 0.0 <= ask_share < 1.0:
            raise ValueError(f"ask_share must be in [0, 1), got {ask_share}")
        self.ask_share = float(ask_share)
        self.remeasure, self.remeasured, self.rescaled = remeasure, 0, 0
        self.drift = DriftCheck(target_cost)
        self.step_overhead = 0.0
        self._outside = {True: None, False: None}  # mean seconds outside the forward, by drafted
        self.begin()

    def begin(self) -> None:
        """Start a ``generate`` call: reset what belongs to one call (the back-off and the live
        forwards' mean cost), keep what was learnt about the machine (see the Notes).

        Examples
        --------
        >>> b = DraftBudget(CostModel((1, 2), (0.01, 0.02)))
        >>> for _ in range(3):
        ...     b.record_decision(False)
        >>> b.begin()
        >>> b.should_propose()
        True
        """
        self._quiet = 0  # consecutive steps whose drafts the budget cut to nothing
        self._skip = 0  # steps left that do not ask the drafter at all
        self._idle = 0  # consecutive asks where the drafter had no draft for any sample
        self._forward = None  # exponential mean of the cost model's seconds for the live forwards

    def should_propose(self) -> bool:
        """Whether the loop should ask the drafter this step (see :meth:`record_decision`).

        Examples
        --------
        >>> b = DraftBudget(CostModel((1, 2), (0.01, 0.02)))
        >>> for drafted in (False, False, False):
        ...     b.record_decision(drafted)
        >>> [b.should_propose() for _ in range(5)]
        [False, False, False, False, True]
        """
        if self._skip > 0:
            self._skip -= 1
            return False
        return True

    def record_decision(self, drafted: bool, seconds: float = 0.0) -> None:
        """After the budget cut a step's drafts to nothing ``k`` times in a row, the next
        ``min(2 ** (k - 1), 16)`` steps skip the drafter and the budget: they are autoregressive
        steps with no speculative overhead. One step with drafts resets the count.

        From the second cut in a row on, the skip is also long enough that such asks cost at most
        ``ask_share`` (0.5%) of the time: ``seconds`` is what this ask cost (the proposal and
        the allocation: 0.6-0.8 ms at batch 4 to 16 on this CPU, 4-12% of a forward), set against
        the mean cost of the live forwards by the cost model (:meth:`observe`: the currency of
        the allocation, re-measured or rescaled when the forwards drift), up to :data:`MAX_SKIP`
        steps. The first cut skips one step only: it may come from the prior alone, before the
        shadow checks of its trimmed drafts have shown how well they would do.

        Examples
        --------
        >>> b = DraftBudget(CostModel((1, 2), (0.01, 0.02)))
        >>> b.observe(1, 1, 0.01)  # a forward of 10 ms, as the model says
        >>> b.record_decision(False, seconds=0.0004); b._skip  # the first cut
        1
        >>> b.record_decision(False, seconds=0.0004); b._skip  # 0.4 ms <= 0.5% of 8 forwards
        8
        """
        self._idle = 0  # the drafter had a draft
        if drafted:
            self._quiet = self._skip = 0
            return
        self._quiet += 1
        self._skip = min(2 ** (self._quiet - 1), 16)
        if self._quiet >= 2:
            self._skip = max(self._skip, self._share_skip(seconds))

    def record_nothing_proposed(self, seconds: float = 0.0) -> None:
        """The drafter had no draft for any sample this step: the next step does not ask it.

        Gentler than a cut (:meth:`record_decision`): a drafter that finds nothing now (LLMA
        before the answer reaches its reference) may find a draft two steps on, and a sample
        that starts copying late should not wait 8 or 16 steps for its first draft (of 32
        tokens, in the benchmarks). Asking every other step halves the cost of a drafter that
        never finds anything (its matching is 0.1 ms a step at batch 1, 1-2% of a step). From
        the second such step in a row on, the skip is also long enough that these asks
        (``seconds`` each: 0.3-0.7 ms for LLMA at batch 16, 2-5% of a forward) cost at most
        ``ask_share`` of the forwards' time, as for cuts.

        Examples
        --------
        >>> b = DraftBudget(CostModel((1, 2), (0.01, 0.02)))
        >>> b.record_nothing_proposed()
        >>> [b.should_propose() for _ in range(3)]
        [False, True, True]
        """
        self._idle += 1
        self._skip = max(self._skip, 1)
        if self._idle >= 2:
            self._skip = max(self._skip, self._share_skip(seconds))

    def _share_skip(self, seconds: float) -> int:
        """Steps to skip so that an ask of ``seconds`` costs at most ``ask_share`` of the forwards."""
        if self.ask_share <= 0 or seconds <= 0 or self._forward is None:
            return 0
        allowed = self.ask_share * self._forward
        steps = seconds / allowed if allowed > 0 else math.inf
        return math.ceil(steps) if steps < MAX_SKIP else MAX_SKIP

    def sample_joined(self) -> None:
        """A new sample joined the batch (continuous batching): the next step asks the drafter.

        The steps the back-off still skips were set by the samples then running; a newcomer
        (another prompt, perhaps one that quotes its reference) is asked for at once. The count
        of cut steps stays: cuts follow from the cost curve more than from the prompt, and with
        many slots a sample joins every few steps.

        Examples
        --------
        >>> b = DraftBudget(CostModel((1, 2), (0.01, 0.02)))
        >>> for _ in range(5):
        ...     b.record_decision(False)
        >>> b.sample_joined()
        >>> b.should_propose()
        True
        """
        self._skip = 0

    def observe_step(self, drafted: bool, seconds_outside_forward: float) -> None:
        """A live step's time outside its target forward: updates :attr:`step_overhead`.

        Means are exponential (weight 0.2 to the newest step), one for steps that verified drafts
        and one for steps that drafted nothing; their difference is the overhead. Before any step
        without drafts, the whole time of a drafting step outside its forward counts (the budget
        then drafts less, meets a step without drafts, and learns the difference).

        Examples
        --------
        >>> b = DraftBudget(CostModel((1, 2), (0.01, 0.02)))
        >>> b.observe_step(True, 0.002); b.step_overhead
        0.002
        >>> b.observe_step(False, 0.0005); round(b.step_overhead, 6)
        0.0015
        """
        prev = self._outside[bool(drafted)]
        x = float(seconds_outside_forward)
        self._outside[bool(drafted)] = x if prev is None else 0.8 * prev + 0.2 * x
        with_drafts, without = self._outside[True], self._outside[False]
        if with_drafts is not None:
            self.step_overhead = max(0.0, with_drafts - (without or 0.0))

    def observe(self, tokens: int, seqs: int, seconds: float) -> None:
        """A live target forward: re-measure (or rescale) the target's cost model when they drifted.

        Examples
        --------
        >>> b = DraftBudget(CostModel((1, 2), (0.01, 0.02)))
        >>> for _ in range(16):
        ...     b.observe(1, 1, 0.03)
        >>> b.rescaled, round(b.target_cost.cost(1), 3)
        (1, 0.03)
        """
        drifted = self.drift.observe(tokens, seqs, seconds)
        p = self.drift.last_predicted  # in the cost model's seconds, as the allocation weighs them
        self._forward = p if self._forward is None else 0.8 * self._forward + 0.2 * p
        if not drifted:
            return
        fresh = None
        if self.remeasure is not None and not self.remeasured:
            self.remeasured += 1
            fresh = self.remeasure()
            if fresh is not None and not isinstance(fresh, CostModel):  # None: nothing measured
                raise TypeError(f"remeasure() must return a CostModel or None, got {type(fresh).__name__}")
        if fresh is not None and fresh != self.target_cost:
            self.target_cost = fresh
        else:  # no re-measurement, or it gave the curve in use: the live ratio rescales it
            self.rescaled += 1
            self.target_cost = self.target_cost.scaled(self.drift.last_ratio)
        self.drift = DriftCheck(self.target_cost, window=self.drift.window, tolerance=self.drift.tolerance)

    def alphas(self, accepted: np.ndarray, rejected: np.ndarray, pooled: bool = True) -> np.ndarray:
        """Per-sample acceptance estimates from accepted draft tokens and rejection events.

        ``(accepted + 2 g) / (accepted + rejected + 2)``, where ``g`` is the pooled estimate of
        the whole batch (itself shrunk toward ``prior``), or ``prior`` itself when ``pooled`` is
        False: the maximum-likelihood estimate of a geometric acceptance length with two
        pseudo-observations. The counts include the speculative loop's shadow checks of trimmed
        drafts (one token each, censored like a fully accepted draft when it matches).

        The loop pools for the rate objective (a newcomer under continuous batching starts at the
        task's rate) and not for the makespan objective: there the sample that sets the end of a
        static batch is often the one with no history (a model that rewrites its reference, whose
        drafter rarely finds a draft), and the batch's rate, learnt from the samples that copy,
        made the budget verify drafts for all of them and leave it decoding alone at the end.

        Examples
        --------
        >>> b = DraftBudget(CostModel((1, 2), (0.01, 0.02)))
        >>> b.alphas(np.array([9.0, 0.0]), np.zeros(2)).round(2).tolist()
        [0.98, 0.91]
        >>> b.alphas(np.array([9.0, 0.0]), np.zeros(2), pooled=False).round(2).tolist()
        [0.91, 0.5]
        """
        a = np.asarray(accepted, dtype=float)
        r = np.asarray(rejected, dtype=float)
        g = (a.sum() + 2 * self.prior) / (a.sum() + r.sum() + 2) if pooled else self.prior
        return np.clip((a + 2 * g) / (a + r + 2), 1e-6, 1 - 1e-6)

    def finishes_batch(self, remaining) -> bool:
        """Whether :meth:`allocate` minimises the time to finish the batch (the makespan objective)
        given ``remaining``, rather than maximising this step's rate.

        Examples
        --------
        >>> b = DraftBudget(CostModel((1, 2), (0.01, 0.02)))
        >>> b.finishes_batch(np.array([5, 9])), b.finishes_batch(None)
        (True, False)
        """
        return remaining is not None and self.objective == "makespan"

    @staticmethod
    def offer_rates(offered: np.ndarray, asked: np.ndarray) -> np.ndarray:
        """Per-sample probability that the drafter has a draft when asked: ``(offered + 1) / (asked + 2)``.

        Each sample's own counts only (Laplace's rule), not pooled over the batch: in a static
        batch the sample whose drafter finds nothing (a model that rewrites a reference instead of
        copying it) is the one that sets the end, and the batch's rate says nothing about it.

        Examples
        --------
        >>> DraftBudget.offer_rates(np.array([5, 0]), np.array([5, 4])).round(2).tolist()
        [0.86, 0.17]
        """
        return (np.asarray(offered, dtype=float) + 1) / (np.asarray(asked, dtype=float) + 2)

    def finish_time(self, alphas, n, remaining, *, padded=False, first=0.0, steady=0.0, offers=None):
        """Predicted seconds to finish a static batch if each sample keeps draft length ``n``.

        ``n`` is ``[B]`` or ``[M, B]`` (``M`` allocations at once). Sample ``i`` has a draft in a
        step with probability ``offers[i]`` (default 1: every step) and then gains
        ``e_i = 1 + offers[i] * sum_{j <= n_i} alphas[i] ** j`` tokens per step, so it runs
        ``remaining[i] / e_i`` steps of ``1 + offers[i] * n_i`` tokens; while ``k`` samples run, a
        step costs ``cost(their tokens, k)`` (padded: ``k`` times one plus their longest draft).
        ``first``/``steady`` ``[M]``: drafting cost of the first and of each later step while a
        drafting sample runs.

        Examples
        --------
        >>> b = DraftBudget(CostModel((1, 2, 4), (1.0, 1.0, 2.0)))
        >>> float(b.finish_time(np.array([0.5, 0.5]), np.array([0, 0]), np.array([4, 4])))
        4.0
        >>> # 2.67 steps of both (3 tokens: cost 1.5), then 1.33 of the undrafted one alone (cost 1)
        >>> float(b.finish_time(np.array([0.5, 0.5]), np.array([1, 0]), np.array([4, 4])))
        5.333333333333334
        """
        a = np.clip(np.asarray(alphas, dtype=float), 0.0, 1 - 1e-9)
        n = np.atleast_2d(np.asarray(n, dtype=float))
        q = 1.0 if offers is None else np.asarray(offers, dtype=float)
        e = 1 + q * a * (1 - a**n) / (1 - a)  # expected tokens per step
        steps = np.asarray(remaining, dtype=float) / e  # [M, B]
        order = np.argsort(steps, axis=1)
        steps = np.take_along_axis(steps, order, axis=1)
        drafted = n if padded else q * n  # the padded layout pads every step to the longest draft
        width = 1 + np.take_along_axis(drafted, order, axis=1)  # tokens per step of each sample
        B = steps.shape[1]
        running = B - np.arange(B)  # samples still running in segment k (those sorted k..B-1)
        if padded:
            widest = np.maximum.accumulate(width[:, ::-1], axis=1)[:, ::-1]
            tokens = running * widest
        else:
            tokens = np.cumsum(width[:, ::-1], axis=1)[:, ::-1]
        seg = np.diff(steps, axis=1, prepend=0.0)  # how many steps each segment lasts
        total = (seg * self.target_cost.cost(tokens, running)).sum(axis=1)
        drafting_steps = np.where(np.take_along_axis(n, order, axis=1) > 0, steps, 0.0).max(axis=1)
        total = total + np.where(drafting_steps > 0, first + np.maximum(drafting_steps - 1, 0) * steady, 0.0)
        return total if total.size > 1 else total[0]

    def allocate(
        self,
        alphas,
        lengths,
        *,
        padded: bool = False,
        include_draft_cost: bool = False,
        setup=None,
        remaining=None,
        offers=None,
    ):
        """Draft lengths (``<= lengths``) that make this batch fastest, by one of two objectives.

        Candidates are every sample's draft tokens, most promising first (``alphas[i] ** j``);
        the budget keeps the best ``N`` of them (prefixes of each draft), ``N = 0`` being the
        autoregressive step, and picks ``N`` by:

        - **rate** (``objective="rate"``, or ``remaining=None``): the most expected tokens per
          second in this step, ``(B + sum of the N values) / cost``. Right where a finished
          sample's slot is refilled at once (continuous batching): every token is worth the same.
        - **makespan** (the default, with ``remaining`` given): the least predicted time to
          finish the whole batch.
          Each sample keeps this step's draft length to its end: it gains
          ``e_i = 1 + sum_j alphas[i] ** j`` tokens per step, needs ``remaining[i] / e_i`` steps,
          and each step costs ``cost(tokens of the samples still running)``. In a static batch the
          slowest sample sets the end, so tokens that only make a fast sample finish early are
          worth just what its leaving saves (little, where the cost curve is flat): the rate
          objective overvalues them, and drafting then loses to autoregressive decoding.

        Parameters
        ----------
        alphas : float array [B]
            Estimated per-token acceptance probability of each sample.
        lengths : int array [B]
            Draft tokens available (proposed, or the most a drafter could propose).
        padded : bool
            Cost the forward as the padded layout does: ``B * (1 + longest draft)`` tokens.
        include_draft_cost : bool
            Add the draft model's cost: a first forward that feeds each drafting sample's ``setup``
            tokens (what its draft cache lacks of the context: the prompt at the first step, the
            accepted tokens later), then one forward of one token per drafting sample per further
            draft step (per step, for the makespan objective).
        setup : int array [B], optional
            Tokens the drafter must feed before a sample's first draft token (default 1 each).
        remaining : int array [B], optional
            Tokens each sample may still generate (``max_new_tokens`` less those it has); the
            makespan objective needs it (without it, the rate objective is used).
        offers : float array [B], optional
            For the makespan objective: how likely the drafter is to have a draft for each sample
            in a later step (:meth:`offer_rates`; default 1). A sample the drafter rarely finds a
            draft for gains little from later steps and sets the end of the batch, so that
            drafting for the others only makes them wait for it.
        """
        alphas = np.asarray(alphas, dtype=float)
        lengths = np.asarray(lengths, dtype=np.int64)
        B = alphas.size
        if B == 0 or lengths.sum() == 0:
            return np.zeros(B, dtype=np.int64)
        # candidates: (value, sample, j) for j = 1..lengths[i]; values decrease in j within a sample
        samp = np.repeat(np.arange(B), lengths)
        j = np.concatenate([np.arange(1, n + 1) for n in lengths])
        val = alphas[samp] ** j
        order = np.lexsort((j, -val))
        samp, j, val = samp[order], j[order], val[order]
        N = np.arange(samp.size + 1)
        longest = np.concatenate([[0], np.maximum.accumulate(j)])  # longest draft among the first N
        drafting = np.concatenate([[0], np.cumsum(j == 1)])  # samples with a draft among the first N
        first = np.zeros(N.size)  # drafting cost of this step with the first N candidates
        steady = np.zeros(N.size)  # ... and of each later step (the draft caches caught up)
        if include_draft_cost and self.draft_cost is not None:
            setup = np.ones(B, np.int64) if setup is None else np.maximum(np.asarray(setup, np.int64), 1)
            fed = np.concatenate([[0], np.cumsum(np.where(j == 1, setup[samp], 0))])  # first forward
            c = self.draft_cost.cost
            one = np.array([c(max(n, 1), max(n, 1)) for n in drafting])  # a token per drafting sample
            first = np.array([c(max(f, 1), max(d, 1)) for f, d in zip(fed, drafting, strict=True)])
            first = np.where(N > 0, first + np.maximum(longest - 1, 0) * one, 0.0)
            steady = np.where(N > 0, longest * one, 0.0)
        # every step that verifies drafts pays the loop's overhead for it (learnt live)
        first = first + np.where(N > 0, self.step_overhead, 0.0)
        steady = steady + np.where(N > 0, self.step_overhead, 0.0)
        if not self.finishes_batch(remaining):
            gain = B + np.concatenate([[0.0], np.cumsum(val)])  # expected tokens, first N candidates
            tokens = B * (1 + longest) if padded else B + N
            rate = gain / (self.target_cost.cost(tokens, B) + first)
            best = int(np.argmax(rate))
            if rate[best] < (1 + self.margin) * rate[0]:  # a predicted gain within the model's error
                best = 0
        else:
            rem = np.maximum(np.asarray(remaining, dtype=float), 1.0)
            total = np.empty(N.size)
            held = np.zeros(B)  # each sample's draft length with the candidates before the block
            rows = max(1, _ALLOCATE_ELEMENTS // B)  # [rows, B] blocks: memory O(B), not O(B^2 k)
            for lo in range(0, N.size, rows):
                hi = min(lo + rows, N.size)
                n = np.zeros((hi - lo, B))  # row r: each sample's draft length with the first r candidates
                r = np.arange(max(lo, 1), hi)
                n[r - lo, samp[r - 1]] = 1
                n = np.cumsum(n, axis=0) + held
                held = n[-1].copy()
                total[lo:hi] = np.atleast_1d(
                    self.finish_time(
                        alphas, n, rem, padded=padded, first=first[lo:hi], steady=steady[lo:hi], offers=offers
                    )
                )
            best = int(np.argmin(total))
            if total[best] > total[0] / (1 + self.margin):  # a predicted gain within the model's error
                best = 0
        # ties: the fewest draft tokens (argmax/argmin return the first)
        out = np.zeros(B, dtype=np.int64)
        np.add.at(out, samp[:best], 1)
        return out
