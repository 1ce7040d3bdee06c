// SPDX-License-Identifier: Apache-2.0
// cuda-pack-pixels.cu: the forward pass's packers that go through pixels (cuda-forward.cu gives the
// row layout): NHWC bit pixels copied into implicit-GEMM rows by words (im2col_words), float
// planes turned into NHWC bits (plane_bits), the row popcounts of bit matrices, the gather of x's
// rows by the GEMM, and pack_any, which picks the packer of an operand.
#include "cuda-forward.cuh"

namespace {

// Implicit-GEMM rows of a binary conv whose x is B1 with whole 32-bit words of channels per pixel
// (C % 32 == 0, channels contiguous, word-aligned pixels: NHWC bits): a tap's C bits are C/32
// words of x, copied as they are (pad taps: all ones for PLUS_ONE, else zeros). A warp takes 8
// consecutive rows (output pixels, stepping ow, oh, n without divisions), a word per lane; what a
// lane's word is (tap offsets and channel word, or row padding) is worked out once for the 8 rows,
// whose loads are then in flight together, so a row costs a load, a store and a popcount per word.
// (Recomputing the position per word and row is bound by instruction issue; rows one after
// another wait for each row's loads in turn.)
constexpr int IW_ROWS = 8; // consecutive rows per warp
struct word_pos {
    int dh, dw, cw; // tap's row and column offset from (oh*sh, ow*sw); channel word; cw < 0: row padding
};
__device__ __forceinline__ word_pos word_position(const struct dgeom & g, int w) {
    const int wpt = (int)(g.C / 32), tap = w / wpt;
    word_pos q;
    if (tap >= g.kh * g.kw) {
        q.dh = q.dw = 0;
        q.cw = -1;
        return q;
    }
    const int i = tap / g.kw, j = tap - i * g.kw;
    q.dh = i * g.dh - g.ph;
    q.dw = j * g.dw - g.pw;
    q.cw = w - tap * wpt;
    return q;
}
__device__ __forceinline__ uint32_t word_at(const uint32_t * x, const struct dgeom & g, int64_t xb, int64_t hb,
                                            int64_t wb, int64_t w2, int64_t w3, const word_pos & q, uint32_t pad) {
    if (q.cw < 0) return 0u;
    const int64_t h = hb + q.dh, w = wb + q.dw;
    return h >= 0 && h < g.H && w >= 0 && w < g.W ? __ldg(x + xb + h * w2 + w * w3 + q.cw) : pad;
}
// Rows with more than 32 words are split across warps (a warp per 8 rows and 32-word chunk) when
// whole rows per warp would leave the GPU short of warps (few rows, long rows: C = 512 at N = 128
// gives 784 warps of five chunks each); the chunks' popcounts then meet by atomic adds in `pop`,
// which the caller clears first.
__global__ void __launch_bounds__(256, 3)
    im2col_words(const uint32_t * x, struct dgeom g, int64_t w0, int64_t w2, int64_t w3, int64_t rows, int64_t kbytes,
                 uint32_t * out, int * pop, int split) {
    griddep_launch_dependents(); // (weight_terms may run beside it: it waits for it before it ends)
    const int lane = threadIdx.x & 31;
    const int64_t warp0 = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
    const int words = (int)(kbytes / 4);
    const int chunks = split ? (words + 31) / 32 : 1; // work units per group of rows
    const int64_t units = (rows + IW_ROWS - 1) / IW_ROWS * chunks;
    const uint32_t pad = g.pad_value == BIE_PAD_PLUS_ONE ? 0xffffffffu : 0u;
    for (int64_t u = warp0; u < units; u += warps) {
        const int64_t r0 = u / chunks * IW_ROWS;
        const int wbeg = split ? (int)(u % chunks) * 32 : 0, wend = split ? min(wbeg + 32, words) : words;
        // The group's rows: their sample and top-left input pixel (stepping ow, oh, n).
        int64_t xb[IW_ROWS];
        int hb[IW_ROWS], wb[IW_ROWS]; // (padded input coordinates fit in 32 bits: checked on the host)
        {
            const uint32_t rr = (uint32_t)r0, OW = (uint32_t)g.OW, OH = (uint32_t)g.OH;
            int ow = (int)(rr % OW), oh = (int)((rr / OW) % OH);
            int64_t n = rr / (OW * OH);
#pragma unroll
            for (int r = 0; r < IW_ROWS; r++) {
                xb[r] = n * w0;
                hb[r] = oh * (int)g.sh;
                wb[r] = ow * (int)g.sw;
                if (++ow == g.OW) {
                    ow = 0;
                    if (++oh == g.OH) {
                        oh = 0;
                        n++;
                    }
                }
            }
        }
        const int nr = rows - r0 < IW_ROWS ? (int)(rows - r0) : IW_ROWS;
        int cnt[IW_ROWS];
#pragma unroll
        for (int r = 0; r < IW_ROWS; r++) cnt[r] = 0;
        // A word position at a time (worked out once for the group), the loads of all the group's
        // rows first (in flight together), then their stores.
        for (int wc = wbeg; wc < wend; wc += 32) {
            const int w = wc + lane;
            const word_pos q = word_position(g, w);
            uint32_t v[IW_ROWS];
#pragma unroll
            for (int r = 0; r < IW_ROWS; r++)
                v[r] = w < wend && r < nr ? word_at(x, g, xb[r], hb[r], wb[r], w2, w3, q, pad) : 0u;
#pragma unroll
            for (int r = 0; r < IW_ROWS; r++)
                if (w < wend && r < nr) {
                    out[(r0 + r) * words + w] = v[r];
                    cnt[r] += __popc(v[r]);
                }
        }
#pragma unroll
        for (int r = 0; r < IW_ROWS; r++) {
            const int c = (int)__reduce_add_sync(0xffffffffu, (unsigned)cnt[r]);
            if (lane == 0 && r < nr && pop) {
                if (split) atomicAdd(pop + r0 + r, c);
                else pop[r0 + r] = c;
            }
        }
    }
}
// Queues im2col_words over NHWC words of x (w0, w2, w3: the word strides of a sample, a row and a
// pixel), splitting long rows when whole rows per warp would give fewer than ~32 warps per SM.
enum bie_status launch_im2col_words(bie_context_t * ctx, cudaStream_t stream, const uint32_t * x,
                                    const struct dgeom & g, int64_t w0, int64_t w2, int64_t w3, int64_t rows,
                                    int64_t kbytes, uint32_t * out, int * pop) {
    const int sms = bie_cuda_sm_count(ctx);
    const int64_t groups = (rows + IW_ROWS - 1) / IW_ROWS, chunks = (kbytes / 4 + 31) / 32;
    const int split = chunks > 1 && groups < (int64_t)sms * 32;
    if (split && pop) CU_TRY(ctx, cudaMemsetAsync(pop, 0, (size_t)rows * sizeof(int), stream), "clear row popcounts");
    im2col_words<<<grid_for(groups * (split ? chunks : 1), 8), 256, 0, stream>>>(x, g, w0, w2, w3, rows, kbytes, out,
                                                                                 pop, split);
    LAUNCHED(ctx, "pack activations");
    return BIE_STATUS_OK;
}
// NHWC sign bits (bit = x' >= 0, as in elem_code) from a float x whose (h, w) planes are dense
// (NCHW and the like), C % 32 == 0: a warp takes 32 channels x 32 consecutive pixels of a sample;
// lane j reads channel c0 + j at the 32 pixels (contiguous), and 32 ballots transpose the block:
// ballot q holds the 32 channel bits of pixel q, which lane q keeps and stores as word c0/32 of
// the pixel. Sample n's words start at out + n * row_words (H*W*C/32 for dense NHWC bits; a weight
// [O, C, kh, kw] is a batch of O samples of kh x kw pixels, its rows kbytes apart).
template <typename T> __global__ void plane_bits(pack_src p, int64_t row_words, uint32_t * out) {
    const struct dgeom & g = p.g;
    const int lane = threadIdx.x & 31;
    const int64_t HW = g.H * g.W, pblocks = (HW + 31) / 32, cwords = g.C / 32, blocks = g.batch * cwords * pblocks;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
    for (int64_t b = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32; b < blocks; b += warps) {
        const int64_t pb = b % pblocks, t = b / pblocks, cw = t % cwords, n = t / cwords;
        const int64_t c = cw * 32 + lane, p0 = pb * 32;
        const T * src = (const T *)p.t.data + n * p.t.stride[0] + c * p.t.stride[1] + p0;
        const float bias = p.bias.data ? ld_float(p.bias.data, p.bias.dtype, c * p.bias.stride[3]) : 0.0f;
        const float ct = clamp_bound(p.s); // (without bias_a the clamp keeps every sign: t > 0)
        float v[32];
        if (p0 + 32 <= HW && ((uintptr_t)src % 16) == 0) {
#pragma unroll
            for (int q = 0; q < 32; q += 8) load8<T>(src + q, v + q);
        } else { // the plane's end, or planes not 16-byte aligned (e.g. 14x14 halves)
#pragma unroll
            for (int q = 0; q < 32; q++) v[q] = p0 + q < HW ? to_f32(src[q]) : 0.0f;
        }
        uint32_t mine = 0;
#pragma unroll
        for (int q = 0; q < 32; q++) {
            const float x = p.bias.data ? __fadd_rn(clamp_in(v[q], ct), bias) : v[q];
            const uint32_t word = __ballot_sync(0xffffffffu, x >= 0.0f);
            if (lane == q) mine = word;
        }
        if (p0 + lane < HW) out[n * row_words + (p0 + lane) * cwords + cw] = mine;
    }
}
__global__ void row_popcounts(popc_rows a, popc_rows b, int64_t K) {
    griddep_launch_dependents();
    const int lane = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
    for (int64_t e = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32; e < a.rows + b.rows; e += warps) {
        const bool first = e < a.rows;
        const int64_t row = first ? e : e - a.rows, ld = first ? a.ld : b.ld;
        const uint8_t * r = (first ? a.p : b.p) + row * ld;
        int cnt = 0;
        if ((((uintptr_t)r) & 15) == 0) {
            for (int64_t vi = lane; vi * 128 < K; vi += 32) cnt += popc_below(((const uint4 *)r)[vi], vi * 4, K);
        } else {
            for (int64_t wi = lane; wi * 32 < K; wi += 32) {
                uint32_t v = ((const uint32_t *)r)[wi];
                const int64_t left = K - wi * 32;
                if (left < 32) v &= (1u << left) - 1u;
                cnt += __popc(v);
            }
        }
        for (int o = 16; o > 0; o >>= 1) cnt += __shfl_xor_sync(0xffffffffu, cnt, o);
        if (lane == 0) (first ? a.pop : b.pop)[row] = cnt;
    }
}
void launch_plane_bits(const pack_src & p, int64_t row_words, uint32_t * out, cudaStream_t stream) {
    const struct dgeom & g = p.g;
    const unsigned pg = grid_for(g.batch * (g.C / 32) * ((g.H * g.W + 31) / 32), 8);
    if (p.t.dtype == BIE_DTYPE_F32) plane_bits<float><<<pg, 256, 0, stream>>>(p, row_words, out);
    else if (p.t.dtype == BIE_DTYPE_F16) plane_bits<__half><<<pg, 256, 0, stream>>>(p, row_words, out);
    else plane_bits<__nv_bfloat16><<<pg, 256, 0, stream>>>(p, row_words, out);
}
// A float conv weight whose (kh, kw) planes are dense (OIHW and the like) with kh*kw > 1, whose
// rows the pixel movers can write: any C for n-bit codes, C % 32 == 0 for bits (rows of words);
// also an 8-bit layer's I8 codes in such planes (no clamp needed: the codes are the full range).
bool planar_weight(const pack_src & p) {
    const struct dgeom & g = p.g;
    const int64_t * st = p.t.stride;
    const bool fl = bie_dtype_is_float((enum bie_dtype)p.t.dtype);
    const bool codes = p.t.dtype == BIE_DTYPE_I8 && p.quant == BIE_QUANT_INT8; // copied as they are
    return p.is_weight && (fl || codes) && g.kh * g.kw > 1 && st[3] == 1 && st[2] == g.kw &&
           (p.quant != BIE_QUANT_BINARY || g.C % 32 == 0);
}
// A float x (PIX_ROWS or PIX_PLANES) into dense NHWC bits in scratch (pixel_scratch_bytes(p)).
enum bie_status pack_pixel_bits(bie_context_t * ctx, cudaStream_t stream, const pack_src & p, pixel_kind pk,
                                uint8_t * scratch) {
    const struct dgeom & g = p.g;
    const int64_t * st = p.t.stride;
    if (pk == PIX_ROWS) {
        // rows of `per` pixels (whole warps busy even for few channels; bias_a by the element's
        // channel), up to 32 when the pixels have no gaps, as many as divide their number
        const int64_t pixels = g.batch * g.H * g.W;
        int64_t per = 1;
        if (st[3] == g.C)
            while (per < 32 && pixels % (2 * per) == 0) per *= 2;
        pack_src pp = p;
        pp.g.K = g.C * per;
        pp.t.stride[0] = st[3] * per;
        pp.bias_period = per > 1 && p.bias.data ? (uint32_t)g.C : 0;
        launch_contiguous(ctx, pp, pixels / per, g.C * per / 8, scratch, NULL, stream);
    } else {
        launch_plane_bits(p, g.H * g.W * (g.C / 32), (uint32_t *)scratch, stream);
    }
    LAUNCHED(ctx, "pack activation pixels");
    return BIE_STATUS_OK;
}

} // namespace

// Queues row_popcounts over one matrix (b.rows == 0) or two.
enum bie_status launch_row_popcounts(bie_context_t * ctx, cudaStream_t s, popc_rows a, popc_rows b, int64_t K,
                                     const char * what) {
    row_popcounts<<<grid_for(a.rows + b.rows, 8), 256, 0, s>>>(a, b, K);
    LAUNCHED(ctx, what);
    return BIE_STATUS_OK;
}
pixel_kind float_pixels(const pack_src & p) {
    const struct dgeom & g = p.g;
    const int64_t * st = p.t.stride;
    const bool fl = bie_dtype_is_float((enum bie_dtype)p.t.dtype);
    if (p.is_weight || !fl || dgeom_one_position(g)) return PIX_NONE;
    if (p.quant != BIE_QUANT_BINARY) return PIX_CODES;
    if (g.C % 32) return PIX_NONE;
    if (st[1] == 1 && st[2] == g.W * st[3] && (g.batch == 1 || st[0] == g.H * st[2])) return PIX_ROWS;
    if (st[3] == 1 && (g.H == 1 || st[2] == g.W)) return PIX_PLANES;
    return PIX_NONE;
}
// Whether the K elements of each row of a weight [O, C, kh, kw] with these strides are contiguous
// in the GEMM's order k = (i*kw + j)*C + c (OHWI).
bool ohwi_rows(const int64_t * st, int64_t C, int64_t kh, int64_t kw) {
    return (C == 1 || st[1] == 1) && (kw == 1 || st[3] == C) && (kh == 1 || st[2] == C * kw);
}
// Whether p is a B1 weight whose rows are the GEMM's rows in whole bytes (OHWI bit order, K % 8
// == 0, rows a whole number of bytes apart): copied into the operand as bytes.
bool b1_weight_rows(const pack_src & p, int64_t rows) {
    const int64_t * st = p.t.stride;
    // (rows that overlap, e.g. one row broadcast with stride 0, have no pitch to copy with)
    return p.is_weight && p.t.dtype == BIE_DTYPE_B1 && ohwi_rows(st, p.g.C, p.g.kh, p.g.kw) && p.g.K % 8 == 0 &&
           (rows == 1 || (st[0] % 8 == 0 && st[0] >= p.g.K));
}
size_t pixel_scratch_bytes(const pack_src & p) {
    return (size_t)(p.g.batch * p.g.H * p.g.W * (p.quant == BIE_QUANT_BINARY ? p.g.C / 8 : p.g.C));
}
// Whether x is B1 in whole 32-bit words of channels per pixel (NHWC bits, C % 32 == 0), word-aligned.
bool word_pixels(const pack_src & p) {
    const int64_t * st = p.t.stride;
    return !p.is_weight && p.quant == BIE_QUANT_BINARY && p.t.dtype == BIE_DTYPE_B1 && p.g.C % 32 == 0 && st[1] == 1 &&
           st[0] % 32 == 0 && st[2] % 32 == 0 && st[3] % 32 == 0 && ((uintptr_t)p.t.data % 4) == 0;
}
// Whether the GEMM can gather x's implicit-GEMM rows itself (gemm_gather): binary NHWC words in
// place, or float pixels that pack_pixel_bits turns into them; n-bit float pixels whose int8 codes
// (bie_cuda_pixel_rows) fill whole words.
bool gatherable(const pack_src & p) {
    if (p.quant != BIE_QUANT_BINARY) return float_pixels(p) == PIX_CODES && p.g.C % 4 == 0;
    return p.g.pad_value != BIE_PAD_PLUS_ONE &&
           (word_pixels(p) || float_pixels(p) == PIX_ROWS || float_pixels(p) == PIX_PLANES);
}
// Sets up the gather of x's rows (gatherable(p)): float pixels are packed into scratch first.
enum bie_status gather_source(bie_context_t * ctx, cudaStream_t stream, const pack_src & p, uint8_t * scratch,
                              gemm_gather * gs) {
    const struct dgeom & g = p.g;
    const bool binary = p.quant == BIE_QUANT_BINARY;
    const int64_t pw = binary ? g.C / 32 : g.C / 4; // words per pixel
    if (word_pixels(p)) {
        const int64_t * st = p.t.stride;
        gs->x = (const uint32_t *)p.t.data;
        gs->w0 = st[0] / 32;
        gs->w2 = st[2] / 32;
        gs->w3 = st[3] / 32;
    } else {
        if (binary) BIE_TRY(pack_pixel_bits(ctx, stream, p, float_pixels(p), scratch));
        else BIE_TRY(bie_cuda_pixel_rows(ctx, stream, p.t, p.bias, p.quant, p.s, BIE_DTYPE_I8, 0, scratch));
        gs->x = (const uint32_t *)scratch;
        gs->w0 = g.H * g.W * pw;
        gs->w2 = g.W * pw;
        gs->w3 = pw;
    }
    gs->wpt = (int)pw;
    gs->kwords = (int)(g.kh * g.kw * pw);
    // The widest copy that stays inside a tap and is aligned at every pixel.
    auto fits = [&](int words) {
        return pw % words == 0 && gs->w0 % words == 0 && gs->w2 % words == 0 && gs->w3 % words == 0 &&
               (uintptr_t)gs->x % (4 * words) == 0;
    };
    gs->piece = fits(4) ? 16 : fits(2) ? 8 : 4;
    gs->div_ow = fast_div_make((uint32_t)g.OW); // (gather_fits keeps them below 2^30, M below 2^31)
    gs->div_oh = fast_div_make((uint32_t)g.OH);
    return BIE_STATUS_OK;
}
// Whether x's words fit the gathering producer's 32-bit offsets.
bool gather_fits(const pack_src & p) {
    const int64_t * st = p.t.stride;
    const int64_t pw = p.quant == BIE_QUANT_BINARY ? p.g.C / 32 : p.g.C / 4;
    const int64_t words = word_pixels(p) ? p.g.batch * (st[0] / 32) : p.g.batch * p.g.H * p.g.W * pw;
    return words < INT32_MAX && p.g.K < INT32_MAX && p.g.H * p.g.sh < INT32_MAX / 2 && p.g.W * p.g.sw < INT32_MAX / 2 &&
           p.g.batch * p.g.OH * p.g.OW < INT32_MAX && p.g.OH < (1 << 30) && p.g.OW < (1 << 30); // (fast_div)
}
// Packs rows with pack_contiguous_rows when their K elements are contiguous floats (the weight of
// a 1x1 kernel; the x of a linear layer, i.e. one output position per image and its one tap
// inside), else with pack_rows (scratch: pixel_scratch_bytes(p) bytes when float_pixels(p)).
enum bie_status pack_any(bie_context_t * ctx, cudaStream_t stream, const pack_src & p, int64_t rows, int64_t kbytes,
                         uint8_t * out, int * pop, uint8_t * scratch) {
    const struct dgeom & g = p.g;
    // rows of K contiguous elements in the GEMM's order: a 1x1 weight or a linear x, and any
    // weight in OHWI order (a channels-last conv weight)
    const bool contiguous =
        (g.kh == 1 && g.kw == 1 && (p.is_weight || dgeom_one_position(g)) && (g.C == 1 || p.t.stride[1] == 1)) ||
        (p.is_weight && ohwi_rows(p.t.stride, g.C, g.kh, g.kw));
    const int64_t * st = p.t.stride;
    const pixel_kind pk = scratch ? float_pixels(p) : PIX_NONE;
    if (b1_weight_rows(p, rows)) {
        // packed bits (bie_pack_weight's OHWI rows): whole bytes, copied into the operand's rows
        if (kbytes * 8 > g.K)
            CU_TRY(ctx, cudaMemsetAsync(out, 0, (size_t)(rows * kbytes), stream), "clear weight rows");
        CU_TRY(ctx,
               cudaMemcpy2DAsync(out, (size_t)kbytes, p.t.data, (size_t)(rows == 1 ? g.K / 8 : st[0] / 8),
                                 (size_t)(g.K / 8), (size_t)rows, cudaMemcpyDeviceToDevice, stream),
               "copy weight rows");
        return launch_row_popcounts(ctx, stream, {out, rows, kbytes, pop}, NO_ROWS, g.K, "weight popcounts");
    }
    if (planar_weight(p)) {
        // [O, C, kh, kw] as a batch of O samples of C channels x kh*kw pixels: the pixel movers
        // write rows [o][tap][c] straight into the operand; its padding past K is zeroed first
        pack_src pp = p;
        pp.g.batch = rows;
        pp.g.H = g.kh;
        pp.g.W = g.kw;
        if (kbytes * (p.quant == BIE_QUANT_BINARY ? 8 : 1) > g.K)
            CU_TRY(ctx, cudaMemsetAsync(out, 0, (size_t)(rows * kbytes), stream), "clear weight rows");
        if (p.quant != BIE_QUANT_BINARY)
            return bie_cuda_pixel_rows(ctx, stream, p.t, p.bias, p.t.dtype == BIE_DTYPE_I8 ? 0 : p.quant, p.s,
                                       BIE_DTYPE_I8, kbytes, out);
        launch_plane_bits(pp, kbytes / 4, (uint32_t *)out, stream);
        LAUNCHED(ctx, "pack weight");
        return launch_row_popcounts(ctx, stream, {out, rows, kbytes, pop}, NO_ROWS, g.K, "weight popcounts");
    }
    if (pk == PIX_CODES) {
        BIE_TRY(bie_cuda_pixel_rows(ctx, stream, p.t, p.bias, p.quant, p.s, BIE_DTYPE_I8, 0, scratch));
        return bie_cuda_im2col(ctx, stream, scratch, 1, 0u, g, kbytes, out);
    }
    if (pk != PIX_NONE) {
        BIE_TRY(pack_pixel_bits(ctx, stream, p, pk, scratch));
        const int64_t pw = g.C / 32; // words per pixel
        return launch_im2col_words(ctx, stream, (const uint32_t *)scratch, g, g.H * g.W * pw, g.W * pw, pw, rows,
                                   kbytes, (uint32_t *)out, pop);
    }
    if (word_pixels(p))
        return launch_im2col_words(ctx, stream, (const uint32_t *)p.t.data, g, st[0] / 32, st[2] / 32, st[3] / 32, rows,
                                   kbytes, (uint32_t *)out, pop);
    if (contiguous && launch_contiguous(ctx, p, rows, kbytes, out, pop, stream)) {
    } else if (contiguous && p.is_weight && p.quant != BIE_QUANT_BINARY &&
               (p.t.dtype == BIE_DTYPE_I8 || p.t.dtype == BIE_DTYPE_S4))
        launch_pack_int_rows(p, rows, kbytes, out, stream);
    else launch_pack_rows(p, rows, kbytes, out, pop, stream);
    LAUNCHED(ctx, p.is_weight ? "pack weight" : "pack activations");
    return BIE_STATUS_OK;
}
