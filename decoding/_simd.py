"""LLVM intrinsics that numba lacks: a cache prefetch, a vector exp, products of quantized weight rows.

numba compiles scalar loops and leaves vectorization to LLVM. Three things the engine needs do
not come out of that: a software prefetch (numba has no spelling for it), a float32 ``exp`` that
vectorizes (numba calls libm's scalar ``expf``; :func:`exp` is a polynomial LLVM vectorizes), and
the product of GGUF weight blocks with float32 activations. Written as scalar numba, the
dequantization of a 32-weight block stays scalar (LLVM cannot prove that the float32 stores do
not alias the bytes it reads, and the block's loop is too short for the loop vectorizer's runtime
check), and a block's scale varies along the row, which the vectorizer cannot hoist. Here the
whole loop over a row's blocks is LLVM IR: a broadcast load of each float32 scale, one vector
load of a block's codes, widening, conversion and a fused multiply-add by its scale per half,
then a fused multiply-add into each token's accumulator. LLVM lowers the 16-lane vectors to one
AVX-512 or two AVX2 registers.

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

__all__ = ["ROWS_DOT", "exp", "prefetch_l2", "prefetch_next_row"]

_I32 = ir.IntType(32)
_F32 = ir.FloatType()


def _has_avx512f() -> bool:
    """Whether numba compiles for AVX-512 (its own feature setting, else the host's)."""
    features = config.CPU_FEATURES if config.CPU_FEATURES is not None else get_host_cpu_features().flatten()
    return "+avx512f" in features


#: Q4_1 blocks dequantize through a 16-entry table held in a register (AVX-512's ``vpermps``)
#: where the CPU has it; else by converting every nibble to float (see ``_rows_dot_codegen``).
AVX512_TABLE = _has_avx512f()


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
        i8p = builder.bitcast(ptr, ir.IntType(8).as_pointer())
        fnty = ir.FunctionType(ir.VoidType(), [i8p.type, _I32, _I32, _I32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [i8p, _I32(0), _I32(2), _I32(1)])  # read, locality 2 (L2), data
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


def _float_splat(builder, byte_ptr, lanes):
    """The float32 at ``byte_ptr`` (an i8*) in every lane of a vector.

    x86 loads it straight into every lane (``vbroadcastss``), with no shuffle: the blocks are
    held with float32 scales for this. From the file's float16 scales, the broadcast and the
    conversion (``vpbroadcastw``, ``vcvtph2ps``) cost two shuffle-port operations a scale, and
    that port is the decode-step product's bottleneck (batch 1: the 30 layers' products in 5.2
    in place of 6.0 ms).
    """
    h = builder.load(builder.bitcast(byte_ptr, _F32.as_pointer()), align=1)
    return _splat(builder, h, lanes)


def _permute(builder, table, index):
    """``table[index & 15]`` lane by lane (AVX-512 ``vpermps``)."""
    fnty = ir.FunctionType(table.type, [table.type, index.type])
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.avx512.permvar.sf.512")
    return builder.call(fn, [table, index])


def _horizontal_sum(builder, v):
    """Sum of the lanes of a float vector by halving: a fixed order, so a fixed result."""
    n = v.type.count
    while n > 1:
        n //= 2
        lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, n), list(range(n))))
        hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, n), list(range(n, 2 * n))))
        v = builder.fadd(lo, hi)
    return builder.extract_element(v, _I32(0))


def _rows_dot_codegen(kind, n_rows, tokens):
    """LLVM IR of ``n_rows`` rows of blocks times ``tokens`` float32 rows of ``x`` (see :data:`ROWS_DOT`)."""
    block_bytes = 24 if kind == "q4_1" else 36  # the held layout: float32 scales first
    halves = 2 if tokens == 1 else 1  # one token: two accumulators a row halve the chain of adds

    def codegen(context, builder, signature, args):
        blocks_t, x_t = signature.args[0], signature.args[n_rows + 1]
        ary = context.make_array(blocks_t)(context, builder, args[0])
        xa = context.make_array(x_t)(context, builder, args[n_rows + 1])
        intp = cgutils.intp_t
        zero_i = ir.Constant(intp, 0)
        i8p = ir.IntType(8).as_pointer()
        rows = [
            builder.bitcast(
                cgutils.get_item_pointer(context, builder, blocks_t, ary, [n, zero_i], wraparound=False), i8p
            )
            for n in args[1 : n_rows + 1]
        ]
        t0 = args[n_rows + 2]
        xrows = [
            cgutils.get_item_pointer(
                context, builder, x_t, xa, [builder.add(t0, ir.Constant(intp, t)), zero_i], wraparound=False
            )
            for t in range(tokens)
        ]
        vty = ir.VectorType(_F32, 16)
        v16p = vty.as_pointer()
        b16p = ir.VectorType(ir.IntType(8), 16).as_pointer()
        zero = ir.Constant(vty, [0.0] * 16)
        iota = ir.Constant(vty, [float(i) for i in range(16)])
        accs = [
            [[cgutils.alloca_once_value(builder, zero) for _ in range(halves)] for _ in range(tokens)]
            for _ in range(n_rows)
        ]
        count = builder.udiv(builder.extract_value(xa.shape, 1), ir.Constant(intp, 32))
        with cgutils.for_range(builder, count) as loop:
            b = loop.index
            xs = []
            for xr in xrows:
                xb = builder.gep(xr, [builder.mul(b, ir.Constant(intp, 32))])
                xlo = builder.load(builder.bitcast(xb, v16p), align=4)
                xhi = builder.load(builder.bitcast(builder.gep(xb, [ir.Constant(intp, 16)]), v16p), align=4)
                xs.append((xlo, xhi))
            for r in range(n_rows):
                base = builder.gep(rows[r], [builder.mul(b, ir.Constant(intp, block_bytes))])
                d = _float_splat(builder, base, 16)
                if kind == "q4_1" and AVX512_TABLE:
                    # the block's 16 possible weights fma(d, q, m), q = 0..15, in one register;
                    # each nibble picks its weight with a permute (vpermps reads an index's low
                    # 4 bits, so the low nibble needs no mask): one FMA a block, not two FMAs and
                    # two conversions, and the same values bit for bit
                    m = _float_splat(builder, builder.gep(base, [_I32(4)]), 16)
                    table = _vector_call(builder, "llvm.fma.v16f32", [d, iota, m])
                    qp = builder.bitcast(builder.gep(base, [_I32(8)]), b16p)
                    wide = builder.zext(builder.load(qp, align=1), ir.VectorType(_I32, 16))
                    hi = builder.lshr(wide, ir.Constant(wide.type, [4] * 16))
                    wlo = _permute(builder, table, wide)
                    whi = _permute(builder, table, hi)
                elif kind == "q4_1":
                    m = _float_splat(builder, builder.gep(base, [_I32(4)]), 16)
                    qp = builder.bitcast(builder.gep(base, [_I32(8)]), b16p)
                    wide = builder.zext(builder.load(qp, align=1), ir.VectorType(_I32, 16))
                    qlo = builder.uitofp(builder.and_(wide, ir.Constant(wide.type, [15] * 16)), vty)
                    qhi = builder.uitofp(builder.lshr(wide, ir.Constant(wide.type, [4] * 16)), vty)
                    wlo = _vector_call(builder, "llvm.fma.v16f32", [d, qlo, m])
                    whi = _vector_call(builder, "llvm.fma.v16f32", [d, qhi, m])
                else:
                    qp = builder.bitcast(builder.gep(base, [_I32(4)]), b16p)
                    q0 = builder.sitofp(builder.load(qp, align=1), vty)
                    q1 = builder.sitofp(builder.load(builder.gep(qp, [_I32(1)]), align=1), vty)
                    wlo, whi = builder.fmul(d, q0), builder.fmul(d, q1)
                for t, (xlo, xhi) in enumerate(xs):
                    a_lo, a_hi = accs[r][t][0], accs[r][t][halves - 1]
                    builder.store(
                        _vector_call(builder, "llvm.fma.v16f32", [xlo, wlo, builder.load(a_lo)]), a_lo
                    )
                    builder.store(
                        _vector_call(builder, "llvm.fma.v16f32", [xhi, whi, builder.load(a_hi)]), a_hi
                    )
        sums = []
        for r in range(n_rows):
            for t in range(tokens):
                v = builder.load(accs[r][t][0])
                if halves == 2:
                    v = builder.fadd(v, builder.load(accs[r][t][1]))
                sums.append(_horizontal_sum(builder, v))
        return context.make_tuple(builder, signature.return_type, sums)

    return codegen


def _rows_dot(kind, n_rows, tokens):
    def typer(*argtys):
        blocks, x = argtys[0], argtys[n_rows + 1]
        ret = types.UniTuple(types.float32, n_rows * tokens)
        sig = ret(blocks, *([types.intp] * n_rows), x, types.intp)
        return sig, _rows_dot_codegen(kind, n_rows, tokens)

    if n_rows == 4:

        def rows_dot(typingctx, blocks, n0, n1, n2, n3, x, t0):
            return typer(blocks, n0, n1, n2, n3, x, t0)
    else:

        def rows_dot(typingctx, blocks, n0, n1, x, t0):
            return typer(blocks, n0, n1, x, t0)

    rows_dot.__name__ = f"rows_dot_{kind}_{n_rows}x{tokens}"
    return intrinsic(rows_dot)


#: Intrinsics ``ROWS_DOT[kind, rows, tokens]``: ``(blocks, n_0, .., n_{rows-1}, x, t0)`` returns
#: the ``rows * tokens`` sums ``s_it = sum_k x[t0 + t, k] * w_i[k]`` (row-major: ``s_00, s_01,
#: ..``), ``w_i`` being row ``n_i`` of ``blocks`` (in :class:`decoding.quantized.QuantizedMatrix`'s
#: held layout, float32 scales first) dequantized: ``fma(d, q, m)`` for Q4_1 (rounded
#: once, as :meth:`decoding.quantized.QuantizedMatrix.dequantize` computes it), ``d * q`` for
#: Q8_0. One loop over the row's blocks in LLVM IR whose accumulators (a 16-lane vector per row
#: and token; two for one token, to halve the chain of dependent adds) stay in registers: each
#: block of each row is converted and scaled once, in registers, and used for every token;
#: nothing goes through memory. The shapes: four rows times one to four tokens, two rows times
#: five to eight (up to 20 accumulators and weights: AVX-512's 32 registers hold them; AVX2 spills
#: some to L1), so that every token count takes passes of eight and one pass of the rest.
ROWS_DOT = {
    (kind, rows, tokens): _rows_dot(kind, rows, tokens)
    for kind in ("q4_1", "q8_0")
    for rows, tokens in ((4, 1), (4, 2), (4, 3), (4, 4), (2, 5), (2, 6), (2, 7), (2, 8))
}
