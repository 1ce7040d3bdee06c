// SPDX-License-Identifier: Apache-2.0
// dispatch.c: bie_dispatch, the choice of backends for a validated call (bie-impl.h).
#include "bie-cuda-plugin.h"

enum bie_status bie_dispatch(bie_context_t * ctx, enum bie_device_type device, bie_slot_runner run, const void * job,
                             const char * what) {
    enum bie_status s = BIE_DECLINED;
    if (device == BIE_DEVICE_CUDA) {
        const struct bie_cuda_plugin * cuda;
        BIE_TRY(bie_cuda_plugin_get(ctx, what, &cuda));
        s = run(ctx, &cuda->backend, job);
        if (s == BIE_DECLINED) s = bie_set_error(ctx, BIE_STATUS_UNSUPPORTED, "cuda: no kernel for %s", what);
    } else if (ctx->params.backend == BIE_BACKEND_CUDA) {
        s = bie_set_error(ctx, BIE_STATUS_INVALID_ARGUMENT,
                          "%s: the tensors are on the CPU but the context's backend "
                          "is CUDA",
                          what);
    } else {
        const struct bie_backend_ops * order[2] = {&bie_cpu_backend, &bie_ref_backend};
        for (int i = ctx->params.backend == BIE_BACKEND_REF ? 1 : 0; i < 2 && s == BIE_DECLINED; i++)
            s = run(ctx, order[i], job);
        if (s == BIE_DECLINED) s = bie_set_error(ctx, BIE_STATUS_INTERNAL, "no CPU implementation for %s", what);
    }
    if (s == BIE_STATUS_OK) bie_clear_error(ctx);
    return s;
}
