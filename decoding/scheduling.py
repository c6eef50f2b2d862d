"""What both decoding loops share: admitting prompts into cache slots, prefill, and emitting tokens.

- :class:`SlotQueue` -- prompts waiting for a cache region (continuous batching) and the prefill
  of those admitted (:func:`prefill`, timed as prefill);
- :class:`Outputs` -- each sample's tokens, streamed text and finish reason; one
  :meth:`Outputs.emit` appends a step's tokens (:func:`emit_tokens`, :class:`StreamState`);
- :func:`check_max_batch` -- the one check of ``max_batch``;
- :func:`loop_memory` and :func:`check_memory` -- the memory a loop will allocate, checked
  before it allocates any of it.
"""

from __future__ import annotations

import time

import numpy as np

from ._xp import to_host
from .kv_cache import KVCache
from .memory import check_fits, format_bytes
from .model import PackedBatch
from .results import GenerationResult
from .sampling import SAMPLE_ROWS

__all__ = [
    "StreamState",
    "emit_tokens",
    "Outputs",
    "prefill",
    "decode_step",
    "SlotQueue",
    "check_max_batch",
    "loop_memory",
    "check_memory",
    "PREFILL_TOKENS",
]

#: The most tokens one prefill forward packs (:func:`prefill`'s ``max_tokens``): longer prompts,
#: and more prompts than fit, run in several forwards, which bounds the activations.
PREFILL_TOKENS = 4096


class StreamState:
    """Per-sequence incremental detokenization with stop strings.

    Each update decodes only the newest tokens, in a window that starts at the previous update's
    new tokens (as vLLM detokenizes): the text the window adds is the difference of the window's
    text and the text of its first part, taken once that does not end in an incomplete UTF-8
    character. Decoding the whole sequence every step cost O(length) a token, 0.3 ms a sample at
    2,048 tokens. Where a tokenizer's text of a window does not begin with the text of its first
    part, the whole sequence is decoded instead; the text at the end is the whole sequence's
    decoded once (exactly what decoding it at once gives). It holds back any tail that could
    still begin a stop string, and reports the new text since the last call. A U+FFFD at the end
    of the text may stand for a character whose bytes have not all come: it is held back and no
    stop string is searched in it until a character follows it or generation ends (:meth:`flush`).
    Text cannot tell it from a U+FFFD that invalid bytes made: a stop string ending in one of those
    stops the sequence once a character follows it or at the end (the text cut at the same place).

    Examples
    --------
    >>> class Chars:  # a tokenizer whose token ids are character codes
    ...     def decode(self, ids):
    ...         return "".join(map(chr, ids))
    >>> st = StreamState(Chars(), stop=["!"])
    >>> st.update([72, 105]), st.update([72, 105, 33, 63]), st.stopped
    ('Hi', '', True)
    """

    def __init__(self, tokenizer, stop: list[str]):
        self.tokenizer = tokenizer
        self.stop = stop
        self.emitted = 0  # characters of text already reported
        self.text = ""
        self.stopped = False
        self._decoded = ""  # the text of the ids decoded so far, window by window
        self._window = 0  # where the last window's new tokens begin
        self._head: list[int] = []  # those tokens (the ids decoded so far end with them)
        self._ids: list[int] = []  # the ids of the latest update

    def _text_of(self, ids: list[int]) -> str:
        """The text of ``ids`` (which extend the previous update's), from its newest tokens."""
        read = self._window + len(self._head)  # ids decoded into _decoded
        if len(ids) < read or list(ids[self._window : read]) != self._head:
            return self._whole(ids)  # not an extension of the ids decoded so far
        if len(ids) == read:
            return self._decoded
        head = self.tokenizer.decode(self._head)
        window = self.tokenizer.decode(ids[self._window :])
        if not window.startswith(head):  # not prefix-stable here: the whole sequence
            return self._whole(ids)
        text = self._decoded + window[len(head) :]
        if not window.endswith("\ufffd"):  # kept; an incomplete character waits for its bytes
            self._decoded, self._window, self._head = text, read, list(ids[read:])
        return text

    def _whole(self, ids: list[int]) -> str:
        """The text of all of ``ids``; kept as decoded when it ends on a whole character (else the
        next window starts from the first token, never inside a character)."""
        text = self.tokenizer.decode(ids)
        kept = not text.endswith("\ufffd")
        self._decoded, self._window, self._head = (text, len(ids), []) if kept else ("", 0, [])
        return text

    def update(self, ids: list[int]) -> str:
        """Register the generated ids so far; return the newly final text (may be empty)."""
        self._ids = ids
        text = self._text_of(ids)
        # A trailing U+FFFD may stand for a character whose bytes have not all come (the window
        # waits for them): it is neither reported nor searched for stop strings (a stop "\ufffd"
        # fired at the first byte of every multi-byte character). One that invalid bytes made is
        # found once a character follows it, or by flush at the end.
        final = len(text.rstrip("\ufffd"))
        cut = self._stop_in(text, final)
        if cut is not None:
            self.stopped = True
            text = text[:cut]
            final = cut
        else:
            for s in self.stop:  # hold back a tail that may grow into a stop string
                for k in range(min(len(s) - 1, final), 0, -1):
                    if text.endswith(s[:k], 0, final):
                        final -= k
                        break
        self.text = text
        delta = text[self.emitted : final]
        self.emitted = max(self.emitted, final)
        return delta

    def _stop_in(self, text: str, end: int) -> int | None:
        """Where the first stop string found in ``text[:end]`` begins (None: none is)."""
        cuts = [i for i in (text.find(s, 0, end) for s in self.stop) if i >= 0]
        return min(cuts) if cuts else None

    def flush(self) -> str:
        """The held-back text at the end of generation (the whole sequence decoded once). No byte
        can come now: a trailing U+FFFD is text, and a stop string it ends stops the sequence here."""
        if not self.stopped:
            self.text = self.tokenizer.decode(self._ids)
            cut = self._stop_in(self.text, len(self.text))
            if cut is not None:
                self.stopped, self.text = True, self.text[:cut]
        delta = self.text[self.emitted :]
        self.emitted = len(self.text)
        return delta


def emit_tokens(out: list[int], state: StreamState, tokens, eos: set, max_new_tokens: int):
    """Append ``tokens`` to one sequence's ``out`` one by one until it finishes.

    Parameters
    ----------
    out : list of int
        The sequence's generated tokens so far (appended to in place).
    state : StreamState
    tokens : iterable of int
    eos : set of int
    max_new_tokens : int

    Returns
    -------
    delta : str
        The new final text.
    reason : {"stop", "eos", "length"} or None
        ``"stop"`` (a stop string), ``"eos"`` (the EOS token, kept in ``out`` but not in the
        text), ``"length"`` (``max_new_tokens`` reached) or None while the sequence goes on;
        tokens after the finishing one are dropped.

    Examples
    --------
    >>> class Chars:
    ...     def decode(self, ids):
    ...         return "".join(map(chr, ids))
    >>> out = []
    >>> emit_tokens(out, StreamState(Chars(), []), [72, 105, 0, 33], eos={0}, max_new_tokens=9)
    ('Hi', 'eos')
    >>> out
    [72, 105, 0]
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
            delta += state.flush()  # which finds a stop string that a trailing U+FFFD ends
            return delta, "stop" if state.stopped else reason
    return delta, None


class Outputs:
    """Every sample's generated tokens, streamed text and finish reason.

    Parameters
    ----------
    tokenizer : Tokenizer
    n : int
        Number of samples (prompts).
    stop : list of str
    eos_ids : iterable of int
    max_new_tokens : int
    stream : callable, optional
        ``stream(i, text)`` receives each new piece of final text of sample ``i``.

    Examples
    --------
    >>> class Chars:
    ...     def decode(self, ids):
    ...         return "".join(map(chr, ids))
    >>> outs = Outputs(Chars(), 2, stop=[], eos_ids=[0], max_new_tokens=3, stream=print)
    >>> outs.emit(0, [79, 75])  # sample 0 goes on
    0 OK
    False
    >>> outs.emit(1, [0]), outs.reasons
    (True, ['length', 'eos'])
    """

    def __init__(self, tokenizer, n: int, *, stop, eos_ids, max_new_tokens: int, stream=None):
        self.tokens: list[list[int]] = [[] for _ in range(n)]
        self.states = [StreamState(tokenizer, stop) for _ in range(n)]
        self.reasons = ["length"] * n
        self.eos = set(int(e) for e in eos_ids)
        self.max_new_tokens = max_new_tokens
        self.stream = stream

    def emit(self, i: int, tokens) -> bool:
        """Append a step's ``tokens`` to sample ``i`` and stream its new text; True when it finished."""
        delta, reason = emit_tokens(self.tokens[i], self.states[i], tokens, self.eos, self.max_new_tokens)
        if reason is not None:
            self.reasons[i] = reason
        if self.stream is not None and delta:
            self.stream(int(i), delta)
        return reason is not None

    def result(self, prompt_ids, queue: SlotQueue, decode_time: float, step_times, **kw) -> GenerationResult:
        """The :class:`GenerationResult` of a finished call (``kw``: ``method``)."""
        return GenerationResult(
            tokens=self.tokens,
            texts=[s.text for s in self.states],
            prompt_tokens=[list(map(int, p)) for p in prompt_ids],
            finish_reasons=self.reasons,
            prefill_time=queue.prefill_time,
            decode_time=decode_time,
            step_times=step_times,
            **kw,
        )


def prefill(model, cache, seq_ids, prompt_ids, *, max_tokens: int = PREFILL_TOKENS):
    """Run every prompt through ``model`` into ``cache``; return each prompt's last logits ``[B, V]`` (host).

    Prompts are packed into forwards of at most ``max_tokens`` tokens (whole prompts while they fit,
    a longer prompt in consecutive chunks through the cache), bounding activation memory.

    Examples
    --------
    >>> cache = model.new_cache(max_seqs=2, capacity=64)  # doctest: +SKIP
    >>> prefill(model, cache, [cache.allocate(), cache.allocate()], [[1, 2, 3], [4]]).shape  # doctest: +SKIP
    (2, 49152)
    """
    out = [None] * len(prompt_ids)
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
        batch = PackedBatch.from_lists(
            [prompt_ids[b][a:e] for b, a, e in group], seq_ids=[seq_ids[b] for b, _, _ in group]
        )
        last = to_host(model.forward(batch, cache=cache, logits="last"))
        for j, (b, _, e) in enumerate(group):
            if e == len(prompt_ids[b]):
                out[b] = last[j]
    return np.stack(out)


def decode_step(model, cache, seq_ids, last_tokens):
    """One autoregressive step: each sequence's last token, packed into one forward; logits ``[B, V]``.

    The step of :func:`decoding.autoregressive.autoregressive_generate`, and of the speculative
    loop whenever no sample has a draft to verify (so that step costs what autoregressive decoding
    costs).

    Examples
    --------
    >>> cache = model.new_cache(max_seqs=2, capacity=64)  # doctest: +SKIP
    >>> seqs = [cache.allocate(), cache.allocate()]  # doctest: +SKIP
    >>> _ = prefill(model, cache, seqs, [[1, 2], [3]])  # doctest: +SKIP
    >>> decode_step(model, cache, seqs, [5, 6]).shape  # doctest: +SKIP
    (2, 49152)
    """
    batch = PackedBatch.from_lists([[int(t)] for t in last_tokens], seq_ids=seq_ids)
    return to_host(model.forward(batch, cache=cache, logits="last"))


class SlotQueue:
    """Prompts waiting for a cache slot (continuous batching): who is admitted next, and the prefill.

    With ``max_batch`` slots for ``B`` prompts, the first ``max_batch`` prompts start together; each
    time a sequence finishes and releases its cache region, the next waiting prompt takes it, its
    prompt run by :func:`prefill` (timed apart, as prefill). ``max_batch=None``: every prompt at once.

    Examples
    --------
    >>> from decoding.kv_cache import KVCache
    >>> cache = KVCache(n_layers=1, n_kv_heads=1, head_dim=2, max_seqs=2, capacity=4)
    >>> queue = SlotQueue(3, max_batch=2)
    >>> seq = np.full(3, -1)
    >>> queue.slots, queue.take(cache, seq), seq.tolist(), bool(queue)
    (2, [0, 1], [0, 1, -1], True)
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
    """Validate ``max_batch`` (None, or an integer >= 1); a padded layout needs every prompt at once.

    Examples
    --------
    >>> check_max_batch(None), check_max_batch(np.int64(4), n_prompts=8)
    (None, 4)
    >>> check_max_batch(4, n_prompts=8, padded=True)
    Traceback (most recent call last):
    ...
    ValueError: max_batch=4 < 8 prompts needs method 'ems' or 'autoregressive': ...
    """
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


def loop_memory(
    model, prompt_lengths, *, slots: int, capacity: int, step_tokens: int, sampled: bool,
    sampled_rows: int | None = None,
) -> list[tuple[str, int]]:  # fmt: skip
    """The memory a decoding loop allocates, by part: ``[(what, bytes), ...]``.

    Parameters
    ----------
    model : Model
    prompt_lengths : list of int
    slots : int
        Sequences in the cache at once.
    capacity : int
        Cache slots per sequence.
    step_tokens : int
        Tokens of the largest decoding forward (``slots`` for autoregressive decoding,
        ``slots * (1 + max_draft)`` for a verification), each with logits.
    sampled : bool
        Whether tokens are drawn (the sampler's temporaries) or taken greedily.
    sampled_rows : int, optional
        The most logits rows one :func:`~decoding.sampling.sample` call draws from (default
        ``step_tokens``; a speculative loop samples at most ``slots`` rows at once, its
        verification one row at a time).

    Returns
    -------
    list of (str, int)
        The KV cache, the prefill (its forward and the logits it keeps), the largest step's
        forward with its logits, and the sampler's temporaries.

    Examples
    --------
    >>> kw = dict(slots=2, capacity=94, step_tokens=2, sampled=False)
    >>> parts = loop_memory(model, [12, 30], **kw)  # doctest: +SKIP
    >>> [what for what, _ in parts]  # doctest: +SKIP
    ['KV cache (2 sequences x 94 slots)', 'prefill', 'decoding step (2 tokens)', 'sampling']
    """
    cfg = model.config
    V, b = cfg.vocab_size, model.dtype.itemsize
    cache = KVCache.bytes_for(model.n_layers, cfg.n_kv_heads, cfg.head_dim, slots, capacity, model.kv_dtype)
    longest = sorted(int(n) for n in prompt_lengths)[-slots:]
    chunk = min(PREFILL_TOKENS, sum(longest))
    prefill_b = model.forward_bytes(chunk, keys=max(longest), logits_rows=min(slots, chunk))
    prefill_b += 2 * slots * V * b  # each prompt's last logits, then stacked
    step = model.forward_bytes(step_tokens, keys=capacity, logits_rows=step_tokens)
    rows = step_tokens if sampled_rows is None else sampled_rows
    sampling = 8 * 8 * V * min(rows, SAMPLE_ROWS) if sampled else 0
    return [
        (f"KV cache ({slots} sequences x {capacity} slots)", cache),
        ("prefill", prefill_b),
        (f"decoding step ({step_tokens} tokens)", step),
        ("sampling", sampling),
    ]


def check_memory(parts, what: str) -> int:
    """Raise ``MemoryError`` (with the parts' sizes) when ``parts`` together do not fit; their total.

    Examples
    --------
    >>> check_memory([("a cache", 10), ("logits", 5)], "a loop")
    15
    """
    total = int(sum(n for _, n in parts))
    detail = ", ".join(f"{name} {format_bytes(n)}" for name, n in parts if n)
    check_fits(total, f"{what} ({detail})")
    return total
