"""Batched autoregressive decoding: prefill every prompt in one packed forward, then one token per step.

Finished sequences (EOS, a stop string, or ``max_new_tokens``) leave the packed batch at once, so
later steps only run the sequences still going, and their cache regions are released. With
``max_batch`` (continuous batching) a released region goes at once to the next waiting prompt.
"""

from __future__ import annotations

import time

import numpy as np

from ._xp import to_host
from .results import GenerationResult
from .sampling import SamplingParams, sample

__all__ = ["autoregressive_generate", "StreamState", "SlotQueue", "check_max_batch"]


class StreamState:
    """Per-sequence incremental detokenization with stop strings.

    Decodes the whole generated id list each step (simple and exact for byte-level BPE), holds
    back an incomplete UTF-8 character and any tail that could still begin a stop string, and
    reports the new text since the last call.
    """

    def __init__(self, tokenizer, stop: list[str]):
        self.tokenizer = tokenizer
        self.stop = stop
        self.emitted = 0  # characters of text already reported
        self.text = ""
        self.stopped = False

    def update(self, ids: list[int]) -> str:
        """Register the generated ids so far; return the newly final text (may be empty)."""
        text = self.tokenizer.decode(ids)
        final = len(text)
        for s in self.stop:
            i = text.find(s)
            if i >= 0:
                self.stopped = True
                final = min(final, i)
        if self.stopped:
            text = text[:final]
        else:
            if text.endswith("\ufffd"):  # incomplete UTF-8 sequence
                final = len(text.rstrip("\ufffd"))
            for s in self.stop:  # hold back a tail that may grow into a stop string
                for k in range(min(len(s) - 1, final), 0, -1):
                    if text[:final].endswith(s[:k]):
                        final -= k
                        break
        self.text = text
        delta = text[self.emitted : final]
        self.emitted = max(self.emitted, final)
        return delta

    def flush(self) -> str:
        """The held-back text at the end of generation."""
        delta = self.text[self.emitted :]
        self.emitted = len(self.text)
        return delta


def emit_tokens(out: list[int], state: StreamState, tokens, eos: set, max_new_tokens: int):
    """Append ``tokens`` to one sequence's ``out`` one by one until it finishes.

    Returns ``(new text, finish reason)``: the reason is ``"stop"`` (a stop string), ``"eos"``
    (the EOS token, kept in ``out`` but not in the text), ``"length"`` (``max_new_tokens``
    reached) or None while the sequence goes on; tokens after the finishing one are dropped.
    """
    delta, reason = "", None
    for tok in tokens:
        out.append(int(tok))
        hit_eos = out[-1] in eos
        delta += state.update(out if not hit_eos else out[:-1])
        if state.stopped:
            reason = "stop"
        elif hit_eos:
            reason = "eos"
        elif len(out) >= max_new_tokens:
            reason = "length"
        if reason is not None:
            return delta + state.flush(), reason
    return delta, None


def prefill(model, cache, seq_ids, prompt_ids, *, max_tokens: int = 4096):
    """Run every prompt through ``model`` into ``cache``; return each prompt's last logits ``[B, V]``.

    Prompts are packed into forwards of at most ``max_tokens`` tokens (whole prompts while they fit,
    a longer prompt in consecutive chunks through the cache), bounding activation memory.
    """
    xp = model.xp
    B = len(prompt_ids)
    out = [None] * B
    # pieces (b, start, end) in order; a prompt longer than max_tokens is cut into chunks
    pieces = [
        (b, a, min(a + max_tokens, len(p)))
        for b, p in enumerate(prompt_ids)
        for a in range(0, len(p), max_tokens)
    ]
    i = 0
    while i < len(pieces):
        group, total, seen = [], 0, set()
        while i < len(pieces) and pieces[i][0] not in seen:
            b, a, e = pieces[i]
            if group and total + (e - a) > max_tokens:
                break
            group.append(pieces[i])
            seen.add(b)
            total += e - a
            i += 1
        toks = np.concatenate([np.asarray(prompt_ids[b][a:e], dtype=np.int64) for b, a, e in group])
        cu = np.concatenate([[0], np.cumsum([e - a for _, a, e in group])])
        last = model.forward(
            toks, cache=cache, seq_ids=[seq_ids[b] for b, _, _ in group], cu_seqlens=cu, logits="last"
        )
        for j, (b, _, e) in enumerate(group):
            if e == len(prompt_ids[b]):
                out[b] = last[j]
    return xp.stack(out)


class SlotQueue:
    """Prompts waiting for a cache slot (continuous batching): who is admitted next, and the prefill.

    With ``max_batch`` slots for ``B`` prompts, the first ``max_batch`` prompts start together; each
    time a sequence finishes and releases its cache region, the next waiting prompt takes it, its
    prompt run by :func:`prefill` (timed apart, as prefill). ``max_batch=None``: every prompt at once.
    """

    def __init__(self, n_prompts: int, max_batch: int | None):
        self.slots = n_prompts if max_batch is None else min(int(max_batch), n_prompts)
        self.waiting = list(range(n_prompts))[::-1]  # popped from the end: prompt order
        self.prefill_time = 0.0
        self.prefill_forwards = 0

    def __bool__(self) -> bool:
        return bool(self.waiting)

    def take(self, cache, seq: np.ndarray) -> list[int]:
        """Waiting prompts for the free cache regions (each region's id written to ``seq``)."""
        free = int((~cache.in_use).sum())
        new = [self.waiting.pop() for _ in range(min(free, len(self.waiting)))]
        for i in new:
            seq[i] = cache.allocate()
        return new

    def record(self, seconds: float) -> None:
        """Count one prefill forward (or one packed group of them) of ``seconds``."""
        self.prefill_time += seconds
        self.prefill_forwards += 1

    def admit(self, model, cache, seq: np.ndarray, prompt_ids) -> tuple[list[int], object]:
        """Give free cache regions to waiting prompts and prefill them; ``(admitted, logits [n, V])``."""
        new = self.take(cache, seq)
        if not new:
            return new, None
        t0 = time.perf_counter()
        logits = prefill(model, cache, seq[new], [prompt_ids[i] for i in new])
        self.record(time.perf_counter() - t0)
        return new, logits


def check_max_batch(max_batch, *, n_prompts: int | None = None, padded: bool = False) -> int | None:
    """Validate ``max_batch`` (None, or an integer >= 1); a padded layout needs every prompt at once."""
    if max_batch is None:
        return None
    if isinstance(max_batch, bool) or not isinstance(max_batch, (int, np.integer)):
        raise TypeError(f"max_batch must be an integer or None, got {type(max_batch).__name__}")
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1 (or None: every prompt at once), got {max_batch}")
    if padded and n_prompts is not None and max_batch < n_prompts:
        raise ValueError(
            f"max_batch={max_batch} < {n_prompts} prompts needs method 'ems' or 'autoregressive': the "
            "padded (vanilla) layout keeps every sample's cache aligned from the first prefill on"
        )
    return int(max_batch)


def autoregressive_generate(
    model,
    tokenizer,
    prompt_ids: list[list[int]],
    *,
    max_new_tokens: int,
    sampling: SamplingParams,
    stop: list[str],
    rng: np.random.Generator,
    stream=None,
    eos_ids=(),
    max_batch: int | None = None,
) -> GenerationResult:
    """Generate up to ``max_new_tokens`` after each prompt (ids, validated by the caller).

    ``stream(i, text)`` is called with each new piece of text of prompt ``i``. With ``max_batch``,
    at most that many prompts decode at once and a finished one's slot goes to the next waiting
    prompt (:class:`SlotQueue`); the prefills of admitted prompts count as prefill time.
    """
    B = len(prompt_ids)
    queue = SlotQueue(B, max_batch)
    lens = np.array([len(p) for p in prompt_ids], dtype=np.int64)
    cache = model.new_cache(max_seqs=queue.slots, capacity=int(lens.max()) + max_new_tokens)
    seq = np.full(B, -1, dtype=np.int64)
    eos = set(int(e) for e in eos_ids)
    out: list[list[int]] = [[] for _ in range(B)]
    states = [StreamState(tokenizer, stop) for _ in range(B)]
    reasons = ["length"] * B

    active, logits = queue.admit(model, cache, seq, prompt_ids)  # [B, V]
    prefill_time = queue.prefill_time
    step_times = []
    decode_start = time.perf_counter()
    while True:
        t_step = time.perf_counter()
        nxt = sample(to_host(logits), sampling, rng)  # [len(active)] (sampling runs on the host)
        still = []
        for j, i in enumerate(active):
            delta, reason = emit_tokens(out[i], states[i], [nxt[j]], eos, max_new_tokens)
            if reason is not None:
                reasons[i] = reason
                cache.release(int(seq[i]))
            else:
                still.append(i)
            if stream is not None and delta:
                stream(int(i), delta)
        if still:
            logits = model.forward(
                np.array([out[i][-1] for i in still], dtype=np.int64),
                cache=cache,
                seq_ids=seq[still],
                cu_seqlens=np.arange(len(still) + 1),
                logits="last",
            )
            step_times.append(time.perf_counter() - t_step)
        elif step_times:  # this pass only emitted: part of the step before
            step_times[-1] += time.perf_counter() - t_step
        new, new_logits = queue.admit(model, cache, seq, prompt_ids)  # into the slots just freed
        if new:
            logits = new_logits if not still else model.xp.concatenate([logits, new_logits])
        elif not still:
            break
        active = still + new
    decode_time = time.perf_counter() - decode_start - (queue.prefill_time - prefill_time)
    return GenerationResult(
        tokens=out,
        texts=[s.text for s in states],
        prompt_tokens=[list(map(int, p)) for p in prompt_ids],
        finish_reasons=reasons,
        prefill_time=queue.prefill_time,
        decode_time=decode_time,
        step_times=step_times,
    )
