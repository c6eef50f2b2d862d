"""Read GGUF files: a bounded header parser and vectorized dequantization.

GGUF (llama.cpp's format) is a little-endian file: magic ``GGUF``, a version, the tensor and
key/value counts, the key/value metadata, one info record per tensor (name, dimensions, type,
offset), then the aligned tensor data. We take the format's constants (value types, quantization
block sizes) from the ``gguf`` package, but parse the header ourselves: ``gguf.GGUFReader`` trusts
the array lengths it reads, so one mutated length makes it loop for hours over an empty buffer.
Here every count and length is checked against the bytes that remain before anything is built,
so a truncated or corrupt file raises :class:`ValueError` saying what was wrong, in time
proportional to the file size. Nothing is ever unpickled.

Memory: the file is memory-mapped (no copy); :meth:`GGUFFile.tensor` dequantizes one tensor at a
time into a new float32 (or float64) array, 4 (or 8) bytes per weight. For SmolLM2-135M that is
about 540 MB in float32 from a 98 MB Q4_1 file.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

__all__ = [
    "GGUFFile",
    "TensorInfo",
    "read_gguf",
    "dequantize",
    "describe_value",
    "quoted",
    "SUPPORTED_TYPES",
]

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4

SUPPORTED_TYPES = (
    GGMLQuantizationType.F32,
    GGMLQuantizationType.F16,
    GGMLQuantizationType.F64,
    GGMLQuantizationType.Q8_0,
    GGMLQuantizationType.Q4_1,
)

# GGUF scalar value types -> (struct format, size in bytes)
_SCALARS = {
    GGUFValueType.UINT8: ("<B", 1),
    GGUFValueType.INT8: ("<b", 1),
    GGUFValueType.UINT16: ("<H", 2),
    GGUFValueType.INT16: ("<h", 2),
    GGUFValueType.UINT32: ("<I", 4),
    GGUFValueType.INT32: ("<i", 4),
    GGUFValueType.FLOAT32: ("<f", 4),
    GGUFValueType.BOOL: ("<?", 1),
    GGUFValueType.UINT64: ("<Q", 8),
    GGUFValueType.INT64: ("<q", 8),
    GGUFValueType.FLOAT64: ("<d", 8),
}
_NP_SCALARS = {
    GGUFValueType.UINT8: "<u1",
    GGUFValueType.INT8: "<i1",
    GGUFValueType.UINT16: "<u2",
    GGUFValueType.INT16: "<i2",
    GGUFValueType.UINT32: "<u4",
    GGUFValueType.INT32: "<i4",
    GGUFValueType.FLOAT32: "<f4",
    GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "<u8",
    GGUFValueType.INT64: "<i8",
    GGUFValueType.FLOAT64: "<f8",
}


#: Characters of a name from a file (a key, a tensor name) that an error message quotes: a 20 MB
#: tensor name had been printed whole.
NAME_CHARS = 64


def quoted(name, limit: int = NAME_CHARS) -> str:
    """``repr`` of a name read from a file, cut to its first ``limit`` characters ("..." after).

    Error messages quote keys and tensor names; the file sets their length.

    Examples
    --------
    >>> quoted("blk.0.attn_q.weight")
    "'blk.0.attn_q.weight'"
    >>> quoted("A" * 20_000_000 + "token_embd.weight")
    "'AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA'... (20000017 characters)"
    """
    if isinstance(name, str) and len(name) > limit:
        return f"{name[:limit]!r}... ({len(name)} characters)"
    return repr(name)


def describe_value(v) -> str:
    """A metadata value as :func:`read_gguf` gives it, in a few words for an error message.

    Its GGUF kind (string, bool, integer, float, or array: a NumPy array of numbers, a list of
    strings), and the value itself when it is a scalar (a long string is cut).

    Examples
    --------
    >>> describe_value("abc"), describe_value(True), describe_value(49152.7)
    ("string 'abc'", 'bool True', 'float 49152.7')
    >>> describe_value(np.arange(3, dtype=np.int32)), describe_value(["a", "b"])
    ('array of 3 int32', 'array of 2 strings')
    """
    if isinstance(v, np.ndarray):
        return f"array of {v.size} {v.dtype}"
    if isinstance(v, list):
        return (
            f"array of {len(v)} strings" if all(isinstance(x, str) for x in v) else f"array of {len(v)} items"
        )
    if isinstance(v, str):
        return f"string {v[:40]!r}" + ("..." if len(v) > 40 else "")
    if isinstance(v, bool):
        return f"bool {v}"
    if isinstance(v, int):
        return f"integer {v}"
    if isinstance(v, float):
        return f"float {v!r}"
    return f"{type(v).__name__} {v!r}"


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's record: name, NumPy-order shape (GGUF lists dimensions innermost first), type, bytes.

    ``offset`` is absolute in the file.

    Examples
    --------
    >>> TensorInfo("output_norm.weight", (576,), GGMLQuantizationType.F32, 1024, 2304).shape
    (576,)
    """

    name: str
    shape: tuple[int, ...]
    ggml_type: GGMLQuantizationType
    offset: int
    nbytes: int


@dataclass
class GGUFFile:
    """A parsed GGUF file: its metadata and tensor records over a read-only memory map.

    Examples
    --------
    >>> f = read_gguf(path)  # doctest: +SKIP
    >>> f.metadata["general.architecture"]  # doctest: +SKIP
    'llama'
    >>> f.tensor("blk.0.attn_q.weight").shape  # doctest: +SKIP
    (576, 576)
    """

    path: Path
    version: int
    metadata: dict
    tensors: dict[str, TensorInfo]
    alignment: int
    _buffer: object = field(repr=False, default=None)

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 view of the file (no copy)."""
        info = self._info(name)
        return np.frombuffer(self._buffer, dtype=np.uint8, count=info.nbytes, offset=info.offset)

    def tensor(self, name: str, dtype=np.float32) -> np.ndarray:
        """Dequantize tensor ``name`` to a new array of ``dtype`` (float32 or float64), NumPy-order shape.

        Raises ``ValueError`` for an unsupported type or non-finite values.
        """
        info = self._info(name)
        with np.errstate(over="ignore"):  # a float64 value past float32's range: said below, by name
            out = dequantize(self.raw(name), info.ggml_type, info.shape, dtype=dtype)
        if not np.isfinite(out).all():
            if info.ggml_type == GGMLQuantizationType.F64 and np.isfinite(self.raw(name).view("<f8")).all():
                raise ValueError(
                    f"GGUF file {self.path}: tensor {quoted(name)} holds float64 values beyond "
                    f"{np.dtype(dtype).name}'s range: load it with dtype=numpy.float64"
                )
            raise ValueError(
                f"GGUF file {self.path}: tensor {quoted(name)} dequantizes to non-finite values "
                "(corrupt data?)"
            )
        return out

    def _info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(f"GGUF file {self.path} has no tensor {quoted(name)}") from None


def dequantize(raw: np.ndarray, ggml_type, shape: tuple[int, ...], *, dtype=np.float32) -> np.ndarray:
    """Dequantize the bytes ``raw`` of one tensor of type ``ggml_type`` to ``dtype`` with ``shape``.

    Supported: F32, F16, F64, Q8_0 (blocks of 32: f16 scale d, 32 int8; w = d q) and Q4_1 (blocks
    of 32: f16 scale d, f16 minimum m, 16 bytes of nibbles; low nibbles are weights 0..15, high
    nibbles 16..31; w = d q + m). Work is vectorized over all blocks at once.

    Examples
    --------
    >>> raw = np.array([1.0, -2.5], dtype="<f2").view(np.uint8)
    >>> dequantize(raw, GGMLQuantizationType.F16, (2,)).tolist()
    [1.0, -2.5]
    """
    ggml_type = GGMLQuantizationType(ggml_type)
    dtype = np.dtype(dtype)
    raw = np.asarray(raw, dtype=np.uint8).reshape(-1)
    n = int(np.prod(shape, dtype=np.int64))
    if ggml_type == GGMLQuantizationType.F32:
        out = raw.view("<f4").astype(dtype)
    elif ggml_type == GGMLQuantizationType.F16:
        out = raw.view("<f2").astype(dtype)
    elif ggml_type == GGMLQuantizationType.F64:
        out = raw.view("<f8").astype(dtype)
    elif ggml_type == GGMLQuantizationType.Q8_0:
        blocks = raw.reshape(-1, 34)
        d = blocks[:, :2].copy().view("<f2").astype(dtype)  # [nb, 1]
        q = blocks[:, 2:].view(np.int8).astype(dtype)  # [nb, 32]
        out = q * d
    elif ggml_type == GGMLQuantizationType.Q4_1:
        blocks = raw.reshape(-1, 20)
        d = blocks[:, 0:2].copy().view("<f2").astype(dtype)  # [nb, 1]
        m = blocks[:, 2:4].copy().view("<f2").astype(dtype)  # [nb, 1]
        qs = blocks[:, 4:]  # [nb, 16]
        # d q + m in float64, rounded once: the value the quantized kernels' fused multiply-add gives
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float64)  # [nb, 32]
        out = (q * d.astype(np.float64) + m.astype(np.float64)).astype(dtype)
    else:
        names = ", ".join(t.name for t in SUPPORTED_TYPES)
        raise ValueError(f"unsupported GGUF tensor type {ggml_type.name}; supported: {names}")
    if out.size != n:
        raise ValueError(f"tensor data holds {out.size} values, shape {shape} needs {n}")
    return out.reshape(shape)


def _tensor_info(path, name, dims, raw_type, start, seen) -> TensorInfo:
    """The :class:`TensorInfo` of one tensor record, its name, type and dimensions checked."""
    if name in seen:
        raise ValueError(f"GGUF file {path}: tensor {quoted(name)} appears twice")
    try:
        ggml_type = GGMLQuantizationType(raw_type)
    except ValueError:
        raise ValueError(f"GGUF file {path}: tensor {quoted(name)} has unknown type id {raw_type}") from None
    if ggml_type not in GGML_QUANT_SIZES:
        raise ValueError(
            f"GGUF file {path}: tensor {quoted(name)} has type {ggml_type.name} with unknown block size"
        )
    if any(d <= 0 for d in dims):
        raise ValueError(f"GGUF file {path}: tensor {quoted(name)} has a non-positive dimension in {dims}")
    n = 1
    for d in dims:
        n *= d
    block, type_size = GGML_QUANT_SIZES[ggml_type]
    if dims[0] % block:
        raise ValueError(
            f"GGUF file {path}: tensor {quoted(name)}: row length {dims[0]} is not a multiple of the "
            f"{ggml_type.name} block size {block}"
        )
    return TensorInfo(name, tuple(reversed(dims)), ggml_type, start, n // block * type_size)


class _Cursor:
    """Bounds-checked little-endian reads from a buffer."""

    def __init__(self, buf, size: int):
        self.buf = buf
        self.size = size
        self.pos = 0

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise ValueError(
                f"GGUF file truncated or corrupt: {what} needs {n} bytes at offset {self.pos}, "
                f"{self.size - self.pos} remain"
            )

    def scalar(self, vtype: GGUFValueType, what: str):
        fmt, n = _SCALARS[vtype]
        self.need(n, what)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v

    def u32(self, what: str) -> int:
        return self.scalar(GGUFValueType.UINT32, what)

    def u64(self, what: str) -> int:
        return self.scalar(GGUFValueType.UINT64, what)

    def string(self, what: str) -> str:
        n = self.u64(f"length of {what}")
        self.need(n, what)
        b = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"GGUF {what} at offset {self.pos - n} is not valid UTF-8") from e

    def value(self, raw_type: int, what: str, *, depth: int = 0):
        try:
            vtype = GGUFValueType(raw_type)
        except ValueError:
            raise ValueError(f"GGUF {what} has unknown value type {raw_type}") from None
        if vtype == GGUFValueType.STRING:
            return self.string(what)
        if vtype in _SCALARS:
            v = self.scalar(vtype, what)
            if vtype == GGUFValueType.BOOL and self.buf[self.pos - 1] > 1:
                raise ValueError(f"GGUF {what} is a bool with byte value {self.buf[self.pos - 1]}")
            return v
        # array: item type, count, items
        if depth > 0:
            raise ValueError(f"GGUF {what} is a nested array (not supported)")
        itype = self.u32(f"item type of {what}")
        count = self.u64(f"length of {what}")
        try:
            ivtype = GGUFValueType(itype)
        except ValueError:
            raise ValueError(f"GGUF {what} has unknown item type {itype}") from None
        if ivtype in _NP_SCALARS:
            size = _SCALARS[ivtype][1]
            self.need(count * size, f"{count} items of {what}")
            arr = np.frombuffer(self.buf, dtype=_NP_SCALARS[ivtype], count=count, offset=self.pos).copy()
            self.pos += count * size
            if ivtype == GGUFValueType.BOOL and arr.size and arr.view(np.uint8).max() > 1:
                raise ValueError(f"GGUF {what} holds bool bytes other than 0/1")
            return arr
        # strings or arrays: each item takes at least 8 bytes, which bounds the count
        self.need(count * 8, f"{count} items of {what}")
        return [self.value(itype, f"item of {what}", depth=depth + 1) for _ in range(count)]


def read_gguf(path) -> GGUFFile:
    """Parse the header, metadata and tensor records of the GGUF file at ``path``.

    Every count, length, type, shape and offset is validated; a truncated or corrupt file raises
    ``ValueError`` naming the problem. As in llama.cpp, each tensor's data must start where the
    previous tensor's ends, padded to the alignment (no overlap, no gap). Tensor data stays in the
    memory map until :meth:`GGUFFile.tensor`.

    Examples
    --------
    >>> f = read_gguf(path)  # path: a GGUF file, e.g. decoding.api.model_path()  # doctest: +SKIP
    >>> sorted(f.tensors)[:2]  # doctest: +SKIP
    ['blk.0.attn_k.weight', 'blk.0.attn_norm.weight']
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {path}")
    size = path.stat().st_size
    if size < 24:
        raise ValueError(f"GGUF file {path} truncated: {size} bytes, the fixed header alone is 24")
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    cur = _Cursor(buf, size)
    if bytes(buf[:4]) != MAGIC:
        raise ValueError(f"{path} is not a GGUF file: magic {bytes(buf[:4])!r}, expected {MAGIC!r}")
    cur.pos = 4
    version = cur.u32("version")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} not supported (expected 2 or 3)")
    n_tensors = cur.u64("tensor count")
    n_kv = cur.u64("metadata count")
    # a key/value takes >= 8 (key length) + 4 (type) + 1 bytes; a tensor record >= 8 + 4 + 8 + 4 + 8
    if n_kv * 13 > size - cur.pos:
        raise ValueError(f"GGUF metadata count {n_kv} cannot fit in a file of {size} bytes")
    if n_tensors * 32 > size - cur.pos:
        raise ValueError(f"GGUF tensor count {n_tensors} cannot fit in a file of {size} bytes")

    metadata: dict = {}
    for i in range(n_kv):
        key = cur.string(f"metadata key #{i}")
        if key in metadata:
            raise ValueError(f"GGUF metadata key {quoted(key)} appears twice")
        vtype = cur.u32(f"type of metadata {quoted(key)}")
        metadata[key] = cur.value(vtype, f"metadata {quoted(key)}")

    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    # the spec's type is UINT32: a BOOL True (an int to Python) had been read as alignment 1
    if (
        isinstance(alignment, bool)
        or not isinstance(alignment, int)
        or alignment <= 0
        or alignment & (alignment - 1)
    ):
        raise ValueError(
            f"GGUF file {path}: general.alignment must be an unsigned integer power of two, got "
            f"{describe_value(alignment)}"
        )

    records = []
    for i in range(n_tensors):
        name = cur.string(f"tensor name #{i}")
        shown = quoted(name)
        n_dims = cur.u32(f"dimension count of tensor {shown}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise ValueError(
                f"GGUF file {path}: tensor {shown} has {n_dims} dimensions (expected 1..{MAX_DIMS})"
            )
        dims = [cur.u64(f"dimension {j} of tensor {shown}") for j in range(n_dims)]
        raw_type = cur.u32(f"type of tensor {shown}")
        offset = cur.u64(f"offset of tensor {shown}")
        records.append((name, dims, raw_type, offset))

    data_start = -(-cur.pos // alignment) * alignment
    tensors: dict[str, TensorInfo] = {}
    expected = 0  # where the next tensor's data must start, relative to data_start
    for name, dims, raw_type, offset in records:
        info = _tensor_info(path, name, dims, raw_type, data_start + offset, tensors)
        # As llama.cpp's gguf_init_from_file: each tensor's data follows the previous one's, padded
        # to the alignment. Without this, 280 tensors of a 2.7 MB file had all pointed at the same
        # 1 MB (43 GB of weights once loaded), and an F32 norm re-typed F16 left a gap and loaded.
        if offset != expected:
            raise ValueError(
                f"GGUF file {path}: tensor {quoted(name)} has data offset {offset}, expected {expected} "
                f"(each tensor's data must follow the previous tensor's, padded to {alignment} bytes): "
                "overlapping or misplaced tensor data, or a wrong type or shape"
            )
        if info.offset + info.nbytes > size:
            raise ValueError(
                f"GGUF file {path}: tensor {quoted(name)} ({info.nbytes} bytes at offset {info.offset}) "
                f"runs past the end of the file ({size} bytes): truncated?"
            )
        expected += -(-info.nbytes // alignment) * alignment
        tensors[name] = info
    return GGUFFile(path, version, metadata, tensors, alignment, buf)
