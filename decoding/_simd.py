"""LLVM intrinsics that numba lacks: a cache prefetch and the vector dequantization of one weight block.

numba compiles scalar loops and leaves vectorization to LLVM. Two things the engine needs do not
come out of that: a software prefetch (numba has no spelling for it), and the dequantization of a
32-weight block of a GGUF file, whose sixteen or thirty-two byte loads LLVM keeps scalar (it
cannot prove that the stores into the float32 row do not alias the bytes it reads, and the block's
loop is too short for the loop vectorizer's runtime check). Here both are written as LLVM IR:
one vector load of the block's bytes, widening, conversion and one fused multiply-add per half,
and vector stores. LLVM lowers the 16-lane vectors to one AVX-512 or two AVX2 registers.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["dequant_q4_1_block", "dequant_q8_0_block", "prefetch_l2", "prefetch_next_row"]

_I32 = ir.IntType(32)
_F32 = ir.FloatType()


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


def _vector_pointer(context, builder, aryty, ary, index, elem, lanes):
    a = context.make_array(aryty)(context, builder, ary)
    ptr = cgutils.get_item_pointer(context, builder, aryty, a, [index], wraparound=False)
    return builder.bitcast(ptr, ir.VectorType(elem, lanes).as_pointer())


def _splat(builder, value, lanes):
    vty = ir.VectorType(value.type, lanes)
    v = builder.insert_element(ir.Constant(vty, ir.Undefined), value, _I32(0))
    return builder.shuffle_vector(
        v, ir.Constant(vty, ir.Undefined), ir.Constant(ir.VectorType(_I32, lanes), [0] * lanes)
    )


def _vector_call(builder, name, args):
    fnty = ir.FunctionType(args[0].type, [a.type for a in args])
    return builder.call(cgutils.get_or_insert_function(builder.module, fnty, name), args)


@intrinsic
def dequant_q4_1_block(typingctx, src, offset, d, m, dst, base):  # pragma: no cover - compiled
    """``dst[base + j] = fma(d, q_j, m)`` for the 32 nibbles of the 16 bytes ``src[offset:offset + 16]``.

    GGUF's Q4_1 order: the low nibble of byte ``j`` is weight ``j``, its high nibble weight
    ``j + 16``. ``fma`` rounds once, so the result is ``float32(d * q + m)`` computed exactly (the
    float64 reference of :func:`decoding.quantized.dequantize_rows`).
    """
    sig = types.void(src, types.intp, types.float32, types.float32, dst, types.intp)

    def codegen(context, builder, signature, args):
        src_t, _, _, _, dst_t, _ = signature.args
        s, off, dv, mv, out, b = args
        raw = builder.load(_vector_pointer(context, builder, src_t, s, off, ir.IntType(8), 16), align=1)
        wide = builder.zext(raw, ir.VectorType(_I32, 16))
        lo = builder.and_(wide, ir.Constant(wide.type, [15] * 16))
        hi = builder.lshr(wide, ir.Constant(wide.type, [4] * 16))
        vty = ir.VectorType(_F32, 16)
        D, M = _splat(builder, dv, 16), _splat(builder, mv, 16)
        for half, q in ((0, lo), (16, hi)):
            w = _vector_call(builder, "llvm.fma.v16f32", [D, builder.uitofp(q, vty), M])
            at = builder.add(b, ir.Constant(b.type, half))
            builder.store(w, _vector_pointer(context, builder, dst_t, out, at, _F32, 16), align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def dequant_q8_0_block(typingctx, src, offset, d, dst, base):  # pragma: no cover - compiled
    """``dst[base + j] = d * q_j`` for the 32 signed bytes ``src[offset:offset + 32]`` (exact in float32)."""
    sig = types.void(src, types.intp, types.float32, dst, types.intp)

    def codegen(context, builder, signature, args):
        src_t, _, _, dst_t, _ = signature.args
        s, off, dv, out, b = args
        raw = builder.load(_vector_pointer(context, builder, src_t, s, off, ir.IntType(8), 32), align=1)
        q = builder.sitofp(raw, ir.VectorType(_F32, 32))
        w = builder.fmul(_splat(builder, dv, 32), q)
        builder.store(w, _vector_pointer(context, builder, dst_t, out, b, _F32, 32), align=4)
        return context.get_dummy_value()

    return sig, codegen


def _half_to_float(builder, byte_ptr):
    """The little-endian float16 at ``byte_ptr`` (an i8*) as a float32 (``vcvtph2ps`` on x86)."""
    h = builder.load(builder.bitcast(byte_ptr, ir.HalfType().as_pointer()), align=1)
    return builder.fpext(h, _F32)


def _horizontal_sum(builder, v):
    """Sum of the lanes of a float vector by halving: a fixed order, so a fixed result."""
    n = v.type.count
    while n > 1:
        n //= 2
        lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, n), list(range(n))))
        hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, n), list(range(n, 2 * n))))
        v = builder.fadd(lo, hi)
    return builder.extract_element(v, _I32(0))


def _row_dot4(kind):
    """An intrinsic: the dot products of four rows of blocks with one float32 row ``x``.

    ``(blocks, n0, n1, n2, n3, x) -> (s0, s1, s2, s3)`` where ``s_i = sum_k x[k] * w_i[k]`` and
    ``w_i`` is row ``n_i`` of ``blocks`` dequantized exactly as by :func:`dequant_q4_1_block` /
    :func:`dequant_q8_0_block` (``kind`` "q4_1" or "q8_0"). One loop over the row's blocks in LLVM
    IR whose accumulators (two 16-lane vectors a row) stay in registers: each weight is converted,
    scaled and multiplied once, with no trip through memory. This is the one-token product, where
    dequantizing into a scratch row would cost as much as the product itself.
    """
    block_bytes = 20 if kind == "q4_1" else 34

    def dot4(typingctx, blocks, n0, n1, n2, n3, x):
        ret = types.UniTuple(types.float32, 4)
        sig = ret(blocks, types.intp, types.intp, types.intp, types.intp, x)

        def codegen(context, builder, signature, args):
            blocks_t, x_t = signature.args[0], signature.args[5]
            ary = context.make_array(blocks_t)(context, builder, args[0])
            xa = context.make_array(x_t)(context, builder, args[5])
            zero_i = ir.Constant(cgutils.intp_t, 0)
            i8p = ir.IntType(8).as_pointer()
            rows = [
                builder.bitcast(
                    cgutils.get_item_pointer(context, builder, blocks_t, ary, [n, zero_i], wraparound=False),
                    i8p,
                )
                for n in args[1:5]
            ]
            xptr = cgutils.get_item_pointer(context, builder, x_t, xa, [zero_i], wraparound=False)
            vty = ir.VectorType(_F32, 16)
            v16p = vty.as_pointer()
            zero = ir.Constant(vty, [0.0] * 16)
            accs = [[cgutils.alloca_once_value(builder, zero) for _ in range(2)] for _ in range(4)]
            count = builder.udiv(builder.extract_value(xa.shape, 0), ir.Constant(cgutils.intp_t, 32))
            with cgutils.for_range(builder, count) as loop:
                b = loop.index
                xb = builder.gep(xptr, [builder.mul(b, ir.Constant(cgutils.intp_t, 32))])
                xlo = builder.load(builder.bitcast(xb, v16p), align=4)
                xhi = builder.load(
                    builder.bitcast(builder.gep(xb, [ir.Constant(cgutils.intp_t, 16)]), v16p), align=4
                )
                for r in range(4):
                    base = builder.gep(rows[r], [builder.mul(b, ir.Constant(cgutils.intp_t, block_bytes))])
                    d = _splat(builder, _half_to_float(builder, base), 16)
                    if kind == "q4_1":
                        m = _splat(builder, _half_to_float(builder, builder.gep(base, [_I32(2)])), 16)
                        qp = builder.bitcast(
                            builder.gep(base, [_I32(4)]), ir.VectorType(ir.IntType(8), 16).as_pointer()
                        )
                        wide = builder.zext(builder.load(qp, align=1), ir.VectorType(_I32, 16))
                        qlo = builder.uitofp(builder.and_(wide, ir.Constant(wide.type, [15] * 16)), vty)
                        qhi = builder.uitofp(builder.lshr(wide, ir.Constant(wide.type, [4] * 16)), vty)
                        wlo = _vector_call(builder, "llvm.fma.v16f32", [d, qlo, m])
                        whi = _vector_call(builder, "llvm.fma.v16f32", [d, qhi, m])
                    else:
                        qp = builder.bitcast(
                            builder.gep(base, [_I32(2)]), ir.VectorType(ir.IntType(8), 16).as_pointer()
                        )
                        q0 = builder.sitofp(builder.load(qp, align=1), vty)
                        q1 = builder.sitofp(builder.load(builder.gep(qp, [_I32(1)]), align=1), vty)
                        wlo, whi = builder.fmul(d, q0), builder.fmul(d, q1)
                    for acc, xv, w in ((accs[r][0], xlo, wlo), (accs[r][1], xhi, whi)):
                        builder.store(
                            _vector_call(builder, "llvm.fma.v16f32", [xv, w, builder.load(acc)]), acc
                        )
            sums = [
                _horizontal_sum(builder, builder.fadd(builder.load(a0), builder.load(a1))) for a0, a1 in accs
            ]
            return context.make_tuple(builder, signature.return_type, sums)

        return sig, codegen

    dot4.__name__ = f"row_dot4_{kind}"
    dot4.__doc__ = _row_dot4.__doc__
    return intrinsic(dot4)


row_dot4_q4_1 = _row_dot4("q4_1")
row_dot4_q8_0 = _row_dot4("q8_0")
