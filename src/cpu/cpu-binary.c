// SPDX-License-Identifier: Apache-2.0
// cpu-binary.c: binary linear / conv2d forward as an XOR-popcount GEMM over bit panels.
//
//   acc[m, o] = sum over taps t and channels c of a_pad(m, t, c) * w[o, t, c]
//             = K - 2 * popc(A_m XOR B_o)                     (every tap read, pads as -1 bits)
//               + (p + 1) * sum over out-of-image taps t of S[o, t]
// where A_m is the bit-im2col row of output pixel m (out-of-image taps are 0 bits, i.e. -1),
// B_o the weight row (OHWI bits), S[o, t] = sum_c w[o, t, c] = 2*popc(B_o tap t) - C, and p the
// pad value (-1, 0 or +1): replacing the -1 that the row holds by p adds (p + 1) * w per padded
// tap. So the three pad values are exact, and only border pixels pay for the correction.
//
// Steps: (1) x -> channel-packed bits NHWC (xb, Cb bytes per pixel), from f32 NCHW (sign bits of
// 8 whole planes, or of rows when the planes are not dense, then 8x8 bit transposes), f32 channels-last (sign bits per pixel),
// byte-aligned channels-last B1 (copies), or any other view (element by element);
// (2) weights -> OHWI bit rows and S, then word-interleaved groups of nr channels (B);
// (3) im2col rows of xb -> A (nibble-split when the ISA wants it); (4) the tiled GEMM
// (outer-product microkernels, cpu-kernels-*.c) with the correction and the output transform
// fused per tile.
#include "cpu/cpu-impl.h"

#include <omp.h>

struct bin_plan {
    const struct bie_layer_call * c;
    const struct cpu_kernels * kern;
    const struct cpu_bin_tile * bt; // the binary tile for these rows
    int64_t Cb, T, KB, KBp, M, N, Mp, Np;
    size_t rowb;        // bytes per A row: KBp, or 2*KBp when split
    size_t group_bytes; // bytes per B group of bt->nr columns
    uint8_t * xb;
    uint8_t * wrows; // [Np][KBp] unsplit weight rows, before interleaving
    uint8_t * A;
    uint8_t * B;
    int32_t * S;  // [Np][T], only when pad_mult != 0
    int pad_mult; // p + 1 for pads that occur, else 0
    struct cpu_epilogue ep;
};

// Set bits of n bytes (SWAR: this file is built without the popcnt instruction).
static inline int64_t popcount_bytes(const uint8_t * p, int64_t n) {
    int64_t total = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v;
        memcpy(&v, p + i, 8);
        v = v - ((v >> 1) & 0x5555555555555555ull);
        v = (v & 0x3333333333333333ull) + ((v >> 2) & 0x3333333333333333ull);
        v = (v + (v >> 4)) & 0x0f0f0f0f0f0f0f0full;
        total += (int64_t)((v * 0x0101010101010101ull) >> 56);
    }
    for (; i < n; i++) {
        unsigned v = p[i];
        v = v - ((v >> 1) & 0x55u);
        v = (v & 0x33u) + ((v >> 2) & 0x33u);
        total += (int64_t)((v + (v >> 4)) & 0x0fu);
    }
    return total;
}

// Transposes an 8x8 bit matrix held as 8 bytes (bit j of byte i <-> bit i of byte j).
static inline uint64_t transpose8x8(uint64_t x) {
    uint64_t t;
    t = (x ^ (x >> 7)) & 0x00AA00AA00AA00AAull;
    x = x ^ t ^ (t << 7);
    t = (x ^ (x >> 14)) & 0x0000CCCC0000CCCCull;
    x = x ^ t ^ (t << 14);
    t = (x ^ (x >> 28)) & 0x00000000F0F0F0F0ull;
    x = x ^ t ^ (t << 28);
    return x;
}

// Step 1: xb[pix][Cb] for pix = (n*H + h)*W + w.
static void pack_x_bits(const struct bin_plan * pl, const float * bias, int threads, uint8_t * tmp_ws) {
    const struct bie_layer_call * c = pl->c;
    const struct bie_geometry * g = &c->g;
    const struct bie_tensor * x = &c->x;
    const int64_t * xs = x->stride;
    const int64_t Cb = pl->Cb, C = g->C, H = g->H, W = g->W, NH = g->batch * H;
    const uint8_t tail_mask = (uint8_t)(C % 8 ? (1u << (C % 8)) - 1 : 0xff);
    if (x->dtype == BIE_DTYPE_B1 && xs[1] == 1 && xs[0] % 8 == 0 && xs[2] % 8 == 0 && xs[3] % 8 == 0) {
#pragma omp parallel for num_threads(threads)
        for (int64_t nh = 0; nh < NH; nh++)
            for (int64_t w = 0; w < W; w++) {
                const int64_t off = (nh / H) * xs[0] + (nh % H) * xs[2] + w * xs[3];
                uint8_t * d = pl->xb + (nh * W + w) * Cb;
                memcpy(d, (const uint8_t *)x->data + off / 8, (size_t)Cb);
                d[Cb - 1] &= tail_mask;
            }
    } else if (x->dtype == BIE_DTYPE_F32 && xs[1] == 1) {
#pragma omp parallel for num_threads(threads)
        for (int64_t nh = 0; nh < NH; nh++)
            for (int64_t w = 0; w < W; w++) {
                const float * src = (const float *)x->data + (nh / H) * xs[0] + (nh % H) * xs[2] + w * xs[3];
                pl->kern->sign_bits(src, bias, 0.0f, C, pl->xb + (nh * W + w) * Cb);
            }
    } else if (x->dtype == BIE_DTYPE_F32 && xs[3] == 1 && (H == 1 || xs[2] == W)) {
        // Dense f32 planes: the sign bits of 8 whole planes (8 sequential streams), then 8x8 bit
        // transposes into byte cb of each pixel. A task is (sample, channel byte).
        const int64_t HW = H * W, HWb = (HW + 7) / 8;
        const size_t per = cpu_round_up((size_t)(8 * HWb), 64);
#pragma omp parallel for num_threads(threads)
        for (int64_t task = 0; task < g->batch * Cb; task++) {
            const int64_t n = task / Cb, cb = task % Cb;
            uint8_t * tmp = tmp_ws + (size_t)omp_get_thread_num() * per;
            for (int64_t r = 0; r < 8; r++) {
                const int64_t ch = cb * 8 + r;
                if (ch < C)
                    pl->kern->sign_bits((const float *)x->data + n * xs[0] + ch * xs[1], NULL, bias ? bias[ch] : 0.0f,
                                        HW, tmp + r * HWb);
                else memset(tmp + r * HWb, 0, (size_t)HWb);
            }
            uint8_t * dst = pl->xb + n * HW * Cb + cb;
            for (int64_t pb = 0; pb < HWb; pb++) {
                uint64_t v = 0;
                for (int r = 0; r < 8; r++) v |= (uint64_t)tmp[r * HWb + pb] << (8 * r);
                v = transpose8x8(v);
                for (int64_t p = 0; p < 8 && pb * 8 + p < HW; p++) dst[(pb * 8 + p) * Cb] = (uint8_t)(v >> (8 * p));
            }
        }
    } else if (x->dtype == BIE_DTYPE_F32 && xs[3] == 1) {
        const int64_t Wb = (W + 7) / 8;
        const size_t per = cpu_round_up((size_t)(Cb * 8 * Wb), 64);
#pragma omp parallel for num_threads(threads)
        for (int64_t nh = 0; nh < NH; nh++) {
            uint8_t * tmp = tmp_ws + (size_t)omp_get_thread_num() * per;
            const float * src = (const float *)x->data + (nh / H) * xs[0] + (nh % H) * xs[2];
            for (int64_t ch = 0; ch < C; ch++)
                pl->kern->sign_bits(src + ch * xs[1], NULL, bias ? bias[ch] : 0.0f, W, tmp + ch * Wb);
            memset(tmp + C * Wb, 0, (size_t)((Cb * 8 - C) * Wb));
            uint8_t * dst = pl->xb + nh * W * Cb;
            for (int64_t cb = 0; cb < Cb; cb++)
                for (int64_t wb = 0; wb < Wb; wb++) {
                    uint64_t v = 0;
                    for (int r = 0; r < 8; r++) v |= (uint64_t)tmp[(cb * 8 + r) * Wb + wb] << (8 * r);
                    v = transpose8x8(v);
                    for (int64_t p = 0; p < 8 && wb * 8 + p < W; p++)
                        dst[(wb * 8 + p) * Cb + cb] = (uint8_t)(v >> (8 * p));
                }
        }
    } else {
#pragma omp parallel for num_threads(threads)
        for (int64_t nh = 0; nh < NH; nh++)
            for (int64_t w = 0; w < W; w++) {
                uint8_t * d = pl->xb + (nh * W + w) * Cb;
                memset(d, 0, (size_t)Cb);
                const int64_t off = (nh / H) * xs[0] + (nh % H) * xs[2] + w * xs[3];
                for (int64_t ch = 0; ch < C; ch++) {
                    const float v = cpu_load(x, off + ch * xs[1]);
                    const bool bit = x->dtype == BIE_DTYPE_B1 ? v > 0 : v + (bias ? bias[ch] : 0.0f) >= 0.0f;
                    d[ch / 8] |= (uint8_t)(bit << (ch % 8));
                }
            }
    }
}

// Moves an unsplit row into panel row `dst` (splitting it into nibble planes when asked).
static inline void put_row(const struct bin_plan * pl, const uint8_t * row, uint8_t * dst) {
    if (pl->bt->split) pl->kern->nibble_split(row, (size_t)pl->KBp, dst, dst + pl->KBp);
    else if (row != dst) memcpy(dst, row, (size_t)pl->KBp);
}

// Step 2: weight rows (OHWI bits), the tap sums S, and the interleaved B groups.
static void pack_weights(const struct bin_plan * pl, int threads) {
    const struct bie_layer_call * c = pl->c;
    const struct bie_geometry * g = &c->g;
    const struct bie_tensor * w = &c->weight;
    const int64_t * ws = w->stride;
    const int64_t C = g->C, Cb = pl->Cb, T = pl->T;
    const uint8_t tail_mask = (uint8_t)(C % 8 ? (1u << (C % 8)) - 1 : 0xff);
    const bool b1_bytes = w->dtype == BIE_DTYPE_B1 && ws[1] == 1 && ws[0] % 8 == 0 && ws[2] % 8 == 0 && ws[3] % 8 == 0;
    const bool f32_rows = w->dtype == BIE_DTYPE_F32 && ws[1] == 1;
#pragma omp parallel for num_threads(threads)
    for (int64_t o = 0; o < pl->Np; o++) {
        uint8_t * row = pl->wrows + (size_t)o * pl->KBp;
        memset(row, 0, (size_t)pl->KBp);
        if (o >= g->O) continue;
        for (int64_t t = 0; t < T; t++) {
            const int64_t off = o * ws[0] + (t / g->kw) * ws[2] + (t % g->kw) * ws[3];
            uint8_t * d = row + t * Cb;
            if (b1_bytes) {
                memcpy(d, (const uint8_t *)w->data + off / 8, (size_t)Cb);
                d[Cb - 1] &= tail_mask;
            } else if (f32_rows) {
                pl->kern->sign_bits((const float *)w->data + off, NULL, 0.0f, C, d);
            } else if (w->dtype == BIE_DTYPE_I8 && ws[1] == 1) {
                const int8_t * src = (const int8_t *)w->data + off;
                for (int64_t ch = 0; ch < C; ch++) d[ch / 8] |= (uint8_t)((src[ch] >= 0) << (ch % 8));
            } else {
                for (int64_t ch = 0; ch < C; ch++)
                    d[ch / 8] |= (uint8_t)((cpu_load(w, off + ch * ws[1]) >= 0.0f) << (ch % 8));
            }
            if (pl->pad_mult) pl->S[o * T + t] = (int32_t)(2 * popcount_bytes(d, Cb) - C);
        }
    }
    // Interleave: word w of column j of group gi at B + gi*group_bytes + (w*nr + j)*8 (lo plane;
    // the hi plane follows at + kw*nr*8 when split).
    const int64_t nr = pl->bt->nr, kw = pl->KBp / 8, groups = pl->Np / nr;
    const uint64_t lo4 = 0x0f0f0f0f0f0f0f0full;
#pragma omp parallel for num_threads(threads)
    for (int64_t gi = 0; gi < groups; gi++) {
        uint64_t * dst = (uint64_t *)(pl->B + (size_t)gi * pl->group_bytes);
        for (int64_t j = 0; j < nr; j++) {
            const uint8_t * row = pl->wrows + (size_t)(gi * nr + j) * pl->KBp;
            for (int64_t wi = 0; wi < kw; wi++) {
                uint64_t v;
                memcpy(&v, row + wi * 8, 8);
                if (pl->bt->split) {
                    dst[wi * nr + j] = v & lo4;
                    dst[kw * nr + wi * nr + j] = (v >> 4) & lo4;
                } else {
                    dst[wi * nr + j] = v;
                }
            }
        }
    }
}

// Step 3: the bit-im2col rows.
static void pack_activations(const struct bin_plan * pl, int threads, uint8_t * rows_ws) {
    const struct bie_geometry * g = &pl->c->g;
    const int64_t P = g->OH * g->OW, Cb = pl->Cb;
#pragma omp parallel for num_threads(threads)
    for (int64_t m = 0; m < pl->Mp; m++) {
        uint8_t * row = pl->bt->split ? rows_ws + (size_t)omp_get_thread_num() * pl->KBp : pl->A + (size_t)m * pl->rowb;
        if (m >= pl->M) {
            memset(row, 0, (size_t)pl->KBp);
        } else {
            const int64_t n = m / P, p = m % P, oh = p / g->OW, ow = p % g->OW;
            for (int64_t t = 0; t < pl->T; t++) {
                const int64_t ih = oh * g->sh - g->ph + (t / g->kw) * g->dh;
                const int64_t iw = ow * g->sw - g->pw + (t % g->kw) * g->dw;
                uint8_t * d = row + t * Cb;
                const bool out = ih < 0 || ih >= g->H || iw < 0 || iw >= g->W;
                const uint8_t * src = out ? NULL : pl->xb + ((n * g->H + ih) * g->W + iw) * Cb;
                switch (Cb) { // fixed-size copies of the common tap widths (no library call)
                case 4: {
                    uint32_t v = 0;
                    if (src) memcpy(&v, src, 4);
                    memcpy(d, &v, 4);
                    break;
                }
                case 8: {
                    uint64_t v = 0;
                    if (src) memcpy(&v, src, 8);
                    memcpy(d, &v, 8);
                    break;
                }
                default:
                    if (src) memcpy(d, src, (size_t)Cb);
                    else memset(d, 0, (size_t)Cb);
                }
            }
            memset(row + pl->KB, 0, (size_t)(pl->KBp - pl->KB));
        }
        put_row(pl, row, pl->A + (size_t)m * pl->rowb);
    }
}

// Per tile: acc = K - 2*popc, plus the pad correction on border pixels, then the output transform.
static void finish_tile(void * vpl, int64_t m0, int64_t mc, int64_t n0, int64_t nc, int32_t * acc, size_t ldacc) {
    const struct bin_plan * pl = vpl;
    const struct bie_geometry * g = &pl->c->g;
    const int32_t K = (int32_t)g->K;
    const int64_t P = g->OH * g->OW;
    for (int64_t r = 0; r < mc; r++) {
        int32_t * a = acc + (size_t)r * ldacc;
        for (int64_t o = 0; o < nc; o++) a[o] = K - 2 * a[o];
        if (!pl->pad_mult) continue;
        const int64_t p = (m0 + r) % P, oh = p / g->OW, ow = p % g->OW;
        const int64_t ih0 = oh * g->sh - g->ph, iw0 = ow * g->sw - g->pw;
        if (ih0 >= 0 && ih0 + (g->kh - 1) * g->dh < g->H && iw0 >= 0 && iw0 + (g->kw - 1) * g->dw < g->W) continue;
        for (int64_t t = 0; t < pl->T; t++) {
            const int64_t ih = ih0 + (t / g->kw) * g->dh, iw = iw0 + (t % g->kw) * g->dw;
            if (ih >= 0 && ih < g->H && iw >= 0 && iw < g->W) continue;
            for (int64_t o = 0; o < nc; o++) a[o] += pl->pad_mult * pl->S[(n0 + o) * pl->T + t];
        }
    }
    cpu_epilogue_store(&pl->ep, m0, mc, n0, nc, acc, ldacc);
}

enum bie_status bie_cpu_binary_forward(bie_context_t * ctx, const struct bie_layer_call * c) {
    const struct bie_geometry * g = &c->g;
    struct bin_plan pl = {.c = c, .kern = bie_cpu_kernels(ctx->isa)};
    const int threads = cpu_threads(ctx);
    pl.Cb = (g->C + 7) / 8;
    pl.T = g->kh * g->kw;
    pl.KB = pl.T * pl.Cb;
    pl.KBp = (int64_t)cpu_round_up((size_t)pl.KB, CPU_KB_ALIGN);
    pl.bt = cpu_bin_tile_for(pl.kern, (size_t)pl.KBp);
    pl.rowb = (size_t)pl.KBp * (pl.bt->split ? 2 : 1);
    pl.M = g->batch * g->OH * g->OW;
    pl.N = g->O;
    pl.Mp = (int64_t)cpu_round_up((size_t)pl.M, CPU_MR);
    pl.Np = (int64_t)cpu_round_up((size_t)pl.N, 16);
    pl.group_bytes = (size_t)pl.KBp * (size_t)pl.bt->nr * (pl.bt->split ? 2 : 1);
    pl.pad_mult = (g->ph > 0 || g->pw > 0) ? (g->pad_value == BIE_PAD_ZERO       ? 1
                                              : g->pad_value == BIE_PAD_PLUS_ONE ? 2
                                                                                 : 0)
                                           : 0;
    cpu_epilogue_init(&pl.ep, c, pl.kern);

    const int64_t Wb = (g->W + 7) / 8;
    const size_t sz_xb = (size_t)(g->batch * g->H * g->W * pl.Cb);
    const size_t per_tmp = cpu_round_up((size_t)(pl.Cb * 8 * Wb), 64),
                 per_tmp_planes = cpu_round_up((size_t)(g->H * g->W + 7) / 8 * 8, 64);
    const size_t sz_tmp = (size_t)threads * (per_tmp > per_tmp_planes ? per_tmp : per_tmp_planes);
    const size_t sz_rows = (size_t)threads * (size_t)pl.KBp;
    const size_t sz_a = (size_t)pl.Mp * pl.rowb, sz_b = (size_t)(pl.Np / pl.bt->nr) * pl.group_bytes;
    const size_t sz_wrows = (size_t)pl.Np * (size_t)pl.KBp;
    const size_t sz_s = pl.pad_mult ? (size_t)(pl.Np * pl.T) * sizeof(int32_t) : 0;
    const size_t sz_bias = (size_t)g->C * sizeof(float);
    const size_t sz_tiles = cpu_gemm_workspace(threads);
    const size_t total = cpu_arena_size(sz_xb) + cpu_arena_size(sz_tmp) + cpu_arena_size(sz_rows) +
                         cpu_arena_size(sz_a) + cpu_arena_size(sz_b) + cpu_arena_size(sz_s) + cpu_arena_size(sz_bias) +
                         cpu_arena_size(sz_tiles) + cpu_arena_size(sz_wrows);
    void * ws;
    enum bie_status st = bie_host_workspace(ctx, total, &ws);
    if (st != BIE_STATUS_OK) return st;
    struct cpu_arena ar = {.base = ws, .used = 0, .cap = total};
    pl.xb = cpu_arena_take(&ar, sz_xb);
    uint8_t * tmp = cpu_arena_take(&ar, sz_tmp);
    uint8_t * rows = cpu_arena_take(&ar, sz_rows);
    pl.A = cpu_arena_take(&ar, sz_a);
    pl.B = cpu_arena_take(&ar, sz_b);
    pl.S = cpu_arena_take(&ar, sz_s);
    float * bias = cpu_arena_take(&ar, sz_bias);
    void * tiles = cpu_arena_take(&ar, sz_tiles);
    pl.wrows = cpu_arena_take(&ar, sz_wrows);

    if (c->bias_a.data) cpu_bias_dense(&c->bias_a, g->C, bias);
    pack_x_bits(&pl, c->bias_a.data ? bias : NULL, threads, tmp);
    pack_weights(&pl, threads);
    pack_activations(&pl, threads, rows);

    const struct cpu_gemm job = {
        .kern = pl.kern,
        .kind = 1,
        .bin = pl.bt,
        .a = pl.A,
        .b = pl.B,
        .lda = pl.rowb,
        .ldb = pl.group_bytes / (size_t)pl.bt->nr,
        .k = (size_t)pl.KBp,
        .M = pl.M,
        .N = pl.N,
        .finish = finish_tile,
        .finish_ctx = &pl,
    };
    cpu_gemm_run(&job, threads, tiles, cpu_epilogue_parallel_safe(&pl.ep));
    return BIE_STATUS_OK;
}
