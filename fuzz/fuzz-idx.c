// SPDX-License-Identifier: Apache-2.0
// fuzz-idx.c: libFuzzer target for the IDX reader, raw and gzip-compressed (the gzip path runs
// zlib's inflate under the reader's size bounds).
#include "bie.h"
#include "bie-train.h"

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    static bie_context_t * ctx;
    if (!ctx && bie_context_create(NULL, &ctx) != BIE_STATUS_OK) return 0;
    struct bie_idx idx;
    if (bie_idx_parse(ctx, data, size, "fuzz", &idx) == BIE_STATUS_OK) {
        int64_t n = 1;
        for (int i = 0; i < idx.ndim; i++) n *= idx.shape[i];
        volatile uint8_t sink = 0;
        for (int64_t i = 0; i < n; i++) sink ^= idx.data[i]; // the whole announced size is readable
        (void)sink;
    }
    bie_idx_free(&idx);
    return 0;
}
