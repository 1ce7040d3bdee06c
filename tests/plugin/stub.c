// SPDX-License-Identifier: Apache-2.0
// stub.c: a library that the fake plugin FAKE_NEEDS_STUB links and that is kept out of the
// loader's reach when the test runs (as cuBLAS is on a machine without CUDA).
int bie_test_stub(void) { return 0; }
