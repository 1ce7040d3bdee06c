// SPDX-License-Identifier: Apache-2.0
// fake-plugin.c: stand-ins for the CUDA plugin that libbie must refuse, built without CUDA:
//   FAKE_WRONG_ABI:   a table from "another build" (another ABI number);
//   FAKE_NEEDS_STUB:  a correct-looking plugin that needs a library the loader cannot find (as the
//                     real plugin needs cuBLAS), so that dlopen fails and names that library;
//   neither:          a library without the entry point.
#include "bie-cuda-plugin.h"

#if defined(FAKE_WRONG_ABI) || defined(FAKE_NEEDS_STUB)
#ifdef FAKE_NEEDS_STUB
int bie_test_stub(void); // tests/plugin/stub.c, a library absent at run time
#endif

static int no_devices(char * why, size_t cap) {
    (void)why, (void)cap;
#ifdef FAKE_NEEDS_STUB
    return bie_test_stub();
#else
    return 0;
#endif
}

static const struct bie_cuda_plugin table = {
#ifdef FAKE_WRONG_ABI
    .abi = BIE_CUDA_PLUGIN_ABI + 1,
#else
    .abi = BIE_CUDA_PLUGIN_ABI,
#endif
    .size = sizeof(struct bie_cuda_plugin),
    .layout = BIE_CUDA_PLUGIN_LAYOUT,
    .version = "0.0.0-test",
    .device_count = no_devices,
};

__attribute__((visibility("default"))) const struct bie_cuda_plugin * BIE_CUDA_PLUGIN_ENTRY(void) { return &table; }
#else
__attribute__((visibility("default"))) int bie_test_not_a_plugin(void) { return 0; }
#endif
