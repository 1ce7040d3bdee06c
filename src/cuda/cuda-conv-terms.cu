// SPDX-License-Identifier: Apache-2.0
// cuda-conv-terms.cu: the epilogue terms of a binary conv's forward pass that depend on the
// conv's geometry: the row popcounts of rows that the GEMM gathers (conv_rowterms), and the weight
// side of a zero-padded conv, whose border rows add back the taps outside the image
// (weight_terms, border_counts; see zero_pad_terms in cuda-impl.cuh).
#include "cuda-forward.cuh"

namespace {

// rowpop[m] = popc of implicit-GEMM row m as the gather reads it: the sum, over the taps of output
// pixel m inside the image, of the popcounts of that pixel's C/32 words of NHWC x (taps outside
// read as zero words), read V words at a time (V = gs.piece / 4, what the words' alignment allows;
// 32-bit offsets: the host gathers only x of fewer than 2^31 words). With zero padding it also
// writes rowterms[m] = {K over the valid taps - 2 rowpop[m], the border class} for the class counts
// `border`. It writes epilogue terms only, so the GEMM queued next may start under it; queued right
// after weight_terms (whose tables it does not read) it may itself start under that kernel, and
// waits for it before it ends, so that a GEMM that waits for it has both. (One launch costs less
// than pixel popcounts and row sums in two; summing the pixel popcounts in the GEMM's epilogue
// costs more than both: 9 loads per row on each tile's path.)
struct border_counts4 {
    int v[4]; // top, bottom, left, right
};
template <int V>
__global__ void conv_rowterms(gemm_gather gs, struct dgeom g, int * rowpop, int2 * rowterms, border_counts4 border) {
    griddep_launch_dependents();
    const int M = (int)(g.batch * g.OH * g.OW), H = (int)g.H, W = (int)g.W, taps = g.kh * g.kw;
    const int pw = (int)(g.C / 32), w0 = (int)gs.w0, w2 = (int)gs.w2, w3 = (int)gs.w3;
    for (int m = blockIdx.x * blockDim.x + threadIdx.x; m < M; m += gridDim.x * blockDim.x) {
        const uint32_t nhw = fast_div((uint32_t)m, gs.div_ow), n = fast_div(nhw, gs.div_oh);
        const int ow = m - (int)nhw * (int)g.OW, oh = (int)nhw - (int)n * (int)g.OH;
        const int h0 = oh * g.sh - g.ph, wl = ow * g.sw - g.pw;
        const uint32_t * xs = gs.x + n * w0;
        int cnt = 0;
        // TB taps at a time, every load issued (a tap outside the image reads the sample's first
        // pixel and counts nothing), so that their latencies overlap: loops that skipped the
        // taps outside issued one load after another.
        constexpr int TB = 9;
        int i = 0, j = 0; // the tap (i, j) of t0 + u
        for (int t0 = 0; t0 < taps; t0 += TB) {
            const uint32_t * px[TB];
            bool in[TB];
#pragma unroll
            for (int u = 0; u < TB; u++) {
                const int h = h0 + i * g.dh, w = wl + j * g.dw;
                in[u] = t0 + u < taps && (unsigned)h < (unsigned)H && (unsigned)w < (unsigned)W;
                px[u] = in[u] ? xs + h * w2 + w * w3 : xs;
                if (++j == g.kw) {
                    j = 0;
                    i++;
                }
            }
            for (int q = 0; q < pw; q += V) {
                int c[TB];
#pragma unroll
                for (int u = 0; u < TB; u++) {
                    if (V == 4) c[u] = popc4(__ldg((const uint4 *)(px[u] + q)));
                    else if (V == 2) {
                        const uint2 v = __ldg((const uint2 *)(px[u] + q));
                        c[u] = __popc(v.x) + __popc(v.y);
                    } else c[u] = __popc(__ldg(px[u] + q));
                }
#pragma unroll
                for (int u = 0; u < TB; u++) cnt += in[u] ? c[u] : 0;
            }
        }
        rowpop[m] = cnt; // (the element-wise epilogue paths read it even with rowterms)
        if (!rowterms) continue;
        int64_t kterm;
        int cls;
        zero_pad_terms(g, border.v, oh, ow, &kterm, &cls);
        rowterms[m] = make_int2((int)kterm - 2 * cnt, cls);
    }
    griddep_wait();
}
// A representative output row (or column) of border class c (border_class in cuda-impl.cuh), or
// -1 for class 0 (no tap outside the image in that dimension).
__device__ __forceinline__ int64_t class_example(int c, int64_t O, int lo, int hi) {
    return c == 0 ? -1 : c <= lo ? c - 1 : O - hi + (c - 1 - lo);
}
__host__ __device__ bool weight_terms_stages_row(int64_t K) { return (K + 7) / 8 <= WT_SMEM_ROW; }
size_t weight_terms_smem(int64_t taps, int64_t K) {
    return (size_t)(32 + (taps <= WT_SMEM_TAPS ? taps : 0)) * sizeof(int) +
           (weight_terms_stages_row(K) ? (size_t)((K + 7) / 8) : 0);
}
__global__ void weight_terms(weight_terms_args a) {
    griddep_launch_dependents(); // (a GEMM queued right after it waits for it before its epilogue)
    const struct dgeom & g = a.g;
    const int64_t o = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const int taps = (int)(g.kh * g.kw);
    const uint8_t * row = a.w + o * a.ld;
    // The launch sizes the shared memory (weight_terms_smem): the warps' sums, the tap popcounts
    // (up to WT_SMEM_TAPS taps, else in tappop), then the row's bytes (rows of up to WT_SMEM_ROW
    // bytes). (Sized by the launch rather than as a fixed array, so that the block stays small
    // enough to run beside the packer of x that it starts under.)
    extern __shared__ int wt_smem[];
    const int ntp = taps <= WT_SMEM_TAPS ? taps : 0;
    int *const wsum = wt_smem, *const tp = ntp ? wt_smem + 32 : a.tappop + o * taps;
    // The row's bytes that hold K, loaded at once: staged in shared memory, where the tap loop
    // below reads them, and copied into the operand (K % 8 == 0 there) from the same loads. (Read
    // by the tap loop from global memory, a load after each tap's sum, they would be three
    // latencies in a row per warp for 9 taps and 4 warps.)
    const int64_t kv = (g.K + 7) / 8;
    const bool staged = weight_terms_stages_row(g.K);
    uint8_t * const srow = (uint8_t *)(wt_smem + 32 + ntp);
    const int64_t nb = a.copy ? a.kbytes : staged ? kv : 0;
    for (int64_t b = threadIdx.x; b < nb; b += blockDim.x) {
        const uint8_t v = b < kv ? row[b] : 0;
        if (a.copy) a.copy[o * a.kbytes + b] = v;
        if (staged && b < kv) srow[b] = v;
    }
    if (staged) {
        __syncthreads();
        row = srow;
    }
    // The tap popcounts, a warp per tap and a byte per lane (the bytes at the ends of the range
    // masked), kept where the sums below read them.
    int part = 0; // this warp's share of popc(row): the sum over its taps
    for (int t = warp; t < taps; t += warps) {
        const int64_t k0 = t * g.C, k1 = k0 + g.C;
        int cnt = 0;
        for (int64_t byte = k0 / 8 + lane; byte * 8 < k1; byte += 32) {
            unsigned v = row[byte];
            if (byte * 8 < k0) v &= 0xffu << (k0 - byte * 8);
            if (byte * 8 + 8 > k1) v &= 0xffu >> (byte * 8 + 8 - k1);
            cnt += __popc(v);
        }
        cnt = (int)__reduce_add_sync(0xffffffffu, (unsigned)cnt);
        if (lane == 0) tp[t] = cnt;
        part += cnt;
    }
    if (lane == 0) wsum[warp] = part;
    __syncthreads(); // (the block's global writes are visible to the block after the barrier)
    int total = 0;   // popc of the row's first K bits
    for (int w = 0; w < warps; w++) total += wsum[w];
    if (a.colpop && threadIdx.x == 0) a.colpop[o] = total;
    if (a.pixcls)
        for (int64_t p = o * blockDim.x + threadIdx.x; p < g.OH * g.OW; p += (int64_t)gridDim.x * blockDim.x) {
            int64_t kterm;
            int cls;
            zero_pad_terms(g, a.border, (int)(p / g.OW), (int)(p % g.OW), &kterm, &cls);
            a.pixcls[p] = make_int2((int)kterm, cls); // (read by the fast epilogue only: K < 2^21)
        }
    const int cwn = 1 + a.border[2] + a.border[3], classes = (1 + a.border[0] + a.border[1]) * cwn;
    for (int p = threadIdx.x; p < classes; p += blockDim.x) {
        int * const cls_row = a.colcls + (int64_t)p * a.colcls_ld;
        for (int64_t col = g.O + o; col < a.colcls_ld; col += g.O) cls_row[col] = 0;
        const int64_t oh = class_example(p / cwn, g.OH, a.border[0], a.border[1]),
                      ow = class_example(p % cwn, g.OW, a.border[2], a.border[3]);
        int sum = 0;
        for (int i = 0; i < g.kh; i++) {
            const int64_t h = oh * g.sh - g.ph + (int64_t)i * g.dh;
            const bool h_out = oh >= 0 && (h < 0 || h >= g.H);
            for (int j = 0; j < g.kw; j++) {
                const int64_t w = ow * g.sw - g.pw + (int64_t)j * g.dw;
                if (h_out || (ow >= 0 && (w < 0 || w >= g.W))) sum += tp[i * g.kw + j];
            }
        }
        a.tapcorr[(int64_t)p * g.O + o] = 2 * sum;
        cls_row[o] = BIE_DOT_BIAS - 2 * total + 2 * sum;
    }
    // Started under the packer of x (terms_under_x in bie_cuda_layer_forward), it ends after that
    // kernel, so that a GEMM waiting for it has both operands.
    griddep_wait();
}

} // namespace

void border_counts(int64_t O, int64_t I, int64_t s, int64_t p, int64_t k, int64_t d, int * lo, int * hi) {
    const int64_t first_inside = (p + s - 1) / s, past = I + p - (k - 1) * d;
    const int64_t first_past = past <= 0 ? 0 : (past + s - 1) / s;
    *lo = (int)(first_inside < O ? first_inside : O);
    *hi = (int)(O - (first_past < O ? first_past : O));
}

enum bie_status launch_weight_terms(bie_context_t * ctx, const weight_terms_args & a, int64_t N, int taps, int64_t K,
                                    bool under_prev) {
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg = bie_cuda_launch_config(ctx, dim3((unsigned)N), dim3(128), weight_terms_smem(taps, K),
                                                          under_prev && bie_cuda_cc(ctx) >= 90, &attr);
    CU_TRY(ctx, cudaLaunchKernelEx(&cfg, weight_terms, a), "weight terms launch");
    LAUNCHED(ctx, "weight terms");
    return BIE_STATUS_OK;
}

enum bie_status bie_cuda_conv_rowpop(bie_context_t * ctx, const gemm_gather & gs, const struct dgeom & g, int * rowpop,
                                     int2 * rowterms, const int * border, bool after_terms) {
    border_counts4 b = {{0, 0, 0, 0}};
    for (int i = 0; rowterms && i < 4; i++) b.v[i] = border[i];
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg =
        bie_cuda_launch_config(ctx, dim3(grid_for(g.batch * g.OH * g.OW, 256)), dim3(256), 0, after_terms, &attr);
    const auto kern = gs.piece == 16 ? conv_rowterms<4> : gs.piece == 8 ? conv_rowterms<2> : conv_rowterms<1>;
    CU_TRY(ctx, cudaLaunchKernelEx(&cfg, kern, gs, g, rowpop, rowterms, b), "row popcounts launch");
    LAUNCHED(ctx, "row popcounts");
    return BIE_STATUS_OK;
}
