// SPDX-License-Identifier: Apache-2.0
// cuda-epilogue-pass.cu: a layer forward's output epilogue (bie_forward_args: out_mul, out_add,
// residual) as one pass over y after the GEMM wrote it, for the routes whose GEMM epilogue does not
// apply it itself. The arithmetic is bie_ref_layer_epilogue's (src/ref/ref-layer.c).
#include "cuda-impl.cuh"

#include <type_traits>

namespace {

struct epilogue_terms : channel_terms {
    bool update; // any of mul, add, residual (else y is only read, for the bits)
};

// ((v * mul) + add) + r, the value round_y takes; the steps of absent terms skipped (mul, add: the
// channel's mul[o] and add[o], read by the caller where t has them).
__device__ __forceinline__ float epilogue_step(const epilogue_terms & t, float mul, float add, float v, bool has_res,
                                               float r) {
    if (t.mul) v = __fmul_rn(v, mul);
    if (t.add) v = __fadd_rn(v, add);
    if (has_res) v = __fadd_rn(v, r);
    return v;
}
__device__ __forceinline__ float epilogue_value(const epilogue_terms & t, int64_t o, float v, bool has_res, float r) {
    return epilogue_step(t, t.mul ? __ldg(t.mul + o * t.ms) : 0.0f, t.add ? __ldg(t.add + o * t.as) : 0.0f, v, has_res,
                         r);
}
// y and residual dense with the O features innermost (channels-last conv output, linear rows), 8
// elements (one 16-byte vector for 16-bit T) per thread: O % 8 == 0 and both 16-byte aligned;
// bits (or NULL): the out_bits bytes, dense in the same order (byte i: elements 8i .. 8i + 7).
// Element 8i is of channel group i % O8 (O8 = O / 8), whose terms come as vectors; I: the index
// type, 32-bit where the elements allow, so that the division per group stays a few instructions
// (the pass has about one issue slot per byte it moves).
template <typename T, typename I>
__global__ void __launch_bounds__(256)
    epilogue_dense8(T * y, const T * res, uint8_t * bits, epilogue_terms t, I n8, I O8) {
    constexpr int dt = std::is_same<T, float>::value    ? BIE_DTYPE_F32
                       : std::is_same<T, __half>::value ? BIE_DTYPE_F16
                                                        : BIE_DTYPE_BF16;
    for (I i = blockIdx.x * (I)blockDim.x + threadIdx.x; i < n8; i += (I)gridDim.x * blockDim.x) {
        const int64_t e = 8 * (int64_t)i, o0 = 8 * (int64_t)(i % O8);
        const raw8<T> ry = raw8_load<T>(y + e);
        raw8<T> rr;
        if (res) rr = raw8_load<T>(res + e);
        float v[8], r[8], mul[8], add[8], bb[8];
        load_channels8(t.mul, t.ms, o0, 0.0f, mul);
        load_channels8(t.add, t.as, o0, 0.0f, add);
        load_channels8(t.bb, t.bs, o0, 0.0f, bb);
        raw8_floats<T>(ry, v);
        if (res) raw8_floats<T>(rr, r);
        if (t.update) {
#pragma unroll
            for (int k = 0; k < 8; k++)
                v[k] = to_f32(from_f32<T>(epilogue_step(t, mul[k], add[k], v[k], res != nullptr, res ? r[k] : 0.0f)));
            store8((char *)y, dt, e, v);
        }
        if (bits) {
            unsigned b = 0;
#pragma unroll
            for (int k = 0; k < 8; k++) b |= (t.bit_of(v[k], bb[k]) ? 1u : 0u) << k;
            bits[i] = (uint8_t)b;
        }
    }
}

// Any 4-D views: one element per thread; the bits (if asked) as codes in y's element order.
__global__ void epilogue_any(struct dview y, struct dview res, int8_t * codes, epilogue_terms t, int64_t n) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        int64_t i[4], q = e;
        for (int d = 3; d >= 0; d--) {
            const int64_t s = y.shape[d];
            i[d] = q % s;
            q /= s;
        }
        const int64_t oy = dview_off4(y, i[0], i[1], i[2], i[3]);
        float v = ld_float(y.data, y.dtype, oy);
        if (t.update) {
            const float r = res.data ? ld_float(res.data, res.dtype, dview_off4(res, i[0], i[1], i[2], i[3])) : 0.0f;
            st_float(y.data, y.dtype, oy, epilogue_value(t, i[1], v, res.data != nullptr, r));
            v = ld_float(y.data, y.dtype, oy);
        }
        if (codes) codes[e] = t.bit(i[1], v) ? 1 : 0;
    }
}

template <typename T>
void launch_dense8(cudaStream_t s, T * y, const T * res, uint8_t * bits, const epilogue_terms & t, int64_t n8,
                   int64_t O8, bool narrow) {
    if (narrow)
        epilogue_dense8<T, uint32_t><<<grid_for(n8, 256), 256, 0, s>>>(y, res, bits, t, (uint32_t)n8, (uint32_t)O8);
    else epilogue_dense8<T, int64_t><<<grid_for(n8, 256), 256, 0, s>>>(y, res, bits, t, n8, O8);
}

} // namespace

bool bie_cuda_epilogue_dense(const struct bie_layer_call * c) {
    const struct bie_tensor &y = c->y, &r = c->residual, &b = c->out_bits;
    return bie_cuda_channels_last(y) && (!r.data || bie_cuda_channels_last(r)) &&
           (!b.data || bie_cuda_channels_last(b)) && y.shape[1] % 8 == 0 && (uintptr_t)y.data % 16 == 0 &&
           (!r.data || (uintptr_t)r.data % 16 == 0);
}

enum bie_status bie_cuda_layer_epilogue(bie_context_t * ctx, const struct bie_layer_call * c, int8_t * codes) {
    if (!bie_layer_has_epilogue(c)) return BIE_STATUS_OK;
    const struct bie_tensor &y = c->y, &r = c->residual, &b = c->out_bits;
    const epilogue_terms t = {channel_terms_of(c->out_mul, c->out_add, c->out_bits_bias),
                              c->out_mul.data || c->out_add.data || r.data};
    const int64_t n = y.shape[0] * y.shape[1] * y.shape[2] * y.shape[3], O = y.shape[1];
    if (n == 0) return BIE_STATUS_OK;
    cudaStream_t s = ctx->cuda->stream;
    if (bie_cuda_epilogue_dense(c)) {
        const int64_t n8 = n / 8;
        uint8_t * bits = (uint8_t *)b.data;
        // (32-bit indices while a grid-stride step past the last group stays below 2^32)
        const bool narrow = n8 + (int64_t)grid_for(n8, 256) * 256 < ((int64_t)1 << 32);
        switch (y.dtype) {
        case BIE_DTYPE_F16:
            launch_dense8(s, (__half *)y.data, (const __half *)r.data, bits, t, n8, O / 8, narrow);
            break;
        case BIE_DTYPE_BF16:
            launch_dense8(s, (__nv_bfloat16 *)y.data, (const __nv_bfloat16 *)r.data, bits, t, n8, O / 8, narrow);
            break;
        default: launch_dense8(s, (float *)y.data, (const float *)r.data, bits, t, n8, O / 8, narrow);
        }
        LAUNCHED(ctx, "layer epilogue");
        return BIE_STATUS_OK;
    }
    struct dview yv, rv;
    dview_make(&y, &yv);
    rv.data = NULL;
    if (r.data) dview_make(&r, &rv);
    epilogue_any<<<grid_for(n, 256), 256, 0, s>>>(yv, rv, b.data ? codes : NULL, t, n);
    LAUNCHED(ctx, "layer epilogue");
    if (b.data) {
        struct dview bv;
        dview_make(&b, &bv);
        BIE_TRY(bie_cuda_store_packed(ctx, codes, bv));
    }
    return BIE_STATUS_OK;
}
