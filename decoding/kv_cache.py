"""An unpadded key/value cache: one preallocated buffer, a region per sequence, a length per sequence.

Layout: ``k`` and ``v`` are each one array ``[n_layers, n_kv_heads, max_seqs * capacity, head_dim]``.
Sequence ``s`` owns the slots ``starts[s] : starts[s] + capacity`` (``starts[s] = s * capacity``) and
uses the first ``lengths[s]`` of them; nothing is ever padded, a short sequence just leaves the end
of its region unused. Per head, a sequence's keys are one contiguous ``[length, head_dim]`` block,
which is what the attention matmul wants.

Lifecycle: :meth:`allocate` hands out a free sequence id (its length reset to 0), the model's
forward appends keys and values through :meth:`prepare` / :meth:`write` / :meth:`advance`,
:meth:`truncate` rolls back rejected draft tokens (the slots are simply overwritten later),
:meth:`reset` empties one sequence and :meth:`release` returns its region for reuse.

Memory: ``2 * n_layers * n_kv_heads * head_dim * itemsize`` bytes per token slot; for SmolLM2-135M
(30 layers, 3 KV heads of 64) in float32 that is 46,080 bytes, so 16 sequences of 2,048 slots take
1.5 GB, 8 sequences of 1,024 slots 377 MB. The quantized engine keeps its cache in float16, as
llama.cpp does by default (:attr:`decoding.model.Model.kv_dtype`): half of that, and half the bytes
its attention reads a step.
"""

from __future__ import annotations

import numpy as np

from rsketch._validation import check_int, check_integers

from ._simd import HALF_CONVERSION
from ._xp import xp_dtype
from .memory import check_fits

__all__ = ["KVCache"]


def check_cache_dtype(dtype, name: str = "dtype") -> np.dtype:
    """``dtype`` as a NumPy dtype of a KV cache (float16, float32 or float64), or an error naming ``name``.

    ``None`` is refused, where ``numpy.dtype(None)`` would give float64: a cache of twice the bytes
    and a slower attention, without a word.

    Examples
    --------
    >>> check_cache_dtype("float32")
    dtype('float32')
    >>> check_cache_dtype(None, "kv_dtype")
    Traceback (most recent call last):
    ...
    ValueError: kv_dtype must be float16, float32 or float64, got None
    """
    if dtype is None:
        raise ValueError(f"{name} must be float16, float32 or float64, got None")
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"{name} must be a NumPy dtype (float16, float32 or float64), got {dtype!r}") from exc
    if dt not in (np.float16, np.float32, np.float64):
        raise ValueError(f"{name} must be float16, float32 or float64, got {dt.name}")
    return dt


class KVCache:
    """Preallocated per-sequence key/value regions.

    Parameters
    ----------
    n_layers, n_kv_heads, head_dim : int
        The model's shape (``KVCache.for_model`` reads them from a model).
    max_seqs : int
        Number of sequence regions.
    capacity : int
        Slots per sequence (the longest prompt plus generated tokens it can hold).
    dtype : numpy dtype
        float16 (the quantized engine's: each key and value rounded to nearest, read as float32 by
        the attention kernel; NumPy only, on a CPU with F16C), float32 for inference, float64 for
        exact tests.

    Examples
    --------
    >>> cache = KVCache(n_layers=2, n_kv_heads=1, head_dim=4, max_seqs=2, capacity=8)
    >>> s = cache.allocate()
    >>> cache.append(s, np.ones((2, 3, 1, 4)), np.ones((2, 3, 1, 4)))
    >>> int(cache.lengths[s])
    3
    >>> cache.truncate(s, 1); int(cache.lengths[s])
    1
    """

    def __init__(
        self, n_layers, n_kv_heads, head_dim, *, max_seqs, capacity, dtype=np.float32, xp=np, device=None
    ):
        self.n_layers, self.n_kv_heads, self.head_dim = (
            check_int(v, name, minimum=1)
            for name, v in (("n_layers", n_layers), ("n_kv_heads", n_kv_heads), ("head_dim", head_dim))
        )
        self.max_seqs = check_int(max_seqs, "max_seqs", minimum=1)
        self.capacity = check_int(capacity, "capacity", minimum=1)
        dtype = check_cache_dtype(dtype)
        if dtype == np.float16 and xp is not np:
            raise ValueError("a float16 cache is the CPU engine's; on a device use dtype float32 or float64")
        if dtype == np.float16 and not HALF_CONVERSION:
            raise ValueError(
                "a float16 cache needs a CPU with F16C (float16 conversions); use dtype=numpy.float32"
            )
        shape = (self.n_layers, self.n_kv_heads, self.max_seqs * self.capacity, self.head_dim)
        if xp is np:  # before the buffers: NumPy's zeros would succeed lazily and fail page by page
            need = self.bytes_for(
                self.n_layers, self.n_kv_heads, self.head_dim, self.max_seqs, self.capacity, dtype
            )
            check_fits(need, f"a KV cache of {self.max_seqs} sequences x {self.capacity} slots")
        self.xp = xp  # numpy, or a GPU library's namespace (lengths and starts stay on the host)
        self.device = device
        self._dtype = dtype
        if xp is np:
            self.k = np.zeros(shape, dtype=dtype)  # [n_layers, n_kv_heads, slots, head_dim]
            self.v = np.zeros(shape, dtype=dtype)
        else:
            self.k = xp.zeros(shape, dtype=xp_dtype(xp, dtype), device=device)
            self.v = xp.zeros(shape, dtype=xp_dtype(xp, dtype), device=device)
        self.starts = np.arange(self.max_seqs, dtype=np.int64) * self.capacity  # [max_seqs]
        self.lengths = np.zeros(self.max_seqs, dtype=np.int64)  # [max_seqs]
        self.in_use = np.zeros(self.max_seqs, dtype=bool)
        # a device library that takes an index array in an assignment (CuPy) writes a forward's keys
        # in one assignment per layer; otherwise one per sequence (a run of consecutive slots)
        self._scatters = xp is not np and _takes_index_arrays(xp, device)
        self._device_slots = None  # (host slots, the same on the device): one forward's, for every layer

    @classmethod
    def for_model(cls, model, *, max_seqs, capacity, dtype=None, xp=None) -> KVCache:
        """A cache shaped for ``model`` (its layers, KV heads, head size and ``kv_dtype``)."""
        cfg = model.config
        return cls(
            model.n_layers,
            cfg.n_kv_heads,
            cfg.head_dim,
            max_seqs=max_seqs,
            capacity=capacity,
            dtype=model.kv_dtype if dtype is None else dtype,
            xp=getattr(model, "xp", np) if xp is None else xp,
            device=getattr(model, "device", None),
        )

    @staticmethod
    def bytes_for(n_layers, n_kv_heads, head_dim, max_seqs, capacity, dtype=np.float32) -> int:
        """Bytes of the ``k`` and ``v`` buffers of such a cache (what the constructor allocates).

        Examples
        --------
        >>> KVCache.bytes_for(30, 3, 64, max_seqs=1, capacity=1)  # SmolLM2-135M: one token slot
        46080
        """
        slot = 2 * int(n_layers) * int(n_kv_heads) * int(head_dim) * np.dtype(dtype).itemsize
        return slot * int(max_seqs) * int(capacity)

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def nbytes(self) -> int:
        return 2 * int(self.k.size) * self._dtype.itemsize

    # -- sequence lifecycle -------------------------------------------------------------------
    def allocate(self) -> int:
        """Take a free sequence region, empty it and return its id; ``RuntimeError`` if none is free."""
        free = np.flatnonzero(~self.in_use)
        if free.size == 0:
            raise RuntimeError(f"all {self.max_seqs} cache sequences are in use; release one first")
        s = int(free[0])
        self.in_use[s] = True
        self.lengths[s] = 0
        return s

    def release(self, seq: int) -> None:
        """Mark sequence ``seq`` finished; its region is reused by a later :meth:`allocate`."""
        seq = self._check_seq(seq)
        self.in_use[seq] = False
        self.lengths[seq] = 0

    def reset(self, seq: int) -> None:
        """Empty sequence ``seq`` (length 0), keeping it allocated."""
        seq = self._check_seq(seq)
        self.lengths[seq] = 0

    def truncate(self, seq: int, new_len: int) -> None:
        """Keep only the first ``new_len`` cached tokens of ``seq`` (roll back rejected drafts)."""
        seq = self._check_seq(seq)
        new_len = check_int(new_len, "new_len", minimum=0)
        if not new_len <= self.lengths[seq]:
            n = int(self.lengths[seq])
            raise ValueError(f"new_len must be in [0, {n}] for sequence {seq}, got {new_len}")
        self.lengths[seq] = new_len

    # -- appending (used by Model.forward) --------------------------------------------------------
    def prepare(self, seq_ids: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Buffer slots where the next ``counts[b]`` tokens of each ``seq_ids[b]`` go, packed in order.

        Checks capacity; does not change lengths (:meth:`advance` does, after every layer is written).
        """
        check_integers(seq_ids, "seq_ids")  # a float id or count would be truncated
        check_integers(counts, "counts")
        seq_ids = np.asarray(seq_ids, dtype=np.int64)
        counts = np.asarray(counts, dtype=np.int64)
        if seq_ids.size and (seq_ids.min() < 0 or seq_ids.max() >= self.max_seqs):
            raise ValueError(f"seq_ids must be in [0, {self.max_seqs}), got {seq_ids.tolist()}")
        if np.unique(seq_ids).size != seq_ids.size:
            raise ValueError(f"seq_ids must be distinct within a batch, got {seq_ids.tolist()}")
        old = self.lengths[seq_ids]
        over = old + counts > self.capacity
        if over.any():
            b = int(np.flatnonzero(over)[0])
            raise ValueError(
                f"sequence {int(seq_ids[b])} would hold {int(old[b] + counts[b])} tokens, "
                f"cache capacity is {self.capacity}"
            )
        # slot of token t of sequence b: starts[s] + old_len[s] + t
        base = np.repeat(self.starts[seq_ids] + old - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
        return base + np.arange(int(counts.sum()), dtype=np.int64)  # [T]

    def write(self, layer: int, slots: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
        """Store ``k``, ``v`` (``[T, n_kv_heads, head_dim]``) of ``layer`` at host ``slots`` (``[T]``).

        On a device whose arrays take an index array in an assignment (CuPy's), the slots go to the
        device once a forward and each layer's keys in one assignment. Otherwise (the array API
        standard has no scatter by an index array) they go in runs of consecutive slots, one slice
        assignment per sequence of a packed batch: on a GPU, two launches per sequence and layer.
        """
        if self.xp is np:
            self.k[layer][:, slots, :] = k.transpose(1, 0, 2)  # [Hkv, T, D]
            self.v[layer][:, slots, :] = v.transpose(1, 0, 2)
            return
        xp = self.xp
        slots = np.asarray(slots, dtype=np.int64)
        if self._scatters:
            index = self._slots_on_device(slots)
            self.k[layer][:, index, :] = xp.permute_dims(k, (1, 0, 2))
            self.v[layer][:, index, :] = xp.permute_dims(v, (1, 0, 2))
            return
        breaks = np.flatnonzero(np.diff(slots) != 1) + 1
        for a, b in zip(np.r_[0, breaks], np.r_[breaks, slots.size], strict=True):
            s0 = int(slots[a])
            self.k[layer, :, s0 : s0 + b - a, :] = xp.permute_dims(k[a:b, ...], (1, 0, 2))
            self.v[layer, :, s0 : s0 + b - a, :] = xp.permute_dims(v[a:b, ...], (1, 0, 2))

    def _slots_on_device(self, slots: np.ndarray):
        """``slots`` on the device, sent once for the layers of a forward (which all write the same slots)."""
        held = self._device_slots
        if held is None or held[0].shape != slots.shape or not np.array_equal(held[0], slots):
            held = self._device_slots = (slots.copy(), self.xp.asarray(slots, device=self.device))
        return held[1]

    def advance(self, seq_ids: np.ndarray, counts: np.ndarray) -> None:
        """Add ``counts[b]`` to the length of ``seq_ids[b]``."""
        self.lengths[np.asarray(seq_ids, dtype=np.int64)] += np.asarray(counts, dtype=np.int64)

    def append(self, seq: int, k: np.ndarray, v: np.ndarray) -> None:
        """Append ``k``, ``v`` of shape ``[n_layers, n, n_kv_heads, head_dim]`` to sequence ``seq``."""
        seq = self._check_seq(seq)
        kshape, vshape = tuple(k.shape), tuple(v.shape)
        expect = (self.n_layers, kshape[1] if len(kshape) == 4 else -1, self.n_kv_heads, self.head_dim)
        if kshape != expect or vshape != expect:
            raise ValueError(f"k and v must have shape {expect}, got {kshape} and {vshape}")
        slots = self.prepare(np.array([seq]), np.array([k.shape[1]]))
        if self.xp is np:
            k, v = np.asarray(k), np.asarray(v)
        for layer in range(self.n_layers):
            self.write(layer, slots, k[layer], v[layer])
        self.advance(np.array([seq]), np.array([k.shape[1]]))

    def keys(self, layer: int, seq: int, length: int | None = None):
        """Views ``(k, v)`` ``[Hkv, length, D]`` of ``seq``'s first ``length`` slots (default: all cached)."""
        seq = self._check_seq(seq)  # a negative id would index the last regions
        layer = check_int(layer, "layer", minimum=0)
        if layer >= self.n_layers:
            raise ValueError(f"layer must be in [0, {self.n_layers}), got {layer}")
        if length is None:
            n = int(self.lengths[seq])
        else:  # past the region, the slice would run into the next sequence's slots
            n = check_int(length, "length", minimum=0)
            if n > self.capacity:
                raise ValueError(f"length must be in [0, {self.capacity}], got {n}")
        a = int(self.starts[seq])
        return self.k[layer, :, a : a + n], self.v[layer, :, a : a + n]

    def _check_seq(self, seq) -> int:
        """``seq`` as an int: an integer in ``[0, max_seqs)`` (``int(0.9)`` would silently be 0)."""
        seq = check_int(seq, "sequence id")
        if not 0 <= seq < self.max_seqs:
            raise ValueError(f"sequence id must be in [0, {self.max_seqs}), got {seq}")
        return seq


def _takes_index_arrays(xp, device) -> bool:
    """Whether ``xp``'s arrays take an integer index array in an assignment: CuPy's and NumPy's do;
    the array API standard does not ask it, and ``array_api_strict`` refuses (``IndexError``)."""
    probe = xp.zeros(2, device=device)
    try:
        probe[xp.asarray([1], device=device)] = 1
    except (IndexError, TypeError, ValueError, NotImplementedError):
        return False
    return True
