// SPDX-License-Identifier: Apache-2.0
// cpu-epilogue.c: the fused output transform of the integer GEMMs. For output pixel m = (n, oh, ow)
// and channel o:
//   y f32/f16/bf16: (float)acc * (scale_a * scale_w), the product computed once in f32, then
//                   rounded (RNE) to the dtype;  y I32: acc;  y B1: bit = (acc >= 0).
// A B1 y whose channel rows are whole bytes (stride[1] == 1, the channels-last packed input of the
// next binary layer) is written a byte at a time; tiles start at multiples of 8 channels, so
// threads never share a byte. Other B1 views are written bit by bit from one thread. An f32 NCHW
// y is written per sample as runs of pixels of every channel (the kernel table's scaled transpose),
// past the caches when y is at least CPU_STREAM_BYTES.
#include "cpu/cpu-impl.h"

void cpu_epilogue_init(struct cpu_epilogue * e, const struct bie_layer_call * call, const struct cpu_kernels * kern) {
    e->call = call;
    e->kern = kern;
    e->scale = call->scale_a * call->scale_w;
    size_t ybytes = 0;
    bie_tensor_nbytes(&call->y, &ybytes);
    e->stream = ybytes >= CPU_STREAM_BYTES;
    const struct bie_tensor * y = &call->y;
    e->b1_bytes = y->dtype == BIE_DTYPE_B1 && y->stride[1] == 1 && y->stride[0] % 8 == 0 && y->stride[2] % 8 == 0 &&
                  y->stride[3] % 8 == 0;
}

bool cpu_epilogue_parallel_safe(const struct cpu_epilogue * e) {
    return e->call->y.dtype != BIE_DTYPE_B1 || e->b1_bytes;
}

static void store_b1_bytes(uint8_t * row, int64_t n0, int64_t nc, const int32_t * a) {
    for (int64_t o = 0; o < nc; o += 8) {
        const int64_t cnt = nc - o < 8 ? nc - o : 8;
        unsigned byte = 0;
        for (int64_t b = 0; b < cnt; b++) byte |= (unsigned)(a[o + b] >= 0) << b;
        uint8_t * p = row + (n0 + o) / 8;
        if (cnt < 8) { // keep the bits past the last channel
            const unsigned keep = 0xffu << cnt;
            byte |= *p & keep;
        }
        *p = (uint8_t)byte;
    }
}

void cpu_epilogue_store(const struct cpu_epilogue * e, int64_t m0, int64_t mc, int64_t n0, int64_t nc,
                        const int32_t * acc, size_t ldacc) {
    const struct bie_geometry * g = &e->call->g;
    const struct bie_tensor * y = &e->call->y;
    const int64_t * ys = y->stride;
    const int64_t P = g->OH * g->OW;
    const float s = e->scale;
    if (y->dtype == BIE_DTYPE_F32 && ys[1] != 1 && (g->OW == 1 || ys[3] == 1) && (g->OH == 1 || ys[2] == g->OW)) {
        // f32 planes (NCHW): per sample, a contiguous run of pixels of every channel (a transpose).
        for (int64_t r0 = 0; r0 < mc;) {
            const int64_t m = m0 + r0, n = m / P, p0 = m % P;
            const int64_t run = mc - r0 < P - p0 ? mc - r0 : P - p0;
            e->kern->store_cols_f32(acc + (size_t)r0 * ldacc, ldacc, run, nc, s,
                                    (float *)y->data + n * ys[0] + n0 * ys[1] + p0, (size_t)ys[1], e->stream);
            r0 += run;
        }
        return;
    }
    for (int64_t r = 0; r < mc; r++) {
        const int64_t m = m0 + r, n = m / P, p = m % P, oh = p / g->OW, ow = p % g->OW;
        const int64_t base = n * ys[0] + oh * ys[2] + ow * ys[3];
        const int32_t * a = acc + (size_t)r * ldacc;
        switch (y->dtype) {
        case BIE_DTYPE_F32: {
            float * d = (float *)y->data + base + n0 * ys[1];
            if (ys[1] == 1)
                for (int64_t o = 0; o < nc; o++) d[o] = (float)a[o] * s;
            else
                for (int64_t o = 0; o < nc; o++) d[o * ys[1]] = (float)a[o] * s;
            break;
        }
        case BIE_DTYPE_F16: {
            uint16_t * d = (uint16_t *)y->data + base + n0 * ys[1];
            for (int64_t o = 0; o < nc; o++) d[o * ys[1]] = bie_f32_to_f16((float)a[o] * s);
            break;
        }
        case BIE_DTYPE_BF16: {
            uint16_t * d = (uint16_t *)y->data + base + n0 * ys[1];
            for (int64_t o = 0; o < nc; o++) d[o * ys[1]] = bie_f32_to_bf16((float)a[o] * s);
            break;
        }
        case BIE_DTYPE_I32: {
            int32_t * d = (int32_t *)y->data + base + n0 * ys[1];
            for (int64_t o = 0; o < nc; o++) d[o * ys[1]] = a[o];
            break;
        }
        case BIE_DTYPE_B1:
            if (e->b1_bytes) {
                store_b1_bytes((uint8_t *)y->data + base / 8, n0, nc, a);
            } else {
                for (int64_t o = 0; o < nc; o++) {
                    const int64_t off = base + (n0 + o) * ys[1];
                    uint8_t * p8 = (uint8_t *)y->data + (off >> 3);
                    const uint8_t bit = (uint8_t)(1u << (off & 7));
                    *p8 = a[o] >= 0 ? (uint8_t)(*p8 | bit) : (uint8_t)(*p8 & ~bit);
                }
            }
            break;
        default: break; // validated: y is float, I32 or B1
        }
    }
}
