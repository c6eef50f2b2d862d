"""Multi-sample speculative decoding: EMS-SD (unpadded) and the padded "vanilla" baseline.

Each step, a drafter proposes for every active sample a draft of 0..k tokens (lengths differ);
the target model verifies every draft in **one** forward; each sample accepts its longest
matching prefix plus one token from the target, independently of the others; rejected tokens are
rolled back; finished samples leave the batch while the others go on.

Two layouts of the same forward (Ni et al., NAACL 2025, "EMS-SD"):

- ``"ems"`` -- *unpad KV cache*: every sample keeps its own cache start and length, and after
  verification its length advances by its own accepted count (a rollback is
  :meth:`KVCache.truncate`, O(1)); *unpad input tokens*: the inputs of all samples (last
  accepted token plus that sample's drafts) are concatenated into one packed sequence with
  per-sample counts and positions, split per sample inside attention. No pad is ever computed.
- ``"vanilla"`` -- the paper's baseline, through the very same ``Model.forward``: inputs are padded
  to ``1 + longest draft`` for every sample, and the cache is kept aligned: every sample's cache
  grows by ``1 + longest accepted count`` each step, the entries beyond its own accepted count
  (rejected drafts and pads) staying in the cache as pad slots hidden by the engine's
  ``key_valid`` mask. Prompts are left-padded to the longest one. It gives the same tokens; pads
  are computed in every matrix product and attended over (masked).

Verification (:func:`verify_greedy`, :func:`verify_sampling`): greedy accepts while the draft
equals the target's argmax; sampling computes at each drafted position the token autoregressive
sampling draws there (the inverse CDF of the target's filtered ``p`` at the uniform ``u(i, t)`` of
:class:`~decoding.sampling.TokenNoise`, for sample ``i``'s ``t``-th token) and accepts while the
draft token is that token; then the target's token follows (the correction, or the bonus token
after a fully accepted draft). Either way the tokens are autoregressive decoding's (for the same
seed), whatever was drafted. A deterministic drafter's token ``x`` is accepted with probability
``p(x)``, as by speculative sampling's rejection rule with a one-hot ``q``; a draft model's where
the two inverse CDFs agree (docs/speculative.md).
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import cached_property, partial, wraps

import numpy as np

from ._threads import engine_threads
from ._xp import to_host
from .cost_model import CostModel, DraftBudget
from .drafters import DRAFTERS, Drafter, DraftModelDrafter, Proposal, make_drafter
from .model import PackedBatch
from .results import GenerationResult
from .sampling import SamplingParams, TokenNoise, filtered_probs, greedy, inverse_cdf, sample
from .scheduling import Outputs, SlotQueue, check_max_batch, check_memory, decode_step, loop_memory
from .tokenizer import check_text, check_token_ids

__all__ = [
    "speculative_generate",
    "check_speculative_arguments",
    "prepare_speculative",
    "packed_step",
    "padded_step",
    "SpeculativeStats",
    "verify_greedy",
    "verify_sampling",
    "LAYOUTS",
    "speculative_sizes",
    "speculative_memory",
]

LAYOUTS = ("ems", "vanilla")
PAD_ID = 0  # token id fed at pad positions of the vanilla layout (their results are never used)


def verify_greedy(logits: np.ndarray, draft: np.ndarray, sampling=None, u=None):
    """Greedy verification: ``(accepted draft count m, the m + 1 new tokens)``.

    ``logits`` ``[n + 1, V]`` are the target's logits after the last accepted token and after each
    draft token; the draft ``[n]`` is accepted while it equals the argmax.

    Examples
    --------
    >>> lg = np.eye(5)[[2, 3, 1]]  # the target would say 2, then 3, then 1
    >>> verify_greedy(lg, np.array([2, 4]))
    (1, [2, 3])
    """
    target = greedy(logits)  # [n + 1]; non-finite logits raise
    n = draft.size
    mism = np.flatnonzero(target[:n] != draft)
    m = int(mism[0]) if mism.size else n
    return m, [int(t) for t in target[: m + 1]]


def verify_sampling(logits: np.ndarray, draft: np.ndarray, sampling: SamplingParams, u: np.ndarray):
    """Sampled verification: ``(m, the m + 1 new tokens)``, the tokens sampling would draw.

    The token at each position is the inverse CDF of the target's :func:`~decoding.sampling.filtered_probs`
    at that position's uniform ``u[j]`` (``[n + 1]``, from :class:`~decoding.sampling.TokenNoise`),
    exactly as :func:`~decoding.sampling.sample` draws it; a draft token is accepted while it is that
    token. The new tokens are therefore autoregressive sampling's, for the same seed, whatever was
    drafted; each is distributed as the target says, since the uniforms are independent. For a
    deterministic drafter a draft token ``x`` is accepted with probability ``p(x)``, as by
    speculative sampling's rejection rule (Leviathan et al. 2023) with a one-hot ``q``; a draft
    model that draws with the same uniforms (:class:`~decoding.drafters.DraftModelDrafter`) is
    accepted where the two inverse CDFs agree, less often than the rejection rule's
    ``sum min(p, q)`` where the two distributions differ (docs/speculative.md).

    Examples
    --------
    >>> lg = np.log(np.eye(4)[[2, 3, 1]] + 1e-12)  # the target says 2, then 3, then 1
    >>> sp = SamplingParams(temperature=1.0)
    >>> verify_sampling(lg, np.array([2, 3]), sp, np.array([0.5, 0.5, 0.5]))
    (2, [2, 3, 1])
    >>> verify_sampling(lg, np.array([2, 0]), sp, np.array([0.5, 0.5, 0.5]))
    (1, [2, 3])
    """

    def token(j):  # one row at a time: rows after a mismatch are never computed
        p = filtered_probs(logits[j : j + 1], sampling.temperature, sampling.top_k, sampling.top_p)
        return int(inverse_cdf(p, u[j : j + 1])[0])

    for j, x in enumerate(draft):
        y = token(j)
        if y != int(x):
            return j, [int(t) for t in draft[:j]] + [y]
    return draft.size, [int(t) for t in draft] + [token(draft.size)]


def _references(tokenizer, references, n_prompts: int, vocab_size: int | None = None, *, encode: bool = True):
    """One int array per prompt from ``references`` (texts, or token ids in ``[0, vocab_size)``), or None.

    A text given for several prompts is encoded once (the CLI gives every sample the same file: a
    9 MB reference at batch 8 took 59 s); with ``encode=False`` texts are checked, not encoded, and
    None is returned (autoregressive decoding, which reads no reference)."""
    if references is None:
        return None
    if not isinstance(references, (list, tuple)):  # a str or a 2-D array is not one entry per prompt
        hint = " (one text per prompt: references=[text])" if isinstance(references, str) else ""
        raise TypeError(
            f"references must be a list with one entry per prompt ({n_prompts}), got "
            f"{type(references).__name__}{hint}"
        )
    if len(references) != n_prompts:
        raise ValueError(
            f"references must be a list with one entry per prompt ({n_prompts}), got {len(references)}"
        )
    refs, encoded = [], {}
    for i, r in enumerate(references):
        if isinstance(r, str):  # plain text: a control token's spelling stays text
            check_text(r, f"references[{i}]")
            if encode and r not in encoded:
                encoded[r] = np.array(tokenizer.encode(r), dtype=np.int64)
                encoded[r].flags.writeable = False  # shared by the prompts that gave this text
            refs.append(encoded.get(r))
        elif isinstance(r, np.ndarray) and r.ndim == 1 and r.size == 0:  # np.array([]) is float64
            refs.append(np.zeros(0, dtype=np.int64))  # empty, as [] and "" are (and as empty drafts are)
        elif isinstance(r, (list, tuple, np.ndarray)):
            refs.append(np.array(check_token_ids(r, f"references[{i}]", vocab_size), dtype=np.int64))
        else:
            raise TypeError(f"references[{i}] must be a str or a list of token ids, got {type(r).__name__}")
    return refs if encode else None


def _draft_budget(draft_budget, model, drafter: Drafter) -> DraftBudget | None:
    """The :class:`DraftBudget` that ``draft_budget`` names ("auto" measures the cost models)."""
    if draft_budget is None or isinstance(draft_budget, DraftBudget):
        return draft_budget
    if isinstance(draft_budget, CostModel) or (isinstance(draft_budget, str) and draft_budget == "auto"):
        target_cost = draft_budget if isinstance(draft_budget, CostModel) else CostModel.for_model(model)
        draft_cost = CostModel.for_model(drafter.model) if isinstance(drafter, DraftModelDrafter) else None
        # live forwards that drift from the cached curve re-measure it (once per process and curve)
        # (a curve the caller gave is only rescaled)
        remeasure = None if isinstance(draft_budget, CostModel) else partial(CostModel.remeasured, model)
        return DraftBudget(target_cost, draft_cost, remeasure=remeasure)
    raise ValueError(f"draft_budget must be 'auto', None, a DraftBudget or a CostModel, got {draft_budget!r}")


def check_speculative_arguments(
    tokenizer, n_prompts: int, *, drafter, max_draft, references, draft_budget, vocab_size: int | None = None,
    encode_references: bool = True,
) -> tuple[int, list[np.ndarray] | None]:  # fmt: skip
    """Check the speculative arguments of :func:`decoding.generate`, building nothing.

    :func:`decoding.generate` calls it whatever the method, so that a bad value raises even where
    it would go unused; no drafter is made and no cost model measured.

    Parameters
    ----------
    tokenizer : Tokenizer
        Encodes text references.
    n_prompts : int
        ``references`` needs one entry per prompt.
    drafter : str or Drafter
        A name of :data:`~decoding.drafters.DRAFTERS` or a :class:`~decoding.drafters.Drafter`.
    max_draft : int >= 1
    references : None, or list of str or of token-id lists
    draft_budget : "auto", None, DraftBudget or CostModel
    vocab_size : int, optional
        Reference token ids must lie in ``[0, vocab_size)``.
    encode_references : bool, default True
        False: text references are checked but not encoded, and None is returned for them (for
        a method that reads none).

    Returns
    -------
    (int, list of int arrays or None)
        ``max_draft`` as an int, and the references as token ids.

    Examples
    --------
    >>> check_speculative_arguments(None, 1, drafter="llma", max_draft=np.int64(3),
    ...                             references=[[4, 5]], draft_budget="auto", vocab_size=10)
    (3, [array([4, 5])])
    >>> check_speculative_arguments(None, 1, drafter="foo", max_draft=3, references=None,
    ...                             draft_budget=None)
    Traceback (most recent call last):
    ...
    ValueError: drafter must be 'llma', 'prompt_lookup', 'draft_model' or a Drafter object, got 'foo'
    """
    if not isinstance(drafter, (str, Drafter)):
        raise TypeError(f"drafter must be a drafter's name or a Drafter object, got {type(drafter).__name__}")
    if isinstance(drafter, str) and drafter not in DRAFTERS:
        raise ValueError(
            f"drafter must be 'llma', 'prompt_lookup', 'draft_model' or a Drafter object, got {drafter!r}"
        )
    if isinstance(max_draft, bool) or not isinstance(max_draft, (int, np.integer)):
        raise TypeError(f"max_draft must be an integer, got {type(max_draft).__name__}")
    if max_draft < 1:  # 0 would draft nothing: autoregressive decoding at speculation's cost
        raise ValueError(f"max_draft must be >= 1, got {max_draft}")
    refs = _references(tokenizer, references, n_prompts, vocab_size, encode=encode_references)
    budget_types = "'auto', None, a DraftBudget or a CostModel"
    if isinstance(draft_budget, str) and draft_budget != "auto":
        raise ValueError(f"draft_budget must be {budget_types}, got {draft_budget!r}")
    if not (draft_budget is None or isinstance(draft_budget, (str, DraftBudget, CostModel))):
        raise TypeError(f"draft_budget must be {budget_types}, got {type(draft_budget).__name__}")
    return int(max_draft), refs


def speculative_sizes(prompt_lengths, *, max_new_tokens: int, max_draft: int, layout: str, slots: int):
    """``(usable draft length, cache slots per sequence)`` of a speculative call.

    A draft is cut to what is left of ``max_new_tokens`` less the token the target adds (at most
    ``max_new_tokens - 2`` after the first token), so a longer ``max_draft`` is never used and
    never paid for. EMS-SD's cache then holds the prompt and ``max_new_tokens``; the padded
    (vanilla) cache grows by ``1 + the longest accepted draft`` of the batch each step, so by
    at most ``min(slots, 1 + k)`` tokens per generated token, plus one step's inputs.

    Examples
    --------
    >>> speculative_sizes([30, 12], max_new_tokens=64, max_draft=10**6, layout="ems", slots=2)
    (62, 94)
    >>> speculative_sizes([30, 12], max_new_tokens=64, max_draft=7, layout="vanilla", slots=2)
    (7, 164)
    """
    k = max(0, min(int(max_draft), int(max_new_tokens) - 2))
    longest = max(int(n) for n in prompt_lengths)
    if layout == "vanilla":
        return k, longest + min(int(slots), 1 + k) * (int(max_new_tokens) - 1) + min(
            1 + k, int(max_new_tokens)
        )
    return k, longest + int(max_new_tokens)


def speculative_memory(
    model, prompt_lengths, *, max_new_tokens: int, max_draft: int, layout: str, slots: int, sampled: bool,
    drafter: Drafter | None = None,
) -> list[tuple[str, int]]:  # fmt: skip
    """The memory of a speculative call, by part (:func:`decoding.scheduling.loop_memory`'s parts,
    the padded layout's mask and one-forward prefill, each step's contexts, and the drafter's).

    Examples
    --------
    >>> parts = speculative_memory(model, [30, 12], max_new_tokens=64, max_draft=7, layout="ems",
    ...                            slots=2, sampled=False)  # doctest: +SKIP
    >>> [what for what, _ in parts][:3]  # doctest: +SKIP
    ['KV cache (2 sequences x 94 slots)', 'prefill', 'decoding step (16 tokens)']
    """
    lens = [int(n) for n in prompt_lengths]
    k, cap = speculative_sizes(
        lens, max_new_tokens=max_new_tokens, max_draft=max_draft, layout=layout, slots=slots
    )
    step = slots * (1 + k)
    parts = loop_memory(
        model, lens, slots=slots, capacity=cap, step_tokens=step, sampled=sampled, sampled_rows=slots
    )  # the first tokens and a step without drafts sample a row per sample; verification, one row
    if layout == "vanilla":  # every prompt left-padded to the longest, in one forward; the pad mask
        P = max(lens)
        parts.append(("padded prefill", model.forward_bytes(len(lens) * P, keys=P, logits_rows=len(lens))))
        parts.append(("pad mask", len(lens) * cap))
    parts.append(("contexts", 8 * slots * cap))
    if drafter is not None:
        own = drafter.memory_bytes(
            lens, max_new_tokens=max_new_tokens, max_active=slots, max_draft=k, sampled=sampled
        )
        parts.append((f"drafter {drafter.name}", int(own)))
    return parts


def _what(n, slots, max_new_tokens, max_draft, layout) -> str:
    return (
        f"generate({n} prompts, method={layout!r}, {slots} at once, max_new_tokens={max_new_tokens}, "
        f"max_draft={max_draft})"
    )


def prepare_speculative(
    model, tokenizer, prompt_ids, *, drafter, max_draft, references, draft_budget, max_new_tokens,
    layout="ems", max_batch=None, sampling=None,
) -> dict:  # fmt: skip
    """Validate the speculative arguments of :func:`decoding.generate`; the keywords of the loop.

    With a model, the call's memory (:func:`speculative_memory`) is checked here, before the draft
    budget measures its cost model: ``MemoryError`` when it cannot fit.

    Returns
    -------
    dict
        ``drafter``, ``max_draft``, ``references`` and ``budget`` for :func:`speculative_generate`.

    Examples
    --------
    >>> kw = prepare_speculative(None, None, [[1, 2]], drafter="llma", max_draft=3, references=None,
    ...                          draft_budget=None, max_new_tokens=8)
    >>> kw["drafter"].name, kw["max_draft"], kw["budget"]
    ('llma', 3, None)
    """
    vocab_size = None if model is None else model.config.vocab_size
    max_draft, refs = check_speculative_arguments(
        tokenizer, len(prompt_ids), drafter=drafter, max_draft=max_draft, references=references,
        draft_budget=draft_budget, vocab_size=vocab_size,
    )  # fmt: skip
    usable = max(1, min(max_draft, int(max_new_tokens)))  # a longer draft is never used
    d = make_drafter(drafter, model, max_draft=usable)
    if isinstance(d, DraftModelDrafter) and d.model.config.vocab_size != model.config.vocab_size:
        raise ValueError(
            f"the draft model's vocabulary ({d.model.config.vocab_size}) differs from the target's "
            f"({model.config.vocab_size})"
        )
    if isinstance(d, DraftModelDrafter) and prompt_ids:
        # the drafter runs each context plus its drafts, up to max_new_tokens past the prompt; past
        # its own context its forward refused a position several steps into the decoding
        longest, ctx = max(len(p) for p in prompt_ids), d.model.config.context_length
        if longest + int(max_new_tokens) > ctx:
            raise ValueError(
                f"the draft model's context is {ctx} tokens: the longest prompt ({longest} tokens) with "
                f"max_new_tokens={int(max_new_tokens)} exceeds it; use a draft model of a longer "
                "context, or shorter prompts or max_new_tokens"
            )
    if model is not None:
        n = len(prompt_ids)
        slots = n if max_batch is None else min(int(max_batch), n)
        parts = speculative_memory(
            model, [len(p) for p in prompt_ids], max_new_tokens=max_new_tokens, max_draft=max_draft,
            layout=layout, slots=slots, sampled=sampling is not None and not sampling.greedy, drafter=d,
        )  # fmt: skip
        check_memory(parts, _what(n, slots, max_new_tokens, max_draft, layout))
    return dict(drafter=d, max_draft=max_draft, references=refs, budget=_draft_budget(draft_budget, model, d))


@dataclass
class SpeculativeStats:
    """The counters of one speculative call; :meth:`as_dict` gives ``GenerationResult.stats``.

    Attributes
    ----------
    accepted, rejected : float arrays [B]
        Per sample: accepted draft tokens and rejection events, shadow checks included (what the
        draft budget's acceptance estimates learn from).
    asked, offered : float arrays [B]
        Per sample: steps the drafter was asked for a draft (with room for one), and steps it had
        one (the draft budget's :meth:`~decoding.cost_model.DraftBudget.offer_rates`).
    forwards : int
        Verification forwards.
    computed, padded : int
        Tokens in those forwards (pads included), and of which pads.
    draft_tokens, accepted_tokens : int
        Draft tokens verified, and accepted, over all sample-steps.
    sample_steps : int
    trimmed : int
        Draft tokens proposed but dropped by the budget.
    shadow_checks : int
        Trimmed draft tokens checked against the target's tokens at no cost (:meth:`expect`).
    last_forward : tuple
        ``(tokens, seconds)`` of the latest forward (the draft budget's drift check reads it).

    Examples
    --------
    >>> st = SpeculativeStats.for_samples(2)
    >>> st.record(0, accepted=2, verified=3)
    >>> st.record(1, accepted=1, verified=1)
    >>> st.forward(computed=6)
    >>> d = st.as_dict()
    >>> d["mean_accepted"], d["acceptance_rate"], st.rejected.tolist()
    (1.5, 0.75, [1.0, 0.0])

    A trimmed tail of sample 1, checked by the tokens of the next two steps (two accepted, then a
    rejection):

    >>> st.expect(1, np.array([4, 5, 6]))
    >>> st.check(1, [4]); st.check(1, [5, 9])
    >>> st.shadow_checks, st.accepted.tolist(), st.rejected.tolist()
    (3, [2.0, 3.0], [1.0, 1.0])
    """

    accepted: np.ndarray
    rejected: np.ndarray
    asked: np.ndarray
    offered: np.ndarray
    forwards: int = 0
    computed: int = 0
    padded: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    sample_steps: int = 0
    trimmed: int = 0
    shadow_checks: int = 0
    last_forward: tuple = ()  # (tokens, seconds) of the latest forward, for the budget's drift check
    tails: dict = field(default_factory=dict)  # sample -> its trimmed draft tokens not yet checked

    @classmethod
    def for_samples(cls, n: int) -> SpeculativeStats:
        """Zero counters for a call of ``n`` samples."""
        return cls(np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n))

    def record(self, i: int, *, accepted: int, verified: int) -> None:
        """Sample ``i`` accepted ``accepted`` of its ``verified`` draft tokens this step."""
        self.accepted_tokens += accepted
        self.draft_tokens += verified
        self.sample_steps += 1
        self.accepted[i] += accepted
        self.rejected[i] += int(accepted < verified)

    def record_undrafted(self, n: int) -> None:
        """``n`` samples verified no draft this step: :meth:`record` with nothing accepted of
        nothing verified, for all of them at once (it only counts their sample-steps)."""
        self.sample_steps += n

    def expect(self, i: int, tail) -> None:
        """Sample ``i``'s drafter predicted ``tail`` to come next, but it was not verified (the
        budget trimmed it): the tokens the target adds from now on check it token by token, free
        (:meth:`check`), as verification would have. A later prediction replaces it (the check of
        this one then ends without a rejection, as a fully accepted draft does)."""
        if len(tail):
            self.tails[i] = [int(t) for t in tail]
        else:
            self.tails.pop(i, None)

    def check(self, i: int, tokens) -> None:
        """The target added ``tokens`` to sample ``i``: they check its trimmed tail, if any.

        Each token equal to the tail's next one is an accepted draft token; the first that differs
        is a rejection, and ends the check (as it would end a verified draft).
        """
        tail = self.tails.get(i)
        for t in tokens if tail is not None else ():
            self.shadow_checks += 1
            if int(t) != tail[0]:
                self.rejected[i] += 1
                del self.tails[i]
                return
            self.accepted[i] += 1
            del tail[0]
            if not tail:
                del self.tails[i]
                return

    def forward(self, *, computed: int, padded: int = 0, seconds: float = 0.0) -> None:
        """One verification forward of ``computed`` tokens, ``padded`` of them pads (``seconds`` long)."""
        self.last_forward = (computed, seconds)
        self.forwards += 1
        self.computed += computed
        self.padded += padded

    def as_dict(self) -> dict:
        """The entries of ``GenerationResult.stats`` these counters give (NaN for an empty ratio)."""

        def ratio(a, b):
            return a / b if b else float("nan")

        return dict(
            verify_forwards=self.forwards,
            sample_steps=self.sample_steps,
            mean_accepted=ratio(self.accepted_tokens, self.sample_steps),
            draft_tokens=self.draft_tokens,
            accepted_tokens=self.accepted_tokens,
            acceptance_rate=ratio(self.accepted_tokens, self.draft_tokens),
            tokens_per_forward=ratio(self.computed, self.forwards),
            padding_fraction=self.padded / self.computed if self.computed else 0.0,
            budget_trimmed=self.trimmed,
            budget_shadow_checks=self.shadow_checks,
        )


@dataclass(frozen=True)
class _Drafts:
    """One step's drafts: ``verified`` (what the target checks), ``proposed`` (before the budget
    trimmed them: the trimmed tails still teach it)."""

    verified: list
    proposed: list
    asked: bool = True  # whether the drafter was asked this step

    @cached_property
    def lengths(self) -> np.ndarray:
        return np.array([d.size for d in self.verified], dtype=np.int64)

    @cached_property
    def drafted(self) -> bool:
        """Whether any sample has a draft to verify."""
        return any(d.size for d in self.verified)

    @classmethod
    def none(cls, n: int) -> _Drafts:
        """``n`` samples, no draft for any, the drafter not asked (a step the budget's back-off skips)."""
        empty = [_NO_DRAFT] * n
        return cls(empty, empty, asked=False)


_NO_DRAFT = np.zeros(0, dtype=np.int64)
_NO_DRAFT.flags.writeable = False  # shared by every sample of a skipped step


def _checked_drafts(drafter: Drafter, tokens, active, vocab_size: int, room) -> list[np.ndarray]:
    """Each sample's draft as an int64 array cut to its ``room``: ``TypeError`` unless a 1-D integer
    array (an empty one of any dtype), ``ValueError`` for an id outside ``[0, vocab_size)`` among
    those kept (tokens past the room are never used), naming the drafter and the sample. A custom
    drafter's slip met the model's check, which names neither, NumPy's errors, or a silent
    ``int()`` (a draft ``[1.7]`` was token 1). The ids of all samples are checked at once (a check
    per draft cost 3 us a sample and step)."""
    drafts = []
    for j, (i, d) in enumerate(zip(active, tokens, strict=True)):
        try:
            a = np.asarray(d)
        except (TypeError, ValueError) as exc:  # a ragged nesting
            why = f"a draft NumPy cannot read as an array ({type(d).__name__}: {exc})"
        else:
            why = None
            if a.ndim != 1:
                why = f"a draft of shape {a.shape} ({type(d).__name__})"
            elif a.size and a.dtype.kind not in "iu":  # np.asarray([]) is float64: an empty draft is fine
                why = f"a draft of dtype {a.dtype}"
        if why is not None:
            raise TypeError(
                f"drafter {drafter.name!r} proposed {why} for sample {i} (Drafter.propose returns a "
                "1-D array of integer token ids, possibly empty, per sample)"
            )
        drafts.append(a[: room[j]].astype(np.int64, copy=False) if a.size else _NO_DRAFT)
    ids = np.concatenate(drafts) if drafts else _NO_DRAFT
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):  # find the first bad id (an error path)
        for i, d, a in zip(active, tokens, drafts, strict=True):
            bad = np.flatnonzero((a < 0) | (a >= vocab_size))
            if bad.size:
                raise ValueError(
                    f"drafter {drafter.name!r} proposed token id {np.asarray(d)[bad[0]]} at index "
                    f"{bad[0]} for sample {i}, outside the vocabulary [0, {vocab_size})"
                )
    return drafts


def _draft(
    drafter: Drafter, budget, context, active, left, *, max_draft, padded, horizon, stats, vocab_size: int
) -> _Drafts:
    """Ask the drafter for each active sample's drafts and cut them to the room and the budget.

    ``context(i)`` gives sample ``i``'s tokens so far, asked for only when the drafter is (the
    loop does not call this function on a step the budget's back-off skips); the drafts must hold
    token ids in ``[0, vocab_size)`` (:func:`_checked_drafts`)."""
    t_ask = time.perf_counter()
    room = np.minimum(max_draft, left - 1)
    alphas, cut = None, False
    contexts = [context(i) for i in active]
    if budget is not None:
        # for this step's rate (prompts waiting), pooled over every sample of the call, finished
        # ones included: the prior of a newcomer is the task's rate so far; for the time to finish
        # a static batch, each sample's own (a sample with no history may be the one that lags)
        makespan = budget.finishes_batch(horizon)
        alphas = budget.alphas(stats.accepted, stats.rejected, pooled=not makespan)[active]
        if budget.draft_cost is not None:  # plan before drafting: it costs
            setup = drafter.pending(contexts, active)
            plan = budget.allocate(
                alphas, room, padded=padded, include_draft_cost=True, setup=setup, remaining=horizon
            )
            cut = bool(room.any()) and not plan.any()  # (at a batch's last step there is no room)
            room = np.minimum(room, plan)
    proposal = drafter.propose(contexts, room, active)
    if not isinstance(proposal, Proposal) or not isinstance(proposal.tokens, (list, tuple)):
        got = type(proposal.tokens if isinstance(proposal, Proposal) else proposal).__name__
        raise TypeError(
            f"drafter {drafter.name!r} proposed a {got} (Drafter.propose returns a Proposal of a list "
            "with one, possibly empty, draft per sample)"
        )
    if len(proposal.tokens) != len(active):  # a custom drafter's slip met zip()'s "shorter than"
        raise ValueError(
            f"drafter {drafter.name!r} proposed {len(proposal.tokens)} drafts for {len(active)} samples "
            "(Drafter.propose returns one, possibly empty, per sample)"
        )
    proposed = _checked_drafts(drafter, proposal.tokens, active, vocab_size, room)
    drafts = _Drafts(proposed, proposed)
    stats.asked[active] += room > 0
    stats.offered[active] += drafts.lengths > 0
    if budget is None:
        return drafts
    if not drafts.lengths.any():  # nothing to verify: the plan cut every draft, or the drafter had none
        if cut:
            budget.record_decision(False, time.perf_counter() - t_ask)
        elif room.any():
            budget.record_nothing_proposed(time.perf_counter() - t_ask)
        return drafts
    offers = budget.offer_rates(stats.offered, stats.asked)[active] if makespan else None
    keep = budget.allocate(alphas, drafts.lengths, padded=padded, remaining=horizon, offers=offers)
    budget.record_decision(bool(keep.any()), time.perf_counter() - t_ask)
    stats.trimmed += int((drafts.lengths - keep).sum())
    return _Drafts([d[: keep[j]] for j, d in enumerate(proposed)], proposed)


def _step_drafts(
    drafter, budget, context, active, outs, max_new_tokens, *, max_draft, padded, waiting, stats, vocab_size
):
    """This step's drafts: none, the drafter not asked, on a step the budget's back-off skips;
    else :func:`_draft`, the budget minimising the time to finish the batch, or, while prompts
    are ``waiting`` for a slot, maximising this step's rate."""
    if budget is not None and not budget.should_propose():
        return _Drafts.none(len(active))
    left = np.array([max_new_tokens - len(outs.tokens[i]) for i in active], dtype=np.int64)
    return _draft(
        drafter, budget, context, active, left, max_draft=max_draft, padded=padded,
        horizon=None if waiting else left, stats=stats, vocab_size=vocab_size,
    )  # fmt: skip


def _teach_budget(budget, drafts: _Drafts, active, results, stats: SpeculativeStats, t_step: float) -> float:
    """After a step begun at ``t_step``: the shadow checks (:func:`_shadow`), the live forward
    against the cost model (re-measured when they drift) and the step's time outside its forward
    (:meth:`~decoding.cost_model.DraftBudget.observe_step`). Returns the seconds a re-measurement
    of the cost model paused the loop (0 without one)."""
    _shadow(drafts, active, results, stats)
    t_obs, remeasured = time.perf_counter(), budget.remeasured
    budget.observe(stats.last_forward[0], len(active), stats.last_forward[1])
    paused = time.perf_counter() - t_obs if budget.remeasured != remeasured else 0.0
    outside = time.perf_counter() - t_step - paused - stats.last_forward[1]
    budget.observe_step(drafts.drafted, outside)
    return paused


def _judge(
    rows, *, drafts: _Drafts, active, done, verify, sampling, noise, stats
) -> list[tuple[int, list[int]]]:
    """Verify each sample's draft against its logits ``rows[j]``: ``(accepted count m, m + 1 tokens)``.

    Sampled, sample ``active[j]``'s positions ``done[j], ..., done[j] + n_j`` (``done[j]`` tokens
    generated so far) take their uniforms from ``noise``, all in one call."""
    us = [None] * len(active)
    if not sampling.greedy:
        counts = drafts.lengths + 1
        positions = np.concatenate([t + np.arange(c) for t, c in zip(done, counts, strict=True)])
        u = noise.uniforms(np.repeat(active, counts), positions)
        us = np.split(u, np.cumsum(counts)[:-1])
    results = []
    for j, i in enumerate(active):
        m, new = verify(rows[j], drafts.verified[j], sampling, us[j])
        results.append((m, new))
        stats.record(i, accepted=m, verified=int(drafts.lengths[j]))
    return results


def _shadow(drafts: _Drafts, active, results, stats: SpeculativeStats) -> None:
    """Shadow checks, free: the tokens the target chose check each sample's trimmed draft tokens.

    After a fully accepted draft, the target's next token is the one the first trimmed draft token
    would have been checked against, and the tokens of the next steps check the rest of the tail
    (a draft token is accepted iff it equals the target's token, greedy or sampled:
    :func:`verify_sampling`). Without them a sample the budget never drafts for never shows that
    its drafts would pay; with the whole tail a quoting sample shows it in a step or two, not one
    token per time the drafter is asked.
    """
    if not drafts.asked and not stats.tails:
        return
    for j, i in enumerate(active):
        proposed = drafts.proposed[j]
        if proposed.size:  # a new prediction: its trimmed tail, if this step accepted all before it
            (m, new), n = results[j], int(drafts.lengths[j])
            stats.expect(i, proposed[n:] if m == n else proposed[:0])
            stats.check(i, new[m:])
        elif i in stats.tails:  # not asked this step, or no draft: the new tokens check an earlier one
            stats.check(i, results[j][1])


def packed_step(model, cache, seq_ids, npos, last, drafts: list, judge, stats: SpeculativeStats):
    """One EMS-SD verification step: no pad in the inputs or in the cache.

    Sample ``j``'s last accepted token ``last[j]`` and its drafts ``drafts[j]`` (``n_j`` tokens)
    are packed with the others into one forward; ``judge(rows)`` verifies the logits of each
    sample (``rows[j]``: ``[1 + n_j, V]``) and returns ``(m_j, new tokens)`` per sample; each
    sample's cache then keeps its own ``npos[j] + 1 + m_j`` tokens (a rollback is
    :meth:`KVCache.truncate`). Returns what ``judge`` returned.

    Examples
    --------
    A stand-in target that caches what it is fed and always predicts token 7; two samples with 3
    cached tokens each, drafts of 3 and 1 tokens:

    >>> from decoding.kv_cache import KVCache
    >>> class Says7:
    ...     def forward(self, batch, *, cache, **kw):
    ...         cache.advance(batch.seq_ids, np.diff(batch.cu_seqlens))
    ...         return np.eye(8)[np.full(batch.tokens.size, 7)]
    >>> cache = KVCache(1, 1, 2, max_seqs=2, capacity=16)
    >>> seq = np.array([cache.allocate(), cache.allocate()]); cache.advance(seq, [3, 3])
    >>> drafts = [np.array([7, 7, 1]), np.array([2])]
    >>> judge = lambda rows: [verify_greedy(r, d) for r, d in zip(rows, drafts)]
    >>> stats = SpeculativeStats.for_samples(2)
    >>> packed_step(Says7(), cache, seq, np.array([3, 3]), [5, 6], drafts, judge, stats)
    [(2, [7, 7, 7]), (0, [7])]
    >>> cache.lengths.tolist(), stats.computed  # each keeps its cached, last and accepted tokens
    ([6, 4], 6)
    """
    batch = PackedBatch.from_lists([np.r_[t, d] for t, d in zip(last, drafts, strict=True)], seq_ids=seq_ids)
    t0 = time.perf_counter()
    logits = to_host(model.forward(batch, cache=cache, logits="all"))  # [sum(1 + n_j), V]
    seconds = time.perf_counter() - t0
    cu = batch.cu_seqlens
    results = judge([logits[cu[j] : cu[j + 1]] for j in range(len(drafts))])
    for s, p, (m, _) in zip(seq_ids, npos, results, strict=True):
        cache.truncate(int(s), int(p) + 1 + int(m))
    stats.forward(computed=int(cu[-1]), seconds=seconds)
    return results


def padded_step(model, cache, seq_ids, npos, last, drafts: list, judge, stats: SpeculativeStats, key_valid):
    """One vanilla verification step: inputs padded to ``1 + longest draft``, the cache kept aligned.

    As :func:`packed_step`, but every sample feeds ``W = 1 + max n_j`` tokens (pads after its
    drafts, at harmless positions, hidden by ``key_valid``), and every sample's cache grows by
    ``1 + max m_j``: the entries beyond its own accepted count (rejected drafts and pads) stay in
    the cache as pad slots, marked False in ``key_valid`` ``[max_seqs, capacity]``.

    Examples
    --------
    The example of :func:`packed_step`, padded: both caches grow by 1 + 2, and sample 1's last
    two slots (its rejected draft and its pad) are hidden.

    >>> from decoding.kv_cache import KVCache
    >>> import types
    >>> class Says7:
    ...     config = types.SimpleNamespace(context_length=16)
    ...     def forward(self, batch, *, cache, **kw):
    ...         cache.advance(batch.seq_ids, np.diff(batch.cu_seqlens))
    ...         return np.eye(8)[np.full(batch.tokens.size, 7)]
    >>> cache = KVCache(1, 1, 2, max_seqs=2, capacity=16)
    >>> seq = np.array([cache.allocate(), cache.allocate()]); cache.advance(seq, [3, 3])
    >>> key_valid = np.ones((2, 16), dtype=bool)
    >>> drafts = [np.array([7, 7, 1]), np.array([2])]
    >>> judge = lambda rows: [verify_greedy(r, d) for r, d in zip(rows, drafts)]
    >>> stats = SpeculativeStats.for_samples(2)
    >>> padded_step(Says7(), cache, seq, np.array([3, 3]), [5, 6], drafts, judge, stats, key_valid)
    [(2, [7, 7, 7]), (0, [7])]
    >>> cache.lengths.tolist(), key_valid[1, 3:6].tolist(), stats.padded
    ([6, 6], [True, False, False], 2)
    """
    A, n = len(drafts), np.array([d.size for d in drafts], dtype=np.int64)
    W = 1 + int(n.max())
    L = int(cache.lengths[seq_ids[0]])  # common (aligned) cache length
    toks = np.full((A, W), PAD_ID, dtype=np.int64)
    for j in range(A):
        toks[j, 0] = last[j]
        toks[j, 1 : 1 + n[j]] = drafts[j]
    key_valid[seq_ids, L : L + W] = np.arange(W)[None, :] < (1 + n)[:, None]
    batch = PackedBatch.from_lists(toks, seq_ids=seq_ids, start_positions=npos)  # [A W]
    # A sample near the context's end pads past it (its pads run to W, the longest draft's width):
    # pads are masked keys and their logits unread, so they take the last position of the context,
    # which Model.forward accepts (positions past it are refused there).
    last_position = model.config.context_length - 1
    if batch.positions.max() > last_position:
        batch = replace(batch, positions=np.minimum(batch.positions, last_position))
    t0 = time.perf_counter()
    logits = to_host(model.forward(batch, cache=cache, logits="all", key_valid=key_valid))
    seconds = time.perf_counter() - t0
    results = judge([logits[j * W : j * W + 1 + n[j]] for j in range(A)])
    K = 1 + max(int(m) for m, _ in results)  # every sample's cache grows by the longest accepted count
    for s, (m, _) in zip(seq_ids, results, strict=True):
        key_valid[int(s), L + 1 + int(m) : L + K] = False  # rejected drafts and pads stay as pads
        cache.truncate(int(s), L + K)
    stats.forward(computed=A * W, padded=A * W - int((1 + n).sum()), seconds=seconds)
    return results


def _verify_step(
    model, cache, seq, npos, tokens, active, drafts: _Drafts, sampling, noise, stats, *, forward, verify
):
    """A step that verifies ``drafts`` of the ``active`` samples (given their ``tokens`` so far) in
    one target ``forward`` (:func:`packed_step` or :func:`padded_step`) under the acceptance rule
    ``verify``; ``npos`` (each sample's cached tokens) advances by what it kept. Returns
    ``(accepted, new tokens)`` per sample."""
    last = [tokens[i][-1] for i in active]
    done = [len(tokens[i]) for i in active]  # each sample's next position
    judge = partial(
        _judge, drafts=drafts, active=active, done=done, verify=verify, sampling=sampling, noise=noise,
        stats=stats,
    )  # fmt: skip
    results = forward(model, cache, seq[active], npos[active], last, drafts.verified, judge, stats)
    npos[active] += 1 + np.array([m for m, _ in results], dtype=np.int64)
    return results


def _autoregressive_step(model, cache, seq, npos, tokens, active, drafts, sampling, noise, stats):
    """The step when no sample verifies a draft: :func:`~decoding.scheduling.decode_step` and
    :func:`~decoding.sampling.sample`, exactly the autoregressive loop's (``drafts`` unused). Returns
    ``(0, [token])`` per sample, as :func:`_verify_step` does."""
    t0 = time.perf_counter()
    logits = decode_step(model, cache, seq[active], [tokens[i][-1] for i in active])
    stats.forward(computed=len(active), seconds=time.perf_counter() - t0)
    new = sample(to_host(logits), sampling, noise, active, [len(tokens[i]) for i in active])
    stats.record_undrafted(len(active))
    npos[active] += 1
    return [(0, [int(t)]) for t in new]


def _padded_prefill(model, cache, queue: SlotQueue, seq, prompts, key_valid):
    """Vanilla's prefill: every prompt left-padded to the longest; pads written to the cache and masked."""
    t0 = time.perf_counter()
    admitted = queue.take(cache, seq)  # every prompt (max_batch is not below B here)
    lens = np.array([p.size for p in prompts], dtype=np.int64)
    P, pads = int(lens.max()), int(lens.max()) - lens
    toks = np.concatenate([np.r_[np.full(n, PAD_ID), p] for n, p in zip(pads, prompts, strict=True)])
    pos = np.concatenate(
        [np.r_[np.zeros(n, np.int64), np.arange(m)] for n, m in zip(pads, lens, strict=True)]
    )
    for b in range(len(prompts)):
        key_valid[seq[b], : pads[b]] = False
    batch = PackedBatch(toks, seq, np.arange(len(prompts) + 1) * P, pos)
    logits = to_host(model.forward(batch, cache=cache, logits="last", key_valid=key_valid))
    queue.record(time.perf_counter() - t0)
    return admitted, logits


class _Contexts:
    """``contexts(i)``: sample ``i``'s prompt and tokens so far, a view of a buffer (the prompt, then
    room for ``max_new_tokens``) that only the new tokens are copied into (building it anew each
    step cost O(context) per sample and step). ``tokens[i]`` is the sample's list of generated
    tokens, read at each call.

    Examples
    --------
    >>> toks = [[7]]
    >>> contexts = _Contexts([np.array([1, 2])], toks, max_new_tokens=4)
    >>> toks[0].append(8); contexts(0).tolist()
    [1, 2, 7, 8]
    """

    def __init__(self, prompts, tokens, max_new_tokens: int):
        self.prompts, self.tokens, self.max_new_tokens = prompts, tokens, max_new_tokens
        self.held: dict = {}  # sample -> (its buffer, generated tokens copied into it)

    def __call__(self, i: int) -> np.ndarray:
        P, toks = self.prompts[i].size, self.tokens[i]
        if i not in self.held:
            buf = np.empty(P + self.max_new_tokens, dtype=np.int64)
            buf[:P] = self.prompts[i]
            self.held[i] = (buf, 0)
        buf, n = self.held[i]
        if len(toks) > n:
            buf[P + n : P + len(toks)] = toks[n:]
            self.held[i] = (buf, len(toks))
        return buf[: P + len(toks)]

    def drop(self, i: int) -> None:
        """Sample ``i`` finished: its buffer goes."""
        self.held.pop(i, None)


_IN_USE: set[int] = set()  # id() of each Drafter and DraftBudget object a speculative call is using
_IN_USE_LOCK = threading.Lock()


@contextmanager
def _claimed(obj, busy: str):
    """``obj``, a Drafter or a DraftBudget, for one call: each holds its call's state (a Drafter's
    :meth:`~decoding.drafters.Drafter.begin` sets it up; a budget's back-off), and a second call at
    once overwrote it (from two threads on one drafter: ``KeyError``, ``IndexError`` or a full
    cache, in 4 of 10 calls). A second claim is a ``RuntimeError``, ``busy``, that says what to do."""
    if obj is None:  # no budget
        yield obj
        return
    with _IN_USE_LOCK:
        if id(obj) in _IN_USE:
            raise RuntimeError(busy)
        _IN_USE.add(id(obj))
    try:
        yield obj
    finally:
        with _IN_USE_LOCK:
            _IN_USE.discard(id(obj))


def _one_call_per_drafter(generate):
    """:func:`speculative_generate` holding its ``drafter`` and its ``budget`` for the call
    (:func:`_claimed`)."""

    @wraps(generate)
    def call(*args, drafter, budget=None, **kwargs):
        drafter_busy = (
            f"drafter {drafter.name!r} is in use by another generate call: a Drafter object serves one "
            "call at a time; give each concurrent call its own (or the drafter's name, which makes one "
            "per call)"
        )
        budget_busy = (
            "draft_budget is in use by another generate call: a DraftBudget object serves one call at "
            "a time; give each concurrent call its own (or draft_budget='auto' or a CostModel, which "
            "make one per call)"
        )
        with _claimed(drafter, drafter_busy), _claimed(budget, budget_busy):
            return generate(*args, drafter=drafter, budget=budget, **kwargs)

    return call


@_one_call_per_drafter
def speculative_generate(
    model,
    tokenizer,
    prompt_ids: list[list[int]],
    *,
    max_new_tokens: int,
    sampling: SamplingParams,
    stop: list[str],
    noise: TokenNoise,
    drafter: Drafter,
    max_draft: int = 7,
    layout: str = "ems",
    budget=None,
    references=None,
    stream=None,
    eos_ids=(),
    verifier=None,
    max_batch: int | None = None,
) -> GenerationResult:
    """Speculative decoding of a batch of prompts (ids, validated by the caller).

    Parameters
    ----------
    drafter : Drafter
        Used by this call alone while it runs (it holds the call's state): another call given the
        same object at the same time gets a ``RuntimeError``.
    max_draft : int
        At most this many draft tokens per sample and step (and never more than what is left of
        ``max_new_tokens``: :func:`speculative_sizes`, which also sizes the cache).
    layout : {"ems", "vanilla"}
        Each step is a :func:`packed_step` (EMS-SD) or a :func:`padded_step` (vanilla).
    budget : DraftBudget or None
        Caps the verified draft tokens per step (None: verify whatever the drafter proposes).
        Used by this call alone, as ``drafter`` is; its per-call state is reset when the call
        begins (:meth:`~decoding.cost_model.DraftBudget.begin`).
    references : list of token arrays, optional
        Per-sample reference texts for the drafter (LLMA).
    noise : TokenNoise
        The uniforms of sampled tokens (unused when greedy).
    verifier : callable, optional
        Replaces the acceptance rule (tests use it to check that a wrong rule is detected).
    max_batch : int, optional
        At most this many samples decode at once; a finished sample's cache region goes to the
        next waiting prompt (continuous batching, ``"ems"`` only: the padded layout keeps every
        cache aligned from the first prefill on). While prompts wait, the budget maximises this
        step's tokens per second (every token is worth the same); once none waits, it minimises
        the time to finish the samples left.

    Returns
    -------
    GenerationResult
        With ``method`` the layout, and the speculative statistics (mean accepted draft tokens
        per sample and step, target forwards, tokens computed per forward, padding fraction:
        :class:`SpeculativeStats`).

    Examples
    --------
    >>> from decoding.drafters import LLMADrafter
    >>> ids = [tok.encode("Repeat: the cat sat on the mat. Again: the cat")]  # doctest: +SKIP
    >>> res = speculative_generate(model, tok, ids, max_new_tokens=16, sampling=SamplingParams(),
    ...     stop=[], noise=TokenNoise(0), drafter=LLMADrafter())  # doctest: +SKIP
    >>> round(res.stats["mean_accepted"], 2)  # accepted draft tokens per sample and step  # doctest: +SKIP
    0.15
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    vanilla, B = layout == "vanilla", len(prompt_ids)
    verify = verifier or (verify_greedy if sampling.greedy else verify_sampling)
    queue = SlotQueue(B, check_max_batch(max_batch, n_prompts=B, padded=vanilla))
    prompts = [np.asarray(p, dtype=np.int64) for p in prompt_ids]
    npos = np.array([p.size for p in prompts], dtype=np.int64)  # real tokens cached (prompt + accepted)
    lens = npos.tolist()
    sizes = dict(max_new_tokens=max_new_tokens, max_draft=max_draft, layout=layout, slots=queue.slots)
    k, cap = speculative_sizes(lens, **sizes)  # the draft length that can be used, the cache it needs
    parts = speculative_memory(model, lens, **sizes, sampled=not sampling.greedy, drafter=drafter)
    check_memory(parts, _what(B, queue.slots, max_new_tokens, max_draft, layout))
    cache = model.new_cache(max_seqs=queue.slots, capacity=cap)
    seq = np.full(B, -1, dtype=np.int64)
    key_valid = np.ones((B, cap), dtype=bool) if vanilla else None
    outs = Outputs(tokenizer, B, stop=stop, eos_ids=eos_ids, max_new_tokens=max_new_tokens, stream=stream)
    stats = SpeculativeStats.for_samples(B)
    drafter.begin(prompts, references, sampling, noise, max_new_tokens=max_new_tokens, max_active=queue.slots)
    if budget is not None:  # a budget reused from an earlier call starts this one afresh
        budget.begin()
    budget_counts = (budget.remeasured, budget.rescaled) if budget is not None else (0, 0)  # before the call

    context = _Contexts(prompts, outs.tokens, max_new_tokens)

    def finished(i: int, tokens) -> bool:
        """Emit sample ``i``'s new tokens; when it finished, free its cache region and its drafter."""
        if not outs.emit(i, tokens):
            return False
        cache.release(int(seq[i]))
        drafter.end(i)
        context.drop(i)
        return True

    def start(new, logits) -> list[int]:
        """Emit the first token of each newly prefilled sample; those still going."""
        first = sample(logits, sampling, noise, new, [0] * len(new))
        return [i for j, i in enumerate(new) if not finished(i, [int(first[j])])]

    forward = partial(padded_step, key_valid=key_valid) if vanilla else packed_step
    verify_step = partial(_verify_step, forward=forward, verify=verify)
    with engine_threads() as threads:  # numba threads for the cores other processes leave free
        # the first prefill too (on the policy's carried-over choice), as autoregressive decoding's:
        # outside it, two threads beside a busy neighbour took 2.1 s where one took 0.09 s
        if vanilla:
            admitted, logits = _padded_prefill(model, cache, queue, seq, prompts, key_valid)
        else:
            admitted, logits = queue.admit(model, cache, seq, prompt_ids)  # [slots, V]
        prefill_time, step_times, calibration = queue.prefill_time, [], 0.0
        decode_start = time.perf_counter()
        active = start(admitted, logits)
        while not active and queue:  # every admitted sample finished at its first token
            active = start(*queue.admit(model, cache, seq, prompt_ids))
        while active:
            t_step = time.perf_counter()
            threads.update()
            drafts = _step_drafts(
                drafter, budget, context, active, outs, max_new_tokens, max_draft=k, padded=vanilla,
                waiting=bool(queue), stats=stats, vocab_size=model.config.vocab_size,
            )  # fmt: skip
            plain = not vanilla and verifier is None and not drafts.drafted  # the autoregressive step
            step = _autoregressive_step if plain else verify_step
            results = step(model, cache, seq, npos, outs.tokens, active, drafts, sampling, noise, stats)
            if budget is not None:  # a pause to re-measure the cost model is not decoding
                paused = _teach_budget(budget, drafts, active, results, stats, t_step)
                calibration, t_step = calibration + paused, t_step + paused
            active = [i for i, (_, new) in zip(active, results, strict=True) if not finished(i, new)]
            step_times.append(time.perf_counter() - t_step)
            while queue and int((~cache.in_use).sum()):  # refill the freed slots (continuous batching)
                joined = start(*queue.admit(model, cache, seq, prompt_ids))
                if joined and budget is not None:
                    budget.sample_joined()
                active += joined
    decode_time = time.perf_counter() - decode_start - (queue.prefill_time - prefill_time) - calibration
    res = outs.result(prompt_ids, queue, decode_time, step_times, method=layout)
    res.stats.update(
        drafter=drafter.name, max_draft=k, budget=budget is not None, max_batch=queue.slots,
        target_forwards=queue.prefill_forwards + stats.forwards, **stats.as_dict(),
        budget_remeasured=budget.remeasured - budget_counts[0] if budget is not None else 0,
        budget_rescaled=budget.rescaled - budget_counts[1] if budget is not None else 0,
        budget_calibration_s=calibration,
    )  # fmt: skip
    return res
