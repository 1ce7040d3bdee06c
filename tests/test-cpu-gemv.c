// SPDX-License-Identifier: Apache-2.0
// test-cpu-gemv.c: the matrix-vector path of the CPU forward (src/cpu/cpu-gemv.c), at every ISA
// level this machine has.
// (1) The kernels against their contract (cpu-gemv.h), written out here once more: every m up to
//     CPU_GEMV_MR, odd row counts and byte counts around the vector widths and the int16 blocks,
//     weight rows with gaps, the last row allocated to its last byte (so that a read past it is a
//     heap overflow under ASan).
// (2) Layers with M <= CPU_GEMV_MAX_M (linear, and 1x1 convs of a few pixels) against the reference
//     backend: binary, 4-bit and 8-bit; packed weights (garbage in their padding bits and row gaps)
//     and f32 weights; f32, f16, B1 and strided x; f32, f16, I32, B1 and strided y; with and
//     without bias_a; 1, 2 and 3 threads with the split into threads forced. Byte-identical outputs.
#include "test-cpu-common.h"

#include "cpu/cpu-gemv.h"

static int64_t popc8(unsigned v) { return __builtin_popcount(v & 0xffu); }

// (1) ---------------------------------------------------------------------------------------------

static const int64_t kb_list[] = {0,   1,   7,   8,    31,   32,   33,   63,   64,   65,  100,
                                  127, 128, 129, 2047, 2048, 2049, 4095, 4096, 4097, 8193};
#define NKB ((int)(sizeof kb_list / sizeof kb_list[0]))

static void kernel_case(const struct cpu_gemv_kernels * gk, int kind, int m, int64_t n, size_t kb) {
    const size_t ldw = kb + (size_t)test_rand_int(0, 9), kp = cpu_round_up(kb, CPU_GEMV_ALIGN);
    const size_t lda = kind == 4 ? 2 * kp + CPU_GEMV_ALIGN : kp + CPU_GEMV_ALIGN;
    const size_t wbytes = (size_t)(n - 1) * ldw + kb;
    uint8_t * w = malloc(wbytes ? wbytes : 1);
    int8_t * a = aligned_alloc(CPU_GEMV_ALIGN, lda * CPU_GEMV_MR);
    memset(a, 0, lda * CPU_GEMV_MR);
    for (size_t i = 0; i < wbytes; i++) w[i] = (uint8_t)test_rand_u64();
    int32_t asum[CPU_GEMV_MR] = {0};
    for (int i = 0; i < m; i++) {
        int8_t * ai = a + (size_t)i * lda;
        for (size_t t = 0; t < kb; t++) {
            if (kind == 1) {
                ai[t] = (int8_t)test_rand_u64();
            } else if (kind == 4) {
                ai[t] = (int8_t)test_rand_int(-8, 7);
                ai[kp + t] = (int8_t)test_rand_int(-8, 7);
                asum[i] += ai[t] + ai[kp + t];
            } else {
                ai[t] = (int8_t)test_rand_int(-128, 127);
                asum[i] += ai[t];
            }
        }
    }
    const size_t ldc = (size_t)n + 3;
    int32_t * c = malloc(sizeof(int32_t) * ldc * CPU_GEMV_MR);
    for (size_t i = 0; i < ldc * CPU_GEMV_MR; i++) c[i] = 0x5a5a5a5a;
    if (kind == 1) gk->b1((const uint8_t *)a, lda, m, w, ldw, n, kb, c, ldc);
    else if (kind == 4) gk->s4(a, lda, asum, m, w, ldw, n, kb, c, ldc);
    else gk->s8(a, lda, asum, m, (const int8_t *)w, ldw, n, kb, c, ldc);
    int64_t bad = 0, bi = 0, bj = 0, bwant = 0;
    for (int i = 0; i < CPU_GEMV_MR; i++)
        for (int64_t j = 0; j < (int64_t)ldc; j++) {
            const int8_t * ai = a + (size_t)i * lda;
            int64_t want = 0x5a5a5a5a; // outside the m x n results: untouched
            if (i < m && j < n) {
                const uint8_t * wj = w + (size_t)j * ldw;
                want = 0;
                for (size_t t = 0; t < kb; t++) {
                    if (kind == 1) want += popc8((unsigned)(uint8_t)ai[t] ^ wj[t]);
                    else if (kind == 4)
                        want += ((int8_t)wj[t] >> 4) * ai[t] + ((int8_t)(uint8_t)(wj[t] << 4) >> 4) * ai[kp + t];
                    else want += (int8_t)wj[t] * ai[t];
                }
            }
            if (c[(size_t)i * ldc + (size_t)j] != (int32_t)want && bad++ == 0) {
                bi = i;
                bj = j;
                bwant = want;
            }
        }
    CHECK(bad == 0, "%s kernel kind %d m=%d n=%lld kb=%zu ldw=%zu: %lld wrong, c[%lld][%lld] = %d, want %lld", gk->name,
          kind, m, (long long)n, kb, ldw, (long long)bad, (long long)bi, (long long)bj,
          c[(size_t)bi * ldc + (size_t)bj], (long long)bwant);
    free(w);
    free(a);
    free(c);
}

static void test_kernels(const enum bie_cpu_isa * levels, int nlev, bool quick) {
    static const int64_t ns[] = {1, 2, 3, 4, 5, 7, 9, 13};
    for (int l = 0; l < nlev; l++) {
        const struct cpu_gemv_kernels * gk = bie_cpu_gemv_kernels(bie_cpu_kernels(levels[l]));
        for (int ki = 0; ki < 3; ki++)
            for (int m = 1; m <= CPU_GEMV_MR; m++)
                for (int kbi = 0; kbi < NKB; kbi++) {
                    if (quick && kb_list[kbi] > 4096 && m > 1) continue;
                    kernel_case(gk, ki == 0 ? 1 : ki == 1 ? 4 : 8, m, test_pick(ns, 8), (size_t)kb_list[kbi]);
                }
    }
}

// (2) ---------------------------------------------------------------------------------------------

static const int64_t k_list[] = {1,   3,   7,   8,   9,   15,   17,   63,   64,   65,   127,
                                 129, 255, 257, 511, 513, 1000, 1025, 4096, 4100, 8200, 16400};
#define NK ((int)(sizeof k_list / sizeof k_list[0]))

// Random bytes in every bit of a packed weight's buffer that is not an element (row gaps, the
// padding bits of a last partial byte or nibble), leaving the elements as they are.
static void garbage_padding(const struct bie_tensor * w, int64_t N, int64_t K) {
    size_t bytes = cpu_test_nbytes(w);
    uint8_t * keep = calloc(1, bytes + 1);
    const int bits = w->dtype == BIE_DTYPE_B1 ? 1 : 4;
    for (int64_t o = 0; o < N; o++)
        for (int64_t k = 0; k < K; k++) {
            const int64_t e = o * w->stride[0] + k * w->stride[1]; // element offset
            if (bits == 1) keep[e / 8] |= (uint8_t)(1u << (e % 8));
            else keep[e / 2] |= (uint8_t)(e % 2 ? 0x0f : 0xf0);
        }
    uint8_t * p = w->data;
    for (size_t i = 0; i < bytes; i++) p[i] = (uint8_t)((p[i] & keep[i]) | ((uint8_t)test_rand_u64() & ~keep[i]));
    free(keep);
}

static enum bie_dtype pick(const enum bie_dtype * d, int n) { return d[test_rand_int(0, n - 1)]; }

// The weight's buffer reallocated to the bytes its view spans and no more, so that a read past
// its last row is a heap overflow under ASan (test_tensor leaves slack after the buffer).
static void exact_buffer(struct bie_tensor * t) {
    const size_t bytes = cpu_test_nbytes(t);
    void * p = malloc(bytes);
    memcpy(p, t->data, bytes);
    free(t->data);
    t->data = p;
}

static void make_case(struct cpu_test_layer * gc, enum bie_quant q, int64_t K) {
    memset(gc, 0, sizeof *gc);
    gc->q = q;
    const enum bie_dtype packed = q == BIE_QUANT_BINARY ? BIE_DTYPE_B1
                                  : q == BIE_QUANT_INT4 ? BIE_DTYPE_S4
                                                        : BIE_DTYPE_I8;
    const enum bie_dtype wd = test_rand_int(0, 3) ? packed : BIE_DTYPE_F32;
    static const enum bie_dtype xds[] = {BIE_DTYPE_F32, BIE_DTYPE_F32, BIE_DTYPE_F16, BIE_DTYPE_B1};
    static const enum bie_dtype yds[] = {BIE_DTYPE_F32, BIE_DTYPE_F32, BIE_DTYPE_F16, BIE_DTYPE_I32, BIE_DTYPE_B1};
    enum bie_dtype xd = pick(xds, 4), yd = pick(yds, 5);
    if (q != BIE_QUANT_BINARY && xd == BIE_DTYPE_B1) xd = BIE_DTYPE_F32;
    if (q != BIE_QUANT_BINARY && yd == BIE_DTYPE_B1) yd = BIE_DTYPE_I32;
    const int64_t N = test_rand_int(0, 3) ? test_rand_int(1, 150) : test_rand_int(151, 700);
    gc->conv = test_rand_int(0, 4) == 0;
    int64_t M;
    const int lw = (int)test_rand_int(0, 1);
    if (!gc->conv) {
        M = test_rand_int(1, CPU_GEMV_MAX_M);
        gc->lin = (struct bie_linear_desc){.quant = q, .in_features = K, .out_features = N};
        const int lx = xd == BIE_DTYPE_B1 ? (int)test_rand_int(0, 1) : (int)test_rand_int(0, 2);
        const int64_t xs[2] = {M, K}, ys[2] = {M, N};
        gc->x = test_tensor_rows(xd, 2, xs, lx);
        gc->w = cpu_test_view2(wd, N, K, lw);
        gc->y = test_rand_int(0, 3) ? cpu_test_view2(yd, M, N, test_rand_int(0, 1)) : test_tensor_rows(yd, 2, ys, 2);
        snprintf(gc->what, sizeof gc->what, "linear q%d M=%lld K=%lld N=%lld x %s/%d w %s/%d y %s", (int)q,
                 (long long)M, (long long)K, (long long)N, bie_dtype_name(xd), lx, bie_dtype_name(wd), lw,
                 bie_dtype_name(yd));
    } else { // a 1x1 conv over at most 8 pixels: K = C
        const int64_t B = test_rand_int(1, 2), H = test_rand_int(1, 2), W = test_rand_int(1, 2);
        M = B * H * W;
        gc->cd = (struct bie_conv2d_desc){.quant = q,
                                          .in_channels = K,
                                          .out_channels = N,
                                          .kernel = {1, 1},
                                          .stride = {1, 1},
                                          .padding = {0, 0},
                                          .dilation = {1, 1},
                                          .groups = 1};
        static const int nchw[4] = {0, 1, 2, 3}, nhwc[4] = {0, 2, 3, 1};
        const int64_t xs[4] = {B, K, H, W}, wsh[4] = {N, K, 1, 1}, ys[4] = {B, N, H, W};
        const bool xl = xd == BIE_DTYPE_B1 || test_rand_int(0, 1), yl = yd == BIE_DTYPE_B1 || test_rand_int(0, 1);
        gc->x = cpu_test_view4(xd, xs, xl ? nhwc : nchw);
        gc->w = cpu_test_view4(wd, wsh, nhwc);
        gc->y = cpu_test_view4(yd, ys, yl ? nhwc : nchw);
        snprintf(gc->what, sizeof gc->what, "conv1x1 q%d B=%lld H=%lld W=%lld C=%lld O=%lld x %s%s w %s y %s%s", (int)q,
                 (long long)B, (long long)H, (long long)W, (long long)K, (long long)N, bie_dtype_name(xd),
                 xl ? "/nhwc" : "", bie_dtype_name(wd), bie_dtype_name(yd), yl ? "/nhwc" : "");
    }
    exact_buffer(&gc->w);
    if (xd == BIE_DTYPE_B1) test_fill_uniform(&gc->x, -1, 1);
    else test_fill_uniform(&gc->x, -2, 2);
    if (wd == BIE_DTYPE_I8) test_fill_uniform(&gc->w, -128, 128);
    else if (wd == BIE_DTYPE_S4) test_fill_uniform(&gc->w, -8, 8);
    else test_fill_uniform(&gc->w, -1, 1);
    if (wd == BIE_DTYPE_B1 || wd == BIE_DTYPE_S4) garbage_padding(&gc->w, N, K);
    gc->has_bias = xd != BIE_DTYPE_B1 && test_rand_int(0, 1);
    if (gc->has_bias) {
        gc->bias = test_tensor(BIE_DTYPE_F32, 1, &K, NULL);
        test_fill_uniform(&gc->bias, -0.5f, 0.5f);
    }
    // Small activation scales for 8-bit layers reach the clamp at both ends.
    gc->sa = test_scalar(q == BIE_QUANT_INT8 ? test_rand_float(0.005f, 0.03f) : test_rand_float(0.05f, 0.4f));
    gc->sw = test_scalar(test_rand_float(0.005f, 0.2f));
    cpu_test_garbage(&gc->y);
    const size_t len = strlen(gc->what);
    snprintf(gc->what + len, sizeof gc->what - len, " bias %d", (int)gc->has_bias);
}

static void check_case(struct cpu_test_layer * gc, bie_context_t * ref, bie_context_t ** cpu, int nctx) {
    struct bie_tensor yr = cpu_test_clone(&gc->y);
    const enum bie_status sr = cpu_test_layer_forward(ref, gc, &yr);
    CHECK(sr == BIE_STATUS_OK, "ref: %s (%s)", bie_context_last_error(ref), gc->what);
    const size_t nb = cpu_test_nbytes(&gc->y);
    for (int l = 0; l < nctx; l++) {
        struct bie_tensor yc = cpu_test_clone(&gc->y);
        const enum bie_status sc = cpu_test_layer_forward(cpu[l], gc, &yc);
        CHECK(sc == BIE_STATUS_OK, "cpu: %s (%s)", bie_context_last_error(cpu[l]), gc->what);
        size_t first = nb;
        for (size_t i = 0; i < nb && first == nb; i++)
            if (((uint8_t *)yc.data)[i] != ((uint8_t *)yr.data)[i]) first = i;
        CHECK(first == nb, "isa %s context %d: first differing byte %zu of %zu (%s)",
              bie_cpu_isa_name(bie_context_cpu_isa(cpu[l])), l, first, nb, gc->what);
        test_tensor_free(&yc);
    }
    test_tensor_free(&yr);
}

static void free_case(struct cpu_test_layer * gc) {
    struct bie_tensor * ts[] = {&gc->x, &gc->w, &gc->y, &gc->sa, &gc->sw, &gc->bias};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) test_tensor_free(ts[i]); // bias: NULL data if absent
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    enum bie_cpu_isa levels[CPU_TEST_LEVELS];
    const int nlev = cpu_test_levels(levels);
    const bool quick = cpu_test_quick();
    test_kernels(levels, nlev, quick);

    bie_cpu_gemv_bytes_per_thread = 1; // every thread takes part whenever there are blocks for it
    bie_context_t * ref = cpu_test_ctx(BIE_BACKEND_REF, BIE_CPU_ISA_BEST, 1);
    bie_context_t * cpu[CPU_TEST_LEVELS * 3];
    int nctx = 0;
    for (int l = 0; l < nlev; l++)
        for (int t = 1; t <= 3; t++) cpu[nctx++] = cpu_test_ctx(BIE_BACKEND_CPU, levels[l], t);
    for (int qi = 0; qi < 3; qi++) {
        const enum bie_quant q = qi == 0 ? BIE_QUANT_BINARY : qi == 1 ? BIE_QUANT_INT4 : BIE_QUANT_INT8;
        for (int ki = 0; ki < NK; ki++)
            for (int rep = 0; rep < (quick ? 1 : 2); rep++) {
                if (quick && k_list[ki] > 4100) continue;
                struct cpu_test_layer gc;
                make_case(&gc, q, k_list[ki]);
                check_case(&gc, ref, cpu, nctx);
                free_case(&gc);
            }
    }
    for (int l = 0; l < nctx; l++) bie_context_destroy(cpu[l]);
    bie_context_destroy(ref);
    return test_finish("test-cpu-gemv");
}
