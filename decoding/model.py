"""The Llama forward pass over a packed batch (gpt-fast style, NumPy).

Shapes: ``T`` packed new tokens, ``B`` sequences, ``d`` model width, ``H`` query heads, ``Hkv``
key/value heads, ``D`` head size, ``F`` MLP width, ``V`` vocabulary.

Weights are held as contiguous matrices in the file's ``[out, in]`` layout, with Q, K, V fused
into one ``[(H + 2 Hkv) D, d]`` matrix and gate/up fused into one ``[2F, d]`` matrix per layer, so a
layer is four matrix products ``x @ W.T`` (:func:`decoding.kernels.linear`: a few-row kernel for
decode and verification steps, BLAS GEMM for prefill). The tied output head reuses the embedding
(no copy) and is applied only to the rows whose logits are asked for.

RoPE: llama.cpp's converter permutes the Q and K rows of Hugging Face checkpoints so that GGUF
llama models rotate *adjacent* pairs ``(x[2i], x[2i+1])`` by ``pos * theta ** (-2i / D)``
(llama.cpp's "normal" RoPE); we apply exactly that to GGUF weights.
"""

from __future__ import annotations

import os
import queue
import threading
import weakref
from dataclasses import dataclass

import numpy as np

from rsketch._parallel import serialized_launches
from rsketch._validation import check_int, check_integers

from . import kernels
from ._simd import HALF_CONVERSION
from ._xp import device_of, namespace, on_device
from .attention import AttentionPlan, attend
from .config import LlamaConfig
from .gguf_reader import SUPPORTED_TYPES, GGUFFile, quoted, read_gguf
from .kernels import linear, rms_norm
from .kv_cache import KVCache, check_cache_dtype
from .quantized import QUANTIZED_TYPES, QuantizedMatrix

__all__ = ["Model", "Layer", "PackedBatch", "check_tensors"]


@dataclass(frozen=True)
class Layer:
    """One transformer block's weights (``[out, in]``, applied as ``x @ W.T``).

    Examples
    --------
    >>> d, H, Hkv, D, F = 8, 2, 1, 4, 16
    >>> L = Layer(np.ones(d), np.zeros(((H + 2 * Hkv) * D, d)), np.zeros((d, H * D)), np.ones(d),
    ...           np.zeros((2 * F, d)), np.zeros((d, F)))
    >>> L.wqkv.shape, L.w_gate_up.shape
    ((16, 8), (32, 8))
    """

    attn_norm: np.ndarray  # [d]
    wqkv: np.ndarray  # [(H + 2 Hkv) D, d]
    wo: np.ndarray  # [d, H D]
    ffn_norm: np.ndarray  # [d]
    w_gate_up: np.ndarray  # [2F, d]
    w_down: np.ndarray  # [d, F]


_FIELDS = ("attn_norm", "wqkv", "wo", "ffn_norm", "w_gate_up", "w_down")


def _nbytes(w) -> int:
    # NumPy, CuPy and QuantizedMatrix have nbytes; the array API has a size and a float dtype's bits
    if hasattr(w, "nbytes"):
        return int(w.nbytes)
    return int(w.size) * namespace(w).finfo(w.dtype).bits // 8


@dataclass(frozen=True)
class PackedBatch:
    """The engine's one currency: new tokens of ``B`` sequences packed into one array.

    Every forward of the engine takes one: prefill, decode steps, EMS-SD verification, the padded
    vanilla layout (pads included, with their own ``positions``) and the draft model's steps.

    Attributes
    ----------
    tokens : int array [T]
    seq_ids : int array [B]
        Cache sequence of each packed sequence (distinct).
    cu_seqlens : int array [B + 1]
        Prefix sums of the new-token counts; sequence ``b`` owns ``tokens[cu_seqlens[b]:cu_seqlens[b+1]]``.
    positions : int array [T] or None
        RoPE position of every token; None: each sequence's cache length plus the token's offset
        (the usual case; a padded layout passes the real positions of its tokens).

    Examples
    --------
    >>> pb = PackedBatch.from_lists([[5, 6, 7], [8]], seq_ids=[0, 1], start_positions=[0, 4])
    >>> pb.cu_seqlens.tolist(), pb.positions.tolist()
    ([0, 3, 4], [0, 1, 2, 4])
    >>> PackedBatch.from_lists([[5, 6], [8]], seq_ids=[0, 1]).positions is None  # from the cache
    True
    """

    tokens: np.ndarray
    seq_ids: np.ndarray
    cu_seqlens: np.ndarray
    positions: np.ndarray | None = None

    @classmethod
    def from_lists(cls, token_lists, *, seq_ids, start_positions=None) -> PackedBatch:
        """Pack one token list per sequence; positions run on from ``start_positions`` (None: the cache's)."""
        for name, lists in (("token_lists", token_lists), ("start_positions", start_positions)):
            for b, t in enumerate(lists if lists is not None else ()):  # int64 would cut 1.5 to 1
                dtype = np.asarray(t).dtype
                if np.size(t) and (dtype.kind not in "iu" or isinstance(t, (bool, np.bool_))):
                    raise TypeError(f"{name}[{b}] must hold integers, got {type(t).__name__} of {dtype}")
        check_integers(seq_ids, "seq_ids")
        n_lists, n_ids = len(token_lists), np.size(seq_ids)
        if n_lists == 0:
            raise ValueError("token_lists is empty: a batch packs at least one sequence")
        if n_ids != n_lists or (start_positions is not None and len(start_positions) != n_lists):
            what = f"{n_ids} seq_ids" + (
                "" if start_positions is None else f", {len(start_positions)} start_positions"
            )
            raise ValueError(f"{what} for {n_lists} token lists: one of each per sequence")
        counts = np.array([len(t) for t in token_lists], dtype=np.int64)
        cu = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        tokens = np.concatenate([np.asarray(t, dtype=np.int64) for t in token_lists])
        pos = None
        if start_positions is not None:
            pos = np.concatenate(
                [p + np.arange(n, dtype=np.int64) for p, n in zip(start_positions, counts, strict=True)]
            )
        return cls(tokens, np.asarray(seq_ids, dtype=np.int64), cu, pos)


def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    # x: [T, heads, D]; cos, sin: [T, 1, D/2]; adjacent pairs (x[2i], x[2i+1]) rotate together
    T, nh, D = x.shape
    xp = namespace(x)
    pairs = xp.reshape(x, (T, nh, D // 2, 2))
    x0, x1 = pairs[..., 0], pairs[..., 1]  # [T, heads, D/2]
    out = xp.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1)
    return xp.reshape(out, (T, nh, D))


def _head(h: np.ndarray, w: np.ndarray, chunk: int = 2048) -> np.ndarray:
    """Logits ``h @ w.T`` for ``h`` [N, d] and the output head ``w`` [V, d].

    NumPy with the kernel on: :func:`decoding.kernels.linear` (the few-row kernel, in row
    blocks). Otherwise (the kernel switched off, or CuPy) up to 64 rows, GEMM would pack the
    whole 113 MB head for the call, tripling its memory traffic; running it over row blocks of
    ``w`` that fit in cache reads the head from memory once.
    """
    N = h.shape[0]
    if isinstance(w, QuantizedMatrix) or N <= kernels.FEW_ROWS or N > 64 or namespace(h) is not np:
        return linear(h, w)
    xp = namespace(h)
    ht = xp.ascontiguousarray(h.T)  # [d, N]
    out_t = xp.empty((w.shape[0], N), dtype=xp.result_type(h, w))  # [V, N]
    for a in range(0, w.shape[0], chunk):
        xp.matmul(w[a : a + chunk], ht, out=out_t[a : a + chunk])
    return xp.ascontiguousarray(out_t.T)  # [N, V]


_PREFETCHER_LOCK = threading.Lock()  # makes each model's one prefetcher once


class _Prefetcher:
    """A helper thread that pulls the next layer's weights into the CPU caches.

    A decode step reads every weight once, and with a few rows per matrix OpenBLAS's GEMM reads
    and packs them without overlapping memory latency with arithmetic. While the main thread
    computes layer ``i``, this thread touches one float per 64-byte line of layer ``i + 1`` (a
    strided NumPy sum, which releases the GIL), so the main thread then finds it in L3 (32 MB
    here; a SmolLM2 layer is 14 MB in float32). It only reads, never blocks the main thread, and
    skips requests that are already stale.

    The thread ends at :meth:`stop`, which a finalizer of its model calls when the model is
    collected (:meth:`Model._layer_prefetcher`); it holds views of the weights, not the model. A
    thread that waited for requests forever leaked one thread per ``drafter="draft_model"`` call
    (each call truncates the target anew: 20 calls, 20 threads) and kept every dropped model's
    weights alive (4 loads, RSS 303 to 559 MB).
    """

    def __init__(self, layers):
        self._lines = [[_weight_lines(w) for w in (L.wqkv, L.wo, L.w_gate_up, L.w_down)] for L in layers]
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.current = -1  # layer the main thread is computing
        self._thread = threading.Thread(target=self._run, name="decoding-prefetch", daemon=True)
        self._thread.start()

    def _run(self):
        while True:
            i = self._queue.get()
            if i is None:  # stop()
                return
            if i > self.current:  # not yet reached by the main thread
                for lines in self._lines[i]:
                    lines.sum()

    def request(self, i: int) -> None:
        self._queue.put(i)

    def stop(self) -> None:
        """End the thread once it has done the requests before (safe in a finalizer: ``put`` of a
        ``SimpleQueue`` is reentrant)."""
        self._queue.put(None)


def _blind_tokens(key_valid, seq_ids, cu, old) -> np.ndarray:
    """Which packed tokens see no key: ``key_valid`` hides every slot of their sequence up to their
    own (a padded layout's left pads, which are never read; any other such token is misuse)."""
    counts = np.diff(cu)
    rows = key_valid[seq_ids]  # [B, capacity]
    first = np.where(rows.any(axis=1), rows.argmax(axis=1), rows.shape[1])  # first visible slot
    own = np.repeat(old - cu[:-1], counts) + np.arange(int(cu[-1]))  # each token's own slot
    return np.repeat(first, counts) > own


def _weight_lines(w) -> np.ndarray:
    """One element per 64-byte line of a weight's memory (its blocks when quantized)."""
    data = w.blocks if isinstance(w, QuantizedMatrix) else w
    return data.reshape(-1)[:: max(1, 64 // data.itemsize)]


def _fuse(parts):
    """Row-concatenate the parts of a fused matrix: as blocks when all are quantized alike, else float."""
    if (
        all(isinstance(p, QuantizedMatrix) for p in parts)
        and len({(p.ggml_type, p.shape[1]) for p in parts}) == 1
    ):
        return QuantizedMatrix.concatenate(parts)
    return np.concatenate([p.dequantize() if isinstance(p, QuantizedMatrix) else p for p in parts], axis=0)


def weight_dtype(dtype) -> tuple[bool, np.dtype]:
    """``(quantized, compute dtype)`` of a ``dtype`` argument of :meth:`Model.from_gguf`.

    Exactly the documented values, ``"quantized"``, ``numpy.float32`` or ``numpy.float64`` (or their
    ``numpy.dtype``); anything else is a ``ValueError`` naming ``dtype``: ``None`` too, which
    ``numpy.dtype`` would read as float64, and ``5``, ``float`` or ``"float32"``.

    Examples
    --------
    >>> weight_dtype("quantized")
    (True, dtype('float32'))
    >>> weight_dtype(np.float64)
    (False, dtype('float64'))
    >>> weight_dtype("q4")
    Traceback (most recent call last):
    ...
    ValueError: dtype must be 'quantized', numpy.float32 or numpy.float64, got 'q4'
    """
    if isinstance(dtype, str) and dtype == "quantized":
        return True, np.dtype(np.float32)
    if (
        dtype is np.float32
        or dtype is np.float64
        or (isinstance(dtype, np.dtype) and dtype in (np.float32, np.float64))
    ):
        return False, np.dtype(dtype)
    raise ValueError(f"dtype must be 'quantized', numpy.float32 or numpy.float64, got {dtype!r}")


def _tensor_shapes(cfg: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """NumPy shape (``[out, in]``) of every tensor of a llama model of ``cfg``, ``output.weight``
    (absent when the head is tied to the embedding) included."""
    d, H, Hkv, D, F, V = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff, cfg.vocab_size
    shapes = {"token_embd.weight": (V, d), "output_norm.weight": (d,), "output.weight": (V, d)}
    block = {
        "attn_norm": (d,), "attn_q": (H * D, d), "attn_k": (Hkv * D, d), "attn_v": (Hkv * D, d),
        "attn_output": (d, H * D), "ffn_norm": (d,), "ffn_gate": (F, d), "ffn_up": (F, d),
        "ffn_down": (d, F),
    }  # fmt: skip
    for i in range(cfg.n_layers):
        shapes.update({f"blk.{i}.{n}.weight": shape for n, shape in block.items()})
    return shapes


def check_tensors(f: GGUFFile, config: LlamaConfig) -> None:
    """Check the tensor records of ``f`` against ``config`` before any weight is read.

    Every tensor a llama model of ``config`` needs must be present (``output.weight`` may be absent:
    the head is then the embedding), with its shape and a type :func:`~decoding.gguf_reader.dequantize`
    reads, and no other tensor. Only the records are read: a BF16 embedding, a Q6_K matrix in the
    last block or one block too many had been found after every other weight was dequantized
    (4-5 s, 1.1 GB for SmolLM2-135M).

    Raises
    ------
    ValueError
        Naming the file and the tensor.

    Examples
    --------
    >>> import dataclasses
    >>> f = read_gguf(path)  # path: the SmolLM2 GGUF file  # doctest: +SKIP
    >>> cfg = LlamaConfig.from_metadata(f.metadata)  # doctest: +SKIP
    >>> check_tensors(f, cfg)  # doctest: +SKIP
    >>> check_tensors(f, dataclasses.replace(cfg, n_layers=29))  # doctest: +SKIP
    Traceback (most recent call last):
    ...
    ValueError: GGUF file ...: 9 tensors that a llama model of llama.block_count 29 does not have: ...
    """
    shapes = _tensor_shapes(config)
    if "rope_freqs.weight" in f.tensors:
        raise ValueError(f"GGUF file {f.path} has rope_freqs.weight (scaled RoPE), which is not supported")
    unexpected = [n for n in f.tensors if n not in shapes]
    if unexpected:
        shown = ", ".join(quoted(n) for n in unexpected[:5]) + (", ..." if len(unexpected) > 5 else "")
        raise ValueError(
            f"GGUF file {f.path}: {len(unexpected)} tensors that a llama model of llama.block_count "
            f"{config.n_layers} does not have: {shown}"
        )
    for name, shape in shapes.items():
        info = f.tensors.get(name)
        if info is None:
            if name == "output.weight":  # tied to the embedding
                continue
            raise ValueError(f"GGUF file {f.path} lacks tensor {name!r}")
        if info.shape != shape:
            raise ValueError(
                f"GGUF file {f.path}: tensor {name!r} has shape {info.shape}, the metadata gives {shape}"
            )
        if info.ggml_type not in SUPPORTED_TYPES:
            raise ValueError(
                f"GGUF file {f.path}: tensor {name!r} has type {info.ggml_type.name}, which is not "
                f"supported (supported: {', '.join(t.name for t in SUPPORTED_TYPES)})"
            )


def _prefetch_default() -> bool:
    """``DECODING_PREFETCH=1`` turns the prefetch thread on (off by default: on this project's
    shared 2-core machine its benefit could not be measured reliably; the benchmark reports both)."""
    return os.environ.get("DECODING_PREFETCH", "0").strip().lower() in ("1", "on", "true", "yes")


class Model:
    """A Llama model whose forward runs on packed batches against a :class:`KVCache`.

    Build it with :meth:`from_gguf`. ``dtype`` is float32 for inference, float64 for exact tests.

    Examples
    --------
    >>> model = Model.from_gguf(path)  # path: the SmolLM2 GGUF file  # doctest: +SKIP
    >>> cache = model.new_cache(max_seqs=2, capacity=64)  # doctest: +SKIP
    >>> a, b = cache.allocate(), cache.allocate()  # doctest: +SKIP
    >>> logits = model.forward(np.array([1, 2, 3, 4]), cache=cache, seq_ids=np.array([a, b]),
    ...                        cu_seqlens=np.array([0, 3, 4]), logits="last")  # doctest: +SKIP
    >>> logits.shape  # doctest: +SKIP
    (2, 49152)
    """

    def __init__(self, config: LlamaConfig, layers, tok_embd, out_norm, output=None, *, dtype=np.float32):
        self.config = config
        self.layers = list(layers)
        self.tok_embd = tok_embd  # [V, d]
        self.out_norm = out_norm  # [d]
        self._output = output  # [V, d] or None when tied to tok_embd
        self.dtype = np.dtype(dtype)  # of the activations and the logits
        # numpy, or a GPU library's namespace when the weights live there (quantized weights are NumPy only)
        self.xp = np if isinstance(tok_embd, QuantizedMatrix) else namespace(tok_embd)
        self.kv_dtype = (
            np.dtype(np.float16) if self.weight_format == "quantized" and HALF_CONVERSION else self.dtype
        )
        self.device = None if self.xp is np else device_of(tok_embd)
        D = config.head_dim
        self._inv_freq = config.rope_theta ** (-np.arange(0, D, 2, dtype=np.float64) / D)  # [D/2]
        #: stream the next layer's weights into cache from a helper thread (``DECODING_PREFETCH=1``
        #: or set this attribute); see ``_Prefetcher``
        self.prefetch = _prefetch_default()
        self._prefetcher = None

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, source, *, dtype="quantized") -> Model:
        """Load a llama GGUF file (a path or a parsed :class:`GGUFFile`).

        ``dtype="quantized"`` keeps the file's Q4_1 and Q8_0 matrices as their blocks
        (:class:`~decoding.quantized.QuantizedMatrix`; other tensors become float32) and computes in
        float32; ``numpy.float32`` or ``numpy.float64`` dequantize every weight to that dtype.
        Checks every tensor record against the metadata (:func:`check_tensors`) before reading any
        weight; ``ValueError`` otherwise.
        Memory: one copy of every weight as held (the file itself is only mapped).
        """
        quantized, dtype = weight_dtype(dtype)
        f = source if isinstance(source, GGUFFile) else read_gguf(source)
        cfg = LlamaConfig.from_metadata(f.metadata)
        check_tensors(f, cfg)  # every record, before any weight is read

        def get(name):
            info = f.tensors[name]
            shape = info.shape
            if quantized and info.ggml_type in QUANTIZED_TYPES and len(shape) == 2 and shape[1] % 32 == 0:
                try:
                    return QuantizedMatrix.from_raw(f.raw(name), info.ggml_type, shape)
                except ValueError as e:
                    raise ValueError(f"GGUF file {f.path}: tensor {quoted(name)}: {e}") from None
            return f.tensor(name, dtype=dtype)

        layers = []
        for i in range(cfg.n_layers):
            p = f"blk.{i}."
            wq, wk, wv = (get(p + n + ".weight") for n in ("attn_q", "attn_k", "attn_v"))  # [out, in]
            layers.append(
                Layer(
                    attn_norm=get(p + "attn_norm.weight"),
                    wqkv=_fuse([wq, wk, wv]),
                    wo=get(p + "attn_output.weight"),
                    ffn_norm=get(p + "ffn_norm.weight"),
                    w_gate_up=_fuse([get(p + "ffn_gate.weight"), get(p + "ffn_up.weight")]),
                    w_down=get(p + "ffn_down.weight"),
                )
            )
        tok_embd = get("token_embd.weight")
        output = get("output.weight") if "output.weight" in f.tensors else None
        return cls(cfg, layers, tok_embd, get("output_norm.weight"), output, dtype=dtype)

    def truncated(self, n_layers: int) -> Model:
        """A model sharing these weights that runs only the first ``n_layers`` blocks, then norm and head.

        A self-speculative drafter; it needs its own cache (``new_cache``) with ``n_layers`` layers.
        """
        check_int(n_layers, "n_layers")  # True would give one layer, 2.7 two
        if not 1 <= n_layers <= self.n_layers:
            raise ValueError(f"n_layers must be in [1, {self.n_layers}], got {n_layers}")
        part = Model(
            self.config,
            self.layers[:n_layers],
            self.tok_embd,
            self.out_norm,
            self._output,
            dtype=self.dtype,
        )
        part.kv_dtype = self.kv_dtype
        part.prefetch = self.prefetch  # this model's setting (it had read DECODING_PREFETCH afresh)
        return part

    def to_device(self, xp, device=None) -> Model:
        """A model with these (float) weights in the array library ``xp`` on ``device``: every forward
        then runs there, through the portable path (``docs/gpu.md``).

        ``xp`` is an array-API namespace: ``array_api_compat.cupy`` for a GPU (what
        :func:`decoding.load_model` passes for ``device="cuda"``), or ``array_api_strict`` on a
        second device, which stands in for a GPU in the tests. Quantized weights have CPU kernels
        only: load with ``dtype=numpy.float32`` (or ``float64``) for a device.

        Examples
        --------
        >>> import array_api_strict as xps
        >>> model = Model.from_gguf("tiny.gguf", dtype=np.float64)  # doctest: +SKIP
        >>> model.to_device(xps, xps.Device("device1")).device  # doctest: +SKIP
        array_api_strict.Device('device1')
        """
        weights = [self.tok_embd, self.out_norm, self._output] + [
            getattr(L, f) for L in self.layers for f in _FIELDS
        ]
        if any(isinstance(w, QuantizedMatrix) for w in weights):
            raise ValueError(
                "quantized weights have CPU kernels only; load the model with dtype=numpy.float32 (or "
                "numpy.float64) to run it on a device"
            )

        def move(w):
            return None if w is None else on_device(np.ascontiguousarray(w), xp, device)

        layers = [Layer(**{f: move(getattr(L, f)) for f in _FIELDS}) for L in self.layers]
        return Model(
            self.config,
            layers,
            move(self.tok_embd),
            move(self.out_norm),
            move(self._output),
            dtype=self.dtype,
        )

    # -- properties ---------------------------------------------------------------------------
    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def weight_format(self) -> str:
        """``"quantized"`` when weights are held as GGUF blocks, else the weights' dtype name."""
        held = [self.tok_embd, self._output] + [
            w for L in self.layers for w in (L.wqkv, L.wo, L.w_gate_up, L.w_down)
        ]
        return "quantized" if any(isinstance(w, QuantizedMatrix) for w in held) else self.dtype.name

    @property
    def kv_dtype(self) -> np.dtype:
        """The KV cache's dtype (:meth:`new_cache`): float16 for quantized weights, as llama.cpp keeps
        it by default (half the bytes the attention reads a step; on a CPU without F16C, float32),
        else the activations' dtype. Set it to ``numpy.float32`` for a float32 cache; anything but
        float16, float32 or float64 is refused when set (``None`` included)."""
        return self._kv_dtype

    @kv_dtype.setter
    def kv_dtype(self, value) -> None:
        self._kv_dtype = check_cache_dtype(value, "kv_dtype")

    @property
    def output_weight(self) -> np.ndarray:
        """The output head ``[V, d]`` (the embedding when tied)."""
        return self.tok_embd if self._output is None else self._output

    @property
    def nbytes(self) -> int:
        """Bytes of the weights as held in memory (what one decode step must read)."""
        weights = [self.tok_embd, self.out_norm] + ([] if self._output is None else [self._output])
        weights += [getattr(L, f) for L in self.layers for f in _FIELDS]
        return sum(_nbytes(w) for w in weights)

    def forward_bytes(self, n_tokens: int, *, keys: int, logits_rows: int) -> int:
        """An upper estimate of the memory one :meth:`forward` allocates (the cache aside).

        ``n_tokens`` new tokens, each attending to at most ``keys`` cached keys, and logits for
        ``logits_rows`` rows (``n_tokens`` for ``logits="all"``, the sequences for ``"last"``,
        0 for None). Per token: the activations of one layer at a time (residual, norm, fused
        QKV, queries, attention output, fused gate/up, SwiGLU, down projection), the attention
        kernel's score rows (``n_heads x keys``) and the host's position and slot arrays.

        Examples
        --------
        >>> model.forward_bytes(1, keys=100, logits_rows=1)  # SmolLM2-135M, float32  # doctest: +SKIP
        436368
        """
        cfg = self.config
        b = self.dtype.itemsize
        d, H, Hkv, D, F, V = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff, cfg.vocab_size
        per_token = b * (5 * d + (H + 2 * Hkv) * D + 2 * H * D + 3 * F + H * int(keys)) + 8 * (2 * D + 16)
        rows = int(logits_rows)
        logits = b * V * (rows + min(rows, kernels.FEW_ROWS))  # the result and one block's product
        return int(n_tokens) * per_token + logits

    def new_cache(self, *, max_seqs: int, capacity: int) -> KVCache:
        """A :class:`KVCache` for this model: ``max_seqs`` regions of ``capacity`` slots, ``kv_dtype``."""
        return KVCache.for_model(self, max_seqs=max_seqs, capacity=capacity, xp=self.xp)

    # -- forward ------------------------------------------------------------------------------
    def _embed(self, tokens: np.ndarray):
        """The embedding rows of ``tokens`` ``[T]`` as ``[T, d]`` activations."""
        if isinstance(self.tok_embd, QuantizedMatrix):
            return self.tok_embd.dequantize(rows=tokens)
        if self.xp is np:
            return self.tok_embd[tokens]
        return self.xp.take(self.tok_embd, self._here(tokens), axis=0)

    def _here(self, a):
        """The host array ``a`` where the weights live (``a`` itself for NumPy)."""
        return on_device(a, self.xp, self.device)

    def _checked_batch(self, tokens, seq_ids, cu_seqlens, positions, cache, logits, key_valid):
        """:meth:`forward`'s arguments checked against the model and ``cache``, before anything is
        written: ``(tokens, seq_ids, cu_seqlens, positions, key_valid)``, the first three int64
        arrays (``positions`` as given, or None)."""
        cfg = self.config
        if isinstance(tokens, PackedBatch):
            if seq_ids is not None or cu_seqlens is not None or positions is not None:
                raise TypeError("pass either a PackedBatch or tokens with seq_ids/cu_seqlens/positions")
            tokens, seq_ids, cu_seqlens, positions = (
                tokens.tokens,
                tokens.seq_ids,
                tokens.cu_seqlens,
                tokens.positions,
            )
        if seq_ids is None or cu_seqlens is None:
            raise TypeError("forward needs seq_ids and cu_seqlens (or a PackedBatch)")
        named = {"tokens": tokens, "seq_ids": seq_ids, "cu_seqlens": cu_seqlens, "positions": positions}
        for name, a in named.items():  # an int64 cast would silently make token 1.7 token 1
            if a is not None:
                check_integers(a, name)
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        seq_ids = np.asarray(seq_ids, dtype=np.int64).reshape(-1)
        cu = np.asarray(cu_seqlens, dtype=np.int64).reshape(-1)
        T, B = tokens.size, seq_ids.size
        if cu.size != B + 1 or cu[0] != 0 or cu[-1] != T or (np.diff(cu) < 0).any():
            raise ValueError(
                f"cu_seqlens must be {B + 1} non-decreasing offsets from 0 to {T}, got {cu.tolist()}"
            )
        if T and (tokens.min() < 0 or tokens.max() >= cfg.vocab_size):
            raise ValueError(f"token ids must be in [0, {cfg.vocab_size})")
        if B and (seq_ids.min() < 0 or seq_ids.max() >= cache.max_seqs):
            raise ValueError(f"seq_ids must be in [0, {cache.max_seqs}), got {seq_ids.tolist()}")
        if not cache.in_use[seq_ids].all():  # O(B): a region never allocated (or released) is no one's
            raise ValueError(
                f"seq_ids must be sequences allocated in the cache (cache.allocate()), got {seq_ids.tolist()}"
            )
        if logits not in ("all", "last", None):
            raise ValueError(f"logits must be 'all', 'last' or None, got {logits!r}")
        if cache.n_layers < self.n_layers:
            raise ValueError(f"cache has {cache.n_layers} layers, the model needs {self.n_layers}")
        # another model's cache: the compiled store wrote this model's heads past its buffers (an
        # abort), and fewer heads gave logits off by 7 without a word
        if (cache.n_kv_heads, cache.head_dim) != (cfg.n_kv_heads, cfg.head_dim):
            raise ValueError(
                f"cache holds {cache.n_kv_heads} KV heads of size {cache.head_dim}, the model has "
                f"{cfg.n_kv_heads} of size {cfg.head_dim}: use model.new_cache()"
            )
        # where the buffers are, not the device the cache was given (None for the current one)
        here = (np, None) if self.xp is np else (self.xp, self.device)
        there = (np, None) if isinstance(cache.k, np.ndarray) else (namespace(cache.k), device_of(cache.k))
        if there[0] is not here[0] or there[1] != here[1]:
            raise ValueError(
                f"cache lives on {there[1] or 'the CPU'}, the model on {here[1] or 'the CPU'}: "
                "use model.new_cache()"
            )
        if key_valid is not None:
            key_valid = np.asarray(key_valid, dtype=bool)
            if key_valid.shape != (cache.max_seqs, cache.capacity):
                raise ValueError(
                    f"key_valid must have shape {(cache.max_seqs, cache.capacity)}, got {key_valid.shape}"
                )
        return tokens, seq_ids, cu, positions, key_valid

    def _logits(self, x, cu, logits: str):
        """The logits of :meth:`forward`: every row of the final activations ``x`` ``[T, d]``
        (``"all"``) or each sequence's last (``"last"``; NaN for a sequence with no new token)."""
        cfg, xp, B, T = self.config, self.xp, cu.size - 1, x.shape[0]
        counts = np.diff(cu)
        if logits == "last":
            idx = np.maximum(cu[1:] - 1, 0)
            if not T:
                x = self._here(np.zeros((B, cfg.d_model), self.dtype))  # [B, d]
            else:
                x = x[idx] if xp is np else xp.take(x, self._here(idx), axis=0)  # [B, d]
        out = _head(rms_norm(x, self.out_norm, cfg.norm_eps), self.output_weight)  # [T or B, V]
        if logits == "last" and (counts == 0).any():
            out[self._here(counts == 0)] = float("nan")
        return out

    def _layer_prefetcher(self):
        """The next layer's weight prefetcher (:attr:`prefetch`), made at the first forward, or None.
        None on a device too: the prefetch reads host memory into the CPU's cache, and on a device it
        would launch work from a second thread."""
        if not self.prefetch or self.xp is not np:
            return None
        if self._prefetcher is None:
            with _PREFETCHER_LOCK:  # two first forwards at once each started one, and one was never stopped
                if self._prefetcher is None:
                    pf = _Prefetcher(self.layers)
                    weakref.finalize(self, pf.stop)  # holds the prefetcher, not the model
                    self._prefetcher = pf
        return self._prefetcher

    def _fuses_rope(self, cache: KVCache) -> bool:
        """Whether RoPE and the cache writes run in one compiled pass: NumPy weights and a NumPy
        cache of their dtype (or float16 beside float32)."""
        return (
            self.xp is np
            and isinstance(cache.k, np.ndarray)
            and self.dtype in (np.float32, np.float64)
            and (cache.k.dtype == self.dtype or (cache.k.dtype == np.float16 and self.dtype == np.float32))
        )

    @serialized_launches  # its kernels one forward at a time under numba's workqueue layer only
    def forward(
        self,
        tokens,
        *,
        cache: KVCache,
        seq_ids=None,
        cu_seqlens=None,
        positions=None,
        logits: str | None = "all",
        key_valid=None,
    ) -> np.ndarray | None:
        """Run the new tokens of a packed batch, append their keys/values to ``cache``, return logits.

        Parameters
        ----------
        tokens : int array [T] or PackedBatch
            New tokens of all sequences, concatenated; a :class:`PackedBatch` supplies
            ``seq_ids``, ``cu_seqlens`` and ``positions`` itself.
        cache : KVCache
            Sequence ``seq_ids[b]`` already caches ``cache.lengths[seq_ids[b]]`` tokens; on return it
            also holds the new ones.
        seq_ids : int array [B]
            Distinct cache sequence ids.
        cu_seqlens : int array [B + 1]
            Offsets of each sequence's new tokens in ``tokens`` (0 first, T last; counts may be 0).
        positions : int array [T], optional
            RoPE positions; default each sequence's cache length plus the token's offset. Given
            or not, they must lie in ``[0, config.context_length)`` (``ValueError`` otherwise, before
            anything is written): a token past the context has no position the model was trained on.
        logits : {"all", "last", None}
            Logits for every new token ``[T, V]``, for each sequence's last new token ``[B, V]``
            (a sequence with no new tokens gives a row of NaN), or none (prefill of a drafter).
        key_valid : bool array [cache.max_seqs, cache.capacity], optional
            Cache slots (including the ones written now) that may be attended to; a padded
            layout marks its pad slots False. Default: all. A token that sees no slot (all of its
            keys hidden) has no attention output: its row of logits is NaN.

        Returns
        -------
        logits : array or None
        """
        tokens, seq_ids, cu, positions, key_valid = self._checked_batch(
            tokens, seq_ids, cu_seqlens, positions, cache, logits, key_valid
        )
        cfg, T = self.config, tokens.size
        counts = np.diff(cu)  # [B]
        old = cache.lengths[seq_ids].copy()  # [B]
        slots = cache.prepare(seq_ids, counts)  # [T]
        if positions is None:
            positions = slots - np.repeat(cache.starts[seq_ids], counts)  # cache offset of each token
        positions = np.asarray(positions, dtype=np.int64).reshape(-1)
        if positions.size != T:
            raise ValueError(f"positions must have {T} entries, got {positions.size}")
        # checked before any write: RoPE of a negative position or one past the trained context gave
        # logits without an error
        if T and (positions.min() < 0 or positions.max() >= cfg.context_length):
            raise ValueError(
                f"positions must lie in [0, {cfg.context_length}) (the model's context), got "
                f"{int(positions.min())} to {int(positions.max())}"
            )

        H, Hkv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        xp = self.xp
        ang = positions[:, None] * self._inv_freq[None, :]  # [T, D/2] (host, float64)
        cos = self._here(np.cos(ang).astype(self.dtype)[:, None, :])  # [T, 1, D/2]
        sin = self._here(np.sin(ang).astype(self.dtype)[:, None, :])
        eps = cfg.norm_eps

        plan = AttentionPlan.build(cache, seq_ids, cu, old, key_valid, dtype=self.dtype, n_heads=H)
        pf = self._layer_prefetcher()
        fused_rope = self._fuses_rope(cache)
        cos2, sin2 = cos[:, 0, :], sin[:, 0, :]  # [T, D/2]
        x = self._embed(tokens)  # [T, d]
        for li, L in enumerate(self.layers):
            if pf is not None:
                pf.current = li
                if li + 1 < self.n_layers:
                    pf.request(li + 1)
            h = rms_norm(x, L.attn_norm, eps)  # [T, d]
            qkv = linear(h, L.wqkv)  # [T, (H + 2Hkv) D]
            if fused_rope:  # one compiled pass: rotate, store k and v, return q
                q = kernels.rope_and_store(qkv, cos2, sin2, H, Hkv, slots, cache.k[li], cache.v[li])
            else:
                qk = _rope(xp.reshape(qkv[:, : (H + Hkv) * D], (T, H + Hkv, D)), cos, sin)  # [T, H + Hkv, D]
                q, k = qk[:, :H, :], qk[:, H:, :]  # [T, H, D], [T, Hkv, D]
                v = xp.reshape(qkv[:, (H + Hkv) * D :], (T, Hkv, D))  # [T, Hkv, D]
                cache.write(li, slots, k, v)
            o = attend(q, cache, li, plan)  # [T, H, D]
            x = x + linear(xp.reshape(o, (T, H * D)), L.wo)  # [T, d]
            h = rms_norm(x, L.ffn_norm, eps)
            gu = linear(h, L.w_gate_up)  # [T, 2F]
            x = x + linear(kernels.swiglu(gu), L.w_down)  # [T, d]
        cache.advance(seq_ids, counts)
        if pf is not None:
            pf.current = self.n_layers

        if logits is None:
            return None
        out = self._logits(x, cu, logits)
        if key_valid is not None and T:
            blind = _blind_tokens(key_valid, seq_ids, cu, old)  # [T]
            if logits == "last":
                blind = blind[np.maximum(cu[1:] - 1, 0)] & (counts > 0)  # [B]
            if blind.any():  # their rows averaged hidden keys: finite, and meaningless
                out[self._here(blind)] = float("nan")
        return out
