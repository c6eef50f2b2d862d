"""Drafters for speculative decoding: LLMA copy-from-reference, prompt lookup, and a draft model.

One small interface, the abstract :class:`Drafter` (after vLLM's ``SpeculativeProposer``). The
speculative loop calls

- ``begin(prompts, references, sampling, noise, max_new_tokens, max_active)`` once per ``generate``
  call (``prompts`` are the prompt ids of every sample, ``references`` one token array per sample
  or None, ``max_active`` how many samples at most run at once: fewer than the prompts under
  continuous batching);
- ``pending(contexts, samples)`` before drafting, when the draft budget counts the drafter's
  cost: the tokens each sample's drafter must feed before its first draft token (None: drafting
  is free, the default);
- ``propose(contexts, max_lens, samples)`` once per step: ``contexts[j]`` is the whole token
  history (prompt and generated tokens) of sample ``samples[j]``; the answer is a
  :class:`Proposal` (after vLLM's ``SpeculativeProposals``) of one int array per sample of at
  most ``max_lens[j]`` draft tokens (possibly empty, lengths may differ; a draft token is accepted
  where it equals the target's own token, greedy or sampled, so no distributions are needed);
- ``end(sample)`` when a sample finishes.

A drafter never needs an explicit rollback hook here: the draft model compares the context it is
given with what its own cache holds and truncates to their common prefix (rejected drafts simply
fall off), so accepting and rolling back are the same operation.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rsketch._validation import check_int

from ._xp import to_host
from .kv_cache import KVCache
from .loading import load_model
from .model import Model, PackedBatch
from .sampling import SamplingParams, TokenNoise, filtered_probs, inverse_cdf
from .scheduling import PREFILL_TOKENS, prefill

__all__ = [
    "Proposal",
    "Drafter",
    "LLMADrafter",
    "PromptLookupDrafter",
    "DraftModelDrafter",
    "make_drafter",
    "DRAFTERS",
]

#: The drafter names :func:`make_drafter` (and ``generate(drafter=...)``) takes.
DRAFTERS = ("llma", "prompt_lookup", "draft_model")


@dataclass(frozen=True)
class Proposal:
    """What a :class:`Drafter` proposes in one step, one entry per sample asked.

    Attributes
    ----------
    tokens : list of int arrays
        The draft of each sample (possibly empty; lengths may differ).

    Examples
    --------
    >>> p = Proposal([np.array([4, 5]), np.array([], dtype=np.int64)])
    >>> p.lengths.tolist()
    [2, 0]
    """

    tokens: list

    @property
    def lengths(self) -> np.ndarray:
        """Draft tokens per sample, ``[len(tokens)]``."""
        return np.array([len(t) for t in self.tokens], dtype=np.int64)


class Drafter(abc.ABC):
    """Proposes draft tokens for the samples of a speculative batch (see the module docstring).

    Subclasses implement :meth:`propose`; :meth:`begin`, :meth:`pending` and :meth:`end` are
    hooks with defaults (nothing to set up, drafting costs nothing, nothing to free).

    Attributes
    ----------
    name : str
        Shown as ``GenerationResult.stats["drafter"]``.

    Examples
    --------
    >>> class RepeatLast(Drafter):  # proposes the last token again, as often as allowed
    ...     name = "repeat"
    ...     def propose(self, contexts, max_lens, samples):
    ...         return Proposal([np.repeat(c[-1:], k) for c, k in zip(contexts, max_lens)])
    >>> RepeatLast().propose([np.array([1, 2]), np.array([3])], [3, 1], [0, 1]).tokens
    [array([2, 2, 2]), array([3])]
    """

    name = "drafter"

    def begin(  # noqa: B027 (a hook: nothing to set up by default)
        self,
        prompts,
        references=None,
        sampling: SamplingParams | None = None,
        noise=None,
        max_new_tokens=512,
        max_active=None,
    ) -> None:
        """Start a ``generate`` call over ``prompts`` (one token array per sample)."""

    def pending(self, contexts: Sequence[np.ndarray], samples: Sequence[int]) -> np.ndarray | None:
        """Tokens each sample's drafter must feed before its first draft token; None: none (free)."""
        return None

    def memory_bytes(
        self, prompt_lengths, *, max_new_tokens: int, max_active: int, max_draft: int, sampled: bool
    ) -> int:
        """Bytes :meth:`begin` and :meth:`propose` will allocate for such a call (default 0).

        The speculative loop adds them to its own estimate before allocating anything, so that
        a call which cannot fit fails at once with ``MemoryError``.
        """
        return 0

    @abc.abstractmethod
    def propose(
        self, contexts: Sequence[np.ndarray], max_lens: Sequence[int], samples: Sequence[int]
    ) -> Proposal:
        """Drafts of at most ``max_lens[j]`` tokens after ``contexts[j]``, sample ``samples[j]``."""

    def end(self, sample: int) -> None:  # noqa: B027 (a hook: nothing to free by default)
        """Sample ``sample`` finished (free what it holds)."""


def _match_and_copy(ref: np.ndarray, key: np.ndarray, limit: int, copy_len: int, prefer_from: int):
    """Find ``key`` in ``ref[:limit]`` and return ``(start of the copy, copied tokens)`` or ``(-1, [])``.

    Among the matches, the first whose copy starts at or after ``prefer_from`` wins (a reference
    being copied in order keeps its place); otherwise the last match.
    """
    n = key.size
    if limit - n < 1:
        return -1, ref[:0]
    # windows ref[j : j + n] == key for j + n < limit (something must follow the match)
    hit = np.ones(limit - n, dtype=bool)
    for t in range(n):
        hit &= ref[t : limit - n + t] == key[t]
    js = np.flatnonzero(hit)
    if js.size == 0:
        return -1, ref[:0]
    after = js[js + n >= prefer_from]
    j = int(after[0]) if after.size else int(js[-1])
    a = j + n
    return a, ref[a : min(a + copy_len, limit)]


class LLMADrafter(Drafter):
    """LLMA (Yang et al. 2023, "Inference with reference"): copy from a per-sample reference text.

    The last ``match_len`` tokens of the context are looked up in the sample's reference; on a
    match the next ``copy_len`` reference tokens are the draft, otherwise the draft is empty. The
    paper's setting is ``match_len=2, copy_len=7``. Without references, the prompt is the reference.

    Examples
    --------
    >>> d = LLMADrafter(match_len=2, copy_len=3)
    >>> d.begin([np.array([9])], references=[np.array([1, 2, 3, 4, 5, 6])])
    >>> [x.tolist() for x in d.propose([np.array([9, 7, 2, 3])], [7], [0]).tokens]
    [[4, 5, 6]]
    """

    name = "llma"

    def __init__(self, match_len: int = 2, copy_len: int = 7):
        self.match_len = check_int(match_len, "match_len", minimum=1)
        self.copy_len = check_int(copy_len, "copy_len", minimum=1)

    def begin(
        self, prompts, references=None, sampling=None, noise=None, max_new_tokens=512, max_active=None
    ) -> None:
        if references is None:
            references = prompts
        if len(references) != len(prompts):
            raise ValueError(
                f"references must have one entry per prompt ({len(prompts)}), got {len(references)}"
            )
        self._refs = [np.asarray(r, dtype=np.int64).reshape(-1) for r in references]
        self._cursor = [0] * len(prompts)  # where the last copy of each sample ended

    def _reference(self, sample: int, context: np.ndarray) -> tuple[np.ndarray, int]:
        ref = self._refs[sample]
        return ref, ref.size

    def propose(self, contexts, max_lens, samples):
        out = []
        for ctx, k, s in zip(contexts, max_lens, samples, strict=True):
            k = min(int(k), self.copy_len)
            ctx = np.asarray(ctx, dtype=np.int64)
            if k <= 0 or ctx.size < self.match_len:
                out.append(np.zeros(0, dtype=np.int64))
                continue
            ref, limit = self._reference(s, ctx)
            a, draft = _match_and_copy(ref, ctx[-self.match_len :], limit, k, self._cursor[s])
            if a >= 0:
                self._cursor[s] = a + 1
            out.append(np.array(draft, dtype=np.int64))
        return Proposal(out)


class PromptLookupDrafter(LLMADrafter):
    """Prompt lookup: LLMA with the sample's own context (prompt and generated text) as reference.

    The match must end before the context's last token, so it is an earlier occurrence.

    Examples
    --------
    >>> d = PromptLookupDrafter(match_len=2, copy_len=2)
    >>> d.begin([np.array([1, 2, 3, 4])])
    >>> [x.tolist() for x in d.propose([np.array([1, 2, 3, 4, 9, 1, 2])], [5], [0]).tokens]
    [[3, 4]]
    """

    name = "prompt_lookup"

    def begin(
        self, prompts, references=None, sampling=None, noise=None, max_new_tokens=512, max_active=None
    ) -> None:
        self._cursor = [0] * len(prompts)

    def _reference(self, sample, context):
        return context, context.size - 1  # the trailing key itself is not a match


class DraftModelDrafter(Drafter):
    """A second (smaller) model drafts greedily, or by sampling when the target samples, for k steps.

    It keeps its own unpadded :class:`~decoding.kv_cache.KVCache`, one region per sample in
    flight (``max_active`` regions; a sample takes one at its first proposal and gives it back at
    its end, so continuous batching over many prompts needs no more). Each
    ``propose`` first truncates every sample's draft cache to the longest common prefix of what
    it holds and the new context (this is the rollback of rejected drafts), then feeds the
    missing context tokens of all drafting samples in one packed forward, then one token per
    sample per step.

    Parameters
    ----------
    model : Model or str or path
        The draft model (for example ``target.truncated(8)``, a self-speculative drafter), or a
        GGUF path loaded with :func:`decoding.load_model`; it must share the target's vocabulary.
    max_draft : int
        Upper bound of the steps per proposal (the loop's ``max_draft`` caps it further).

    Examples
    --------
    >>> d = DraftModelDrafter(target.truncated(8), max_draft=4)  # doctest: +SKIP
    >>> d.begin([np.array(tok.encode("Hi"))])  # doctest: +SKIP
    >>> d.propose([np.array(tok.encode("Hi"))], [4], [0]).lengths.tolist()  # doctest: +SKIP
    [4]
    """

    name = "draft_model"

    def __init__(self, model, max_draft: int = 4):
        max_draft = check_int(max_draft, "max_draft", minimum=1)  # before a model is loaded for nothing
        if not isinstance(model, (Model, str, os.PathLike)):
            raise TypeError(
                f"model must be a Model, a model name or a GGUF path, got {type(model).__name__} {model!r}"
            )
        if not isinstance(model, Model):
            model = load_model(model).model
        self.model, self.max_draft = model, max_draft

    def begin(
        self, prompts, references=None, sampling=None, noise=None, max_new_tokens=512, max_active=None
    ) -> None:
        self._sampling = sampling or SamplingParams()
        # sampled, a draft token is drawn at the uniform its position's target token will be drawn
        # at (verify_sampling): where the two distributions agree, so do the tokens
        self._noise = noise if noise is not None else TokenNoise(0)
        self._prompt_lens = [len(p) for p in prompts]
        # contexts plus drafts never pass max_new_tokens after the prompt (the loop cuts every
        # draft to what is left of max_new_tokens), so that is all the cache holds
        cap = self._capacity_for(max(len(p) for p in prompts), max_new_tokens)
        self._capacity = cap
        # one cache region per sample in flight, taken at its first proposal, given back at its end
        slots = len(prompts) if max_active is None else min(int(max_active), len(prompts))
        self._cache = self.model.new_cache(max_seqs=max(slots, 1), capacity=cap)
        self._seq: dict[int, int] = {}  # sample -> its cache region
        self._held: dict[int, np.ndarray] = {}  # sample -> the tokens its region holds

    @staticmethod
    def _capacity_for(longest: int, max_new_tokens: int) -> int:
        return int(longest) + int(max_new_tokens)

    def memory_bytes(self, prompt_lengths, *, max_new_tokens, max_active, max_draft, sampled) -> int:
        """The draft cache, the catch-up prefill, a step's logits and, when sampling, the draft
        distributions kept for verification (``max_active x max_draft`` rows of the vocabulary).

        Examples
        --------
        >>> d = DraftModelDrafter(target.truncated(7))  # doctest: +SKIP
        >>> kw = dict(max_new_tokens=64, max_active=4, max_draft=7, sampled=False)
        >>> d.memory_bytes([20] * 4, **kw) > 0  # doctest: +SKIP
        True
        """
        m, cfg = self.model, self.model.config
        lens = sorted(int(n) for n in prompt_lengths)[-max_active:]
        cap = self._capacity_for(max(lens), max_new_tokens)
        cache = KVCache.bytes_for(m.n_layers, cfg.n_kv_heads, cfg.head_dim, max_active, cap, m.kv_dtype)
        feed = m.forward_bytes(min(PREFILL_TOKENS, sum(lens)), keys=cap, logits_rows=max_active)
        probs = 64 * cfg.vocab_size * max_active if sampled else 0  # a step's filtered_probs temporaries
        return cache + feed + 2 * max_active * cfg.vocab_size * m.dtype.itemsize + probs

    def _region(self, sample: int) -> int:
        if sample not in self._seq:
            self._seq[sample] = self._cache.allocate()
            self._held[sample] = np.zeros(0, dtype=np.int64)
        return self._seq[sample]

    def _kept(self, sample: int, ctx) -> int:
        """How much of ``ctx`` the sample's draft cache holds (always feed the last context token)."""
        held = self._held.get(sample, np.zeros(0, dtype=np.int64))
        m = min(held.size, len(ctx) - 1)
        neq = np.flatnonzero(held[:m] != np.asarray(ctx[:m]))
        return int(neq[0]) if neq.size else m

    def pending(self, contexts, samples) -> np.ndarray:
        """Tokens each sample's draft cache lacks of its context (what a proposal must feed first)."""
        return np.array([len(c) - self._kept(s, c) for c, s in zip(contexts, samples, strict=True)], np.int64)

    def end(self, sample: int) -> None:
        if sample in self._seq:
            self._cache.release(self._seq.pop(sample))
            del self._held[sample]

    def _draw(self, logits, samples, positions):
        """Next draft token of each row ``[n]`` (row ``r``: sample ``samples[r]`` at ``positions[r]``)."""
        if self._sampling.greedy:
            return np.argmax(logits, axis=-1)
        sp = self._sampling
        q = filtered_probs(logits, sp.temperature, sp.top_k, sp.top_p)  # [n, V]
        return inverse_cdf(q, self._noise.uniforms(samples, positions))

    def propose(self, contexts, max_lens, samples) -> Proposal:
        out = [np.zeros(0, dtype=np.int64) for _ in contexts]
        steps = [min(int(k), self.max_draft) for k in max_lens]
        js = [j for j in range(len(contexts)) if steps[j] > 0]  # the samples drafting
        if not js:
            return Proposal(out)
        feeds = []  # roll each draft cache back to what it shares with the context, feed the rest
        for j in js:
            s, ctx = samples[j], np.asarray(contexts[j], dtype=np.int64)
            self._region(s)
            lcp = self._kept(s, ctx)
            self._cache.truncate(self._seq[s], lcp)
            feeds.append(ctx[lcp:])
            self._held[s] = ctx
        live = list(range(len(js)))  # indices into js still drafting
        drafts = [[] for _ in js]
        # the first draft token's position: the tokens the sample has generated
        first = [len(contexts[j]) - self._prompt_lens[samples[j]] for j in js]
        for step in range(max(steps)):
            seq_ids = [self._seq[samples[js[t]]] for t in live]
            if step == 0:  # the catch-up (whole prompts at first) in forwards of bounded size
                logits = prefill(self.model, self._cache, seq_ids, feeds)  # [len(live), V]
            else:
                batch = PackedBatch.from_lists([drafts[t][-1:] for t in live], seq_ids=seq_ids)
                logits = to_host(
                    self.model.forward(batch, cache=self._cache, logits="last")
                )  # [len(live), V]
            nxt = self._draw(logits, [samples[js[t]] for t in live], [first[t] + step for t in live])
            for r, t in enumerate(live):
                drafts[t].append(int(nxt[r]))
            live = [t for t in live if len(drafts[t]) < steps[js[t]]]
            if not live:
                break
        for t, j in enumerate(js):
            out[j] = np.array(drafts[t], dtype=np.int64)
            # the cache now holds the context plus all drafts but the last
            self._held[samples[j]] = np.concatenate([self._held[samples[j]], out[j][:-1]])
        return Proposal(out)


def make_drafter(drafter, target=None, *, max_draft: int = 7) -> Drafter:
    """A :class:`Drafter` from a name (``"llma"``, ``"prompt_lookup"``, ``"draft_model"``) or itself.

    ``"draft_model"`` is the self-speculative ``target.truncated(n_layers // 4)`` (at least one layer).

    Examples
    --------
    >>> make_drafter("llma", max_draft=3).copy_len
    3
    >>> make_drafter("draft_model", target, max_draft=3).model.n_layers  # doctest: +SKIP
    7
    """
    if isinstance(drafter, Drafter):
        return drafter
    check_int(max_draft, "max_draft")  # an int (2.7 would draft 2); below 1, drafts of 1
    if drafter == "llma":
        return LLMADrafter(copy_len=max(1, max_draft))
    if drafter == "prompt_lookup":
        return PromptLookupDrafter(copy_len=max(1, max_draft))
    if drafter == "draft_model":
        if target is None:
            raise ValueError("drafter='draft_model' needs the target model (to truncate it)")
        return DraftModelDrafter(target.truncated(max(1, target.n_layers // 4)), max_draft=max(1, max_draft))
    raise ValueError(
        f"drafter must be 'llma', 'prompt_lookup', 'draft_model' or a Drafter object, got {drafter!r}"
    )
