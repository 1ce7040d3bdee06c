// SPDX-License-Identifier: Apache-2.0
// bench.c: `bie bench` on the CPU (bench.h describes the options and the shape files).
// Every measurement is the median of --repeat timed runs after one warm-up run; bie and the
// baseline run in the same process with the same thread count (OpenMP for bie,
// openblas_set_num_threads for OpenBLAS).
#include "bench.h"

#include "bie.h"

#include <cblas.h>
#include <errno.h>
#include <getopt.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct bench_case {
    char kind[16], name[64];
    int quant;
    int64_t M, N, K, B, C, H, W, O, k, s, p;
};

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

static int cmp_double(const void * a, const void * b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef int (*bench_fn)(void * state);

// Median milliseconds of fn over `repeat` runs after one warm-up; negative when fn fails.
static double time_median(bench_fn fn, void * state, int repeat) {
    if (fn(state)) return -1.0;
    double t[64];
    if (repeat > 64) repeat = 64;
    for (int i = 0; i < repeat; i++) {
        const double t0 = now_ms();
        if (fn(state)) return -1.0;
        t[i] = now_ms() - t0;
    }
    qsort(t, (size_t)repeat, sizeof t[0], cmp_double);
    return repeat % 2 ? t[repeat / 2] : 0.5 * (t[repeat / 2 - 1] + t[repeat / 2]);
}

double bench_now_ms(void) { return now_ms(); }

bie_context_t * bench_context(const struct bench_options * opt, int threads) {
    struct bie_context_params p;
    bie_context_params_default(&p);
    p.backend = !strcmp(opt->backend, "ref") ? BIE_BACKEND_REF : BIE_BACKEND_CPU;
    p.num_threads = threads;
    bie_context_t * ctx = NULL;
    return bie_context_create(&p, &ctx) == BIE_STATUS_OK ? ctx : NULL;
}

double bench_median(double * t, int n) {
    qsort(t, (size_t)n, sizeof t[0], cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

// What every --json row also names, made once: the CPU's model name (/proc/cpuinfo), its logical
// CPUs, the ISA level bie's CPU backend uses (after any BIE_CPU_ISA cap), OpenBLAS's build, bie's
// version and the UTC date of the run.
const char * bench_cpu_run_info(void) {
    static char info[768];
    if (info[0]) return info;
    char model[160] = "unknown CPU", blas[256], line[512];
    FILE * f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f)) {
        const char * colon = strchr(line, ':');
        if (colon && !strncmp(line, "model name", 10)) {
            bench_json_text(model, sizeof model, colon + 1);
            break;
        }
    }
    if (f) fclose(f);
    bench_json_text(blas, sizeof blas, openblas_get_config());
    const char * isa = "unknown";
    bie_context_t * ctx;
    if (bie_context_create(NULL, &ctx) == BIE_STATUS_OK) {
        isa = bie_cpu_isa_name(bie_context_cpu_isa(ctx));
        bie_context_destroy(ctx);
    }
    char date[16];
    bench_utc_date(date, sizeof date);
    snprintf(info, sizeof info,
             "\"device\": \"%s\", \"cpus\": %d, \"isa\": \"%s\", \"blas\": \"%s\", \"bie_version\": \"%s\", "
             "\"date\": \"%s\"",
             model, omp_get_num_procs(), isa, blas, bie_version_string(), date);
    return info;
}

void bench_print(const struct bench_options * opt, const struct bench_result * r) {
    const double speedup = r->bie_ms > 0 ? r->baseline_ms / r->bie_ms : 0.0;
    const double gops = r->bie_ms > 0 ? r->ops / (r->bie_ms * 1e6) : 0.0;
    if (opt->json)
        printf("{\"case\": \"%s\", \"backend\": \"%s\", \"threads\": %d, \"bie_ms\": %.4f, \"baseline\": \"%s\", "
               "\"baseline_ms\": %.4f, \"speedup\": %.3f, \"gops\": %.2f, %s}\n",
               r->name, r->backend, r->threads, r->bie_ms, r->baseline, r->baseline_ms, speedup, gops,
               bench_cpu_run_info());
    else
        printf("%-24s %-5s %3d %11.3f  %-22s %11.3f %8.2fx %9.1f\n", r->name, r->backend, r->threads, r->bie_ms,
               r->baseline, r->baseline_ms, speedup, gops);
    fflush(stdout);
}

// --- data -------------------------------------------------------------------------------------

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) * 0x1p-24) * 2.0f - 1.0f;
}
static float * falloc(int64_t n, bool fill) {
    float * p = aligned_alloc(64, ((size_t)n * sizeof(float) + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "bie bench: out of memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < n; i++) p[i] = fill ? frand() : 0.0f;
    return p;
}

// A tensor over new memory of the given dtype and row-major shape (packed rows for B1/S4).
static struct bie_tensor tensor(enum bie_dtype d, int32_t nd, const int64_t * shape) {
    struct bie_tensor t;
    bie_tensor_make(&t, NULL, d, nd, shape);
    size_t bytes = 0;
    bie_tensor_nbytes(&t, &bytes);
    t.data = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!t.data) {
        fprintf(stderr, "bie bench: out of memory\n");
        exit(1);
    }
    memset(t.data, 0, bytes);
    return t;
}

// --- the cases --------------------------------------------------------------------------------

struct layer_state {
    const struct bench_case * c;
    bie_context_t * ctx;
    struct bie_tensor x, w, y, sa, sw, gy, gx, gw, gs;
    struct bie_linear_desc lin;
    struct bie_conv2d_desc conv;
    // baseline
    float *fx, *fw, *fy, *fg, *fgx, *fgw, *col;
    int threads;
};

static int bie_fwd(void * v) {
    struct layer_state * s = v;
    struct bie_forward_args a = {.x = &s->x, .weight = &s->w, .scale_a = &s->sa, .scale_w = &s->sw, .y = &s->y};
    const enum bie_status st = strcmp(s->c->kind, "conv") == 0 ? bie_conv2d_forward(s->ctx, &s->conv, &a)
                                                               : bie_linear_forward(s->ctx, &s->lin, &a);
    if (st != BIE_STATUS_OK) fprintf(stderr, "bie bench: %s: %s\n", s->c->name, bie_context_last_error(s->ctx));
    return st != BIE_STATUS_OK;
}

static int bie_train(void * v) {
    struct layer_state * s = v;
    if (bie_fwd(v)) return 1;
    struct bie_backward_args a = {.x = &s->x,
                                  .weight = &s->w,
                                  .scale_a = &s->sa,
                                  .scale_w = &s->sw,
                                  .grad_y = &s->gy,
                                  .grad_x = &s->gx,
                                  .grad_weight = &s->gw,
                                  .grad_scale_a = &s->gs};
    const enum bie_status st = bie_linear_backward(s->ctx, &s->lin, &a);
    if (st != BIE_STATUS_OK) fprintf(stderr, "bie bench: %s: %s\n", s->c->name, bie_context_last_error(s->ctx));
    return st != BIE_STATUS_OK;
}

static int base_gemm(void * v) { // y[M,N] = x[M,K] w[N,K]^T
    struct layer_state * s = v;
    const struct bench_case * c = s->c;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)c->M, (int)c->N, (int)c->K, 1.0f, s->fx, (int)c->K, s->fw,
                (int)c->K, 0.0f, s->fy, (int)c->N);
    return 0;
}

static int base_train(void * v) { // forward, grad_x = g w, grad_w = g^T x
    struct layer_state * s = v;
    const struct bench_case * c = s->c;
    base_gemm(v);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)c->M, (int)c->K, (int)c->N, 1.0f, s->fg, (int)c->N,
                s->fw, (int)c->K, 0.0f, s->fgx, (int)c->K);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)c->N, (int)c->K, (int)c->M, 1.0f, s->fg, (int)c->N, s->fx,
                (int)c->K, 0.0f, s->fgw, (int)c->K);
    return 0;
}

static int base_conv(void * v) { // per sample: col[K][P] = im2col(x), y[O][P] = w[O][K] col
    struct layer_state * s = v;
    const struct bench_case * c = s->c;
    const int64_t OH = (c->H + 2 * c->p - c->k) / c->s + 1, OW = (c->W + 2 * c->p - c->k) / c->s + 1;
    const int64_t P = OH * OW, K = c->C * c->k * c->k;
    for (int64_t n = 0; n < c->B; n++) {
        const float * x = s->fx + n * c->C * c->H * c->W;
        // im2col on the calling thread: OpenMP workers spinning next to OpenBLAS's would slow the
        // sgemm down (and it is O(K*P) against the sgemm's O(O*K*P)).
        for (int64_t r = 0; r < K; r++) {
            const int64_t ch = r / (c->k * c->k), i = (r / c->k) % c->k, j = r % c->k;
            float * d = s->col + r * P;
            for (int64_t oh = 0; oh < OH; oh++) {
                const int64_t ih = oh * c->s - c->p + i;
                for (int64_t ow = 0; ow < OW; ow++) {
                    const int64_t iw = ow * c->s - c->p + j;
                    d[oh * OW + ow] =
                        (ih < 0 || ih >= c->H || iw < 0 || iw >= c->W) ? 0.0f : x[(ch * c->H + ih) * c->W + iw];
                }
            }
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)c->O, (int)P, (int)K, 1.0f, s->fw, (int)K, s->col,
                    (int)P, 0.0f, s->fy + n * c->O * P, (int)P);
    }
    return 0;
}

static enum bie_dtype packed_dtype(int quant) {
    return quant == 1 ? BIE_DTYPE_B1 : quant == 4 ? BIE_DTYPE_S4 : BIE_DTYPE_I8;
}

static int run_case(const struct bench_options * opt, const struct bench_case * c, int threads) {
    if (!strcmp(c->kind, "gemv")) return bench_gemv_case(opt, c->name, c->quant, c->M, c->K, c->N, threads);
    struct layer_state s;
    memset(&s, 0, sizeof s);
    s.c = c;
    s.threads = threads;
    struct bie_context_params p;
    bie_context_params_default(&p);
    p.backend = !strcmp(opt->backend, "ref") ? BIE_BACKEND_REF : BIE_BACKEND_CPU;
    p.num_threads = threads;
    if (bie_context_create(&p, &s.ctx) != BIE_STATUS_OK) return 1;
    openblas_set_num_threads(threads);
    const bool conv = !strcmp(c->kind, "conv"), train = !strcmp(c->kind, "train");
    const enum bie_quant q = (enum bie_quant)c->quant;
    s.sa = tensor(BIE_DTYPE_F32, 0, NULL);
    s.sw = tensor(BIE_DTYPE_F32, 0, NULL);
    *(float *)s.sa.data = c->quant == 1 ? 1.0f : 0.05f;
    *(float *)s.sw.data = c->quant == 1 ? 0.02f : 0.01f;
    double ops;
    int64_t wsz;
    struct bie_tensor wf; // the float weight, packed into s.w
    if (conv) {
        const int64_t OH = (c->H + 2 * c->p - c->k) / c->s + 1, OW = (c->W + 2 * c->p - c->k) / c->s + 1;
        const int64_t xs[4] = {c->B, c->C, c->H, c->W}, ys[4] = {c->B, c->O, OH, OW};
        const int64_t ws_ohwi[4] = {c->O, c->k, c->k, c->C};
        s.x = tensor(BIE_DTYPE_F32, 4, xs);
        s.y = tensor(BIE_DTYPE_F32, 4, ys);
        s.w = tensor(packed_dtype(c->quant), 4, ws_ohwi);
        wf = tensor(BIE_DTYPE_F32, 4, ws_ohwi);
        const int32_t perm[4] = {0, 3, 1, 2};
        bie_tensor_permute(&s.w, perm);
        bie_tensor_permute(&wf, perm);
        s.conv = (struct bie_conv2d_desc){.quant = q,
                                          .in_channels = c->C,
                                          .out_channels = c->O,
                                          .kernel = {(int)c->k, (int)c->k},
                                          .stride = {(int)c->s, (int)c->s},
                                          .padding = {(int)c->p, (int)c->p},
                                          .dilation = {1, 1},
                                          .groups = 1};
        wsz = c->O * c->C * c->k * c->k;
        ops = 2.0 * (double)(c->B * OH * OW) * (double)c->O * (double)(c->C * c->k * c->k);
        s.fx = falloc(c->B * c->C * c->H * c->W, true);
        s.fw = falloc(wsz, true);
        s.fy = falloc(c->B * c->O * OH * OW, false);
        s.col = falloc(c->C * c->k * c->k * OH * OW, false);
        memcpy(s.x.data, s.fx, (size_t)(c->B * c->C * c->H * c->W) * sizeof(float));
    } else {
        const int64_t xs[2] = {c->M, c->K}, ys[2] = {c->M, c->N}, ws[2] = {c->N, c->K};
        const bool gemm = !strcmp(c->kind, "gemm");
        s.x = tensor(gemm ? BIE_DTYPE_B1 : BIE_DTYPE_F32, 2, xs);
        s.y = tensor(gemm ? BIE_DTYPE_I32 : BIE_DTYPE_F32, 2, ys);
        s.w = tensor(train ? BIE_DTYPE_F32 : packed_dtype(c->quant), 2, ws);
        wf = tensor(BIE_DTYPE_F32, 2, ws);
        s.lin = (struct bie_linear_desc){.quant = q, .in_features = c->K, .out_features = c->N};
        wsz = c->N * c->K;
        ops = 2.0 * (double)c->M * (double)c->N * (double)c->K * (train ? 3.0 : 1.0);
        s.fx = falloc(c->M * c->K, true);
        s.fw = falloc(wsz, true);
        s.fy = falloc(c->M * c->N, false);
        struct bie_tensor xf = tensor(BIE_DTYPE_F32, 2, xs);
        memcpy(xf.data, s.fx, (size_t)(c->M * c->K) * sizeof(float));
        if (gemm) bie_pack(s.ctx, &xf, NULL, &s.x);
        else memcpy(s.x.data, s.fx, (size_t)(c->M * c->K) * sizeof(float));
        free(xf.data);
        if (train) {
            s.gy = tensor(BIE_DTYPE_F32, 2, ys);
            s.gx = tensor(BIE_DTYPE_F32, 2, xs);
            s.gw = tensor(BIE_DTYPE_F32, 2, ws);
            s.gs = tensor(BIE_DTYPE_F32, 0, NULL);
            s.fg = falloc(c->M * c->N, true);
            memcpy(s.gy.data, s.fg, (size_t)(c->M * c->N) * sizeof(float));
            s.fgx = falloc(c->M * c->K, false);
            s.fgw = falloc(wsz, false);
        }
    }
    memcpy(wf.data, s.fw, (size_t)wsz * sizeof(float));
    if (train) memcpy(s.w.data, s.fw, (size_t)wsz * sizeof(float));
    else bie_pack(s.ctx, &wf, c->quant == 1 ? NULL : &s.sw, &s.w);
    free(wf.data);

    struct bench_result r = {.name = c->name, .backend = opt->backend, .threads = threads, .ops = ops};
    // A pause before each side lets the other runtime's idle threads (OpenBLAS workers spin for a
    // while after a call) go to sleep, so that neither side is timed against the other's spinning.
    usleep(200000);
    r.bie_ms = time_median(train ? bie_train : bie_fwd, &s, opt->repeat);
    r.baseline = conv ? "im2col+openblas-sgemm" : train ? "openblas-sgemm-step" : "openblas-sgemm";
    usleep(200000);
    r.baseline_ms = time_median(conv ? base_conv : train ? base_train : base_gemm, &s, opt->repeat);
    if (r.bie_ms >= 0) bench_print(opt, &r);

    struct bie_tensor * ts[] = {&s.x, &s.w, &s.y, &s.sa, &s.sw, &s.gy, &s.gx, &s.gw, &s.gs};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) free(ts[i]->data);
    float * fs[] = {s.fx, s.fw, s.fy, s.fg, s.fgx, s.fgw, s.col};
    for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++) free(fs[i]);
    bie_context_destroy(s.ctx);
    return r.bie_ms < 0;
}

// --- shape files and options ----------------------------------------------------------------

// Bounds of a shape line: every size in [1, 2^20] (padding [0, 64], kernel and stride [1, 64]),
// and every buffer the case allocates (and every sgemm argument) at most 2^31 - 1 elements.
#define SHAPE_MAX (INT64_C(1) << 20)
#define ELEMS_MAX (INT64_C(0x7fffffff))

static bool elems_ok(int64_t a, int64_t b, int64_t c, int64_t d) {
    int64_t p;
    return !__builtin_mul_overflow(a, b, &p) && !__builtin_mul_overflow(p, c, &p) &&
           !__builtin_mul_overflow(p, d, &p) && p <= ELEMS_MAX;
}

// Checks a parsed case; false (after a message naming the line) when it cannot run.
static bool check_case(const struct bench_case * c, const char * file, int lineno) {
    const char * why = NULL;
    const bool conv = !strcmp(c->kind, "conv"), gemv = !strcmp(c->kind, "gemv");
    if (!conv && !gemv && strcmp(c->kind, "linear") && strcmp(c->kind, "gemm") && strcmp(c->kind, "train"))
        why = "the kind must be linear, gemm, gemv, conv or train";
    else if (gemv && (c->M < 1 || c->M > 8)) why = "a gemv case has M in [1, 8] (the matrix-vector path)";
    else if (c->quant != 1 && c->quant != 4 && c->quant != 8) why = "quant must be 1, 4 or 8";
    else if (!strcmp(c->kind, "gemm") && c->quant != 1) why = "a gemm case is binary (quant=1)";
    else if (!conv && (c->M < 1 || c->N < 1 || c->K < 1 || c->M > SHAPE_MAX || c->N > SHAPE_MAX || c->K > SHAPE_MAX))
        why = "M, N and K must be in [1, 2^20]";
    else if (!conv && !(elems_ok(c->M, c->K, 1, 1) && elems_ok(c->M, c->N, 1, 1) && elems_ok(c->N, c->K, 1, 1)))
        why = "M*K, M*N and N*K must be at most 2^31 - 1";
    else if (conv && (c->B < 1 || c->C < 1 || c->H < 1 || c->W < 1 || c->O < 1 || c->B > SHAPE_MAX ||
                      c->C > SHAPE_MAX || c->H > SHAPE_MAX || c->W > SHAPE_MAX || c->O > SHAPE_MAX))
        why = "B, C, H, W and O must be in [1, 2^20]";
    else if (conv && (c->k < 1 || c->k > 64 || c->s < 1 || c->s > 64 || c->p < 0 || c->p > 64))
        why = "k and s must be in [1, 64], p in [0, 64]";
    else if (conv && (c->H + 2 * c->p < c->k || c->W + 2 * c->p < c->k))
        why = "the kernel is larger than the padded input";
    if (!why && conv) {
        const int64_t OH = (c->H + 2 * c->p - c->k) / c->s + 1, OW = (c->W + 2 * c->p - c->k) / c->s + 1;
        if (!(elems_ok(c->B, c->C, c->H, c->W) && elems_ok(c->B, c->O, OH, OW) && elems_ok(c->O, c->C, c->k, c->k) &&
              elems_ok(c->C * c->k * c->k, OH, OW, 1)))
            why = "its tensors (input, output, weight, im2col) must hold at most 2^31 - 1 elements each";
    }
    if (why) fprintf(stderr, "bie bench: %s:%d: %s: %s\n", file, lineno, c->name, why);
    return why == NULL;
}

// Parses one line `kind name key=value ...`: 1 for a case, 0 for a blank or comment line, -1 (after
// a message) for a line that is not a valid case.
static int parse_line(char * line, struct bench_case * c, const char * file, int lineno) {
    memset(c, 0, sizeof *c);
    c->quant = 1;
    c->B = 1;
    c->k = 3;
    c->s = 1;
    char * save = NULL;
    char * tok = strtok_r(line, " \t\r\n", &save);
    if (!tok || tok[0] == '#') return 0;
    snprintf(c->kind, sizeof c->kind, "%s", tok);
    tok = strtok_r(NULL, " \t\r\n", &save);
    snprintf(c->name, sizeof c->name, "%s", tok ? tok : "?");
    while ((tok = strtok_r(NULL, " \t\r\n", &save))) {
        char * eq = strchr(tok, '=');
        if (!eq) {
            fprintf(stderr, "bie bench: %s:%d: \"%.40s\" is not key=value\n", file, lineno, tok);
            return -1;
        }
        *eq = 0;
        char * end = NULL;
        errno = 0;
        const long long v = strtoll(eq + 1, &end, 10);
        if (errno || end == eq + 1 || *end) {
            fprintf(stderr, "bie bench: %s:%d: %s=%.40s is not an integer\n", file, lineno, tok, eq + 1);
            return -1;
        }
        struct {
            const char * k;
            int64_t * p;
        } keys[] = {{"M", &c->M}, {"N", &c->N}, {"K", &c->K}, {"B", &c->B}, {"C", &c->C}, {"H", &c->H},
                    {"W", &c->W}, {"O", &c->O}, {"k", &c->k}, {"s", &c->s}, {"p", &c->p}};
        bool found = !strcmp(tok, "quant");
        if (found) c->quant = v < -1000 || v > 1000 ? 0 : (int)v;
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            if (!strcmp(tok, keys[i].k)) {
                *keys[i].p = v;
                found = true;
            }
        if (!found) {
            fprintf(stderr, "bie bench: %s:%d: unknown key %.40s\n", file, lineno, tok);
            return -1;
        }
    }
    return check_case(c, file, lineno) ? 1 : -1;
}

// Opens the shape file as given, or relative to the program's directory: in a build tree
// (build/../bench/shapes) or an installed one (bin/../share/bie/bench/shapes).
static FILE * open_shapes(const char * path) {
    FILE * f = fopen(path, "r");
    if (f) return f;
    char exe[4096];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return NULL;
    exe[n] = 0;
    char * slash = strrchr(exe, '/');
    if (!slash) return NULL;
    *slash = 0;
    char alt[8192];
    snprintf(alt, sizeof alt, "%s/../%s", exe, path);
    if ((f = fopen(alt, "r"))) return f;
    snprintf(alt, sizeof alt, "%s/../share/bie/%s", exe, path);
    return fopen(alt, "r");
}

static void usage(FILE * f) {
    fprintf(f, "usage: bie bench [--shapes=FILE] [--case=SUBSTRING] [--threads=N] [--repeat=N] [--json]\n"
               "                 [--quick] [--backend=cpu|ref|cuda] [--llm]\n"
               "Times bie's layers and the float baseline (OpenBLAS sgemm, im2col + sgemm) in the same run;\n"
               "prints medians, the ratio baseline/bie and bie's GOPS, with 1 thread and with all threads.\n"
               "Default shapes: bench/shapes/cpu.txt (--quick: bench/shapes/quick.txt). --threads 1..1024,\n"
               "--repeat 1..64. --backend=cuda runs the program bie_bench_cuda beside this one (its own\n"
               "options: --shape S, --call-only, --rows M). A --case that selects nothing exits 2.\n"
               "--llm: the weight-only n-bit layer at LLM shapes against OpenBLAS (cuBLAS fp16 with\n"
               "--backend=cuda).\n");
}

// A whole number in [lo, hi] from an option's value, or -1 after a message.
static int bench_int(const char * opt, const char * v, int lo, int hi) {
    char * end;
    const long n = strtol(v, &end, 10);
    if (end == v || *end || n < lo || n > hi) {
        fprintf(stderr, "bie bench: --%s: '%s' is not an integer in %d..%d\n", opt, v, lo, hi);
        return -1;
    }
    return (int)n;
}

int bench_run_cuda_program(int argc, char ** argv) {
    char exe[4096];
    const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 32);
    if (n > 0) exe[n] = '\0';
    char * slash = n > 0 ? strrchr(exe, '/') : NULL;
    if (!slash) {
        fprintf(stderr, "bie bench: cannot find this program's directory\n");
        return 1;
    }
    strcpy(slash + 1, "bie_bench_cuda");
    if (access(exe, X_OK) != 0) {
        fprintf(stderr, "bie bench: %s is missing: the CUDA benchmarks are built with the CUDA backend\n", exe);
        return 2;
    }
    char ** args = calloc((size_t)(2 * argc + 1), sizeof *args);
    if (!args) return 1;
    int k = 0;
    args[k++] = exe;
    for (int i = 1; i < argc; i++) {
        char * eq = strncmp(argv[i], "--", 2) == 0 ? strchr(argv[i], '=') : NULL;
        if (eq) *eq = '\0';
        args[k++] = argv[i];
        if (eq) args[k++] = eq + 1;
    }
    execv(exe, args);
    fprintf(stderr, "bie bench: cannot run %s: %s\n", exe, strerror(errno));
    free(args);
    return 1;
}

int bie_bench_main(int argc, char ** argv) {
    struct bench_options o = {.shapes = NULL, .filter = NULL, .threads = 0, .repeat = 5, .backend = "cpu"};
    static const struct option longopts[] = {
        {"help", no_argument, NULL, 'h'},         {"json", no_argument, NULL, 'j'},
        {"quick", no_argument, NULL, 'q'},        {"shapes", required_argument, NULL, 's'},
        {"case", required_argument, NULL, 'c'},   {"threads", required_argument, NULL, 't'},
        {"repeat", required_argument, NULL, 'r'}, {"backend", required_argument, NULL, 'b'},
        {"llm", no_argument, NULL, 'l'},          {NULL, 0, NULL, 0},
    };
    char ** args = malloc(sizeof *args * (size_t)(argc + 1)); // getopt permutes; the CUDA program gets argv
    if (!args) return 1;
    memcpy(args, argv, sizeof *args * (size_t)argc);
    args[argc] = NULL;
    optind = 1;
    opterr = 0;
    int c, bad = 0;
    bool llm = false;
    while (!bad && (c = getopt_long(argc, args, ":h", longopts, NULL)) != -1) {
        switch (c) {
        case 'h':
            usage(stdout);
            free(args);
            return 0;
        case 'j': o.json = true; break;
        case 'q': o.quick = true; break;
        case 's': o.shapes = optarg; break;
        case 'c': o.filter = optarg; break;
        case 't': bad = (o.threads = bench_int("threads", optarg, 1, 1024)) < 0; break;
        case 'r': bad = (o.repeat = bench_int("repeat", optarg, 1, 64)) < 0; break;
        case 'b': o.backend = optarg; break;
        case 'l': llm = true; break;
        case ':':
            fprintf(stderr, "bie bench: %s needs a value\n", args[optind - 1]);
            bad = 1;
            break;
        default:
            fprintf(stderr, "bie bench: unknown option %s\n", args[optind - 1]);
            bad = 1;
            break;
        }
    }
    if (!bad && optind < argc) {
        fprintf(stderr, "bie bench: unexpected argument '%s'\n", args[optind]);
        bad = 1;
    }
    free(args);
    if (bad) {
        usage(stderr);
        return 2;
    }
    if (llm) return bench_llm_main(&o, argc, argv);
    if (!strcmp(o.backend, "cuda"))
        return bie_bench_cuda_main ? bie_bench_cuda_main(argc, argv) : bench_run_cuda_program(argc, argv);
    if (strcmp(o.backend, "cpu") && strcmp(o.backend, "ref")) {
        fprintf(stderr, "bie bench: --backend must be cpu, ref or cuda\n");
        return 2;
    }
    if (!o.shapes) o.shapes = o.quick ? "bench/shapes/quick.txt" : "bench/shapes/cpu.txt";
    FILE * f = open_shapes(o.shapes);
    if (!f) {
        fprintf(stderr, "bie bench: cannot open the shape file %s (use --shapes FILE)\n", o.shapes);
        return 2;
    }
    const int all = omp_get_num_procs();
    char line[1024];
    int lineno = 0, failed = 0, selected = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        struct bench_case c;
        const int parsed = parse_line(line, &c, o.shapes, lineno);
        if (parsed < 0) {
            fclose(f);
            return 2;
        }
        if (!parsed) continue;
        if (o.filter && !strstr(c.name, o.filter)) continue;
        if (!selected++ && !o.json)
            printf("%-24s %-5s %3s %11s  %-22s %11s %9s %9s\n", "case", "bknd", "thr", "bie_ms", "baseline",
                   "baseline_ms", "speedup", "gops");
        if (o.threads > 0) {
            failed |= run_case(&o, &c, o.threads);
        } else {
            failed |= run_case(&o, &c, 1);
            if (all > 1) failed |= run_case(&o, &c, all);
        }
    }
    fclose(f);
    if (!selected) {
        fprintf(stderr, "bie bench: no case of %s matches --case '%s'\n", o.shapes, o.filter ? o.filter : "");
        return 2;
    }
    return failed ? 1 : 0;
}
