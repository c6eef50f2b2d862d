"""Command line: ``python -m decoding generate "prompt" ...`` and ``python -m decoding demo``."""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import textwrap
import time

from rsketch._validation import check_seed  # the one seed check of both packages

from .api import METHODS, generate
from .drafters import DRAFTERS
from .loading import load_model
from .sampling import SamplingParams
from .scheduling import check_max_batch, check_memory, loop_memory
from .tokenizer import check_text

#: The longest ``--reference`` file read, in characters (16 Mi; the tokenizer needs about 130 bytes of
#: memory a character of text).
MAX_REFERENCE_CHARS = 16 << 20

DEMO_QUESTIONS = [
    "What is the capital of Germany?",
    "Name three primary colors.",
    "What is 7 times 8?",
    "Write one sentence about the sea.",
]


def _generate(args) -> int:
    check_text(args.prompt, "the prompt")  # before loading: bytes that are not UTF-8 fail here
    model, tok = load_model(args.model)
    prompt = args.prompt
    if args.chat:  # the template's control tokens; the prompt's text stays text unless --special
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": prompt}], allow_special_in_content=args.special
        )
    elif args.special:
        prompt = tok.encode(prompt, special=True)
    batch = args.batch
    n = len(prompt) if isinstance(prompt, list) else len(tok.encode(prompt))
    if n + args.max_new_tokens > model.config.context_length:  # before the memory it would take
        raise ValueError(
            f"--max-new-tokens {args.max_new_tokens}: with the prompt's {n} tokens that exceeds the "
            f"model's context of {model.config.context_length} tokens"
        )
    _check_batch_memory(model, n, batch, args)
    # checked before the warm-up call below, which would cost a bad value a prefill
    SamplingParams(args.temperature, args.top_k, args.top_p)
    check_seed(args.seed)
    speculative = _speculative_kwargs(args, batch)  # reads --reference
    # The first call loads the compiled kernels (a second or two): not the prompt's prefill, which
    # the speed line below reports (it read 0.6 tok/s for 740).
    generate(model, tok, [prompt], max_new_tokens=1)

    def stream(i, text):
        if i == 0:
            sys.stdout.write(text)
            sys.stdout.flush()

    res = generate(
        model,
        tok,
        [prompt] * batch,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        stream=stream,
        max_batch=args.max_batch,
        **speculative,
    )
    print()
    for i in range(1, batch):
        print(f"--- sample {i} ---\n{res.texts[i]}")
    print(
        f"[{res.n_generated} tokens, batch {batch}: prefill {res.prefill_tokens_per_s:.1f} tok/s, "
        f"decode {res.decode_tokens_per_s:.1f} tok/s, {1e3 * res.time_per_step:.1f} ms/step]"
    )
    if res.method != "autoregressive":
        print(
            f"[{res.method}, drafter {res.stats['drafter']}: {res.mean_accepted:.2f} accepted draft tokens "
            f"per step and sample, {res.target_forwards} target forwards, "
            f"{res.tokens_per_forward:.1f} tokens per forward, padding {100 * res.padding_fraction:.0f}%]"
        )
    return 0


def _check_batch_memory(model, n, batch, args) -> None:
    """``MemoryError`` before ``--batch`` copies of the prompt are made and tokenized: ``--batch
    2000000`` took 11 s and 684 MB to reach generate's own check, ``100000000`` was silent a minute on.
    The cache of the sequences decoded at once and the batch's token ids, from one prompt's length
    ``n`` (generate checks the rest)."""
    slots = batch if args.max_batch is None else min(batch, args.max_batch)  # checked: >= 1
    parts = loop_memory(
        model, [n], slots=slots, capacity=n + max(args.max_new_tokens, 0), step_tokens=slots, sampled=False
    )
    check_memory([("the batch's token ids", 16 * batch * n), *parts[:1]], f"--batch {batch}")


def _speculative_kwargs(args, batch) -> dict:
    """Whatever ``--method``: generate checks the speculative arguments with every method, and a
    ``--reference`` that cannot be read is an error with autoregressive decoding too."""
    kw = {"method": args.method, "drafter": args.drafter, "max_draft": args.max_draft}
    if args.reference is not None:
        try:
            with open(args.reference, encoding="utf-8") as f:
                text = f.read(MAX_REFERENCE_CHARS + 1)  # bounded: /dev/zero had been read to 5 GB
            if len(text) > MAX_REFERENCE_CHARS:
                raise ValueError(
                    f"--reference {args.reference}: longer than {MAX_REFERENCE_CHARS:,} characters "
                    "(a reference the drafter copies from, not a corpus)"
                )
            kw["references"] = [text] * batch  # one object: generate encodes it once
        except UnicodeDecodeError as e:
            raise ValueError(
                f"--reference {args.reference}: not valid UTF-8 "
                f"(byte 0x{e.object[e.start]:02x} at offset {e.start})"
            ) from None
        except OSError as e:  # a directory, a missing file: "[Errno 21] Is a directory" named no option
            raise ValueError(f"--reference {args.reference}: {e.strerror or e}") from None
    if args.no_budget:
        kw["draft_budget"] = None
    return kw


def _demo_speculative(model, tok, max_new_tokens) -> None:
    """One EMS-SD run against autoregressive decoding: a quote task at batch 4 with LLMA."""
    docs = [" ".join(inspect.getdoc(f).split()[:40]) for f in (json.dumps, textwrap.fill, textwrap.wrap, len)]
    docs = [d for d in docs if d][:4]
    ask = "Copy this text word for word:\n\n"
    # The answer opens with the text's first three words: SmolLM2-135M then quotes it (unprimed it
    # often paraphrases; see docs/speculative.md).
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": ask + d}]) + " ".join(d.split()[:3])
        for d in docs
    ]
    ar = generate(model, tok, prompts, max_new_tokens=max_new_tokens)
    common = dict(max_new_tokens=max_new_tokens, method="ems", drafter="llma", references=docs)
    fixed = generate(model, tok, prompts, **common, draft_budget=None)  # every draft verified
    budget = generate(model, tok, prompts, **common)  # the default: drafts this CPU's costs pay for
    print("EMS-SD (speculative, LLMA drafter, no padding) against autoregressive, batch 4, quote task:")
    print(f"  first answer: {budget.texts[0].strip()[:100]!r}")
    print(f"  autoregressive {ar.decode_tokens_per_s:.1f} tok/s")
    for what, res in (("every draft", fixed), ("draft budget (default)", budget)):
        print(
            f"  EMS-SD, {what}: {res.decode_tokens_per_s:.1f} tok/s "
            f"({res.decode_tokens_per_s / ar.decode_tokens_per_s:.2f}x, {res.mean_accepted:.2f} accepted "
            f"draft tokens per step and sample); identical text: {res.texts == ar.texts}"
        )


def _demo(args) -> int:
    t0 = time.perf_counter()
    model, tok = load_model(args.model)
    dt = time.perf_counter() - t0
    print(f"loaded {args.model} ({model.nbytes / 1e6:.0f} MB of {model.weight_format} weights) in {dt:.1f} s")
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}]) for q in DEMO_QUESTIONS]
    t0 = time.perf_counter()
    generate(model, tok, prompts, max_new_tokens=2)  # the first call loads the compiled kernels
    dt = time.perf_counter() - t0
    print(f"compiled kernels loaded (numba's cache, or compiled on a first run) in {dt:.1f} s")
    res = generate(model, tok, prompts, max_new_tokens=args.max_new_tokens)
    for q, a in zip(DEMO_QUESTIONS, res.texts, strict=True):
        print(f"Q: {q}\nA: {a.strip()}\n")
    print(
        f"batch {len(prompts)}: {res.n_generated} tokens; prefill {res.prefill_tokens_per_s:.1f} tok/s, "
        f"decode {res.decode_tokens_per_s:.1f} tok/s ({1e3 * res.time_per_step:.1f} ms per step)"
    )
    print()
    _demo_speculative(model, tok, args.max_new_tokens)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m decoding", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate text from a prompt, streaming it")
    g.add_argument("prompt")
    g.add_argument("--max-new-tokens", type=int, default=64)
    g.add_argument("--batch", type=int, default=1, help="run the prompt as a batch of B sequences")
    g.add_argument(
        "--max-batch", type=int, default=None,
        help="decode at most M sequences at once, refilling finished slots (continuous batching)",
    )  # fmt: skip
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-k", type=int, default=None)
    g.add_argument("--top-p", type=float, default=None)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    g.add_argument(
        "--special", action="store_true",
        help="read control-token spellings in the prompt (e.g. <|im_end|>) as control tokens; "
        "by default they are plain text, with or without --chat",
    )  # fmt: skip
    g.add_argument("--model", default="smollm2-135m", help="model name or GGUF path")
    g.add_argument(
        "--method",
        choices=METHODS,
        default="autoregressive",
        help="ems: speculative decoding without padding (EMS-SD); vanilla: the padded baseline",
    )
    g.add_argument("--drafter", choices=DRAFTERS, default="llma")
    g.add_argument("--max-draft", type=int, default=7, help="draft tokens per step at most (>= 1)")
    g.add_argument("--reference", default=None, help="a text FILE the LLMA drafter copies from")
    g.add_argument("--no-budget", action="store_true", help="verify every draft (no cost-model budget)")
    d = sub.add_parser("demo", help="answer four chat questions at batch 4")
    d.add_argument("--max-new-tokens", type=int, default=48)
    d.add_argument("--model", default="smollm2-135m")
    args = parser.parse_args(argv)
    # before the model loads, each with its subcommand's usage and the flag's name
    command = g if args.command == "generate" else d
    if args.max_new_tokens < 1:
        command.error(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.command == "generate" and args.batch < 1:
        command.error(f"--batch must be >= 1, got {args.batch}")
    if args.command == "generate" and args.max_draft < 1:  # whatever --method
        command.error(f"--max-draft must be >= 1, got {args.max_draft}")
    if args.command == "generate":  # generate's own rule, before the load (it had come after it)
        try:
            check_max_batch(args.max_batch, n_prompts=args.batch, padded=args.method == "vanilla")
        except ValueError as e:
            command.error(f"--max-batch: {e}")
    try:
        return _generate(args) if args.command == "generate" else _demo(args)
    # FloatingPointError: non-finite logits (a model file whose weights overflow the activations)
    except (
        ValueError,
        TypeError,
        MemoryError,
        ModuleNotFoundError,
        FileNotFoundError,
        OSError,
        FloatingPointError,
    ) as e:
        print(f"error: {e or type(e).__name__}", file=sys.stderr)  # a MemoryError has no message
        return 2
