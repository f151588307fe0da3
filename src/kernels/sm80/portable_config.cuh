// The portable kernel's tile configurations (one per block height) and what follows from them.
// bench/portable_configs.sh rewrites the Config<BM> rows of this file for its experiments.
#pragma once
#include <cuda_runtime.h>

#include "kernels/ptx/mma_sm80.cuh"

namespace sparsek {
namespace {

using ptx::cp_async_16;
using ptx::smem_addr;

constexpr int kThreads = 256;  // 8 warps

// Tile configuration per block height BM (= the CTA's rows): output columns per CTA (BN), warp
// grid (WARPS_M x 8 / WARPS_M), K per pipeline stage (KC, a multiple of the 16-deep slice),
// pipeline depth (STAGES), block indices staged per segment (IDX_CAP) and the CTAs per SM the
// register budget aims at (MIN_CTAS, for __launch_bounds__). Chosen by measurement on an H100
// (bench/portable_configs.sh, docs/history/products.md): BM <= 64 gains most from 256-column tiles (more
// mma per loader instruction, half the CTAs paying the prologue); BM = 128 from 64-deep stages
// (half the barriers) while 3 x 32 KB stages still leave room for 2 CTAs per SM. All stay within
// 99 KB of shared memory so that sm_86/sm_89 run them too.
template <int BM>
struct Config;
template <>
struct Config<16> {
  static constexpr int BN = 256, WARPS_M = 1, KC = 32, STAGES = 4, IDX_CAP = 1024, MIN_CTAS = 2;
};
template <>
struct Config<32> {
  static constexpr int BN = 256, WARPS_M = 1, KC = 32, STAGES = 4, IDX_CAP = 1024, MIN_CTAS = 2;
};
template <>
struct Config<64> {
  static constexpr int BN = 256, WARPS_M = 2, KC = 32, STAGES = 4, IDX_CAP = 1024, MIN_CTAS = 2;
};
template <>
struct Config<128> {
  static constexpr int BN = 128, WARPS_M = 2, KC = 64, STAGES = 3, IDX_CAP = 256, MIN_CTAS = 2;
};

// Smallest number of column passes (1, 2, 4, 8) in which the epilogue's f32 output tile, padded
// by 4 floats per row, fits in `bytes` of shared memory in either orientation.
constexpr int epilogue_passes(int bm, int bn, int bytes) {
  int p = 1;
  while (p < 8 && ((bm * (bn / p + 4) * 4 > bytes) || ((bn / p) * (bm + 4) * 4 > bytes))) p *= 2;
  return p;
}

template <int BM>
struct Tile {
  using C = Config<BM>;
  static constexpr int BN = C::BN, KC = C::KC, STAGES = C::STAGES, IDX_CAP = C::IDX_CAP;
  static constexpr int SLICES = KC / 16;  // a slice: 16 of K from one block (the smallest block depth)
  static constexpr int WARPS_M = C::WARPS_M, WARPS_N = (kThreads / 32) / WARPS_M;
  static constexpr int WM = BM / WARPS_M;  // warp tile
  static constexpr int WN = BN / WARPS_N;
  static constexpr int MI = WM / 16;  // m16 fragments per warp
  static constexpr int NI = WN / 8;   // n8 fragments per warp
  static constexpr int A_BYTES = BM * KC * 2;
  static constexpr int B_BYTES = BN * KC * 2;
  static constexpr int SMEM = STAGES * (A_BYTES + B_BYTES) + 2 * IDX_CAP * 4;
  // The epilogue reuses all of it for the f32 output tile, BNP columns at a time.
  static constexpr int C_PASSES = epilogue_passes(BM, BN, SMEM), BNP = BN / C_PASSES;
  static_assert(KC % 16 == 0 && STAGES >= 2, "a stage holds whole 16-deep slices");
  static_assert(WM % 16 == 0 && WN % 16 == 0, "warp tile must hold whole m16 fragments and n16 pairs");
  static_assert(SMEM <= 99 * 1024, "sm_86/sm_89 allow at most 99 KB of shared memory per block");
  static_assert(BM * (BNP + 4) * 4 <= SMEM && BNP * (BM + 4) * 4 <= SMEM && BNP % WN == 0,
                "each epilogue pass holds whole warp tiles");
};

// Output columns per CTA for a run-time block height.
int bn_for(int bm) {
  switch (bm) {
    case 16: return Tile<16>::BN;
    case 32: return Tile<32>::BN;
    case 64: return Tile<64>::BN;
    default: return Tile<128>::BN;
  }
}

}  // namespace
}  // namespace sparsek
