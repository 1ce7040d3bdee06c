// SPDX-License-Identifier: Apache-2.0
// test-abi.c: bie_abi_layout reports the public structs' sizes and field offsets as this compiler
// lays them out (what a binding compares its own declarations with), and refuses unknown names.
#include "bie-train.h"
#include "test-util.h"

#include <stddef.h>

static void check(const char * s, const char * f, size_t want_off, size_t want_size) {
    int64_t off = -1, size = -1;
    const enum bie_status st = bie_abi_layout(s, f, &off, &size);
    CHECK(st == BIE_STATUS_OK && off == (int64_t)want_off && size == (int64_t)want_size,
          "%s.%s: status %d, offset %lld size %lld, want %zu %zu", s, f ? f : "(struct)", (int)st, (long long)off,
          (long long)size, want_off, want_size);
}

int main(int argc, char ** argv) {
    test_init(argc, argv);
    check("bie_tensor", NULL, 0, sizeof(struct bie_tensor));
    check("bie_tensor", "shape", offsetof(struct bie_tensor, shape), sizeof(((struct bie_tensor *)0)->shape));
    check("bie_tensor", "device_index", offsetof(struct bie_tensor, device_index), sizeof(int32_t));
    check("bie_conv2d_desc", "pad_value", offsetof(struct bie_conv2d_desc, pad_value), sizeof(enum bie_pad_value));
    check("bie_backward_args", "x_mask", offsetof(struct bie_backward_args, x_mask), sizeof(void *));
    check("bie_matmul_backward_args", "grad_y_clip", offsetof(struct bie_matmul_backward_args, grad_y_clip),
          sizeof(void *));
    check("bie_embedding_desc", "bag", offsetof(struct bie_embedding_desc, bag), sizeof(int32_t));
    check("bie_embedding_backward_args", NULL, 0, sizeof(struct bie_embedding_backward_args));
    check("bie_batchnorm_args", "y", offsetof(struct bie_batchnorm_args, y), sizeof(void *));
    check("bie_adam_args", "v", offsetof(struct bie_adam_args, v), sizeof(void *));
    check("bie_diode_init_args", "seed", 0, sizeof(uint64_t));
    check("bie_model_step_desc", "diode_lr", offsetof(struct bie_model_step_desc, diode_lr), sizeof(float));
    int64_t off, size;
    CHECK(bie_abi_layout("bie_tensor", "no_such_field", &off, &size) == BIE_STATUS_INVALID_ARGUMENT, "unknown field");
    CHECK(bie_abi_layout("bie_nothing", NULL, &off, &size) == BIE_STATUS_INVALID_ARGUMENT, "unknown struct");
    CHECK(bie_abi_layout(NULL, NULL, &off, &size) == BIE_STATUS_INVALID_ARGUMENT, "NULL name");
    CHECK(bie_abi_layout("bie_tensor", NULL, NULL, &size) == BIE_STATUS_INVALID_ARGUMENT, "NULL offset");
    CHECK(strcmp(bie_dtype_name(BIE_DTYPE_I64), "i64") == 0, "the i64 dtype's name");
    return test_finish("test-abi");
}
