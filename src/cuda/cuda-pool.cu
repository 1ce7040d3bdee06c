// SPDX-License-Identifier: Apache-2.0
// cuda-pool.cu: bie_affine_maxpool2d_forward on the GPU, one pass over x. Channels-last x and y
// (a network's stem in PyTorch's channels_last) take 8 channels of one output pixel per thread
// with 16-byte loads and stores, and write the bits' byte of those 8 channels; other views take
// one output element per thread. The arithmetic is bie_ref_affine_maxpool2d's (src/ref/ref-pool.c):
// the window's max of x (min where mul < 0, taken as the max of -x), then the clamped affine map.
#include "cuda-impl.cuh"

namespace {

struct pool_terms : channel_terms {
    float lo, hi;
    int kh, kw, sh, sw, ph, pw;
    int64_t H, W, OH, OW;
};

// clamp((v * mul) + add, lo, hi), keeping NaN.
__device__ __forceinline__ float affine_clamp(const pool_terms & t, float v, float mul, float add) {
    if (t.mul) v = __fmul_rn(v, mul);
    if (t.add) v = __fadd_rn(v, add);
    return v < t.lo ? t.lo : v > t.hi ? t.hi : v;
}
// max with NaN winning (max.NaN), and s*v + 0 (exact: v or -v, a zero counted as +0).
__device__ __forceinline__ float max_nan(float a, float b) {
    float d;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
    return d;
}
__device__ __forceinline__ float signed_plus0(float v, float s) { return __fmaf_rn(v, s, 0.0f); }
// -1 where mul < 0, else +1 (the window's min of x is the max of -x).
__device__ __forceinline__ float pool_sign(const pool_terms & t, int64_t c) {
    return t.mul && __ldg(t.mul + c * t.ms) < 0.0f ? -1.0f : 1.0f;
}

// The running maxima of s*x + 0 for 8 channels, in the element type's own arithmetic: pairs of
// 16-bit floats (fma and max.NaN on f16x2 / bf16x2, exact here) or f32.
template <typename T2> __device__ __forceinline__ T2 pair_of(float a, float b);
template <> __device__ __forceinline__ __half2 pair_of<__half2>(float a, float b) { return __floats2half2_rn(a, b); }
template <> __device__ __forceinline__ __nv_bfloat162 pair_of<__nv_bfloat162>(float a, float b) {
    return __floats2bfloat162_rn(a, b);
}
template <typename T2> struct max8_pairs {
    T2 m[4], s[4];
    __device__ __forceinline__ void init(const float * sg) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            s[k] = pair_of<T2>(sg[2 * k], sg[2 * k + 1]);
            m[k] = pair_of<T2>(-INFINITY, -INFINITY);
        }
    }
    __device__ __forceinline__ void take_u(const uint4 & u) {
        const T2 * h = (const T2 *)&u;
        const T2 zero = pair_of<T2>(0.0f, 0.0f);
#pragma unroll
        for (int k = 0; k < 4; k++) m[k] = __hmax2_nan(m[k], __hfma2(h[k], s[k], zero));
    }
    __device__ __forceinline__ void get(float * v) const {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float2 f = to_float2(m[k]);
            v[2 * k] = f.x;
            v[2 * k + 1] = f.y;
        }
    }
};
template <typename T> struct max8;
template <> struct max8<__half> : max8_pairs<__half2> {
    __device__ __forceinline__ void take(const raw8<__half> & r) { take_u(r.u[0]); }
};
template <> struct max8<__nv_bfloat16> : max8_pairs<__nv_bfloat162> {
    __device__ __forceinline__ void take(const raw8<__nv_bfloat16> & r) { take_u(r.u[0]); }
};
template <> struct max8<float> {
    float m[8], s[8];
    __device__ __forceinline__ void init(const float * sg) {
#pragma unroll
        for (int k = 0; k < 8; k++) s[k] = sg[k], m[k] = -INFINITY;
    }
    __device__ __forceinline__ void take(const raw8<float> & r) {
        float v[8];
        raw8_floats<float>(r, v);
#pragma unroll
        for (int k = 0; k < 8; k++) m[k] = max_nan(m[k], signed_plus0(v[k], s[k]));
    }
    __device__ __forceinline__ void get(float * v) const {
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = m[k];
    }
};

// The window of output (i, j) clipped to x: rows [h0, h1), columns [w0, w1).
__device__ __forceinline__ void window(const pool_terms & t, int64_t i, int64_t j, int64_t & h0, int64_t & h1,
                                       int64_t & w0, int64_t & w1) {
    h0 = i * t.sh - t.ph;
    w0 = j * t.sw - t.pw;
    h1 = min(h0 + t.kh, t.H);
    w1 = min(w0 + t.kw, t.W);
    h0 = max(h0, (int64_t)0);
    w0 = max(w0, (int64_t)0);
}

// x and y channels-last, C % 8 == 0, 16-byte aligned, OW * C8 < 2^31: blockIdx.y (and its
// strides) walks the output rows n*OH + i; in a row, thread q takes channels 8*(q % C8) .. + 7 of
// output column q / C8. bits (or NULL): the out_bits bytes, channels-last and dense. KH x KW windows
// (0 x 0: the call's size) inside x issue all their loads first; windows over its edge (and all of
// a 0 x 0 size) read one position at a time.
// Whether the gradient of a stored output yk passes the clamp (bie.h: argmax 255 where it stops).
__device__ __forceinline__ bool clamp_passes(const pool_terms & t, float yk) {
    return !((t.lo > -INFINITY && !(yk > t.lo)) || (t.hi < INFINITY && !(yk < t.hi)));
}
// f32 of a value stored as dtype (the value y holds).
__device__ __forceinline__ float stored(int dtype, float v) {
    return dtype == BIE_DTYPE_F32   ? v
           : dtype == BIE_DTYPE_F16 ? __half2float(__float2half_rn(v))
                                    : __bfloat162float(__float2bfloat16_rn(v));
}

// The argmax bytes of 8 channels: the first window position whose s * x + 0 is m[k] (the first NaN
// when m[k] is NaN), read again from x (cached since the max's pass), or 255 where the clamp stops
// the gradient of the stored y (yk).
template <typename T>
__device__ __forceinline__ uint2 argmax8(const T * xn, int sh2, int sw3, const pool_terms & t, int h0, int w0, int kh,
                                         int kw, const float * m, const float * sg, const float * yk) {
    int pos[8];
#pragma unroll
    for (int k = 0; k < 8; k++) pos[k] = -1;
    for (int h = max(h0, 0); h < min(h0 + kh, (int)t.H); h++)
        for (int w = max(w0, 0); w < min(w0 + kw, (int)t.W); w++) {
            float v[8];
            load8<T>(xn + h * sh2 + w * sw3, v);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const float s = signed_plus0(v[k], sg[k]);
                if (pos[k] < 0 && (isnan(m[k]) ? isnan(s) : s == m[k])) pos[k] = (h - h0) * kw + (w - w0);
            }
        }
    uint32_t b[2] = {0, 0};
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const uint32_t a = clamp_passes(t, yk[k]) && pos[k] >= 0 ? (uint32_t)pos[k] : 255u;
        b[k / 4] |= a << (8 * (k % 4));
    }
    return make_uint2(b[0], b[1]);
}

template <typename T, int KH, int KW>
__global__ void pool_nhwc8(const T * x, struct dview xv, char * y, struct dview yv, uint8_t * bits, uint8_t * amax,
                           pool_terms t, int C8, int64_t rows) {
    const int per_row = (int)t.OW * C8;
    for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
        const int64_t n = row / t.OH, i = row - n * t.OH;
        for (int q = blockIdx.x * blockDim.x + threadIdx.x; q < per_row; q += gridDim.x * blockDim.x) {
            const int j = q / C8, c0 = 8 * (q - j * C8);
            float mul[8], add[8], bbc[8], sg[8];
            load_channels8(t.mul, t.ms, c0, 1.0f, mul);
            load_channels8(t.add, t.as, c0, 0.0f, add);
            load_channels8(t.bb, t.bs, c0, 0.0f, bbc);
#pragma unroll
            for (int k = 0; k < 8; k++) sg[k] = mul[k] < 0.0f ? -1.0f : 1.0f;
            max8<T> acc;
            acc.init(sg);
            const T * xn = x + n * xv.stride[0] + c0; // this image's channels c0 ..; offsets within an image fit
            const int sh2 = (int)xv.stride[2], sw3 = (int)xv.stride[3]; // in 32 bits (the launch checks)
            const int h0 = (int)(i * t.sh - t.ph), w0 = j * t.sw - t.pw;
            if (KH > 0 && h0 >= 0 && w0 >= 0 && h0 + KH <= t.H && w0 + KW <= t.W) { // inside x: no checks
                raw8<T> r[KH > 0 ? KH * KW : 1];
#pragma unroll
                for (int a = 0; a < KH; a++)
#pragma unroll
                    for (int b = 0; b < KW; b++) r[a * KW + b] = raw8_load<T>(xn + (h0 + a) * sh2 + (w0 + b) * sw3);
#pragma unroll
                for (int p = 0; p < (KH > 0 ? KH * KW : 1); p++) acc.take(r[p]);
            } else {
                const int kh = KH > 0 ? KH : t.kh, kw = KW > 0 ? KW : t.kw;
                for (int h = max(h0, 0); h < min(h0 + kh, (int)t.H); h++)
                    for (int w = max(w0, 0); w < min(w0 + kw, (int)t.W); w++)
                        acc.take(raw8_load<T>(xn + h * sh2 + w * sw3));
            }
            float m[8], yk[8], sm[8];
            acc.get(sm);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                m[k] = affine_clamp(t, sm[k] * sg[k], mul[k], add[k]);
                yk[k] = stored(yv.dtype, m[k]);
            }
            store8(y, yv.dtype, n * yv.stride[0] + c0 + i * yv.stride[2] + (int64_t)j * yv.stride[3], m);
            if (bits) {
                unsigned b = 0;
#pragma unroll
                for (int k = 0; k < 8; k++) b |= (t.bit_of(yk[k], bbc[k]) ? 1u : 0u) << k;
                bits[row * per_row + q] = (uint8_t)b;
            }
            if (amax)
                ((uint2 *)amax)[row * per_row + q] =
                    argmax8<T>(xn, sh2, sw3, t, h0, w0, KH > 0 ? KH : t.kh, KW > 0 ? KW : t.kw, sm, sg, yk);
        }
    }
}

// Launches pool_nhwc8 for x's element type T: 3x3 and 2x2 windows unrolled, others at run time.
template <typename T>
void launch_nhwc8(const struct dview & xv, const struct dview & yv, uint8_t * bits, uint8_t * amax,
                  const pool_terms & t, int C8, int64_t rows, cudaStream_t s) {
    const int per_row = (int)t.OW * C8;
    const dim3 grid((unsigned)((per_row + 255) / 256), (unsigned)(rows < 65535 ? rows : 65535));
    const T * x = (const T *)xv.data;
    if (t.kh == 3 && t.kw == 3) pool_nhwc8<T, 3, 3><<<grid, 256, 0, s>>>(x, xv, yv.data, yv, bits, amax, t, C8, rows);
    else if (t.kh == 2 && t.kw == 2)
        pool_nhwc8<T, 2, 2><<<grid, 256, 0, s>>>(x, xv, yv.data, yv, bits, amax, t, C8, rows);
    else pool_nhwc8<T, 0, 0><<<grid, 256, 0, s>>>(x, xv, yv.data, yv, bits, amax, t, C8, rows);
}

// The outputs whose windows hold x's (h, w): rows i0 .. i1 and columns j0 .. j1, i from
// ceil((h + ph - kh + 1) / sh) to floor((h + ph) / sh) within the output, j alike.
template <typename I> struct holders { I i0, i1, j0, j1; };
template <typename I>
__device__ __forceinline__ holders<I> windows_holding(const pool_terms & t, I h, I w, I OH, I OW) {
    const I ti = h + t.ph - t.kh + 1, tj = w + t.pw - t.kw + 1;
    return {ti <= 0 ? 0 : (ti + t.sh - 1) / t.sh, min((h + t.ph) / t.sh, OH - 1), tj <= 0 ? 0 : (tj + t.sw - 1) / t.sw,
            min((w + t.pw) / t.sw, OW - 1)};
}
// The position of x's (h, w) in the window of output (i, j), row-major (argmax's numbering).
template <typename I> __device__ __forceinline__ I window_pos(const pool_terms & t, I h, I w, I i, I j) {
    return (h - (i * t.sh - t.ph)) * t.kw + (w - (j * t.sw - t.pw));
}

// Any views: one output element per thread, in y's row-major order; the bits (if asked) as codes.
__global__ void pool_any(struct dview xv, struct dview yv, int8_t * codes, struct dview av, pool_terms t, int64_t n,
                         int64_t C) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t j = e % t.OW, i = (e / t.OW) % t.OH, c = (e / (t.OW * t.OH)) % C, b = e / (t.OW * t.OH * C);
        const float sg = pool_sign(t, c);
        int64_t h0, h1, w0, w1;
        window(t, i, j, h0, h1, w0, w1);
        float m = -INFINITY;
        int pos = -1;
        for (int64_t h = h0; h < h1; h++)
            for (int64_t w = w0; w < w1; w++) {
                const float v = signed_plus0(ld_float(xv.data, xv.dtype, dview_off4(xv, b, c, h, w)), sg);
                if (pos < 0 || (!isnan(m) && (isnan(v) || v > m))) {
                    m = v;
                    pos = (int)window_pos<int64_t>(t, h, w, i, j);
                }
            }
        m = affine_clamp(t, m * sg, t.mul ? __ldg(t.mul + c * t.ms) : 1.0f, t.add ? __ldg(t.add + c * t.as) : 0.0f);
        const int64_t oy = dview_off4(yv, b, c, i, j);
        st_float(yv.data, yv.dtype, oy, m);
        const float yk = ld_float(yv.data, yv.dtype, oy);
        if (codes) codes[e] = t.bit(c, yk) ? 1 : 0;
        if (av.data) ((uint8_t *)av.data)[dview_off4(av, b, c, i, j)] = clamp_passes(t, yk) ? (uint8_t)pos : 255;
    }
}

// The backward (bie_affine_maxpool2d_backward), any views: one element of grad_z a thread, the
// windows that hold it in increasing i, then j (bie_ref_affine_maxpool2d_backward's order).
__global__ void pool_back_any(struct dview zv, struct dview gv, struct dview av, pool_terms t, int64_t n, int64_t C) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t w = e % t.W, h = (e / t.W) % t.H, c = (e / (t.W * t.H)) % C, b = e / (t.W * t.H * C);
        const holders<int64_t> r = windows_holding<int64_t>(t, h, w, t.OH, t.OW);
        float s = 0.0f;
        for (int64_t i = r.i0; i <= r.i1; i++)
            for (int64_t j = r.j0; j <= r.j1; j++) {
                if (((const uint8_t *)av.data)[dview_off4(av, b, c, i, j)] == window_pos<int64_t>(t, h, w, i, j))
                    s += ld_float(gv.data, gv.dtype, dview_off4(gv, b, c, i, j));
            }
        st_float(zv.data, zv.dtype, dview_off4(zv, b, c, h, w), s);
    }
}

// The backward on channels-last dense views of 8k channels: 8 channels of one grad_z pixel a thread
// (grad_y of type T, 16-byte loads; argmax 8-byte loads), the windows in the same order.
// (H, W, OH, OW and the window fit 32 bits here: the launch checks.)
template <typename T>
__global__ void pool_back_nhwc8(struct dview zv, const T * g, const uint8_t * am, pool_terms t, int C8, int64_t n8) {
    const int H = (int)t.H, W = (int)t.W, OH = (int)t.OH, OW = (int)t.OW;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n8; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t pix = qdiv(e, C8), img = qdiv(pix, (int64_t)H * W);
        const int hw = (int)(pix - img * H * W), h = hw / W, w = hw - h * W;
        const int c0 = (int)(e - pix * C8) * 8;
        const holders<int> r = windows_holding<int>(t, h, w, OH, OW);
        float s[8] = {};
        for (int i = r.i0; i <= r.i1; i++)
            for (int j = r.j0; j <= r.j1; j++) {
                const uint32_t k = (uint32_t)window_pos<int>(t, h, w, i, j);
                const int64_t o = ((img * OH + i) * OW + j) * C8 * 8 + c0;
                const uint2 a = *(const uint2 *)(am + o);
                unsigned took = 0; // bit q: channel c0 + q took this position
#pragma unroll
                for (int q = 0; q < 8; q++)
                    took |= (((q < 4 ? a.x : a.y) >> (8 * (q % 4)) & 0xffu) == k ? 1u : 0u) << q;
                if (!took) continue;
                float v[8];
                load8<T>(g + o, v);
#pragma unroll
                for (int q = 0; q < 8; q++)
                    if (took >> q & 1) s[q] += v[q];
            }
        store8(zv.data, zv.dtype, e * 8, s);
    }
}

bool aligned16(const void * p) { return (uintptr_t)p % 16 == 0; }

} // namespace

static pool_terms terms_of(const struct bie_pool_call * c) {
    return {channel_terms_of(c->mul, c->add, c->bits_bias),
            c->lo,
            c->hi,
            c->kh,
            c->kw,
            c->sh,
            c->sw,
            c->ph,
            c->pw,
            c->H,
            c->W,
            c->OH,
            c->OW};
}

extern "C" enum bie_status bie_cuda_affine_maxpool2d_backward(bie_context_t * ctx, const struct bie_pool_call * c) {
    struct bie_cuda_state * st;
    BIE_TRY(bie_cuda_state_get(ctx, c->device_index, &st));
    const int64_t n = c->N * c->C * c->H * c->W;
    if (n == 0) return BIE_STATUS_OK;
    const pool_terms t = terms_of(c);
    struct dview zv, gv, av;
    dview_make(&c->x, &zv);
    dview_make(&c->y, &gv);
    dview_make(&c->argmax, &av);
    if (c->C % 8 == 0 && c->H * c->W < INT32_MAX && c->H + c->kh < INT32_MAX && c->W + c->kw < INT32_MAX &&
        bie_cuda_channels_last(c->x) && bie_cuda_channels_last(c->y) && bie_cuda_channels_last(c->argmax) &&
        aligned16(c->x.data) && aligned16(c->y.data) && (uintptr_t)c->argmax.data % 8 == 0) {
        const int64_t n8 = n / 8;
        const int C8 = (int)(c->C / 8);
        const uint8_t * am = (const uint8_t *)c->argmax.data;
        if (c->y.dtype == BIE_DTYPE_F16)
            pool_back_nhwc8<__half>
                <<<grid_for(n8, 256), 256, 0, st->stream>>>(zv, (const __half *)c->y.data, am, t, C8, n8);
        else if (c->y.dtype == BIE_DTYPE_BF16)
            pool_back_nhwc8<__nv_bfloat16>
                <<<grid_for(n8, 256), 256, 0, st->stream>>>(zv, (const __nv_bfloat16 *)c->y.data, am, t, C8, n8);
        else
            pool_back_nhwc8<float>
                <<<grid_for(n8, 256), 256, 0, st->stream>>>(zv, (const float *)c->y.data, am, t, C8, n8);
    } else {
        pool_back_any<<<grid_for(n, 256), 256, 0, st->stream>>>(zv, gv, av, t, n, c->C);
    }
    LAUNCHED(ctx, "affine max-pool backward");
    return BIE_STATUS_OK;
}

extern "C" enum bie_status bie_cuda_affine_maxpool2d(bie_context_t * ctx, const struct bie_pool_call * c) {
    struct bie_cuda_state * st;
    BIE_TRY(bie_cuda_state_get(ctx, c->device_index, &st));
    const int64_t n = c->N * c->C * c->OH * c->OW;
    if (n == 0) return BIE_STATUS_OK;
    const pool_terms t = terms_of(c);
    struct dview xv, yv;
    dview_make(&c->x, &xv);
    dview_make(&c->y, &yv);
    const bool bits_dense = !c->out_bits.data || bie_cuda_channels_last(c->out_bits);
    const bool amax_dense =
        !c->argmax.data || (bie_cuda_channels_last(c->argmax) && (uintptr_t)c->argmax.data % 8 == 0);
    const int64_t image = (c->H - 1) * c->x.stride[2] + (c->W - 1) * c->x.stride[3] + c->C; // x's span in an image
    if (c->C % 8 == 0 && c->OW * (c->C / 8) < INT32_MAX && image < INT32_MAX && bie_cuda_channels_last(c->x) &&
        bie_cuda_channels_last(c->y) && bits_dense && amax_dense && aligned16(c->x.data) && aligned16(c->y.data)) {
        const int C8 = (int)(c->C / 8);
        const int64_t rows = c->N * c->OH;
        uint8_t *bits = (uint8_t *)c->out_bits.data, *amax = (uint8_t *)c->argmax.data;
        if (c->x.dtype == BIE_DTYPE_F16) launch_nhwc8<__half>(xv, yv, bits, amax, t, C8, rows, st->stream);
        else if (c->x.dtype == BIE_DTYPE_BF16) launch_nhwc8<__nv_bfloat16>(xv, yv, bits, amax, t, C8, rows, st->stream);
        else launch_nhwc8<float>(xv, yv, bits, amax, t, C8, rows, st->stream);
        LAUNCHED(ctx, "affine max-pool");
        return BIE_STATUS_OK;
    }
    int8_t * codes = NULL;
    if (c->out_bits.data) BIE_TRY(bie_cuda_workspace(ctx, (size_t)n, (void **)&codes));
    struct dview av = {};
    if (c->argmax.data) dview_make(&c->argmax, &av);
    pool_any<<<grid_for(n, 256), 256, 0, st->stream>>>(xv, yv, codes, av, t, n, c->C);
    LAUNCHED(ctx, "affine max-pool");
    if (codes) {
        struct dview bv;
        dview_make(&c->out_bits, &bv);
        BIE_TRY(bie_cuda_store_packed(ctx, codes, bv));
    }
    return BIE_STATUS_OK;
}
