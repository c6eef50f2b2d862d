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

Verification: greedy (accept while the draft equals the target's argmax) or speculative sampling
(accept draft ``x`` with probability ``min(1, p(x) / q(x))``, else draw from the normalised
``max(0, p - q)``; after a fully accepted draft draw the bonus token from ``p``), which leaves the
output distribution exactly the target's. Deterministic drafters have a one-hot ``q``.
"""

from __future__ import annotations

import time

import numpy as np

from .autoregressive import SlotQueue, StreamState, check_max_batch, emit_tokens
from .cost_model import CostModel, DraftBudget
from .drafters import Drafter, DraftModelDrafter, make_drafter
from .results import GenerationResult
from .sampling import SamplingParams, filtered_probs, sample

__all__ = ["speculative_generate", "prepare_speculative", "verify_greedy", "verify_sampling", "LAYOUTS"]

LAYOUTS = ("ems", "vanilla")
PAD_ID = 0  # token id fed at pad positions of the vanilla layout (their results are never used)


def verify_greedy(logits: np.ndarray, draft: np.ndarray, sampling=None, q=None, rng=None):
    """Greedy verification: ``(accepted draft count m, the m + 1 new tokens)``.

    ``logits`` ``[n + 1, V]`` are the target's logits after the last accepted token and after each
    draft token; the draft ``[n]`` is accepted while it equals the argmax.

    Examples
    --------
    >>> lg = np.eye(5)[[2, 3, 1]]  # the target would say 2, then 3, then 1
    >>> verify_greedy(lg, np.array([2, 4]))
    (1, [2, 3])
    """
    target = np.argmax(logits, axis=-1)  # [n + 1]
    n = draft.size
    mism = np.flatnonzero(target[:n] != draft)
    m = int(mism[0]) if mism.size else n
    return m, [int(t) for t in target[: m + 1]]


def _draw(p: np.ndarray, rng: np.random.Generator) -> int:
    cdf = np.cumsum(p)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), p.size - 1))


def verify_sampling(logits: np.ndarray, draft: np.ndarray, sampling: SamplingParams, q, rng):
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): ``(m, the m + 1 new tokens)``.

    ``q`` is ``[n, V]`` (the distributions the drafts were drawn from) or None for a
    deterministic drafter (one-hot at each draft token). Target probabilities are
    :func:`~decoding.sampling.filtered_probs` of ``logits`` with the same temperature, top-k, top-p.
    """
    p = filtered_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p)  # [n + 1, V]
    for j, x in enumerate(draft):
        x = int(x)
        qx = 1.0 if q is None else float(q[j, x])
        if qx > 0 and rng.random() < min(1.0, p[j, x] / qx):
            continue
        resid = p[j].copy()
        if q is None:
            resid[x] = 0.0
        else:
            resid = np.maximum(resid - q[j], 0.0)
        if resid.sum() <= 0:  # p == q numerically: acceptance was (almost) certain
            resid = p[j]
        return j, [int(t) for t in draft[:j]] + [_draw(resid, rng)]
    return draft.size, [int(t) for t in draft] + [_draw(p[draft.size], rng)]


def prepare_speculative(
    model, tokenizer, prompt_ids, *, drafter, max_draft, references, draft_budget, max_new_tokens
) -> dict:
    """Validate the speculative arguments of :func:`decoding.generate`; the keywords of the loop."""
    if isinstance(max_draft, bool) or not isinstance(max_draft, (int, np.integer)):
        raise TypeError(f"max_draft must be an integer, got {type(max_draft).__name__}")
    if max_draft < 0:
        raise ValueError(f"max_draft must be >= 0, got {max_draft}")
    d = make_drafter(drafter, model, max_draft=max(1, int(max_draft)))
    if isinstance(d, DraftModelDrafter) and d.model.config.vocab_size != model.config.vocab_size:
        raise ValueError(
            f"the draft model's vocabulary ({d.model.config.vocab_size}) differs from the target's "
            f"({model.config.vocab_size})"
        )
    refs = None
    if references is not None:
        if isinstance(references, str) or len(references) != len(prompt_ids):
            raise ValueError(f"references must be a list with one entry per prompt ({len(prompt_ids)})")
        refs = []
        for i, r in enumerate(references):
            if isinstance(r, str):
                refs.append(np.array(tokenizer.encode(r), dtype=np.int64))
            elif isinstance(r, (list, tuple, np.ndarray)):
                refs.append(np.asarray(r, dtype=np.int64).reshape(-1))
            else:
                raise TypeError(
                    f"references[{i}] must be a str or a list of token ids, got {type(r).__name__}"
                )
    if draft_budget is None:
        budget = None
    elif isinstance(draft_budget, DraftBudget):
        budget = draft_budget
    elif isinstance(draft_budget, CostModel) or (isinstance(draft_budget, str) and draft_budget == "auto"):
        target_cost = draft_budget if isinstance(draft_budget, CostModel) else CostModel.for_model(model)
        draft_cost = CostModel.for_model(d.model) if isinstance(d, DraftModelDrafter) else None
        budget = DraftBudget(target_cost, draft_cost)
    else:
        raise ValueError(
            f"draft_budget must be 'auto', None, a DraftBudget or a CostModel, got {draft_budget!r}"
        )
    return dict(drafter=d, max_draft=int(max_draft), references=refs, budget=budget)


def speculative_generate(
    model,
    tokenizer,
    prompt_ids: list[list[int]],
    *,
    max_new_tokens: int,
    sampling: SamplingParams,
    stop: list[str],
    rng: np.random.Generator,
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
    max_draft : int
        At most this many draft tokens per sample and step.
    layout : {"ems", "vanilla"}
    budget : DraftBudget or None
        Caps the verified draft tokens per step (None: verify whatever the drafter proposes).
    references : list of token arrays, optional
        Per-sample reference texts for the drafter (LLMA).
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
        per sample and step, target forwards, tokens computed per forward, padding fraction).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    vanilla = layout == "vanilla"
    verify = verifier or (verify_greedy if sampling.greedy else verify_sampling)
    B = len(prompt_ids)
    queue = SlotQueue(B, check_max_batch(max_batch, n_prompts=B, padded=vanilla))
    lens = np.array([len(p) for p in prompt_ids], dtype=np.int64)
    P = int(lens.max())
    k = int(max_draft)
    # vanilla's aligned cache can grow by up to k + 1 per step even for a sample that gains one token
    cap = P + max_new_tokens + k + 1 if not vanilla else P + max_new_tokens * (k + 1) + k + 1
    cache = model.new_cache(max_seqs=queue.slots, capacity=cap)
    seq = np.full(B, -1, dtype=np.int64)
    key_valid = np.ones((B, cap), dtype=bool) if vanilla else None
    eos = set(int(e) for e in eos_ids)
    out: list[list[int]] = [[] for _ in range(B)]
    states = [StreamState(tokenizer, stop) for _ in range(B)]
    reasons = ["length"] * B
    prompts_np = [np.asarray(p, dtype=np.int64) for p in prompt_ids]
    drafter.begin(
        prompts_np, references, sampling, rng, max_new_tokens=max_new_tokens, max_active=queue.slots
    )

    if vanilla:  # left-pad every prompt to the longest; pads are written to the cache and masked
        t0 = time.perf_counter()
        admitted = queue.take(cache, seq)  # every prompt (max_batch is not below B here)
        pads = P - lens
        toks = np.concatenate(
            [np.concatenate([np.full(n, PAD_ID), p]) for n, p in zip(pads, prompts_np, strict=True)]
        )
        pos = np.concatenate(
            [np.concatenate([np.zeros(n, np.int64), np.arange(m)]) for n, m in zip(pads, lens, strict=True)]
        )
        for b in range(B):
            key_valid[seq[b], : pads[b]] = False
        logits = model.forward(
            toks, cache=cache, seq_ids=seq, cu_seqlens=np.arange(B + 1) * P, positions=pos,
            logits="last", key_valid=key_valid,
        )  # fmt: skip
        queue.record(time.perf_counter() - t0)
    else:
        admitted, logits = queue.admit(model, cache, seq, prompt_ids)  # [slots, V]
    prefill_time = queue.prefill_time
    npos = lens.copy()  # real tokens cached per sample (prompt + accepted)

    def emit(i: int, toks: list[int]) -> bool:
        """Append accepted tokens of sample ``i``; True when it finished."""
        delta, reason = emit_tokens(out[i], states[i], toks, eos, max_new_tokens)
        if reason is not None:
            reasons[i] = reason
        if stream is not None and delta:
            stream(int(i), delta)
        return reason is not None

    step_times: list[float] = []
    n_forwards = 0  # verification forwards
    computed = 0  # tokens in the verification forwards (pads included)
    padded = 0  # of which pads
    accepted_sum = 0  # accepted draft tokens over sample-steps
    proposed_sum = 0  # draft tokens verified
    sample_steps = 0
    acc_n = np.zeros(B)  # per-sample accepted draft tokens (for the budget's estimates)
    rej_n = np.zeros(B)  # per-sample rejection events
    trimmed = 0  # draft tokens proposed but dropped by the budget
    shadow_checks = 0  # trimmed draft tokens checked against the target's token at no cost

    def start(new, logits) -> list[int]:
        """Emit the first token of each newly prefilled sample; those still going."""
        first = sample(logits, sampling, rng)
        going = []
        for j, i in enumerate(new):
            if emit(i, [int(first[j])]):
                cache.release(int(seq[i]))
                drafter.end(i)
            else:
                going.append(i)
        return going

    decode_start = time.perf_counter()
    active = start(admitted, logits)
    while not active and queue:  # every admitted sample finished at its first token
        active = start(*queue.admit(model, cache, seq, prompt_ids))
    while active:
        t_step = time.perf_counter()
        A = len(active)
        left = np.array([max_new_tokens - len(out[i]) for i in active], dtype=np.int64)
        room = np.minimum(k, left - 1)
        # pooled over every sample of the call, finished ones included: the prior of a sample with
        # little history (a newcomer under continuous batching) is the task's rate so far
        alphas = budget.alphas(acc_n, rej_n)[active] if budget is not None else None
        horizon = None if queue else left  # prompts waiting: this step's rate (see max_batch)
        contexts = [np.concatenate([prompts_np[i], np.asarray(out[i], dtype=np.int64)]) for i in active]
        if budget is not None and budget.draft_cost is not None:  # plan before drafting: it costs
            setup = drafter.pending(contexts, active) if hasattr(drafter, "pending") else None
            plan = budget.allocate(
                alphas, room, padded=vanilla, include_draft_cost=True, setup=setup, remaining=horizon
            )
            room = np.minimum(room, plan)
        drafts = drafter.propose(contexts, room, active)
        qprobs = drafter.proposal_probs
        drafts = [np.asarray(d, dtype=np.int64)[: room[j]] for j, d in enumerate(drafts)]
        n = np.array([d.size for d in drafts], dtype=np.int64)
        proposed = drafts  # before the budget trims: the trimmed tails still teach it (below)
        if budget is not None and n.sum():
            keep = budget.allocate(alphas, n, padded=vanilla, remaining=horizon)
            trimmed += int((n - keep).sum())
            drafts = [d[: keep[j]] for j, d in enumerate(drafts)]
            n = keep
        act = np.array(active, dtype=np.int64)
        last = [out[i][-1] for i in active]
        if vanilla:
            W = 1 + int(n.max())
            L = int(cache.lengths[seq[act[0]]])  # common (aligned) cache length
            toks = np.full((A, W), PAD_ID, dtype=np.int64)
            for j in range(A):
                toks[j, 0] = last[j]
                toks[j, 1 : 1 + n[j]] = drafts[j]
            pos = npos[act][:, None] + np.arange(W)[None, :]  # [A, W]; pads get harmless positions
            key_valid[seq[act], L : L + W] = np.arange(W)[None, :] < (1 + n)[:, None]
            logits = model.forward(
                toks.reshape(-1), cache=cache, seq_ids=seq[act], cu_seqlens=np.arange(A + 1) * W,
                positions=pos.reshape(-1), logits="all", key_valid=key_valid,
            )  # fmt: skip
            rows = [logits[j * W : j * W + 1 + n[j]] for j in range(A)]
            computed += A * W
            padded += A * W - int((1 + n).sum())
        else:
            counts = 1 + n
            cu = np.concatenate([[0], np.cumsum(counts)])
            toks = np.concatenate([np.concatenate([[last[j]], drafts[j]]) for j in range(A)])
            logits = model.forward(toks, cache=cache, seq_ids=seq[act], cu_seqlens=cu, logits="all")
            rows = [logits[cu[j] : cu[j + 1]] for j in range(A)]
            computed += int(counts.sum())
        n_forwards += 1

        results = []
        for j, i in enumerate(active):
            q = None if qprobs is None else qprobs[j][: n[j]]
            m, new = verify(rows[j], drafts[j], sampling, q, rng)
            results.append((m, new))
            accepted_sum += m
            proposed_sum += int(n[j])
            acc_n[i] += m
            rej_n[i] += int(m < n[j])
            if m == n[j] and proposed[j].size > m and qprobs is None:
                # A shadow check, free: the token the target chose after the last verified draft
                # token is the one the first trimmed draft token would have been checked against
                # (for a deterministic drafter, accepted iff equal, greedy or sampled). Without it
                # a sample the budget never drafts for never shows that its drafts would pay.
                hit = new[-1] == int(proposed[j][m])
                acc_n[i] += hit
                rej_n[i] += not hit
                shadow_checks += 1
        sample_steps += A
        ms = np.array([m for m, _ in results], dtype=np.int64)
        if vanilla:
            K = 1 + int(ms.max())  # every sample's cache grows by the longest accepted count
            for j in range(A):
                s = int(seq[act[j]])
                key_valid[s, L + 1 + ms[j] : L + K] = False  # rejected drafts and pads stay as pads
                cache.truncate(s, L + K)
        else:
            for j in range(A):
                s = int(seq[act[j]])
                cache.truncate(s, int(npos[act[j]]) + 1 + int(ms[j]))
        npos[act] += 1 + ms
        still = []
        for j, i in enumerate(active):
            if emit(i, results[j][1]):
                cache.release(int(seq[i]))
                drafter.end(i)
            else:
                still.append(i)
        step_times.append(time.perf_counter() - t_step)
        active = still
        while queue and int((~cache.in_use).sum()):  # refill the freed slots (continuous batching)
            active += start(*queue.admit(model, cache, seq, prompt_ids))
    decode_time = time.perf_counter() - decode_start - (queue.prefill_time - prefill_time)

    res = GenerationResult(
        tokens=out,
        texts=[s.text for s in states],
        prompt_tokens=[list(map(int, p)) for p in prompt_ids],
        finish_reasons=reasons,
        prefill_time=queue.prefill_time,
        decode_time=decode_time,
        step_times=step_times,
        method=layout,
    )
    res.stats.update(
        drafter=getattr(drafter, "name", type(drafter).__name__),
        max_draft=k,
        budget=budget is not None,
        target_forwards=queue.prefill_forwards + n_forwards,
        verify_forwards=n_forwards,
        max_batch=queue.slots,
        sample_steps=sample_steps,
        mean_accepted=accepted_sum / sample_steps if sample_steps else float("nan"),
        draft_tokens=proposed_sum,
        accepted_tokens=accepted_sum,
        acceptance_rate=accepted_sum / proposed_sum if proposed_sum else float("nan"),
        tokens_per_forward=computed / n_forwards if n_forwards else float("nan"),
        padding_fraction=padded / computed if computed else 0.0,
        budget_trimmed=trimmed,
        budget_shadow_checks=shadow_checks,
    )
    return res
