/* sparsek from C: C = A * B with A block-sparse (f32, host memory, CPU backend), one-shot and
 * through a plan; every call returns a status and sparsek_last_error() says what went wrong. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <sparsek/sparsek.h>

#define CHECK(call)                                                                          \
  do {                                                                                       \
    sparsek_status s_ = (call);                                                              \
    if (s_ != SPARSEK_OK) {                                                                  \
      fprintf(stderr, "%s failed (%s): %s\n", #call, sparsek_status_string(s_), sparsek_last_error()); \
      return 1;                                                                              \
    }                                                                                        \
  } while (0)

enum { M = 128, K = 96, N = 8, BM = 32, BK = 32 };

int main(void) {
  /* A: 4 block rows x 3 block columns of 32x32 blocks; block row 2 is empty. */
  static const int32_t row_ptr[] = {0, 2, 3, 3, 5};
  static const int32_t col_idx[] = {0, 2, 1, 0, 2};
  const int64_t nnzb = 5;
  float* values = malloc(sizeof(float) * nnzb * BM * BK);
  float* b = malloc(sizeof(float) * K * N);
  float* c = malloc(sizeof(float) * M * N);
  for (int64_t i = 0; i < nnzb * BM * BK; ++i) values[i] = (float)(i % 7) - 3.f;
  for (int i = 0; i < K * N; ++i) b[i] = (float)(i % 5) - 2.f;

  sparsek_bsr a = {M, K, BM, BK, nnzb, row_ptr, col_idx, values, SPARSEK_F32, SPARSEK_HOST};
  sparsek_dense bd = {b, K, N, N, SPARSEK_ROW_MAJOR, SPARSEK_F32, SPARSEK_HOST};
  sparsek_dense cd = {c, M, N, N, SPARSEK_ROW_MAJOR, SPARSEK_F32, SPARSEK_HOST};
  printf("sparsek %s (headers %s), CUDA device: %s\n", sparsek_version(), SPARSEK_VERSION_STRING,
         sparsek_has_cuda() ? "yes" : "no");

  CHECK(sparsek_dsd(SPARSEK_OP_NONE, 1.f, &a, &bd, 0.f, &cd, NULL)); /* one shot */

  /* The same through a plan: made once per pattern, run many times. */
  sparsek_gemm_args args = {0};
  args.kind = SPARSEK_DSD; /* DSD slots: sparse = A, b = B, c = C */
  args.op = SPARSEK_OP_NONE;
  args.alpha = 1.f;
  args.sparse = a;
  args.b = bd;
  args.c = cd;
  sparsek_plan plan = NULL;
  CHECK(sparsek_plan_create(&plan, &args, NULL));
  args.alpha = 2.f; /* alpha, beta, values and data may change between runs */
  CHECK(sparsek_plan_run(plan, &args, NULL));
  printf("plan variant: %s\n", sparsek_plan_variant(plan));
  CHECK(sparsek_plan_destroy(plan));

  /* Check C against a direct sum: C = 2 * A * B. */
  double worst = 0;
  for (int br = 0; br < M / BM; ++br)
    for (int r = 0; r < BM; ++r)
      for (int j = 0; j < N; ++j) {
        double want = 0;
        for (int32_t p = row_ptr[br]; p < row_ptr[br + 1]; ++p)
          for (int k = 0; k < BK; ++k)
            want += 2.0 * values[(p * BM + r) * BK + k] * b[(col_idx[p] * BK + k) * N + j];
        worst = fmax(worst, fabs(c[(br * BM + r) * N + j] - want));
      }
  printf("max |C - reference| = %g\n", worst);

  /* Bad input: a column index out of range is refused with its position and value. */
  static const int32_t bad_cols[] = {0, 3, 1, 0, 2};
  a.col_idx = bad_cols;
  sparsek_status s = sparsek_dsd(SPARSEK_OP_NONE, 1.f, &a, &bd, 0.f, &cd, NULL);
  printf("bad col_idx -> %s: %s\n", sparsek_status_string(s), sparsek_last_error());

  free(values);
  free(b);
  free(c);
  return worst == 0 && s == SPARSEK_INVALID_ARGUMENT ? 0 : 1;
}
