// Hopper fp8 DSD: C = alpha * (sA ⊙ A) * (sB ⊙ B) + beta * C with A block-sparse in e4m3 (one fp32
// scale per stored block), B dense e4m3 (one fp32 scale per column of the DSD view: per token of a
// layer's activations), C f16 / bf16 / f32. DDS runs here as the DSD on the transposes, as for the
// 16-bit products. What is built (the config table), each configuration's constants and the
// parameters the host and the kernel share. docs/design/dsd_fp8_sm90.md says how it works.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/sm90/kit/launch.hpp"
#include "kernels/sm90/kit/smem.cuh"
#include "kernels/sm90/kit/tile.cuh"
#include "kernels/sm90/kit/tma.hpp"
#include "sparsek/gemm.hpp"

namespace sparsek::dsd_fp8_sm90 {

// ---- the config table: every (block height, block width, C width) that is built ----
struct Key {
  int bm = 0, bk = 0;  // A's block shape (one block is one ring stage: its K is the stage's)
  int out_bytes = 2;   // 4: f32 C; 2: f16 or bf16 C (which one: Params::out_bf16)
  constexpr bool operator==(const Key& o) const { return bm == o.bm && bk == o.bk && out_bytes == o.out_bytes; }
};
inline constexpr Key kConfigs[] = {{64, 64, 2},   {64, 64, 4},   {64, 128, 2},  {64, 128, 4},
                                   {128, 64, 2},  {128, 64, 4},  {128, 128, 2}, {128, 128, 4}};
inline constexpr int kNumConfigs = int(sizeof(kConfigs) / sizeof(kConfigs[0]));

constexpr int kThreads = 384;  // 3 warpgroups: producer, consumer 0, consumer 1

template <int BM_, int BK_, class TOut_>
struct Config {
  static constexpr int BM = BM_;  // rows of a work tile = rows of A's blocks
  static constexpr int BK = BK_;  // K of a stage = one stored block's width (64 or 128 bytes of e4m3)
  using TOut = TOut_;             // float (f32 C) or uint16_t (f16 / bf16 C)
  static constexpr int BN = 128;  // columns of a work tile
  // Both consumers on every item: 128-row blocks split by rows (64 each, all BN columns), 64-row
  // blocks by columns (all 64 rows, BN / 2 columns each), so that each stage feeds both.
  static constexpr bool SPLIT_M = BM == 128;
  static constexpr int WN = SPLIT_M ? BN : BN / 2;  // wgmma N of a consumer
  static constexpr int ACC = WN / 2;                // fp32 registers of one accumulator
  // Promotion overlapped with the next block's wgmmas (two partial accumulators): 5% slower with
  // 128-wide warpgroup tiles (128-row blocks), within run-to-run spread with 64-wide ones (H200,
  // docs/design/dsd_fp8_sm90.md), so only the latter use it.
  static constexpr bool PIPELINED = ACC <= 32;
  using ATile = kit::TileLayout<BM, BK, true, 64, 1>;  // A's block: BM rows of BK bytes, K-major
  using BTile = kit::TileLayout<BN, BK, true, 64, 1>;  // B's panel: BN rows (of B^T) of BK bytes, K-major
  static constexpr int A_BYTES = ATile::BYTES, B_BYTES = BTile::BYTES;
  static constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
  // 16-bit C leaves through a staging tile per consumer (64 rows x WN columns as [WN / 64][64][64],
  // 128B-swizzled: one TMA box of 64 x 64 per chunk) where the TMA can store C (Params::tma_c); f32
  // C is stored by the threads, and so is 16-bit C that the TMA cannot store or that is read (beta).
  static constexpr bool STAGED = sizeof(TOut) == 2;
  static constexpr int STAGING_BYTES = STAGED ? 64 * WN * 2 : 0;  // one consumer's
  static constexpr int STAGES = std::min(8, (kit::kSmemPerBlock - 2048 - 2 * STAGING_BYTES) / STAGE_BYTES);
  // Shared memory: A stages | B stages | staging [2] | full[STAGES] | empty[STAGES] | block scales [STAGES].
  static constexpr kit::Region A = kit::first_region(STAGES * A_BYTES);
  static constexpr kit::Region B = A.then(STAGES * B_BYTES);
  static constexpr kit::Region STAGING = B.then(2 * STAGING_BYTES);
  static constexpr kit::Region FULL = STAGING.then(8 * STAGES, 8);
  static constexpr kit::Region EMPTY = FULL.then(8 * STAGES, 8);
  static constexpr kit::Region SCALE = EMPTY.then(4 * STAGES, 4);
  static constexpr int SMEM = int(SCALE.end()) + kit::kSmemAlignSlack;

  static_assert(BM == 64 || BM == 128, "fp8 blocks are 64 or 128 rows");
  static_assert(BK == 64 || BK == 128, "fp8 blocks are 64 or 128 wide (one 64B or 128B swizzle row)");
  static_assert(STAGES >= 3, "the ring needs at least 3 stages to overlap load and math");
  static_assert(SMEM <= kit::kSmemPerBlock, "shared memory per block on sm_90 is 227 KB");
};
template <int I>
using ConfigAt =
    Config<kConfigs[I].bm, kConfigs[I].bk, std::conditional_t<kConfigs[I].out_bytes == 4, float, uint16_t>>;

// Work item: x = block row, y = first column n0, z = first stored block, w = end stored block.
struct Params {
  const int4* items;      // [total items], grouped by CTA
  const int* cta_items;   // [grid + 1]
  const int* col_idx;     // [nnzb] A's block columns
  const float* a_scales;  // [nnzb] A's block scales
  const float* b_scales;  // [N] the scale of each column of B
  void* c;                // C(m, n) at c[m * c_rs + n * c_cs]
  int64_t c_rs, c_cs;
  int n;                  // N
  int c_pairs;            // an accumulator pair (n, n + 1) is two adjacent, aligned elements of C
  int tma_c;              // 16-bit C written by TMA stores from the staging tiles (the kernel's third map)
  int out_bf16;           // bf16 (else f16) C when TOut is 16-bit
  float alpha, beta;
};

// ---- host side of the kernels (kernel.cu) ----
struct LaunchState {
  int64_t mb = 0, n = 0, nnzb = 0;  // what the schedule was built for (run() checks it)
  int bm = 0, bk = 0;
  int grid = 0;
  int4* items = nullptr;
  int* cta_items = nullptr;
  void* bt = nullptr;  // B transposed to K-major (N x K) when the caller's B is row-major; else null
};
struct Kernel {
  Key key;
  kit::KernelInfo info;
  // g: the DSD view; b_kmajor: B as an N x K row-major e4m3 matrix (ld in elements).
  void (*launch)(const GemmArgs& g, const void* b_kmajor, int64_t b_ld, const LaunchState& st, cudaStream_t s) =
      nullptr;
};
const Kernel* find_kernel(const Key& key);
// B (K x N row-major e4m3, ld elements) -> bt (N x K row-major, K elements per row), on stream.
void transpose_b(const void* b, int64_t ld, int64_t k, int64_t n, void* bt, cudaStream_t stream);

}  // namespace sparsek::dsd_fp8_sm90
