"""LLVM intrinsics that numba lacks: a cache prefetch, float16 loads and stores, a vector exp,
products of quantized weight blocks.

numba compiles scalar loops and leaves vectorization to LLVM. Four things the engine needs do
not come out of that: a software prefetch (numba has no spelling for it), float16 (numba has no
such type on the CPU: :func:`as_float` and :func:`as_stored` convert a ``uint16`` view's
elements, for the quantized engine's KV cache), a float32 ``exp`` that
vectorizes (numba calls libm's scalar ``expf``; :func:`exp` is a polynomial LLVM vectorizes), and
the integer dot products of GGUF weight blocks with int8 activations (:func:`block_dot`): LLVM
does not turn a scalar loop into ``vpdpbusd`` (or AVX2's ``vpmaddubsw``/``vpmaddwd``) over 16
interleaved rows, so the loop over a 16-row group's blocks is written here as LLVM IR: vector
loads of the 16 rows' scales and codes, the nibbles split with a mask and a shift, four activation
bytes broadcast to every lane, the byte products summed into 16 int32 lanes, then a conversion
and fused multiply-adds into one float32 accumulator per token. LLVM lowers the 16-lane vectors
to one AVX-512 or two AVX2 registers.

numba caches a compiled kernel by its own source file only: after a change here, delete
``decoding/__pycache__/{quantized,kernels}.*.nb[ic]`` (or touch ``decoding/quantized.py`` and
``decoding/kernels.py``), or the kernels of :mod:`decoding.quantized` and
:mod:`decoding.kernels` keep the old code (the decoding tests' ``conftest.py`` deletes such stale
builds before it runs).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from llvmlite.binding import get_host_cpu_features
from numba import config, njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

__all__ = [
    "DOT_PATH",
    "GROUP_BLOCK_BYTES",
    "HALF_CONVERSION",
    "PASS_TOKENS",
    "as_float",
    "as_stored",
    "block_dot",
    "exp",
    "prefetch_l2",
    "prefetch_next_row",
]

_I32 = ir.IntType(32)
_F32 = ir.FloatType()
_F16 = ir.HalfType()


def _cpu_features() -> set[str]:
    """numba's target features (``+avx2``, ...): its own setting (``NUMBA_CPU_FEATURES``), else the host's."""
    features = config.CPU_FEATURES if config.CPU_FEATURES is not None else get_host_cpu_features().flatten()
    return set(features.split(","))


def _dot_path(features: set[str]) -> str:
    if {"+avx512vnni", "+avx512bw"} <= features:
        return "vnni"
    return "avx2" if "+avx2" in features else "generic"


#: How a block's integer dot products are computed (see :func:`block_dot`): ``"vnni"`` with
#: AVX-512 VNNI (``vpdpbusd``: 64 byte products summed by fours into 16 int32 lanes, one
#: instruction), ``"avx2"`` with AVX2 (``vpmaddubsw`` then ``vpmaddwd``, two instructions a 32-byte
#: half), else ``"generic"`` (widened to int32 in LLVM IR, for any CPU). The sums are integers,
#: exact on every path, so every path gives the same products bit for bit.
DOT_PATH = _dot_path(_cpu_features())


#: Whether the CPU converts float16 to and from float32 in hardware (F16C: ``vcvtph2ps``,
#: ``vcvtps2ph``, 8 or 16 values an instruction). Without it LLVM would call a runtime routine that
#: numba's JIT may not link, so the quantized engine keeps a float32 KV cache there
#: (:attr:`decoding.model.Model.kv_dtype`).
HALF_CONVERSION = "+f16c" in _cpu_features()


@intrinsic
def _float32_from_half(typingctx, bits):  # pragma: no cover - compiled
    """The float32 value of the float16 whose bits are the uint16 ``bits`` (exact)."""
    sig = types.float32(types.uint16)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], _F16), _F32)

    return sig, codegen


@intrinsic
def _half_from_float32(typingctx, x):  # pragma: no cover - compiled
    """The bits (uint16) of the float16 nearest to the float32 ``x`` (ties to even, as NumPy's
    ``astype(np.float16)``: overflow to infinity, NaN stays NaN)."""
    sig = types.uint16(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], _F16), ir.IntType(16))

    return sig, codegen


def as_float(x):
    """``x`` as a float, in compiled code: a uint16 holds float16 bits and gives their float32 value;
    a float is returned as it is.

    numba has no float16 on the CPU, so a float16 array reaches the kernels as its ``uint16``
    view (``a.view(np.uint16)``), and each element read goes through this. LLVM vectorizes the
    conversion (``vcvtph2ps``, :data:`HALF_CONVERSION`), so a loop over a row of the KV cache
    reads half the bytes of a float32 one for the same arithmetic.
    """
    return x


@overload(as_float, inline="always")
def _as_float_overload(x):  # pragma: no cover - compiled
    if isinstance(x, types.Integer) and x.bitwidth == 16 and not x.signed:
        return lambda x: _float32_from_half(x)
    return lambda x: x


def as_stored(dst, x):
    """The float ``x`` as the array ``dst`` holds its elements, in compiled code: the bits of the
    nearest float16 (ties to even) for a ``uint16`` view of a float16 array, ``x`` itself else
    (the assignment converts it)."""
    return x


@overload(as_stored, inline="always")
def _as_stored_overload(dst, x):  # pragma: no cover - compiled
    if isinstance(dst.dtype, types.Integer) and dst.dtype.bitwidth == 16 and not dst.dtype.signed:
        return lambda dst, x: _half_from_float32(np.float32(x))
    return lambda dst, x: x


def _prefetch(builder, ptr, locality):
    """``llvm.prefetch`` of the byte at ``ptr`` (an ``i8*``) for reading, with ``locality`` 3 (keep
    in L1: ``prefetcht0``) to 1; a hint only: it never faults, even past the end of an array."""
    fnty = ir.FunctionType(ir.VoidType(), [ptr.type, _I32, _I32, _I32])
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
    builder.call(fn, [ptr, _I32(0), _I32(locality), _I32(1)])  # read, locality, data


@intrinsic
def prefetch_l2(typingctx, row, k):  # pragma: no cover - compiled
    """Hint the CPU to bring the cache line holding ``row[k]`` (a contiguous 1-d array) into L2.

    LLVM's ``llvm.prefetch`` (read, locality 2: ``prefetcht1``); a hint only, never a fault, so
    it needs no bounds check.
    """
    sig = types.void(row, types.intp)

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]], wraparound=False)
        _prefetch(builder, builder.bitcast(ptr, ir.IntType(8).as_pointer()), locality=2)  # L2
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True)
def prefetch_next_row(w, r, end, line):  # pragma: no cover - compiled
    """Prefetch row ``r`` of ``w`` (if ``r < end``) into L2, a hint per ``line`` elements; returns ``r + 1``.

    The kernels call this once per pass over their tokens, so the rows they ask for are spread
    over the block's work: the whole block's rows asked for at once filled the core's queue of
    outstanding misses and stalled the arithmetic behind it.
    """
    if r < end:
        row = w[r]
        for k in range(0, w.shape[1], line):
            prefetch_l2(row, k)
        r += 1
    return r


@intrinsic
def _float32_from_bits(typingctx, bits):  # pragma: no cover - compiled
    """The float32 whose bit pattern is the int32 ``bits`` (a bitcast; numba has no spelling for it)."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], _F32)

    return sig, codegen


# exp's constants (float32): Cody-Waite's two-part ln 2 and the minimax polynomial of Cephes'
# expf on [-ln2/2, ln2/2]
_LOG2E = np.float32(1.4426950408889634)
_LN2_HI, _LN2_LO = np.float32(0.693359375), np.float32(-2.12194440e-4)
_EXP_POLY = tuple(
    np.float32(c)
    for c in (
        1.9875691500e-4,
        1.3981999507e-3,
        8.3334519073e-3,
        4.1665795894e-2,
        1.6666665459e-1,
        5.0000001201e-1,
    )
)
#: exp is 0 below ``_EXP_MIN`` (a subnormal result is flushed) and infinite above ``_EXP_MAX``
#: (ln of float32's largest value).
_EXP_MIN, _EXP_MAX = np.float32(-87.33654), np.float32(88.72283)


@njit(inline="always")
def _exp_float32(x):  # pragma: no cover - compiled
    # e^x = 2^n e^r: n = round(x / ln 2), r = x - n ln 2 in two parts (exact products), e^r by
    # Cephes' polynomial, 2^n built from its bits as 2^(n - n // 2) 2^(n // 2), each factor a
    # normal float32 for n in -126..128 and the products exact. Selects, not branches, so that
    # loops vectorize.
    xc = min(max(x, _EXP_MIN), _EXP_MAX)
    n = np.floor(xc * _LOG2E + np.float32(0.5))
    r = xc - n * _LN2_HI
    r = r - n * _LN2_LO
    c0, c1, c2, c3, c4, c5 = _EXP_POLY
    p = ((((c0 * r + c1) * r + c2) * r + c3) * r + c4) * r + c5
    e = (p * (r * r) + r) + np.float32(1.0)
    ni = np.int32(n)
    half = ni >> np.int32(1)
    e = e * _float32_from_bits((ni - half + np.int32(127)) << np.int32(23))
    e = e * _float32_from_bits((half + np.int32(127)) << np.int32(23))
    e = e if x >= _EXP_MIN else np.float32(0.0)
    e = e if x <= _EXP_MAX else np.float32(np.inf)
    return e if x == x else x  # NaN stays NaN


def exp(x):
    """``e**x`` for a float scalar, in compiled code: the polynomial below for float32, ``np.exp`` else.

    numba compiles ``np.exp`` of a float32 to a call of libm's ``expf``, one value at a time (it
    has no vector math library here), and a loop that calls it stays scalar. The float32 form
    here is lane-wise arithmetic, a compare and a bitcast, which LLVM vectorizes: the softmax of
    the attention kernel and SwiGLU run 16 values a vector operation. It is within 2 ulp of the
    exact value (the tests check float32 arguments across the range against float64), 0 below
    ``-87.34`` (where float32 would go subnormal), infinite above ``88.72``. float64
    keeps ``np.exp`` (the exact tests). Call it from numba only, in functions compiled with at
    most ``fastmath={"reassoc", "contract"}`` (the kernels' flags): with ``nsz`` or
    ``fastmath=True`` LLVM also reorders the two-part reduction and the split power of two (up to
    4.6 ulp, infinity above 88.38, NaN as infinity).
    """
    return np.exp(x)


@overload(exp, inline="always")
def _exp_overload(x):  # pragma: no cover - compiled
    if isinstance(x, types.Float) and x.bitwidth == 32:
        return lambda x: _exp_float32(x)
    return lambda x: np.exp(x)


def _splat(builder, value, lanes):
    vty = ir.VectorType(value.type, lanes)
    v = builder.insert_element(ir.Constant(vty, ir.Undefined), value, _I32(0))
    return builder.shuffle_vector(
        v, ir.Constant(vty, ir.Undefined), ir.Constant(ir.VectorType(_I32, lanes), [0] * lanes)
    )


def _vector_call(builder, name, args):
    fnty = ir.FunctionType(args[0].type, [a.type for a in args])
    return builder.call(cgutils.get_or_insert_function(builder.module, fnty, name), args)


def _block_sum(builder, weights, xs, signed):
    """A block's integer sums, ``<16 x i32>``: lane ``i`` gets, over the block's vectors ``c``,
    ``sum over j < 4 of weights[c][4 i + j] * xs[c][4 i + j]`` (``<64 x i8>`` each): ``xs`` signed
    activations (``|x| <= 127``), ``weights`` unsigned (Q4_1's codes 0..15) or, with ``signed``,
    signed (Q8_0's codes; the VNNI path gets them offset by 128 and corrects the sum itself, see
    :func:`block_dot`)."""
    i8x64, i32x16 = ir.VectorType(ir.IntType(8), 64), ir.VectorType(_I32, 16)
    if DOT_PATH == "avx2":
        return _block_sum_avx2(builder, weights, xs, signed)
    isum = ir.Constant(i32x16, [0] * 16)
    for w, x in zip(weights, xs, strict=True):
        if DOT_PATH == "vnni":
            fnty = ir.FunctionType(i32x16, [i32x16, i8x64, i8x64])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.avx512.vpdpbusd.512")
            isum = builder.call(fn, [isum, w, x])
        else:  # generic: widened to int32
            i32x64 = ir.VectorType(_I32, 64)
            wide = builder.sext(w, i32x64) if signed else builder.zext(w, i32x64)
            prod = builder.mul(wide, builder.sext(x, i32x64))
            for j in range(4):
                pick = ir.Constant(i32x16, list(range(j, 64, 4)))
                isum = builder.add(isum, builder.shuffle_vector(prod, prod, pick))
    return isum


def _block_sum_avx2(builder, weights, xs, signed):
    """:func:`_block_sum` with AVX2, a 32-byte half at a time: ``vpmaddubsw`` (unsigned bytes times
    signed ones, adjacent pairs summed into int16), then ``vpmaddwd`` by ones (pairs of int16 into
    int32). Q4_1's pair sums are at most ``2 * 15 * 127 = 3810`` in magnitude, so a block's eight
    add up exactly in int16 (at most 30,480) before one ``vpmaddwd``; Q8_0's are taken by sign and
    magnitude (``|w|`` at most 128 times ``x`` with ``w``'s sign: no pair saturates int16) and, as
    their sums fill int16, widened one by one."""
    i8x32, i16x16 = ir.VectorType(ir.IntType(8), 32), ir.VectorType(ir.IntType(16), 16)
    maddubs = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(i16x16, [i8x32, i8x32]), "llvm.x86.avx2.pmadd.ub.sw"
    )
    maddwd = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VectorType(_I32, 8), [i16x16, i16x16]), "llvm.x86.avx2.pmadd.wd"
    )
    ones = ir.Constant(i16x16, [1] * 16)
    halves = []
    for h in range(2):
        pick = ir.Constant(ir.VectorType(_I32, 32), list(range(32 * h, 32 * h + 32)))
        total = None  # int32 sums (Q8_0), or int16 ones (Q4_1)
        for w, x in zip(weights, xs, strict=True):
            wh, xh = builder.shuffle_vector(w, w, pick), builder.shuffle_vector(x, x, pick)
            if signed:
                xh = _vector_call(builder, "llvm.x86.avx2.psign.b", [xh, wh])
                wh = _vector_call(builder, "llvm.abs.v32i8", [wh, ir.Constant(ir.IntType(1), 0)])
            part = builder.call(maddubs, [wh, xh])
            if signed:
                part = builder.call(maddwd, [part, ones])
            total = part if total is None else builder.add(total, part)
        halves.append(total if signed else builder.call(maddwd, [total, ones]))
    return builder.shuffle_vector(halves[0], halves[1], ir.Constant(ir.VectorType(_I32, 16), list(range(16))))


#: How far ahead (bytes) :func:`block_dot` asks for the weight blocks it will need: each block
#: column of a group, as it is used, prefetches the cache lines this far on in the thread's run
#: of groups (4 KB: some 60% of a group of a 576-wide Q4_1 matrix ahead). The hardware prefetcher
#: alone left the reads and the arithmetic mostly one after the other: eight tokens' products
#: of every layer's matrices took 4.7-5.3 ms from memory against 3.6 with the weights in cache,
#: and 3.8-4.0 ms with this. Spread over the blocks (six or nine lines each), the prefetches
#: never queue up: a whole group asked for at once (an earlier try) stalled the arithmetic.
_PREFETCH_BYTES = 4096

#: Bytes of one block column of a 16-row group, as :class:`decoding.quantized.QuantizedMatrix`
#: holds it: the 16 rows' float32 scales ``d`` (Q4_1: then ``m``), then their codes in 4-byte
#: groups, the 16 rows' first four bytes, then their next four, ... (see that module).
GROUP_BLOCK_BYTES = {"q4_1": 64 + 64 + 256, "q8_0": 64 + 512}


def _block_dot_codegen(kind, tokens):
    """LLVM IR of one 16-row group times ``tokens`` quantized activation rows (see :func:`block_dot`)."""
    group_bytes = GROUP_BLOCK_BYTES[kind]
    q4 = kind == "q4_1"
    offset = not q4 and DOT_PATH == "vnni"  # vpdpbusd multiplies unsigned weights: Q8_0's q + 128

    def codegen(context, builder, signature, args):
        blocks_t, _, qx_t, dx_t, corr_t, out_t = signature.args[:6]
        arrays = [
            context.make_array(t)(context, builder, a)
            for t, a in zip(
                (blocks_t, qx_t, dx_t, corr_t, out_t),
                (args[0], args[2], args[3], args[4], args[5]),
                strict=True,
            )
        ]
        blocks_a, qx_a, dx_a, corr_a, out_a = arrays
        group, t0 = args[1], args[6]
        intp = cgutils.intp_t
        zero_i = ir.Constant(intp, 0)
        i8, i8p = ir.IntType(8), ir.IntType(8).as_pointer()
        f32x16, i8x64 = ir.VectorType(_F32, 16), ir.VectorType(i8, 64)

        def item(t, a, index):
            return cgutils.get_item_pointer(context, builder, t, a, index, wraparound=False)

        base = builder.bitcast(item(blocks_t, blocks_a, [group, zero_i]), i8p)
        rows_t = [builder.add(t0, ir.Constant(intp, t)) for t in range(tokens)]
        qx_rows = [builder.bitcast(item(qx_t, qx_a, [t, zero_i]), i8p) for t in rows_t]
        dx_rows = [item(dx_t, dx_a, [t, zero_i]) for t in rows_t]
        corr_rows = [item(corr_t, corr_a, [t, zero_i]) for t in rows_t]
        accs = [cgutils.alloca_once_value(builder, ir.Constant(f32x16, [0.0] * 16)) for _ in range(tokens)]
        count = builder.udiv(builder.extract_value(qx_a.shape, 1), ir.Constant(intp, 32))

        def load(ptr, offset_bytes, vty):
            return builder.load(
                builder.bitcast(builder.gep(ptr, [_I32(offset_bytes)]), vty.as_pointer()), align=1
            )

        with cgutils.for_range(builder, count) as loop:
            b = loop.index
            blk = builder.gep(base, [builder.mul(b, ir.Constant(intp, group_bytes))])
            for line in range(0, group_bytes, 64):
                _prefetch(builder, builder.gep(blk, [_I32(_PREFETCH_BYTES + line)]), locality=3)
            d = load(blk, 0, f32x16)
            if q4:
                m = load(blk, 64, f32x16)
                codes = [load(blk, 128 + 64 * c, i8x64) for c in range(4)]
                low = [builder.and_(c, ir.Constant(i8x64, [15] * 64)) for c in codes]
                high = [builder.lshr(c, ir.Constant(i8x64, [4] * 64)) for c in codes]
                weights = low + high  # weights 4c..4c+3, then 16+4c..16+4c+3
            else:
                weights = [load(blk, 64 + 64 * c, i8x64) for c in range(8)]
                if offset:
                    weights = [builder.xor(w, ir.Constant(i8x64, [-128] * 64)) for w in weights]
            xoff = builder.mul(b, ir.Constant(intp, 32))
            for t in range(tokens):
                xb = builder.gep(qx_rows[t], [xoff])
                xs = []
                for c in range(len(weights)):  # four activation bytes, in every lane
                    x4 = builder.load(
                        builder.bitcast(builder.gep(xb, [_I32(4 * c)]), _I32.as_pointer()), align=1
                    )
                    xs.append(builder.bitcast(_splat(builder, x4, 16), i8x64))
                isum = _block_sum(builder, weights, xs, not q4)
                corr = builder.load(builder.gep(corr_rows[t], [b]))
                if offset:  # sum (q + 128) x = sum q x + 128 sum x
                    isum = builder.sub(isum, _splat(builder, builder.mul(corr, _I32(128)), 16))
                scale = builder.fmul(d, _splat(builder, builder.load(builder.gep(dx_rows[t], [b])), 16))
                acc = builder.load(accs[t])
                acc = _vector_call(builder, "llvm.fma.v16f32", [builder.sitofp(isum, f32x16), scale, acc])
                if q4:
                    acc = _vector_call(builder, "llvm.fma.v16f32", [m, _splat(builder, corr, 16), acc])
                builder.store(acc, accs[t])
        column = builder.mul(group, ir.Constant(intp, 16))
        for t in range(tokens):
            ptr = builder.bitcast(item(out_t, out_a, [rows_t[t], column]), f32x16.as_pointer())
            builder.store(builder.load(accs[t]), ptr, align=4)

    return codegen


#: Most activation rows one call of :func:`block_dot` takes: their accumulators (a 16-lane vector
#: each) and the block's unpacked codes stay in registers.
PASS_TOKENS = 8


@intrinsic
def block_dot(typingctx, blocks, group, qx, dx, corr, out, t0, tokens):  # pragma: no cover - compiled
    """Write ``out[t0 + t, 16 g : 16 g + 16]`` for ``t < tokens`` (1 to :data:`PASS_TOKENS`): the
    products of the 16 rows of group ``g`` of ``blocks`` (:class:`decoding.quantized.QuantizedMatrix`'s
    layout) with activation rows ``t0 .. t0 + tokens - 1`` quantized per 32 values (``x ~ dx * qx``,
    ``qx`` int8).

    ``corr`` is, for Q4_1, the float32 ``dx * sum(qx)`` of each block and, for Q8_0, the int32
    ``sum(qx)``: its dtype says which kind ``blocks`` holds, and numba compiles one kernel for each.
    Per block and token, the 32 products of each row are summed as integers (exact), then
    ``acc = fma(float(isum), d * dx, acc)``, and for Q4_1 ``acc = fma(m, dx * sum(qx), acc)``: the
    same float32 operations in the same order for every token count and on every
    :data:`DOT_PATH`, so a token's products do not depend on the tokens beside it. The group's
    block is unpacked once and used for every token; the accumulators (a 16-lane vector per token,
    the 16 rows) stay in registers, so each token count has its own code: the call branches to
    it (an LLVM ``switch`` on ``tokens``; another count writes nothing).
    """
    kind = "q4_1" if corr.dtype == types.float32 else "q8_0"
    sig = types.void(blocks, group, qx, dx, corr, out, t0, tokens)
    bodies = {n: _block_dot_codegen(kind, n) for n in range(1, PASS_TOKENS + 1)}

    def codegen(context, builder, signature, args):
        done = builder.append_basic_block("block_dot.done")
        switch = builder.switch(args[7], done)
        for n, body in bodies.items():
            case = builder.append_basic_block(f"block_dot.{n}")
            switch.add_case(ir.Constant(args[7].type, n), case)
            builder.position_at_end(case)
            body(context, builder, signature, args)
            builder.branch(done)
        builder.position_at_end(done)
        return context.get_dummy_value()

    return sig, codegen
