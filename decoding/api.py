"""The public entry point: :func:`generate` (and :func:`load_model`, from :mod:`decoding.loading`)."""

from __future__ import annotations

import numpy as np

from rsketch._validation import check_seed  # the one seed check of both packages

from ._threads import blas_threads
from .autoregressive import autoregressive_generate
from .loading import MODELS, LoadedModel, load_model, model_path
from .model import Model
from .results import GenerationResult
from .sampling import SamplingParams, TokenNoise
from .scheduling import check_max_batch
from .speculative import LAYOUTS, check_speculative_arguments, prepare_speculative, speculative_generate
from .tokenizer import check_text, check_token_ids

__all__ = ["LoadedModel", "load_model", "generate", "model_path", "MODELS", "METHODS"]

#: The ``method`` values of :func:`generate`: autoregressive, then the speculative layouts.
METHODS = ("autoregressive", *LAYOUTS)


def _prompt_ids(tokenizer, prompts, vocab_size, ctx: int, max_new_tokens: int) -> list[list[int]]:
    """Each prompt's token ids; a text prompt whose bytes need more than ``ctx - max_new_tokens`` tokens
    even at the tokenizer's longest token is refused before it is encoded (a 9 MB text had taken 6.5 s
    and 1.2 GB to tokenize, only to be refused for the context)."""
    max_tokens = max(0, ctx - max_new_tokens)
    if isinstance(prompts, str):
        prompts = [prompts]
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise TypeError("prompts must be a string or a non-empty list of strings (or of token-id lists)")
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            if not p:
                raise ValueError(f"prompts[{i}] is empty")
            size = len(check_text(p, f"prompts[{i}]").encode("utf-8"))
            # max_token_bytes >= 1, so only a text above max_tokens bytes asks for it (a vocabulary pass)
            if size > max_tokens and not max_tokens:  # "more than 0 tokens hold" had said it oddly
                raise ValueError(
                    f"prompts[{i}]: max_new_tokens={max_new_tokens} exceeds the model's context of "
                    f"{ctx} tokens and leaves no room for the prompt (refused before tokenizing)"
                )
            if size > max_tokens and size > max_tokens * tokenizer.max_token_bytes:
                raise ValueError(
                    f"prompts[{i}] is {size:,} bytes, more than {max_tokens:,} tokens hold at "
                    f"{tokenizer.max_token_bytes} bytes a token at most: with "
                    f"max_new_tokens={max_new_tokens} that exceeds the model's context of {ctx} tokens "
                    "(refused before tokenizing)"
                )
            ids = tokenizer.encode(p)
        elif isinstance(p, (list, tuple, np.ndarray)):
            ids = check_token_ids(p, f"prompts[{i}]", vocab_size)
        else:
            raise TypeError(f"prompts[{i}] must be a str or a list of token ids, got {type(p).__name__}")
        if not ids and isinstance(p, str):  # a byte-level BPE drops the bytes it has no token for
            raise ValueError(
                f"prompts[{i}] ({p[:40]!r}) encodes to no tokens: the vocabulary has none of its bytes"
            )
        if not ids:
            raise ValueError(f"prompts[{i}] is empty (no tokens)")
        out.append(ids)
    return out


def _stop_strings(stop) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, (list, tuple)):
        raise TypeError(f"stop must be a string, a list of strings or None, got {type(stop).__name__}")
    for j, s in enumerate(stop):
        if not isinstance(s, str):
            raise TypeError(f"stop[{j}] must be a string, got {type(s).__name__} {s!r}")
        if not s:
            raise ValueError(f"stop[{j}] is empty: stop strings must be non-empty")
        # as prompts are: a lone surrogate, which decoded text never holds, could never match
        check_text(s, f"stop[{j}]")
    return list(stop)


def _loop_arguments(
    model,
    tokenizer,
    prompts,
    *,
    max_new_tokens,
    temperature,
    top_k,
    top_p,
    stop,
    seed,
    stream,
    method,
    max_batch,
) -> dict:
    """Validate what both loops take (in :func:`generate`'s order); their keyword arguments."""
    if not isinstance(model, Model):
        raise TypeError(f"model must be a decoding.Model, got {type(model).__name__}")
    if not (callable(getattr(tokenizer, "encode", None)) and callable(getattr(tokenizer, "decode", None))):
        raise TypeError(
            f"tokenizer must be a decoding.Tokenizer (with encode and decode), got {type(tokenizer).__name__}"
        )
    vocab = getattr(tokenizer, "vocab_size", None)
    if vocab is not None and vocab != model.config.vocab_size:  # its ids would index another embedding
        raise ValueError(
            f"tokenizer has {vocab:,} tokens and the model {model.config.vocab_size:,}: give the model's "
            "own tokenizer (load_model returns both)"
        )
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)):
        raise TypeError(f"max_new_tokens must be an integer, got {type(max_new_tokens).__name__}")
    max_new_tokens = int(max_new_tokens)  # a NumPy integer would overflow in len(p) + max_new_tokens
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    sampling = SamplingParams(temperature, top_k, top_p)
    stop = _stop_strings(stop)
    seed = check_seed(seed)
    if stream is not None and not callable(stream):
        raise TypeError("stream must be a callable stream(index, text) or None")
    ctx = model.config.context_length
    ids = _prompt_ids(tokenizer, prompts, model.config.vocab_size, ctx, max_new_tokens)
    for i, p in enumerate(ids):
        if len(p) + max_new_tokens > ctx:
            raise ValueError(
                f"prompts[{i}] has {len(p)} tokens; with max_new_tokens={max_new_tokens} that exceeds "
                f"the model's context of {ctx} tokens"
            )
    # before the drafter and the cost model are set up (measuring a cost curve takes a while)
    max_batch = check_max_batch(max_batch, n_prompts=len(ids), padded=method == "vanilla")
    eos = [
        e for e in (getattr(tokenizer, "eos_id", None), getattr(tokenizer, "eot_id", None)) if e is not None
    ]
    if method not in METHODS:
        raise ValueError(f"method must be 'autoregressive', 'ems' or 'vanilla', got {method!r}")
    return dict(
        prompt_ids=ids, max_new_tokens=max_new_tokens, sampling=sampling, stop=stop, seed=seed,
        stream=stream, eos_ids=eos, max_batch=max_batch,
    )  # fmt: skip


def _token_noise(kw: dict) -> dict:
    """``kw`` with its ``seed`` made the loops' :class:`TokenNoise`, once every argument is checked:
    a Generator given as ``seed`` is drawn from only when sampling and only by a call that runs (it
    had been drawn from by greedy calls, which ignore it, and by calls refused for another argument,
    so that the corrected call sampled other tokens than a first one would)."""
    seed = kw.pop("seed")
    return dict(kw, noise=TokenNoise(0 if kw["sampling"].greedy else seed))


def generate(
    model,
    tokenizer,
    prompts,
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop=None,
    seed=None,
    stream=None,
    method: str = "autoregressive",
    drafter="llma",
    max_draft: int = 7,
    references=None,
    draft_budget="auto",
    max_batch: int | None = None,
) -> GenerationResult:
    """Generate continuations of a batch of prompts.

    Parameters
    ----------
    model : Model
    tokenizer : Tokenizer
    prompts : str, list of str, or list of lists of token ids
        A plain ``str`` is tokenized as plain text (``tokenizer.encode``: a control token's
        spelling such as ``<|im_end|>`` stays text); a :class:`~decoding.tokenizer.ChatPrompt` from
        ``tokenizer.apply_chat_template`` gives its template's control tokens. Token ids are
        Python or NumPy integers (floats, strings and bools raise ``TypeError``); pass
        ``tokenizer.encode(text, special=True)`` to read control-token spellings in trusted text.
    max_new_tokens : int
        At most this many tokens per prompt; prompt plus new tokens must fit the context.
    temperature : float, default 0.0
        0 is greedy decoding (deterministic); otherwise logits are divided by it before sampling.
    top_k : int, optional
        Sample among the ``top_k`` most likely tokens only.
    top_p : float in (0, 1], optional
        Sample among the smallest set of tokens whose probability reaches ``top_p``.
    stop : str or list of str, optional
        A sequence stops (and its text is cut) when its text contains one of these.
        Sequences also stop at the tokenizer's EOS token.
    seed : int, numpy.random.SeedSequence, numpy.random.Generator or numpy.random.RandomState, optional
        Seed of the sampler (ignored when greedy): a non-negative int (checked by rsketch's
        ``check_seed``, as rsketch's own seeds are). The ``t``-th token of ``prompts[i]`` is drawn
        at the uniform ``u(i, t)`` of :class:`~decoding.sampling.TokenNoise`, a pure function of
        the seed: the same seed gives the same tokens for every method (speculative decoding
        verifies drafts against the very token sampling draws), batch size, ``max_batch``, thread
        count and draft budget, on the quantized engine (the default), whose products of a token do
        not depend on the tokens beside it in a forward. The float32 and float64 engines
        (``load_model(dtype=...)``) order a token's sums by how many tokens the forward holds, so
        their logits, and so their tokens at near-ties, can differ between methods and batch
        sizes (``docs/speculative.md``). None draws a fresh seed. A Generator
        (or RandomState) is drawn from once, when sampling, after every argument is checked.
    stream : callable, optional
        ``stream(i, text)`` receives each new piece of the text of prompt ``i`` as it is generated.
    method : {"autoregressive", "ems", "vanilla"}, default "autoregressive"
        ``"ems"``: multi-sample speculative decoding without padding (EMS-SD); ``"vanilla"``: the
        padded baseline (same tokens, more computation); see :mod:`decoding.speculative`.
        ``drafter``, ``max_draft``, ``references`` and ``draft_budget`` serve the speculative
        methods only; with ``"autoregressive"`` they are still checked (a bad value raises, as
        with any method) and valid ones are ignored, as ``seed`` is when decoding is greedy.
    drafter : {"llma", "prompt_lookup", "draft_model"} or Drafter, default "llma"
        Who proposes the drafts (speculative methods only); ``"draft_model"`` is the target
        truncated to a quarter of its layers; see :mod:`decoding.drafters`.
    max_draft : int >= 1, default 7
        At most this many draft tokens per sample and step (the LLMA paper's copy length); a
        draft never runs past ``max_new_tokens`` (nor, therefore, the context), and the caches
        are sized by the draft length that can be used, not by ``max_draft``.
    references : list of str or of token-id lists, optional
        One reference text per prompt for the LLMA drafter (default: the prompt itself).
    draft_budget : "auto", None, DraftBudget or CostModel, default "auto"
        ``"auto"`` caps the draft tokens per step with this machine's measured cost per forward
        (:mod:`decoding.cost_model`; measured once in about 1.5 s, announced on the
        ``"decoding"`` logger, cached, and re-measured when live steps drift from it by more
        than 30%) so that speculation does not run slower than autoregressive decoding; None
        verifies every draft (the paper's behaviour).
    max_batch : int, optional
        Continuous batching: at most this many prompts decode at once, and each time one
        finishes the next waiting prompt takes its cache slot (its prefill counts as prefill
        time). None: every prompt at once (a static batch). Not with ``method="vanilla"``, whose
        padded cache stays aligned from the first prefill on.

    Returns
    -------
    GenerationResult
        Tokens, texts, finish reasons and timings (prefill and decode tokens/s, time per step).

    Notes
    -----
    Threads: numba's kernels run on as many threads as there are cores the other processes leave
    free, re-chosen at most every 0.25 s (:class:`decoding._threads.ThreadPolicy`;
    ``DECODING_THREADS=N`` fixes the count). Only the calling thread's numba setting changes, and it
    is restored on return. BLAS's thread count (one per process) is left as it is, unless
    ``DECODING_BLAS_THREADS=N`` asks for a limit while the call runs (process-wide).

    Raises
    ------
    TypeError, ValueError
        A bad argument (the message names it), or a prompt that does not fit the context with
        ``max_new_tokens``.
    MemoryError
        Before any large allocation, when the KV cache, the forwards' activations and logits
        and the drafter's buffers, as estimated for this call (they grow with the batch,
        ``max_new_tokens`` and ``max_draft``), exceed the memory available (``MemAvailable``);
        the message gives both figures.

    Examples
    --------
    >>> model, tok = load_model()  # doctest: +SKIP
    >>> messages = [{"role": "user", "content": "What is the capital of Germany?"}]
    >>> prompt = tok.apply_chat_template(messages)  # doctest: +SKIP
    >>> generate(model, tok, [prompt] * 4, max_new_tokens=20).texts[0]  # doctest: +SKIP
    'The capital of Germany is Berlin.'
    """
    kw = _loop_arguments(
        model, tokenizer, prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
        top_p=top_p, stop=stop, seed=seed, stream=stream, method=method, max_batch=max_batch,
    )  # fmt: skip
    # checked whatever the method: a bad value is an error even where it would go unused
    max_draft, references = check_speculative_arguments(
        tokenizer, len(kw["prompt_ids"]), drafter=drafter, max_draft=max_draft, references=references,
        draft_budget=draft_budget, vocab_size=model.config.vocab_size,
        encode_references=method != "autoregressive",  # which reads none (a 9 MB text took 8 s)
    )  # fmt: skip
    with blas_threads():
        if method == "autoregressive":
            return autoregressive_generate(model, tokenizer, **_token_noise(kw))
        spec = prepare_speculative(
            model, tokenizer, kw["prompt_ids"], drafter=drafter, max_draft=max_draft, references=references,
            draft_budget=draft_budget, max_new_tokens=kw["max_new_tokens"], layout=method,
            max_batch=max_batch, sampling=kw["sampling"],
        )  # fmt: skip
        return speculative_generate(model, tokenizer, layout=method, **_token_noise(kw), **spec)
