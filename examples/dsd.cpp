// sparsek from C++: C = A * B with A block-sparse, on host memory (CPU backend) and, when a GPU
// answers, on device memory; a plan made once and run many times; bad input as sparsek::Error.
#include <sparsek/gemm.hpp>
#include <sparsek/plan.hpp>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <vector>

using namespace sparsek;

static void check(cudaError_t e) {  // CUDA failures as sparsek errors, for one error path
  if (e != cudaSuccess) throw Error(Status::cuda_error, cudaGetErrorString(e));
}

static int example() {
  const int64_t M = 1024, K = 1024, N = 64;
  // A: M x K of 64x64 blocks, 2 of the 16 blocks in each block row stored (12.5%), f16 values.
  BsrMatrix A = random_bsr(PatternKind::fixed_k, M, K, 64, 64, 0.125, DType::f16, /*seed=*/1);
  std::vector<half_t> B(K * N, float_to_half(1.f));  // all ones: C[i][j] = sum of A's row i
  std::vector<float> C(M * N, NAN);                    // beta = 0: C is never read
  DenseView b{B.data(), K, N, /*ld=*/N, Layout::row_major, DType::f16, Memory::host};
  DenseView c{C.data(), M, N, /*ld=*/N, Layout::row_major, DType::f32, Memory::host};

  dsd(A.view(), b, c);  // one shot: C = A * B (checks everything, plans, runs)

  GemmArgs args;  // or plan once and run many times (allocation-free, CUDA-graph capturable)
  args.kind = OpKind::dsd;
  args.sparse = A.view();
  args.b = b;
  args.c = c;
  Plan p = plan(args);
  for (int i = 0; i < 3; ++i) run(p, args);
  float row0 = 0;  // C[0][j] is the sum of A's first row
  for (int32_t j = A.row_ptr()[0]; j < A.row_ptr()[1]; ++j)
    for (int k = 0; k < A.bk(); ++k) row0 += A.value(j, 0, k);
  std::printf("host: %lld blocks, variant %s, C[0][0] = %g (expected %g)\n", (long long)A.nnzb(),
              p.variant().c_str(), C[0], row0);
  if (!(std::fabs(C[0] - row0) <= 1e-3f * (1 + std::fabs(row0)))) return 1;

  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) == cudaSuccess && gpus > 0) {  // the same product on the GPU
    int32_t *row_ptr, *col_idx;
    void *values, *dB, *dC;
    check(cudaMalloc(&row_ptr, A.row_ptr().size() * 4));
    check(cudaMalloc(&col_idx, A.col_idx().size() * 4));
    check(cudaMalloc(&values, A.value_bytes().size()));
    check(cudaMalloc(&dB, B.size() * 2));
    check(cudaMalloc(&dC, C.size() * 4));
    check(cudaMemcpy(row_ptr, A.row_ptr().data(), A.row_ptr().size() * 4, cudaMemcpyHostToDevice));
    check(cudaMemcpy(col_idx, A.col_idx().data(), A.col_idx().size() * 4, cudaMemcpyHostToDevice));
    check(cudaMemcpy(values, A.value_bytes().data(), A.value_bytes().size(), cudaMemcpyHostToDevice));
    check(cudaMemcpy(dB, B.data(), B.size() * 2, cudaMemcpyHostToDevice));
    GemmArgs d = args;
    d.sparse.row_ptr = row_ptr, d.sparse.col_idx = col_idx, d.sparse.values = values;
    d.sparse.memory = d.b.memory = d.c.memory = Memory::device;
    d.b.data = dB, d.c.data = dC;
    cudaStream_t stream;
    check(cudaStreamCreate(&stream));
    Options o;
    o.stream = stream;
    Plan dp = plan(d, o);
    run(dp, d, stream);
    std::vector<float> got(C.size());
    check(cudaMemcpyAsync(got.data(), dC, got.size() * 4, cudaMemcpyDeviceToHost, stream));
    check(cudaStreamSynchronize(stream));
    double worst = 0;
    for (size_t i = 0; i < C.size(); ++i) worst = std::fmax(worst, std::fabs(got[i] - C[i]));
    std::printf("device: variant %s, max |GPU - CPU| = %g\n", dp.variant().c_str(), worst);
    for (void* ptr : {(void*)row_ptr, (void*)col_idx, values, dB, dC}) cudaFree(ptr);
    cudaStreamDestroy(stream);
    if (!(worst <= 1e-2)) return 1;
  } else {
    std::printf("device: no GPU answers, skipped\n");
  }

  try {
    DenseView wrong = b;  // bad input: B has the wrong number of rows
    wrong.rows = 512;
    dsd(A.view(), wrong, c);
    return 1;  // not reached: dsd throws
  } catch (const Error& e) {  // every error names the argument and the offending value
    std::printf("error, as expected (%s): %s\n", to_string(e.status()), e.what());
  }
  return 0;
}

int main() {
  try {
    return example();
  } catch (const Error& e) {
    std::fprintf(stderr, "sparsek error (%s): %s\n", to_string(e.status()), e.what());
    return 1;
  }
}
