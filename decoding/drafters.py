"""Drafters for speculative decoding: LLMA copy-from-reference, prompt lookup, and a draft model.

One small interface, :class:`Drafter`. The speculative loop calls

- ``begin(prompts, references, sampling, rng, max_new_tokens, max_active)`` once per ``generate``
  call (``prompts`` are the prompt ids of every sample, ``references`` one token array per sample
  or None, ``max_active`` how many samples at most run at once: fewer than the prompts under
  continuous batching);
- ``propose(contexts, max_lens, samples)`` once per step: ``contexts[j]`` is the whole token
  history (prompt and generated tokens) of sample ``samples[j]``; the answer is one int array per
  sample of at most ``max_lens[j]`` draft tokens (possibly empty, lengths may differ);
- ``proposal_probs`` after ``propose``: None for deterministic drafters (a one-hot proposal
  distribution, which is what speculative sampling then assumes), else one ``[n_j, V]`` array of
  the distributions the drafts were drawn from;
- ``end(sample)`` when a sample finishes.

A drafter never needs an explicit rollback hook here: the draft model compares the context it is
given with what its own cache holds and truncates to their common prefix (rejected drafts simply
fall off), so accepting and rolling back are the same operation.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .sampling import SamplingParams, filtered_probs

__all__ = ["Drafter", "LLMADrafter", "PromptLookupDrafter", "DraftModelDrafter", "make_drafter"]


class Drafter:
    """Base class: proposes nothing (speculative decoding then degenerates to autoregressive)."""

    name = "none"

    def begin(
        self,
        prompts,
        references=None,
        sampling: SamplingParams | None = None,
        rng=None,
        max_new_tokens=512,
        max_active=None,
    ) -> None:
        self.proposal_probs = None

    def propose(self, contexts: Sequence[np.ndarray], max_lens: Sequence[int], samples: Sequence[int]):
        return [np.zeros(0, dtype=np.int64) for _ in contexts]

    def end(self, sample: int) -> None:
        pass


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
    >>> [x.tolist() for x in d.propose([np.array([9, 7, 2, 3])], [7], [0])]
    [[4, 5, 6]]
    """

    name = "llma"

    def __init__(self, match_len: int = 2, copy_len: int = 7):
        if match_len < 1:
            raise ValueError(f"match_len must be >= 1, got {match_len}")
        if copy_len < 1:
            raise ValueError(f"copy_len must be >= 1, got {copy_len}")
        self.match_len, self.copy_len = int(match_len), int(copy_len)

    def begin(
        self, prompts, references=None, sampling=None, rng=None, max_new_tokens=512, max_active=None
    ) -> None:
        self.proposal_probs = None
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
        return out


class PromptLookupDrafter(LLMADrafter):
    """Prompt lookup: LLMA with the sample's own context (prompt and generated text) as reference.

    The match must end before the context's last token, so it is an earlier occurrence.

    Examples
    --------
    >>> d = PromptLookupDrafter(match_len=2, copy_len=2)
    >>> d.begin([np.array([1, 2, 3, 4])])
    >>> [x.tolist() for x in d.propose([np.array([1, 2, 3, 4, 9, 1, 2])], [5], [0])]
    [[3, 4]]
    """

    name = "prompt_lookup"

    def begin(
        self, prompts, references=None, sampling=None, rng=None, max_new_tokens=512, max_active=None
    ) -> None:
        self.proposal_probs = None
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
    """

    name = "draft_model"

    def __init__(self, model, max_draft: int = 4):
        from .model import Model

        if not isinstance(model, Model):
            from .api import load_model

            model = load_model(model).model
        if max_draft < 1:
            raise ValueError(f"max_draft must be >= 1, got {max_draft}")
        self.model, self.max_draft = model, int(max_draft)

    def begin(
        self, prompts, references=None, sampling=None, rng=None, max_new_tokens=512, max_active=None
    ) -> None:
        self.proposal_probs = None
        self._sampling = sampling or SamplingParams()
        self._rng = rng if rng is not None else np.random.default_rng(0)
        cap = max(len(p) for p in prompts) + int(max_new_tokens) + self.max_draft + 1
        self._capacity = cap
        # one cache region per sample in flight, taken at its first proposal, given back at its end
        slots = len(prompts) if max_active is None else min(int(max_active), len(prompts))
        self._cache = self.model.new_cache(max_seqs=max(slots, 1), capacity=cap)
        self._seq: dict[int, int] = {}  # sample -> its cache region
        self._held: dict[int, np.ndarray] = {}  # sample -> the tokens its region holds

    def _region(self, sample: int) -> int:
        if sample not in self._seq:
            self._seq[sample] = self._cache.allocate()
            self._held[sample] = np.zeros(0, dtype=np.int64)
        return self._seq[sample]

    def pending(self, contexts, samples) -> np.ndarray:
        """Tokens each sample's draft cache lacks of its context (what a proposal must feed first)."""
        out = np.empty(len(contexts), dtype=np.int64)
        for j, (ctx, s) in enumerate(zip(contexts, samples, strict=True)):
            held = self._held.get(s, np.zeros(0, dtype=np.int64))
            m = min(held.size, len(ctx) - 1)
            neq = np.flatnonzero(held[:m] != np.asarray(ctx[:m]))
            out[j] = len(ctx) - (int(neq[0]) if neq.size else m)
        return out

    def end(self, sample: int) -> None:
        if sample in self._seq:
            self._cache.release(self._seq.pop(sample))
            del self._held[sample]

    def propose(self, contexts, max_lens, samples):
        n_out = len(contexts)
        out = [np.zeros(0, dtype=np.int64) for _ in range(n_out)]
        probs: list = [None] * n_out
        js = [j for j in range(n_out) if min(int(max_lens[j]), self.max_draft) > 0]
        if not js:
            self.proposal_probs = None if self._sampling.greedy else [np.zeros((0, 0))] * n_out
            return out
        feeds = []
        for j in js:
            s, ctx = samples[j], np.asarray(contexts[j], dtype=np.int64)
            self._region(s)
            held = self._held[s]
            m = min(held.size, ctx.size - 1)  # always feed at least the last context token
            neq = np.flatnonzero(held[:m] != ctx[:m])
            lcp = int(neq[0]) if neq.size else m
            self._cache.truncate(self._seq[s], lcp)
            feeds.append(ctx[lcp:])
            self._held[s] = ctx
        steps = np.array([min(int(max_lens[j]), self.max_draft) for j in js])
        live = list(range(len(js)))  # indices into js still drafting
        drafts = [[] for _ in js]
        qs = [[] for _ in js]
        for step in range(int(steps.max())):
            seq_ids = np.array([self._seq[samples[js[t]]] for t in live])
            if step == 0:
                toks = [feeds[t] for t in live]
            else:
                toks = [np.array([drafts[t][-1]]) for t in live]
            counts = np.array([len(x) for x in toks])
            logits = self.model.forward(
                np.concatenate(toks),
                cache=self._cache,
                seq_ids=seq_ids,
                cu_seqlens=np.concatenate([[0], np.cumsum(counts)]),
                logits="last",
            )  # [len(live), V]
            if self._sampling.greedy:
                nxt = np.argmax(logits, axis=-1)
            else:
                sp = self._sampling
                q = filtered_probs(logits, sp.temperature, sp.top_k, sp.top_p)  # [len(live), V]
                u = self._rng.random(q.shape[0])[:, None]
                cdf = np.cumsum(q, axis=-1)
                nxt = np.minimum((cdf < u * cdf[:, -1:]).sum(axis=-1), q.shape[1] - 1)
            for r, t in enumerate(live):
                drafts[t].append(int(nxt[r]))
                if not self._sampling.greedy:
                    qs[t].append(q[r])
            live = [t for t in live if len(drafts[t]) < steps[t]]
            if not live:
                break
        for t, j in enumerate(js):
            s = samples[j]
            d = np.array(drafts[t], dtype=np.int64)
            out[j] = d
            # the cache now holds the context plus all drafts but the last
            self._held[s] = np.concatenate([self._held[s], d[:-1]])
            if not self._sampling.greedy:
                probs[j] = np.array(qs[t])
        if self._sampling.greedy:
            self.proposal_probs = None
        else:
            V = self.model.config.vocab_size
            self.proposal_probs = [p if p is not None else np.zeros((0, V)) for p in probs]
        return out


def make_drafter(drafter, target=None, *, max_draft: int = 7) -> Drafter:
    """A :class:`Drafter` from a name (``"llma"``, ``"prompt_lookup"``, ``"draft_model"``) or itself.

    ``"draft_model"`` is the self-speculative ``target.truncated(n_layers // 4)`` (at least one layer).
    """
    if isinstance(drafter, Drafter):
        return drafter
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
