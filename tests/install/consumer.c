// SPDX-License-Identifier: Apache-2.0
// consumer.c: a program outside the project that uses an installed bie, built by
// check-install.sh through pkg-config and through find_package(bie). binary_linear is the
// README's example as printed there; main checks its result and what libbie says about CUDA.
#include <bie.h>
#include <stdio.h>

// y[M, N] = binary linear layer of x[M, K] with a float latent weight w[N, K].
int binary_linear(float * x, float * w, float * y, int64_t M, int64_t K, int64_t N) {
    bie_context_t * ctx;
    if (bie_context_create(NULL, &ctx) != BIE_STATUS_OK) return -1;
    struct bie_tensor tx, tw, ty, sa, sw;
    float scale_a, scale_w;
    bie_tensor_make(&tx, x, BIE_DTYPE_F32, 2, (int64_t[]){M, K});
    bie_tensor_make(&tw, w, BIE_DTYPE_F32, 2, (int64_t[]){N, K});
    bie_tensor_make(&ty, y, BIE_DTYPE_F32, 2, (int64_t[]){M, N});
    bie_tensor_make(&sa, &scale_a, BIE_DTYPE_F32, 0, NULL);
    bie_tensor_make(&sw, &scale_w, BIE_DTYPE_F32, 0, NULL);
    bie_activation_scale_init(ctx, BIE_QUANT_BINARY, 1, &tx, &sa); // 2*mean|x|
    bie_weight_scale_init(ctx, BIE_QUANT_BINARY, &tw, &sw);        // mean|w|
    struct bie_linear_desc d = {BIE_QUANT_BINARY, K, N};
    struct bie_forward_args a = {.x = &tx, .weight = &tw, .scale_a = &sa, .scale_w = &sw, .y = &ty};
    enum bie_status s = bie_linear_forward(ctx, &d, &a); // y = scale_a*scale_w*(sign x . sign w)
    if (s != BIE_STATUS_OK) fprintf(stderr, "bie: %s\n", bie_context_last_error(ctx));
    bie_context_destroy(ctx);
    return s == BIE_STATUS_OK ? 0 : -1;
}

int main(void) {
    // x = [[1, -2, 3], [-1, -1, 1]], w = [[1, 1, 1], [-1, 1, -1]]: sign dot products 1 and -3 in
    // row 0, -1 and -1 in row 1; scale_a = 2*mean|x| = 3, scale_w = mean|w| = 1.
    float x[6] = {1, -2, 3, -1, -1, 1}, w[6] = {1, 1, 1, -1, 1, -1}, y[4];
    const float want[4] = {3, -9, -3, -3};
    if (binary_linear(x, w, y, 2, 3, 2) != 0) return 1;
    for (int i = 0; i < 4; i++)
        if (y[i] != want[i]) {
            fprintf(stderr, "consumer: y[%d] = %g, want %g\n", i, (double)y[i], (double)want[i]);
            return 1;
        }
    const char * why = bie_backend_unavailable_reason(BIE_BACKEND_CUDA);
    printf("consumer: bie %s works; CUDA: %s\n", bie_version_string(), why ? why : "available");
    return 0;
}
