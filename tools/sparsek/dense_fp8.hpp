// cuBLASLt's dense fp8 GEMM, the dense peer of the e4m3 products: `sparsek bench --dtype e4m3`
// times it beside sparsek's rows, and bench/fp8_timer.cu beside the fp8 kernel (built into the
// sparsek_timing library so that both share one set-up).
//
//   C (m x n, row-major, bf16 / f16 / f32) = a_scale * b_scale * A (m x k, e4m3, row-major) * B^T
//   (B: n x k, e4m3, row-major: both operands K-contiguous, the only fp8 layout cuBLASLt takes),
//
// with one fp32 scale per operand (tensor-wise, as torch._scaled_mm's tensor-wise mode) and fp32
// accumulation. cuBLASLt wants m, n, k and the leading dimensions multiples of 16.
#pragma once
#include <cstdint>

#include "sparsek/types.hpp"

namespace sparsek::timing {

class DenseFp8Gemm {
 public:
  // Picks cuBLASLt's first heuristic algorithm (32 MiB of workspace). Throws Error(unsupported)
  // when cuBLASLt has none for this shape and output dtype, Error(cuda_error) when a call fails.
  DenseFp8Gemm(int64_t m, int64_t n, int64_t k, DType out);
  ~DenseFp8Gemm();
  DenseFp8Gemm(const DenseFp8Gemm&) = delete;
  DenseFp8Gemm& operator=(const DenseFp8Gemm&) = delete;

  // Enqueues C = ... on `stream` (a cudaStream_t; null: the legacy default stream). a_scale,
  // b_scale: one float each in device memory, or null for 1.
  void run(const void* a, const void* b, void* c, const float* a_scale, const float* b_scale,
           void* stream = nullptr) const;

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace sparsek::timing
