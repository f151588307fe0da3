// Warpgroup products over 128B-swizzled shared-memory tiles of [D / 64 chunks][rows][64 elements]
// (the layout a TMA box of (64, rows, D / 64) writes): the attention kernels' building blocks.
#pragma once
#include <cstdint>

#include "kernels/ptx/wgmma.cuh"

namespace sparsek::dev {

// acc (m64 x N) = A B^T summed over D: A = 64 rows starting at a_rows, B = N rows starting at
// b_rows, both K-major (D contiguous), D in 64-wide chunks a_chunk / b_chunk bytes apart.
template <int D, int N, bool BF16>
__device__ __forceinline__ void mma_rows_rows(float (&acc)[N / 2], uint32_t a_rows, uint32_t a_chunk, uint32_t b_rows,
                                              uint32_t b_chunk) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint32_t off = (kk % 4) * 32;  // +16 elements inside the 128-byte swizzled row
    const uint64_t da = ptx::smem_desc(a_rows + (kk / 4) * a_chunk + off, 16, 1024, ptx::Swizzle::b128);
    const uint64_t db = ptx::smem_desc(b_rows + (kk / 4) * b_chunk + off, 16, 1024, ptx::Swizzle::b128);
    ptx::wgmma_m64k16<N, BF16, 0, 0>(acc, da, db, kk > 0 ? 1 : 0);
  }
}

// acc (m64 x N) += A B summed over K: A from registers (k16 step kk = a[kk], the A fragment
// layout of wgmma_m64k16_rs: registers 8kk..8kk+7 of an fp32 accumulator packed in pairs), B = K
// rows starting at b_rows read MN-major (N contiguous, in 64-wide chunks b_chunk bytes apart).
template <int K, int N, bool BF16>
__device__ __forceinline__ void mma_regs_rows(float (&acc)[N / 2], const uint32_t (&a)[K / 16][4], uint32_t b_rows,
                                              uint32_t b_chunk) {
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    const uint64_t db = ptx::smem_desc(b_rows + kk * 16 * 128, b_chunk, 1024, ptx::Swizzle::b128);
    ptx::wgmma_m64k16_rs<N, BF16, 1>(acc, a[kk], db, 1);
  }
}

}  // namespace sparsek::dev
