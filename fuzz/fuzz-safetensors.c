// SPDX-License-Identifier: Apache-2.0
// fuzz-safetensors.c: libFuzzer target for the safetensors reader (and the strict JSON parser
// under it) and for the model loader on top of it (architecture parsing, tensor validation).
// Any input must give OK or an error status, never a crash, a leak or undefined behaviour.
#include "bie.h"
#include "bie-train.h"

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    static bie_context_t * ctx;
    if (!ctx && bie_context_create(NULL, &ctx) != BIE_STATUS_OK) return 0;
    bie_safetensors_t * st = NULL;
    if (bie_safetensors_parse(ctx, data, size, &st) == BIE_STATUS_OK) {
        for (size_t i = 0; i < bie_safetensors_count(st); i++) {
            const struct bie_st_tensor * t = bie_safetensors_at(st, i);
            volatile uint8_t sink = 0;
            for (size_t b = 0; b < t->nbytes; b++) sink ^= ((const uint8_t *)t->data)[b]; // in bounds?
            (void)sink;
        }
        bie_model_t * m = NULL;
        if (bie_model_from_safetensors(ctx, st, &m) == BIE_STATUS_OK) {
            struct bie_model_layer_info li;
            for (int64_t i = 0; i < bie_model_num_layers(m); i++) bie_model_layer_info(m, i, &li);
        }
        bie_model_destroy(m);
    }
    bie_safetensors_free(st);
    return 0;
}
