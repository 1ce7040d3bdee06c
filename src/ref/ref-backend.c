// SPDX-License-Identifier: Apache-2.0
// ref-backend.c: the reference backend's table.
#include "ref/ref-impl.h"

const struct bie_backend_ops bie_ref_backend = {
    .name = "ref",
    .layer_forward = bie_ref_layer_forward,
    .layer_backward = bie_ref_layer_backward,
    .pack = bie_ref_pack,
    .unpack = bie_ref_unpack,
    .reduce = bie_ref_reduce,
    .binarize_ste = bie_ref_binarize_ste,
    .matmul_forward = bie_ref_matmul_forward,
    .matmul_backward = bie_ref_matmul_backward,
    .embedding_forward = bie_ref_embedding_forward,
    .embedding_backward = bie_ref_embedding_backward,
    .affine_maxpool2d = bie_ref_affine_maxpool2d,
};
