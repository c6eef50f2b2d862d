"""Batched autoregressive decoding: prefill every prompt in one packed forward, then one token per step.

Finished sequences (EOS, a stop string, or ``max_new_tokens``) leave the packed batch at once, so
later steps only run the sequences still going, and their cache regions are released. With
``max_batch`` (continuous batching) a released region goes at once to the next waiting prompt
(:class:`~decoding.scheduling.SlotQueue`).
"""

from __future__ import annotations

import time

import numpy as np

from ._threads import engine_threads
from ._xp import to_host
from .results import GenerationResult
from .sampling import SamplingParams, TokenNoise, sample
from .scheduling import Outputs, SlotQueue, check_memory, decode_step, loop_memory

__all__ = ["autoregressive_generate"]


def autoregressive_generate(
    model,
    tokenizer,
    prompt_ids: list[list[int]],
    *,
    max_new_tokens: int,
    sampling: SamplingParams,
    stop: list[str],
    noise: TokenNoise,
    stream=None,
    eos_ids=(),
    max_batch: int | None = None,
) -> GenerationResult:
    """Generate up to ``max_new_tokens`` after each prompt (ids, validated by the caller).

    Parameters
    ----------
    model : Model
    tokenizer : Tokenizer
    prompt_ids : list of lists of int
    max_new_tokens : int
    sampling : SamplingParams
    stop : list of str
    noise : TokenNoise
        The uniforms of sampled tokens: sample ``i``'s ``t``-th token is drawn at ``u(i, t)``
        (unused when greedy).
    stream : callable, optional
        ``stream(i, text)`` is called with each new piece of text of prompt ``i``.
    eos_ids : iterable of int
        Tokens that end a sequence.
    max_batch : int, optional
        At most that many prompts decode at once and a finished one's slot goes to the next
        waiting prompt; the prefills of admitted prompts count as prefill time.

    Returns
    -------
    GenerationResult

    Raises
    ------
    MemoryError
        Before anything is allocated, when the cache (``min(max_batch, prompts)`` sequences of
        the longest prompt plus ``max_new_tokens`` slots), the prefill and a step's logits do
        not fit the memory available (:func:`decoding.scheduling.loop_memory`).

    Examples
    --------
    >>> res = autoregressive_generate(model, tok, [tok.encode("Hi")], max_new_tokens=4,
    ...     sampling=SamplingParams(), stop=[], noise=TokenNoise(0))  # doctest: +SKIP
    >>> len(res.tokens[0])  # doctest: +SKIP
    4
    """
    queue = SlotQueue(len(prompt_ids), max_batch)
    capacity = max(len(p) for p in prompt_ids) + max_new_tokens
    parts = loop_memory(
        model, [len(p) for p in prompt_ids], slots=queue.slots, capacity=capacity, step_tokens=queue.slots,
        sampled=not sampling.greedy,
    )  # fmt: skip
    check_memory(
        parts, f"generate({len(prompt_ids)} prompts, max_batch={max_batch}, max_new_tokens={max_new_tokens})"
    )
    cache = model.new_cache(max_seqs=queue.slots, capacity=capacity)
    seq = np.full(len(prompt_ids), -1, dtype=np.int64)
    outs = Outputs(
        tokenizer, len(prompt_ids), stop=stop, eos_ids=eos_ids, max_new_tokens=max_new_tokens, stream=stream
    )

    with engine_threads() as threads:  # numba threads for the cores other processes leave free
        active, logits = queue.admit(model, cache, seq, prompt_ids)  # [B, V]
        prefill_time = queue.prefill_time
        step_times, computed = [], 0  # decode forwards' tokens (one per sample in flight)
        decode_start = time.perf_counter()
        while True:
            t_step = time.perf_counter()
            threads.update()
            done = [len(outs.tokens[i]) for i in active]  # each sample's next position
            nxt = sample(to_host(logits), sampling, noise, active, done)  # (sampling runs on the host)
            still = []
            for j, i in enumerate(active):
                if outs.emit(i, [nxt[j]]):
                    cache.release(int(seq[i]))
                else:
                    still.append(i)
            if still:
                logits = decode_step(model, cache, seq[still], [outs.tokens[i][-1] for i in still])
                computed += len(still)
                step_times.append(time.perf_counter() - t_step)
            elif step_times:  # this pass only emitted: part of the step before
                step_times[-1] += time.perf_counter() - t_step
            new, new_logits = queue.admit(model, cache, seq, prompt_ids)  # into the slots just freed
            if new:
                logits = new_logits if not still else np.concatenate([logits, new_logits])  # host logits
            elif not still:
                break
            active = still + new
    decode_time = time.perf_counter() - decode_start - (queue.prefill_time - prefill_time)
    # with max_batch, the prefills of admitted prompts are forwards too, and a step holds the samples in
    # flight, not every prompt (the fallbacks had reported 1 + steps and the number of prompts)
    forwards = len(step_times)
    stats = {
        "target_forwards": queue.prefill_forwards + forwards,
        "tokens_per_forward": computed / forwards if forwards else float("nan"),
    }
    return outs.result(prompt_ids, queue, decode_time, step_times, stats=stats)
