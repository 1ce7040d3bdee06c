// SPDX-License-Identifier: Apache-2.0
// cpu-gemv.c: the matrix-vector forward of binary, 4-bit and 8-bit layers with at most
// CPU_GEMV_MAX_M rows of activations (cpu-gemv.h says when it applies and what the kernels do).
//
//   binary: acc[m, o] = K - 2 * popc(A_m XOR W_o)    over the K bits (B1 rows, bit k%8 of byte k/8)
//   n-bit : acc[m, o] = sum_k a[m, k] * w[o, k]      (int8 codes; 4-bit weights as S4 nibbles)
// with A_m / a[m, .] the activation row of output pixel m (x' = x + bias_a, binarized or quantized
// as in cpu-binary.c / cpu-nbit.c) and W_o the weight row of output channel o, read in place.
//
// Steps: (1) the M activation rows, once, into the kernels' form (zero-padded to 64 bytes; the bits
// of a last partial byte, or the last code of an odd K, kept aside); (2) the weight rows in blocks of
// GEMV_NB, a contiguous range of blocks per thread: each block's rows stream through the kernel
// against all activation rows, CPU_GEMV_MR at a time (f32 weights are first quantized a block at a time into the thread's
// buffer, so they too are read once); the part of K the kernels do not read (the partial byte,
// whose padding bits in the weight may hold anything) is added per row here; (3) the fused output
// transform (cpu-epilogue.c) per block.
#include "cpu/cpu-gemv.h"

#include <omp.h>

#define GEMV_NB 64 // weight rows per block (a multiple of 8: whole B1 output bytes)

size_t bie_cpu_gemv_bytes_per_thread = (size_t)96 << 10;

const struct cpu_gemv_kernels * bie_cpu_gemv_kernels(const struct cpu_kernels * kern) {
    switch (kern->isa) {
    case BIE_CPU_ISA_AVX512_VNNI: return &bie_cpu_gemv_avx512vpopcnt_vnni;
    case BIE_CPU_ISA_AVX512_VPOPCNT: return &bie_cpu_gemv_avx512vpopcnt;
    case BIE_CPU_ISA_AVX512: return &bie_cpu_gemv_avx512;
    case BIE_CPU_ISA_AVX2: return &bie_cpu_gemv_avx2;
    default: return &bie_cpu_gemv_scalar;
    }
}

enum wform { W_NONE, W_PACKED, W_F32 }; // the weight rows as the kernels read them, f32 rows, or neither

static enum wform weight_form(const struct bie_layer_call * c) {
    const struct bie_tensor * w = &c->weight;
    const int64_t * ws = w->stride;
    if (ws[1] != 1) return W_NONE;
    if (c->quant == BIE_QUANT_BINARY && w->dtype == BIE_DTYPE_B1 && ws[0] % 8 == 0) return W_PACKED;
    if (c->quant == BIE_QUANT_INT4 && w->dtype == BIE_DTYPE_S4 && ws[0] % 2 == 0) return W_PACKED;
    if (c->quant == BIE_QUANT_INT8 && w->dtype == BIE_DTYPE_I8) return W_PACKED; // the codes (in range)
    return w->dtype == BIE_DTYPE_F32 ? W_F32 : W_NONE;
}

bool bie_cpu_gemv_applies(const struct bie_layer_call * c) {
    const struct bie_geometry * g = &c->g;
    return cpu_is_plain_1x1(g) && g->batch * g->OH * g->OW <= CPU_GEMV_MAX_M && weight_form(c) != W_NONE;
}

struct gemv {
    const struct bie_layer_call * c;
    const struct cpu_kernels * kern;
    const struct cpu_gemv_kernels * gk;
    enum wform form;
    int lo, hi; // n-bit code range
    int64_t M, N, K;
    size_t kb;   // bytes of a weight row the kernels read: K/8 (binary), K/2 (4-bit), K (8-bit)
    size_t rowb; // bytes of a packed weight row: kb plus the partial byte, if any
    size_t lda;  // bytes per activation row
    uint8_t * a; // the activation rows
    int32_t asum[CPU_GEMV_MAX_M];
    int32_t last[CPU_GEMV_MAX_M]; // binary: the bits of A's partial byte; 4-bit, K odd: the code x[K-1]
    const uint8_t * w;            // W_PACKED: row 0, and the row stride ldw in bytes
    size_t ldw;
    uint8_t * wbuf; // W_F32: per thread GEMV_NB packed rows, then K int16 codes
    size_t wbuf_bytes;
    struct cpu_epilogue ep;
};

// Step 1: activation row m (output pixel m) in the kernels' form. q: K int16 of scratch (n-bit).
static void prepare_row(struct gemv * j, int64_t m, const float * bias, int16_t * q) {
    const struct bie_layer_call * c = j->c;
    const struct bie_geometry * g = &c->g;
    const struct bie_tensor * x = &c->x;
    const int64_t * xs = x->stride;
    const int64_t P = g->OH * g->OW, p = m % P;
    const int64_t off = (m / P) * xs[0] + (p / g->OW) * xs[2] + (p % g->OW) * xs[3], K = j->K;
    uint8_t * row = j->a + (size_t)m * j->lda;
    memset(row, 0, j->lda);
    if (c->quant == BIE_QUANT_BINARY) {
        if (x->dtype == BIE_DTYPE_B1 && xs[1] == 1 && off % 8 == 0) {
            memcpy(row, (const uint8_t *)x->data + off / 8, (size_t)(K + 7) / 8);
        } else if (x->dtype == BIE_DTYPE_F32 && xs[1] == 1) {
            j->kern->sign_bits((const float *)x->data + off, bias, 0.0f, K, row);
        } else {
            for (int64_t k = 0; k < K; k++) {
                const float v = cpu_load(x, off + k * xs[1]);
                const bool bit = x->dtype == BIE_DTYPE_B1 ? v > 0 : v + (bias ? bias[k] : 0.0f) >= 0.0f;
                row[k / 8] |= (uint8_t)(bit << (k % 8));
            }
        }
        j->last[m] = K % 8 ? row[j->kb] & ((1 << (K % 8)) - 1) : 0;
        if (K % 8) row[j->kb] = 0;
        return;
    }
    if (x->dtype == BIE_DTYPE_F32 && xs[1] == 1)
        j->kern->quantize((const float *)x->data + off, bias, 0.0f, K, c->scale_a, j->lo, j->hi, q);
    else
        for (int64_t k = 0; k < K; k++)
            q[k] = (int16_t)cpu_quantize1(cpu_load(x, off + k * xs[1]) + (bias ? bias[k] : 0.0f), c->scale_a, j->lo,
                                          j->hi);
    int8_t * r = (int8_t *)row;
    int32_t sum = 0;
    if (c->quant == BIE_QUANT_INT8) {
        for (int64_t k = 0; k < K; k++) {
            r[k] = (int8_t)q[k];
            sum += q[k];
        }
    } else {
        const size_t kp = cpu_round_up(j->kb, CPU_GEMV_ALIGN);
        for (size_t t = 0; t < j->kb; t++) {
            r[t] = (int8_t)q[2 * t];
            r[kp + t] = (int8_t)q[2 * t + 1];
            sum += q[2 * t] + q[2 * t + 1];
        }
        j->last[m] = K % 2 ? q[K - 1] : 0;
    }
    j->asum[m] = sum;
}

// W_F32: rows n0 .. n0+nc-1 of the weight, packed into dst (rows of rowb bytes). q: K int16.
static void pack_rows(const struct gemv * j, int64_t n0, int64_t nc, uint8_t * dst, int16_t * q) {
    const struct bie_layer_call * c = j->c;
    const float * w = (const float *)c->weight.data;
    const int64_t ws0 = c->weight.stride[0], K = j->K;
    for (int64_t r = 0; r < nc; r++) {
        const float * src = w + (n0 + r) * ws0;
        uint8_t * d = dst + (size_t)r * j->rowb;
        if (c->quant == BIE_QUANT_BINARY) {
            j->kern->sign_bits(src, NULL, 0.0f, K, d);
            continue;
        }
        j->kern->quantize(src, NULL, 0.0f, K, c->scale_w, j->lo, j->hi, q);
        if (c->quant == BIE_QUANT_INT8) {
            for (int64_t k = 0; k < K; k++) d[k] = (uint8_t)q[k];
        } else { // element 2t in the high nibble of byte t
            for (int64_t t = 0; t < K / 2; t++)
                d[t] = (uint8_t)(((unsigned)q[2 * t] & 15) << 4 | ((unsigned)q[2 * t + 1] & 15));
            if (K % 2) d[K / 2] = (uint8_t)(((unsigned)q[K - 1] & 15) << 4);
        }
    }
}

// Step 2 and 3 for blocks b0 .. b1-1 on the calling thread (tid: its buffer).
static void run_blocks(const struct gemv * j, int64_t b0, int64_t b1, int tid) {
    const struct bie_layer_call * c = j->c;
    const int64_t M = j->M, K = j->K;
    int32_t acc[CPU_GEMV_MAX_M * GEMV_NB];
    uint8_t * buf = j->wbuf ? j->wbuf + (size_t)tid * j->wbuf_bytes : NULL;
    for (int64_t b = b0; b < b1; b++) {
        const int64_t n0 = b * GEMV_NB, nc = j->N - n0 < GEMV_NB ? j->N - n0 : GEMV_NB;
        const uint8_t * w = buf;
        size_t ldw = j->rowb;
        if (j->form == W_F32) {
            pack_rows(j, n0, nc, buf, (int16_t *)(buf + cpu_arena_size(GEMV_NB * j->rowb)));
        } else {
            w = j->w + (size_t)n0 * j->ldw;
            ldw = j->ldw;
        }
        for (int64_t i = 0; i < M; i += CPU_GEMV_MR) {
            const int mr = M - i < CPU_GEMV_MR ? (int)(M - i) : CPU_GEMV_MR;
            const uint8_t * a = j->a + (size_t)i * j->lda;
            int32_t * ci = acc + i * GEMV_NB;
            if (c->quant == BIE_QUANT_BINARY) j->gk->b1(a, j->lda, mr, w, ldw, nc, j->kb, ci, GEMV_NB);
            else if (c->quant == BIE_QUANT_INT4)
                j->gk->s4((const int8_t *)a, j->lda, j->asum + i, mr, w, ldw, nc, j->kb, ci, GEMV_NB);
            else j->gk->s8((const int8_t *)a, j->lda, j->asum + i, mr, (const int8_t *)w, ldw, nc, j->kb, ci, GEMV_NB);
        }
        if (c->quant == BIE_QUANT_BINARY) {
            const unsigned tail = K % 8 ? (1u << (K % 8)) - 1 : 0;
            for (int64_t i = 0; i < M; i++)
                for (int64_t o = 0; o < nc; o++) {
                    int32_t * d = acc + i * GEMV_NB + o;
                    int32_t p = *d;
                    if (tail) // the partial byte (only then does the row have byte kb)
                        p += __builtin_popcount(((unsigned)j->last[i] ^ w[(size_t)o * ldw + j->kb]) & tail);
                    *d = (int32_t)K - 2 * p;
                }
        } else if (c->quant == BIE_QUANT_INT4 && K % 2) {
            for (int64_t i = 0; i < M; i++)
                for (int64_t o = 0; o < nc; o++) {
                    const int32_t hi = (int8_t)w[(size_t)o * ldw + j->kb] >> 4;
                    acc[i * GEMV_NB + o] = (int32_t)((uint32_t)acc[i * GEMV_NB + o] + (uint32_t)(hi * j->last[i]));
                }
        }
        cpu_epilogue_store(&j->ep, 0, M, n0, nc, acc, GEMV_NB);
    }
}

enum bie_status bie_cpu_gemv_forward(bie_context_t * ctx, const struct bie_layer_call * c) {
    const struct bie_geometry * g = &c->g;
    struct gemv j = {.c = c, .kern = bie_cpu_kernels(ctx->isa), .form = weight_form(c)};
    j.gk = bie_cpu_gemv_kernels(j.kern);
    j.M = g->batch * g->OH * g->OW;
    j.N = g->O;
    j.K = g->K;
    const int64_t K = j.K;
    size_t abytes; // bytes of an activation row before padding
    if (c->quant == BIE_QUANT_BINARY) {
        j.kb = (size_t)K / 8;
        j.rowb = (size_t)(K + 7) / 8;
        abytes = j.rowb;
    } else {
        j.lo = bie_quant_lo(c->quant);
        j.hi = bie_quant_hi(c->quant);
        j.kb = c->quant == BIE_QUANT_INT4 ? (size_t)K / 2 : (size_t)K;
        j.rowb = c->quant == BIE_QUANT_INT4 ? (size_t)(K + 1) / 2 : (size_t)K;
        abytes = c->quant == BIE_QUANT_INT4 ? 2 * cpu_round_up(j.kb, CPU_GEMV_ALIGN) : j.kb;
    }
    j.lda = cpu_round_up(abytes ? abytes : 1, CPU_GEMV_ALIGN);
    cpu_epilogue_init(&j.ep, c, j.kern);

    const int64_t blocks = (j.N + GEMV_NB - 1) / GEMV_NB;
    const size_t wbytes = (size_t)j.N * (j.form == W_F32 ? (size_t)K * sizeof(float) : j.rowb);
    int threads = cpu_threads(ctx);
    const size_t most = wbytes / bie_cpu_gemv_bytes_per_thread;
    if ((size_t)threads > most) threads = (int)most;
    if (threads > blocks) threads = (int)blocks;
    if (threads < 1 || !cpu_epilogue_parallel_safe(&j.ep)) threads = 1;

    const size_t sz_a = (size_t)j.M * j.lda, sz_q = (size_t)K * sizeof(int16_t), sz_bias = (size_t)g->C * sizeof(float);
    j.wbuf_bytes = j.form == W_F32 ? cpu_arena_size(GEMV_NB * j.rowb) + cpu_arena_size(sz_q) : 0;
    const size_t total =
        cpu_arena_size(sz_a) + cpu_arena_size(sz_q) + cpu_arena_size(sz_bias) + (size_t)threads * j.wbuf_bytes;
    void * ws;
    BIE_TRY(bie_host_workspace(ctx, total, &ws));
    struct cpu_arena ar = {.base = ws, .used = 0, .cap = total};
    j.a = cpu_arena_take(&ar, sz_a);
    int16_t * q = cpu_arena_take(&ar, sz_q);
    float * bias = cpu_arena_take(&ar, sz_bias);
    j.wbuf = j.form == W_F32 ? cpu_arena_take(&ar, (size_t)threads * j.wbuf_bytes) : NULL;

    if (c->bias_a.data) cpu_bias_dense(&c->bias_a, g->C, bias);
    for (int64_t m = 0; m < j.M; m++) prepare_row(&j, m, c->bias_a.data ? bias : NULL, q);
    if (j.form == W_PACKED) {
        const int64_t ws0 = c->weight.stride[0];
        const int64_t per = c->quant == BIE_QUANT_BINARY ? 8 : c->quant == BIE_QUANT_INT4 ? 2 : 1; // elements per byte
        j.w = c->weight.data;
        j.ldw = (size_t)(ws0 / per);
    }

    if (threads == 1) {
        run_blocks(&j, 0, blocks, 0);
        return BIE_STATUS_OK;
    }
#pragma omp parallel num_threads(threads)
    {
        const int t = omp_get_thread_num(), nt = omp_get_num_threads();
        run_blocks(&j, blocks * t / nt, blocks * (t + 1) / nt, t);
    }
    return BIE_STATUS_OK;
}
