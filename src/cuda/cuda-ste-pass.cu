// SPDX-License-Identifier: Apache-2.0
// cuda-ste-pass.cu: the fused straight-through-estimator pass of the backward (docs/semantics.md),
// one kernel over x that, from the tap sums of grad_x's GEMM or convolution (dCol), gives
//   binary: r = x'/scale_a, mask = 1{|r| <= 1}, grad_x = gx*mask, term = grad_x * sign(x')
//   n-bit : mid = 1{lo <= r <= hi}, grad_x = gx*mid,
//           term = gx * (lo*1{r<lo} + hi*1{r>hi} + mid*(rne(r) - r))
// with gx = scale_w * (the tap sum), then grad_scale_a = sum(term) / sqrt(numel(x)) (n-bit:
// / sqrt(numel(x)*hi)) and grad_bias_a[c] = the sum of grad_x over every other axis. x is float,
// or the sign bits saved by bie_binarize_ste with their mask bits (rows only). A float x under an
// x_clamp t (the scale_a dscale's clamp) is read as clamp(x, -t, t), and grad_x, once the sums are
// taken, is gated by the clamp's derivative 1{|x| < t}. Last, grad_x_add (gadd) is added to grad_x:
// round(f32(round(grad_x)) + f32(gadd)) in grad_x's dtype.
#include "cuda-impl.cuh"
#include "cuda-ste.cuh"

#include <math.h>

#include <algorithm>
#include <type_traits>

namespace {

// The binary STE of one element from its sign bit and its pass test: the masked gradient and the
// scale_a-gradient term (saved bits give both tests as bits).
__device__ __forceinline__ void ste_elem_binary(bool sign, bool pass, float gx, float * gxm, float * term) {
    *gxm = pass ? gx : 0.0f;
    *term = sign ? *gxm : -*gxm;
}
// The STE of one element (header comment): from x' and gx, the masked gradient and the
// scale_a-gradient term.
__device__ __forceinline__ void ste_elem(float xp, float gx, int quant, float s_a, int lo, int hi, float * gxm,
                                         float * term) {
    if (quant == BIE_QUANT_BINARY) {
        ste_elem_binary(xp >= 0.0f, ste_passes(xp, s_a, quant, lo, hi), gx, gxm, term);
    } else { // (one division: the test and the term both take r)
        const float r = __fdiv_rn(xp, s_a);
        const bool mid = ste_passes_r(r, quant, lo, hi);
        *gxm = mid ? gx : 0.0f;
        const float f = r < (float)lo ? (float)lo : r > (float)hi ? (float)hi : mid ? rintf(r) - r : 0.0f;
        *term = gx * f;
    }
}

// round(v) + grad_x_add[off] (grad_x's dtype gdt): the tiles pass's last step where grad_x_add is
// given, out of line (inlined there, the element load's dtype switch took the compiler tens of
// minutes).
__device__ __noinline__ float plus_add(float v, int gdt, const struct dview & gadd, int64_t off) {
    return round_as(gdt, v) + ld_float(gadd.data, gadd.dtype, off);
}

// Adds a block's double to *sum (blockDim.x a multiple of 32, at most 1024 threads).
__device__ void block_sum_add(double acc, double * sum) {
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    __shared__ double part[32];
    const int tid = threadIdx.y * blockDim.x + threadIdx.x, nt = blockDim.x * blockDim.y;
    if ((tid & 31) == 0) part[tid >> 5] = acc;
    __syncthreads();
    if (tid == 0) {
        double t = 0.0;
        for (int i = 0; i < nt / 32; i++) t += part[i];
        atomicAdd(sum, t);
    }
}

// Output index that tap offset k (of dilation dil) of input coordinate x feeds, or -1:
// x = o*stride - pad + k*dil for o in [0, OX).
__device__ __forceinline__ int out_index(int x, int pad, int k, int dil, int stride, int OX) {
    const int t = x + pad - k * dil;
    if (t < 0) return -1;
    const int o = stride == 1 ? t : t / stride;
    return o * stride == t && o < OX ? o : -1;
}

// Element off of view v as f32 (float, __half and __nv_bfloat16).
template <typename T> __device__ __forceinline__ float ld_as(const struct dview & v, int64_t off) {
    return to_f32(((const T *)v.data)[off]);
}

constexpr int STE_TAPS = 9; // taps of a pixel whose dCol loads are issued together (a 3x3 kernel's at once)

// ste_tiles: this block's sums of its channels into colpart, in a fixed order (cacc: the thread's
// running sums, see ste_tiles).
__device__ __forceinline__ void colpart_store(double (&csum)[8][33], const double * cacc, int along_pixels, int64_t c0,
                                              int64_t C, int64_t ctiles, double * colpart) {
    const int lane = threadIdx.x, ty = threadIdx.y;
    if (along_pixels) { // thread (lane, ty) holds channels ty + 8k: summed over the lanes
#pragma unroll
        for (int k = 0; k < 4; k++) {
            double t = cacc[k];
            for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
            if (lane == 0) csum[0][ty + 8 * k] = t;
        }
        __syncthreads();
        if (ty == 0 && c0 + lane < C) colpart[(blockIdx.x / ctiles) * C + c0 + lane] = csum[0][lane];
    } else { // every warp holds channel c0 + lane: summed over the warps
        csum[ty][lane] = cacc[0];
        __syncthreads();
        if (ty == 0 && c0 + lane < C) {
            double t = 0.0;
            for (int y = 0; y < (int)blockDim.y; y++) t += csum[y][lane];
            colpart[(blockIdx.x / ctiles) * C + c0 + lane] = t;
        }
    }
}

// The fused STE pass over x, any geometry, by tiles of 32 pixels (p = (n*H + h)*W + w over the
// batch) x 32 channels, block (32, 8): the tap sums gx = sum of dCol over the taps that read
// (h, w) are gathered along the channels (rows of dCol are channel-contiguous), a thread's 4
// pixels x NT taps of loads in flight at once, into shared memory; x, grad_x and gxm are then
// visited along the pixels when those are contiguous in x (NCHW), else along the channels. A
// block keeps one channel tile (the grid is a multiple of the channel tiles) and leaves its
// channels' sums of the masked gradient in colpart[blockIdx.x / ctiles][c], for grad_bias_a
// (finish_pass). NT = 0: dCol has one tap per pixel at stride 1 without padding, so gx of pixel p
// is dCol[p][c] (a 1x1 conv's dCol, or the grad_x GEMM of a stride-1 conv); T: x's element type
// (float, __half, __nv_bfloat16; void: any, by its dtype).
template <int NT, typename T, typename D>
__global__ void __launch_bounds__(256, NT == STE_TAPS ? 2 : 3)
    ste_tiles(struct dview x, struct dview bias, struct dgeom g, int quant, struct dscale sa, struct dscale sw,
              const D * dcol, struct dview gx_out, struct dview gadd, int write_gx, int along_pixels,
              double * colpart /* or NULL */, double * term_sum) {
    constexpr int NL = NT > 0 ? NT : 1; // loads per pixel in flight
    __shared__ float tile[32][33];      // [pixel][channel]
    __shared__ double csum[8][33];
    const float s_a = ld_scale(sa), s_w = ld_scale(sw), t = sa.clamp;
    const int lo = qlo(quant), hi = qhi(quant), taps = g.kh * g.kw;
    const int64_t HW = g.H * g.W, P = g.batch * HW, ptiles = (P + 31) / 32, ctiles = (g.C + 31) / 32;
    const int lane = threadIdx.x, ty = threadIdx.y;
    const int64_t c0 = (blockIdx.x % ctiles) * 32;
    // cacc[k]: the thread's running sum of channel c0 + lane (along channels: k = 0 only) or of
    // channel c0 + ty + 8k over its lane's pixels (along pixels, summed over the lanes at the end)
    double acc = 0.0, cacc[4] = {0.0, 0.0, 0.0, 0.0};
    float bv[4]; // bias_a of the thread's channels, which stay fixed
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int64_t cc = c0 + (along_pixels ? ty + 8 * k : lane);
        bv[k] = bias.data && cc < g.C ? ld_float(bias.data, bias.dtype, cc * bias.stride[3]) : 0.0f;
    }
    for (int64_t pt = blockIdx.x / ctiles; pt < ptiles; pt += gridDim.x / ctiles) {
        const int64_t p0 = pt * 32;
        // tap sums of pixels p0 + ty + 8k at channel c0 + lane
        float sum[4] = {0.0f, 0.0f, 0.0f,
                        0.0f}; // taps in order (i, then j); a skipped tap adds +0, which changes no sum
        if (NT == 0) {
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int64_t p = p0 + ty + 8 * k, c = c0 + lane;
                sum[k] = p < P && c < g.C ? __fadd_rn(0.0f, to_f32(dcol[p * g.C + c])) : 0.0f;
            }
        } else {
            const int64_t c = c0 + lane;
            int h[4], w[4];
            const D * base[4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int64_t p = p0 + ty + 8 * k;
                const bool in = p < P && c < g.C;
                const int64_t n = in ? qdiv(p, HW) : 0, q = p - n * HW;
                h[k] = in ? (int)qdiv(q, g.W) : -(1 << 29); // outside: no tap reaches it
                w[k] = in ? (int)(q - (int64_t)h[k] * g.W) : 0;
                base[k] = dcol + n * g.OH * g.OW * g.K + c;
            }
            for (int t0 = 0; t0 < taps; t0 += NL) {
                float v[4][NL];
#pragma unroll
                for (int u = 0; u < NL; u++) {
                    const int t = t0 + u, i = t / g.kw, j = t - i * g.kw;
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        const int oh = t < taps ? out_index(h[k], g.ph, i, g.dh, g.sh, (int)g.OH) : -1;
                        const int ow = oh >= 0 ? out_index(w[k], g.pw, j, g.dw, g.sw, (int)g.OW) : -1;
                        v[k][u] = ow >= 0 ? to_f32(base[k][((int64_t)oh * g.OW + ow) * g.K + (int64_t)t * g.C]) : 0.0f;
                    }
                }
#pragma unroll
                for (int k = 0; k < 4; k++)
#pragma unroll
                    for (int u = 0; u < NL; u++) sum[k] += v[k][u];
            }
        }
#pragma unroll
        for (int k = 0; k < 4; k++) tile[ty + 8 * k][lane] = sum[k];
        __syncthreads();
        // element k of this thread: pixel p0 + lane and channel c0 + ty + 8k along the pixels,
        // else pixel p0 + ty + 8k and channel c0 + lane; the offsets of x and grad_x split into a
        // pixel part and a channel part
        int64_t xo[4], go[4], ao[4];
        float xv[4];
        bool open[4]; // the clamp's derivative 1{|x| < t} (x_clamp), or true
#pragma unroll
        for (int k = 0; k < 4; k++) {
            if (along_pixels && k > 0) {
                xo[k] = xo[0];
                go[k] = go[0];
                ao[k] = ao[0];
                continue;
            }
            const int64_t p = p0 + (along_pixels ? lane : ty + 8 * k);
            const int64_t n = p < P ? qdiv(p, HW) : 0, q = p - n * HW, hh = p < P ? qdiv(q, g.W) : 0, ww = q - hh * g.W;
            xo[k] = p < P ? n * x.stride[0] + hh * x.stride[2] + ww * x.stride[3] : -1;
            go[k] = write_gx ? n * gx_out.stride[0] + hh * gx_out.stride[2] + ww * gx_out.stride[3] : 0;
            ao[k] = gadd.data ? n * gadd.stride[0] + hh * gadd.stride[2] + ww * gadd.stride[3] : 0;
        }
#pragma unroll
        for (int k = 0; k < 4; k++) { // x first, all 4 loads in flight
            const int64_t cc = c0 + (along_pixels ? ty + 8 * k : lane);
            xv[k] = xo[k] >= 0 && cc < g.C ? ld_as<T>(x, xo[k] + cc * x.stride[1]) : 0.0f;
            open[k] = !(t > 0.0f) || clamp_open(xv[k], t);
            if (t > 0.0f) xv[k] = clamp_in(xv[k], t);
            if (bias.data) xv[k] = __fadd_rn(xv[k], bv[k]);
        }
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int r = ty + 8 * k, pi = along_pixels ? lane : r, ci = along_pixels ? r : lane;
            const int64_t cc = c0 + ci;
            float gxm_v = 0.0f, term = 0.0f;
            if (xo[k] >= 0 && cc < g.C) {
                ste_elem(xv[k], __fmul_rn(tile[pi][ci], s_w), quant, s_a, lo, hi, &gxm_v, &term);
                if (write_gx) {
                    float v = open[k] ? gxm_v : 0.0f;
                    if (gadd.data) v = plus_add(v, gx_out.dtype, gadd, ao[k] + cc * gadd.stride[1]);
                    st_float(gx_out.data, gx_out.dtype, go[k] + cc * gx_out.stride[1], v);
                }
            }
            acc += (double)term;
            cacc[along_pixels ? k : 0] += (double)gxm_v;
        }
        __syncthreads();
    }
    if (colpart) colpart_store(csum, cacc, along_pixels, c0, g.C, ctiles, colpart);
    if (term_sum) block_sum_add(acc, term_sum);
}

// ste_tiles for dCol's shape: several taps per pixel, one at a stride or with padding, or
// dCol[p][c] itself (a 1x1, stride-1 conv without padding).
template <typename T, typename D>
void launch_ste_tiles(unsigned grid, cudaStream_t s, struct dview x, struct dview bias, struct dgeom g, int quant,
                      struct dscale sa, struct dscale sw, const D * dcol, struct dview gxo, struct dview gadd, int wgx,
                      int ap, double * colpart, double * sum) {
    const bool dense = g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0 && g.OH == g.H && g.OW == g.W;
    const int mode = g.kh * g.kw > 1 ? 2 : dense ? 0 : 1;
    const dim3 b(32, 8);
    if constexpr (!std::is_same<D, float>::value) { // (cuDNN's dgrad: one f16/bf16 tap sum per pixel)
        ste_tiles<0, T, D><<<grid, b, 0, s>>>(x, bias, g, quant, sa, sw, dcol, gxo, gadd, wgx, ap, colpart, sum);
        return;
    }
    if (mode == 0)
        ste_tiles<0, T, D><<<grid, b, 0, s>>>(x, bias, g, quant, sa, sw, dcol, gxo, gadd, wgx, ap, colpart, sum);
    else if (mode == 1)
        ste_tiles<1, T, D><<<grid, b, 0, s>>>(x, bias, g, quant, sa, sw, dcol, gxo, gadd, wgx, ap, colpart, sum);
    else
        ste_tiles<STE_TAPS, T, D><<<grid, b, 0, s>>>(x, bias, g, quant, sa, sw, dcol, gxo, gadd, wgx, ap, colpart, sum);
}

// The same pass for a linear layer (dgeom_one_position: dCol[n][c] is element (n, c)'s own sum
// over its one tap) whose x has contiguous features: a thread takes 8 consecutive features of a
// row, with 16-byte loads and stores where aligned. Block (32, 8) covers 256 features of a slab of
// `slab` rows; instead of the transposed copy for the per-channel sums, each block writes its
// slab's column sums to colpart[slab index][c] (finished by finish_pass). Rows of few features take
// narrower blocks (blockDim.x threads of 8 features, 256 threads in all), so that no lane idles.
// D: dCol's element type (f32 from the GEMM, or the caller's dtype from cuDNN). T = sbits: x is saved
// sign bits and xm the saved mask, both in rows that start on whole bytes (a byte of each per
// thread and row), and each element's gradient and term are those of the x' they came from; gm
// (grad_x_mask, data NULL when absent) then zeroes grad_x where its bit is 0, after the sums, and
// gadd (rows like gx_out's) is added last. Three blocks a multiprocessor: unbounded, the float
// instances take 136-139 registers, one block of eight warps a multiprocessor (at four blocks they
// spill).
template <typename T, typename D>
__global__ void __launch_bounds__(256, 3)
    ste_rows(struct dview x, struct dview xm, struct dview gm, struct dview bias, int64_t rows, int64_t C, int64_t slab,
             int quant, struct dscale sa, struct dscale sw, const D * dcol, struct dview gx_out, struct dview gadd,
             int write_gx, double * colpart, double * term_sum) {
    const float s_a = ld_scale(sa), s_w = ld_scale(sw), t = sa.clamp;
    const int lo = qlo(quant), hi = qhi(quant);
    const int64_t c0 = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    const int64_t r0 = (int64_t)blockIdx.y * slab, r1 = r0 + slab < rows ? r0 + slab : rows;
    float b[8];
#pragma unroll
    for (int i = 0; i < 8; i++)
        b[i] = bias.data && c0 + i < C ? ld_float(bias.data, bias.dtype, (c0 + i) * bias.stride[3]) : 0.0f;
    double csum[8] = {0, 0, 0, 0, 0, 0, 0, 0}, acc = 0.0;
    const bool full = c0 + 8 <= C;
    // Row r's STE from its dCol values dv and its saved bits (sign, pass, gate) or x values xv:
    // the sums, then grad_x.
    auto row = [&](int64_t r, const float * dv, const float * xv, uint32_t sign, uint32_t pass, uint32_t gate) {
        float gv[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            // as ste_pass: the tap sum starts from 0.0f, x' adds the bias in f32
            const float gxi = __fmul_rn(__fadd_rn(0.0f, dv[i]), s_w);
            if constexpr (is_sbits<T>) {
                // (the term is +-gv: one conversion to double serves both sums)
                gv[i] = (pass >> i) & 1u ? gxi : 0.0f;
                const double d = (double)gv[i];
                if (c0 + i < C) {
                    csum[i] += d;
                    acc += (sign >> i) & 1u ? d : -d;
                }
            } else {
                float term;
                float xc = xv[i];
                if (t > 0.0f) { // x_clamp: the clamp's derivative gates grad_x after the sums
                    if (!clamp_open(xc, t)) gate &= ~(1u << i);
                    xc = clamp_in(xc, t);
                }
                const float xp = bias.data ? __fadd_rn(xc, b[i]) : xc;
                ste_elem(xp, gxi, quant, s_a, lo, hi, &gv[i], &term);
                if (c0 + i < C) {
                    csum[i] += (double)gv[i];
                    acc += (double)term;
                }
            }
        }
        if (!write_gx) return;
#pragma unroll
        for (int i = 0; i < 8; i++) gv[i] = (gate >> i) & 1u ? gv[i] : 0.0f; // grad_x_mask, after the sums
        if (gadd.data) {                                                     // grad_x_add, last
            float av[8];
            const int64_t ao = r * gadd.stride[0] + c0 * gadd.stride[1];
            if (full) load8_at(gadd.data, gadd.dtype, ao, gadd.stride[1], av);
            else
                for (int i = 0; i < 8; i++)
                    av[i] = c0 + i < C ? ld_float(gadd.data, gadd.dtype, ao + i * gadd.stride[1]) : 0.0f;
#pragma unroll
            for (int i = 0; i < 8; i++) gv[i] = round_as(gx_out.dtype, gv[i]) + av[i];
        }
        const int64_t go = r * gx_out.stride[0] + c0 * gx_out.stride[1];
        if (full && gx_out.stride[1] == 1 && vec8_ok(gx_out.data, gx_out.dtype, go))
            store8(gx_out.data, gx_out.dtype, go, gv);
        else
            for (int i = 0; i < 8 && c0 + i < C; i++)
                st_float(gx_out.data, gx_out.dtype, go + i * gx_out.stride[1], gv[i]);
    };
    // (x's rows as whole 16-byte vectors too, for a float x)
    const bool x_vectors = is_sbits<T> || (x.stride[1] == 1 && (uintptr_t)x.data % 16 == 0 &&
                                           (x.stride[0] * (int64_t)sizeof(T)) % 16 == 0);
    const bool pipelined = full && x_vectors && (C * sizeof(D)) % 16 == 0 && (uintptr_t)dcol % 16 == 0;
    // Row r's saved bytes (saved bits only): its sign bits, pass bits and gate (grad_x_mask) bits.
    auto saved = [&](int64_t r, uint32_t * sign, uint32_t * pass, uint32_t * gate) {
        *sign = ((const uint8_t *)x.data)[r * (x.stride[0] / 8) + c0 / 8];
        *pass = ((const uint8_t *)xm.data)[r * (xm.stride[0] / 8) + c0 / 8];
        if (gm.data) *gate = ((const uint8_t *)gm.data)[r * (gm.stride[0] / 8) + c0 / 8];
    };
    if (c0 < C && pipelined) {
        // whole 16-byte vectors of dCol (and of a float x): the next row's loads are issued before
        // this row is worked, so that each thread has two rows' bytes in flight
        using xraw = raw8<typename std::conditional<is_sbits<T>, __half, T>::type>;
        raw8<D> nd;
        xraw nx;
        uint32_t ns = 0, np = 0, ng = 0xFFu;
        auto fetch = [&](int64_t r) {
            nd = raw8_load<D>(dcol + r * C + c0);
            if constexpr (is_sbits<T>) {
                saved(r, &ns, &np, &ng);
            } else {
                nx = raw8_load<T>((const T *)x.data + r * x.stride[0] + c0);
            }
        };
        int64_t r = r0 + threadIdx.y;
        if (r < r1) fetch(r);
        for (; r < r1; r += blockDim.y) {
            const raw8<D> cd = nd;
            const xraw cx = nx;
            const uint32_t cs = ns, cp = np, cg = ng;
            if (r + blockDim.y < r1) fetch(r + blockDim.y);
            float dv[8], xv[8];
            raw8_floats<D>(cd, dv);
            if constexpr (!is_sbits<T>) raw8_floats<T>(cx, xv);
            row(r, dv, xv, cs, cp, cg);
        }
    } else if (c0 < C)
        for (int64_t r = r0 + threadIdx.y; r < r1; r += blockDim.y) {
            const D * dr = dcol + r * C;
            float xv[8], dv[8];
            uint32_t sign = 0, pass = 0, gate = 0xFFu; // saved bits
            if constexpr (is_sbits<T>) {
                saved(r, &sign, &pass, &gate);
            } else {
                const T * xr = (const T *)x.data + r * x.stride[0];
                if (full && vec8_ok(xr, x.dtype, c0)) load8<T>(xr + c0, xv);
                else
                    for (int i = 0; i < 8; i++) xv[i] = c0 + i < C ? ld_float((const char *)xr, x.dtype, c0 + i) : 0.0f;
            }
            if (full && ((uintptr_t)(dr + c0) % 16) == 0) load8<D>(dr + c0, dv);
            else
                for (int i = 0; i < 8; i++) dv[i] = c0 + i < C ? to_f32(dr[c0 + i]) : 0.0f;
            row(r, dv, xv, sign, pass, gate);
        }
    if (colpart) { // column sums over the block's rows of threads, in a fixed order
        __shared__ double cs[256 * 8];
        const int ncols = (int)blockDim.x * 8, tid = threadIdx.y * blockDim.x + threadIdx.x;
#pragma unroll
        for (int i = 0; i < 8; i++) cs[threadIdx.y * ncols + threadIdx.x * 8 + i] = csum[i];
        __syncthreads();
        for (int j = tid; j < ncols; j += (int)(blockDim.x * blockDim.y)) {
            const int64_t c = (int64_t)blockIdx.x * ncols + j;
            double t = 0.0;
            for (int y = 0; y < (int)blockDim.y; y++) t += cs[y * ncols + j];
            if (c < C) colpart[blockIdx.y * C + c] = t;
        }
    }
    if (term_sum) block_sum_add(acc, term_sum);
}

// The pass's results after it, in one launch: grad_bias_a[c] = sum over the rows of colpart[row][c]
// (colpart NULL: none), block (32, 32) per 32 channels, row r summed by warp r % 32, the 32 partial
// sums added in a fixed order; and grad_scale_a = term_sum / denom (term_sum NULL: none), by the
// first thread.
__global__ void finish_pass(const double * colpart, int64_t rows, int64_t C, struct dview gb, const double * term_sum,
                            double denom, struct dview gsa) {
    if (term_sum && blockIdx.x == 0 && threadIdx.x == 0 && threadIdx.y == 0)
        st_float(gsa.data, gsa.dtype, 0, (float)(*term_sum / denom));
    if (!colpart) return;
    __shared__ double part[32][33];
    const int64_t c = (int64_t)blockIdx.x * 32 + threadIdx.x;
    double t = 0.0;
    if (c < C) { // (the rows' loads 8 at a time in flight, added in the same order)
        const int64_t step = blockDim.y;
        int64_t r = threadIdx.y;
        for (; r + 7 * step < rows; r += 8 * step) {
            double v[8];
#pragma unroll
            for (int u = 0; u < 8; u++) v[u] = colpart[(r + u * step) * C + c];
#pragma unroll
            for (int u = 0; u < 8; u++) t += v[u];
        }
        for (; r < rows; r += step) t += colpart[r * C + c];
    }
    part[threadIdx.y][threadIdx.x] = t;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        double sum = 0.0;
        for (int y = 0; y < (int)blockDim.y; y++) sum += part[y][threadIdx.x];
        st_float(gb.data, gb.dtype, c * gb.stride[3], (float)sum);
    }
}

// ste_rows' blocks: 256 threads of 8 features each, as many across as a row of C needs (up to 32).
int rows_tx(int64_t C) {
    int tx = 1;
    while (tx < 32 && tx * 8 < C) tx *= 2;
    return tx;
}
// ste_rows' blocks across a row of C features.
int64_t rows_xblocks(int64_t C) {
    const int64_t w = (int64_t)rows_tx(C) * 8;
    return (C + w - 1) / w;
}

// The launches for x's element type T (sbits: saved bits) and dCol's D.
template <typename T, typename D>
void launch_pass(const ste_pass_job & j, cudaStream_t s, int64_t slab, int64_t slabs, unsigned tiles_grid,
                 double * colpart, double * sum) {
    const int q = j.quant, wgx = j.gx.data != NULL;
    const D * dcol = (const D *)j.dcol;
    if (j.rows) {
        const int tx = rows_tx(j.g.C);
        const dim3 grid((unsigned)rows_xblocks(j.g.C), (unsigned)slabs), block(tx, 256 / tx);
        ste_rows<T, D><<<grid, block, 0, s>>>(j.x, j.xm, j.gm, j.bias, j.g.batch, j.g.C, slab, q, j.sa, j.sw, dcol,
                                              j.gx, j.gadd, wgx, colpart, sum);
    } else if constexpr (!is_sbits<T>) {
        launch_ste_tiles<T, D>(tiles_grid, s, j.x, j.bias, j.g, q, j.sa, j.sw, dcol, j.gx, j.gadd, wgx,
                               bie_cuda_along_pixels(j.x), colpart, sum);
    }
}

template <typename T>
void launch_for_dcol(const ste_pass_job & j, cudaStream_t s, int64_t slab, int64_t slabs, unsigned tiles_grid,
                     double * colpart, double * sum) {
    if (j.dcol_dtype == BIE_DTYPE_F16) launch_pass<T, __half>(j, s, slab, slabs, tiles_grid, colpart, sum);
    else if (j.dcol_dtype == BIE_DTYPE_BF16) launch_pass<T, __nv_bfloat16>(j, s, slab, slabs, tiles_grid, colpart, sum);
    else launch_pass<T, float>(j, s, slab, slabs, tiles_grid, colpart, sum);
}

// How the pass splits its work: rows in slabs of `slab` (rows mode; at most 65535 slabs), or
// `groups` blocks per tile of 32 channels (tiles mode); part_rows rows of partial channel sums.
struct pass_split {
    int64_t slab, slabs, ctiles, groups, part_rows;
};
pass_split split_of(const ste_pass_job & j) {
    pass_split p;
    // slabs of 64 rows, at most 1024 of them (few rows of partial sums for finish_pass to add), or
    // of fewer rows (a block's rows of threads at least) where slabs of 64 would leave fewer than
    // 1024 blocks to fill the GPU
    const int64_t M = j.g.batch, tx = rows_tx(j.g.C), xblocks = rows_xblocks(j.g.C);
    p.slab = 64;
    if ((M + p.slab - 1) / p.slab > 1024) p.slab = ((M + 1023) / 1024 + 7) / 8 * 8;
    else if ((M + p.slab - 1) / p.slab * xblocks < 1024)
        p.slab = std::min<int64_t>(64, std::max<int64_t>(256 / tx, ((M * xblocks + 1023) / 1024 + 7) / 8 * 8));
    p.slabs = (M + p.slab - 1) / p.slab;
    p.ctiles = (j.g.C + 31) / 32;
    const int64_t ptiles = (j.xnumel / j.g.C + 31) / 32;
    p.groups = std::max<int64_t>(1, std::min<int64_t>(ptiles, 2048 / p.ctiles));
    p.part_rows = j.rows ? p.slabs : p.groups;
    return p;
}

size_t align256(size_t v) { return (v + 255) & ~(size_t)255; }

} // namespace

size_t bie_cuda_ste_pass_workspace(const ste_pass_job & j) {
    const pass_split p = split_of(j);
    return align256(j.gb.data ? (size_t)(p.part_rows * j.g.C) * 8 : 0) + align256(sizeof(double));
}

enum bie_status bie_cuda_ste_pass(bie_context_t * ctx, cudaStream_t s, const ste_pass_job & j, void * ws) {
    const pass_split p = split_of(j);
    double * colpart = j.gb.data ? (double *)ws : NULL;
    double * sum =
        j.gsa.data ? (double *)((uint8_t *)ws + align256(j.gb.data ? (size_t)(p.part_rows * j.g.C) * 8 : 0)) : NULL;
    if (!j.rows && j.x.dtype == BIE_DTYPE_B1)
        return bie_set_error(ctx, BIE_STATUS_INTERNAL, "STE pass: saved bits are read by rows only");
    if (sum) CU_TRY(ctx, cudaMemsetAsync(sum, 0, sizeof(double), s), "cudaMemsetAsync");
    const unsigned tiles_grid = (unsigned)(p.groups * p.ctiles);
    switch (j.x.dtype) {
    case BIE_DTYPE_F32: launch_for_dcol<float>(j, s, p.slab, p.slabs, tiles_grid, colpart, sum); break;
    case BIE_DTYPE_F16: launch_for_dcol<__half>(j, s, p.slab, p.slabs, tiles_grid, colpart, sum); break;
    case BIE_DTYPE_BF16: launch_for_dcol<__nv_bfloat16>(j, s, p.slab, p.slabs, tiles_grid, colpart, sum); break;
    case BIE_DTYPE_B1: launch_for_dcol<sbits>(j, s, p.slab, p.slabs, tiles_grid, colpart, sum); break;
    default: return bie_set_error(ctx, BIE_STATUS_INTERNAL, "STE pass: x of dtype %d", j.x.dtype);
    }
    LAUNCHED(ctx, j.rows ? "STE pass (rows)" : "STE pass");
    if (colpart || sum) {
        struct dview gsa = j.gsa;
        gsa.stride[3] = 0;
        const double denom = j.quant == BIE_QUANT_BINARY
                                 ? sqrt((double)j.xnumel)
                                 : sqrt((double)j.xnumel * bie_quant_hi((enum bie_quant)j.quant));
        finish_pass<<<colpart ? (unsigned)p.ctiles : 1u, colpart ? dim3(32, 32) : dim3(1), 0, s>>>(
            colpart, p.part_rows, j.g.C, j.gb, sum, denom, gsa);
        LAUNCHED(ctx, "grad_bias_a and grad_scale_a");
    }
    return BIE_STATUS_OK;
}
