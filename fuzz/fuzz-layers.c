// SPDX-License-Identifier: Apache-2.0
// fuzz-layers.c: libFuzzer target of the layer API, differential: every CPU backend and ISA level
// against the reference on one call per input (fuzz/lib/layer-case.h says what is decoded and
// what must hold). Built with ASan and UBSan (make fuzz, make test-fuzz).
#include "lib/layer-case.h"

#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t * data, size_t size) {
    static struct fuzz_backends b;
    static bool ready;
    if (!ready) {
        if (!fuzz_backends_init(&b, false)) {
            fprintf(stderr, "fuzz-layers: cannot create the contexts\n");
            abort();
        }
        ready = true;
    }
    fuzz_layer_case(&b, data, size);
    return 0;
}
