"""The byte-level BPE tokenizer and chat template stored in a GGUF file.

Built with the ``tokenizers`` package from ``tokenizer.ggml.tokens`` / ``merges`` / ``token_type``:
control tokens (type 3) become special added tokens, so ``<|im_start|>`` in a prompt is one id, as
in llama.cpp with special parsing on. The pre-tokenizer follows llama.cpp's ``tokenizer.ggml.pre``:
``smollm`` (and other StarCoder-style vocabularies) split digits individually before the GPT-2
regex. The chat template (``tokenizer.chat_template``) is rendered with jinja2 in a sandbox.
"""

from __future__ import annotations

import numpy as np
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as _HFTokenizer

__all__ = ["Tokenizer"]

# llama.cpp pre-tokenizer names whose regex begins with single digits (\p{N}), then the GPT-2 regex.
_DIGIT_SPLIT = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}
_GPT2 = {"default", "gpt2", "gpt-2"}
# token types: 3 = control (special), 4 = user-defined


class Tokenizer:
    """Encode, decode and apply the chat template.

    Examples
    --------
    >>> tok = Tokenizer.from_metadata(gguf_file.metadata)  # doctest: +SKIP
    >>> tok.decode(tok.encode("Hello world"))  # doctest: +SKIP
    'Hello world'
    >>> tok.apply_chat_template([{"role": "user", "content": "Hi"}])  # doctest: +SKIP
    '<|im_start|>system\\n...<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n'
    """

    def __init__(self, hf: _HFTokenizer, *, bos_id, eos_id, add_bos, chat_template, id_to_token, eot_id=None):
        self._hf = hf
        self.eot_id = eot_id
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.add_bos = add_bos
        self.chat_template = chat_template
        self._id_to_token = id_to_token
        self.vocab_size = len(id_to_token)
        self._special = {int(i) for i, t in hf.get_added_tokens_decoder().items() if t.special}

    @classmethod
    def from_metadata(cls, md: dict) -> Tokenizer:
        """Build from GGUF metadata; ``ValueError`` for an unsupported or inconsistent vocabulary."""
        model = md.get("tokenizer.ggml.model")
        if model != "gpt2":
            raise ValueError(f"tokenizer.ggml.model {model!r} not supported (only byte-level BPE 'gpt2')")
        tokens = md.get("tokenizer.ggml.tokens")
        merges = md.get("tokenizer.ggml.merges")
        if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
            raise ValueError("GGUF tokenizer.ggml.tokens must be a non-empty list of strings")
        if not isinstance(merges, list) or not all(isinstance(m, str) for m in merges):
            raise ValueError("GGUF tokenizer.ggml.merges must be a list of strings")
        types = md.get("tokenizer.ggml.token_type")
        types = np.ones(len(tokens), dtype=np.int64) if types is None else np.asarray(types)
        if types.shape != (len(tokens),):
            raise ValueError(f"tokenizer.ggml.token_type has {types.size} entries for {len(tokens)} tokens")
        vocab = {}
        for i, t in enumerate(tokens):
            vocab.setdefault(t, i)
        pairs = []
        for m in merges:
            parts = m.split(" ")
            if len(parts) != 2:
                raise ValueError(f"malformed BPE merge {m!r}")
            pairs.append((parts[0], parts[1]))
        try:
            bpe = models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False)
        except Exception as e:  # the tokenizers package raises its own exception types
            raise ValueError(f"GGUF vocabulary and merges do not form a BPE model: {e}") from e
        hf = _HFTokenizer(bpe)
        pre = md.get("tokenizer.ggml.pre", "default")
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        if pre in _DIGIT_SPLIT:
            hf.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"), byte_level]
            )
        elif pre in _GPT2:
            hf.pre_tokenizer = byte_level
        else:
            raise ValueError(f"tokenizer.ggml.pre {pre!r} not supported")
        hf.decoder = decoders.ByteLevel()
        special = [AddedToken(tokens[i], special=True, normalized=False) for i in np.flatnonzero(types == 3)]
        user = [AddedToken(tokens[i], special=False, normalized=False) for i in np.flatnonzero(types == 4)]
        hf.add_special_tokens(special)
        if user:
            hf.add_tokens(user)
        if hf.get_vocab_size() != len(tokens):
            n = hf.get_vocab_size()
            raise ValueError(f"tokenizer has {n} ids for {len(tokens)} GGUF tokens (duplicates?)")

        def tok_id(key):
            v = md.get(key)
            if v is None:
                return None
            if not isinstance(v, int) or not 0 <= v < len(tokens):
                raise ValueError(f"GGUF {key} {v!r} is not a token id")
            return v

        return cls(
            hf,
            bos_id=tok_id("tokenizer.ggml.bos_token_id"),
            eos_id=tok_id("tokenizer.ggml.eos_token_id"),
            eot_id=tok_id("tokenizer.ggml.eot_token_id"),
            add_bos=bool(md.get("tokenizer.ggml.add_bos_token", False)),
            chat_template=md.get("tokenizer.chat_template"),
            id_to_token=list(tokens),
        )

    def encode(self, text: str, *, add_bos: bool | None = None) -> list[int]:
        """Token ids of ``text`` (special tokens written in the text are parsed as such)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        ids = self._hf.encode(text, add_special_tokens=False).ids
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids = [self.bos_id, *ids]
        return ids

    def decode(self, ids, *, skip_special: bool = True) -> str:
        """Text of ``ids``; special tokens (e.g. ``<|im_end|>``) are dropped unless ``skip_special=False``."""
        return self._hf.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def token_text(self, i: int) -> str:
        """The vocabulary string of id ``i`` (byte-level, as stored)."""
        return self._id_to_token[i]

    def is_special(self, i: int) -> bool:
        return int(i) in self._special

    def apply_chat_template(self, messages, *, add_generation_prompt: bool = True) -> str:
        """Render ``messages`` (dicts with ``role`` and ``content``) with the model's chat template."""
        if not self.chat_template:
            raise ValueError("this model has no chat template (tokenizer.chat_template)")
        from jinja2.sandbox import ImmutableSandboxedEnvironment  # only chat prompts need jinja2

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        tpl = env.from_string(self.chat_template)
        tok = self._id_to_token
        return tpl.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=tok[self.bos_id] if self.bos_id is not None else "",
            eos_token=tok[self.eos_id] if self.eos_id is not None else "",
        )
