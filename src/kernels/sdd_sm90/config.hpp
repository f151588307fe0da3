// Hopper SDD: what is built (the config table), each configuration's compile-time constants, and
// the parameters the host and the kernel share. docs/design/sdd_sm90.md says how the kernel works.
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

namespace sparsek::sdd_sm90 {

// ---- the config table: every (C's block height, input dtype, C's width, A and B layouts) ----
struct Key {
  int bm = 0;          // C's block height
  bool bf16 = false;   // bf16 (else f16) inputs
  int out_bytes = 2;   // 4: f32 C; 2: f16 or bf16 C (which one: Params::out_bf16)
  bool a_mn = false;   // A column-major: MN-major A tile
  bool b_k = false;    // B column-major: K-major B tile
  int bw = 64;         // width of a B chunk when B is row-major (32 for 32-wide blocks)
  constexpr bool operator==(const Key& o) const {
    return bm == o.bm && bf16 == o.bf16 && out_bytes == o.out_bytes && a_mn == o.a_mn && b_k == o.b_k && bw == o.bw;
  }
};
inline constexpr int kNumConfigs = 3 * 2 * 2 * 2 * 3;
inline constexpr Key config_at(int i) {
  constexpr int bms[] = {32, 64, 128};
  const int layout = i % 3;  // B column-major; row-major in 64-wide chunks; row-major in 32-wide chunks
  return {bms[i / 24], (i / 12) % 2 == 1, (i / 6) % 2 == 1 ? 4 : 2, (i / 3) % 2 == 1, layout == 0,
          layout == 2 ? 32 : 64};
}

constexpr int kThreads = 384;  // 3 warpgroups: producer, consumer 0, consumer 1

// BM: C's block height; BF16: bf16 (else f16) inputs; TOut: float (f32 C) or uint16_t (f16 / bf16
// C: which one is a run-time parameter, as in the DSD kernel); A_MN: A column-major (MN-major A
// tile); B_K: B column-major (K-major B tile); BW: width of a B chunk when B is row-major (32 for
// 32-wide blocks, else 64).
template <int BM_, bool BF16_, class TOut_, bool A_MN_, bool B_K_, int BW_>
struct Config {
  static constexpr int BM = BM_;
  static constexpr int KS = 64;  // K per stage: one 128-byte swizzle row
  static constexpr bool BF16 = BF16_;
  using TOut = TOut_;
  static constexpr bool A_MN = A_MN_, B_K = B_K_;
  static constexpr int BW = BW_;
  static constexpr bool SWAP = BM == 32;  // the tile is computed as C^T: the 256 columns are the wgmma M side
  static constexpr bool COOP = BM == 128;  // both consumers on every item, 64 rows each
  static constexpr int BN = 256;           // columns of a tile (G blocks of bk)
  static constexpr int MI = SWAP ? BN / 64 : 1;
  static constexpr int WN = SWAP ? BM : BN;
  static constexpr int ACC = WN / 2;
  using ATile = kit::TileLayout<BM, KS, !A_MN>;
  using BTile = kit::TileLayout<BN, KS, B_K, BW>;
  static constexpr int A_BYTES = ATile::BYTES;
  static constexpr int B_BYTES = BTile::BYTES;
  static constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
  static constexpr int STAGES = std::min(12, (kit::kSmemPerBlock - 2048) / STAGE_BYTES);
  // Shared memory: A stages | B stages | full[STAGES] | empty[STAGES].
  static constexpr kit::Region A = kit::first_region(STAGES * A_BYTES);
  static constexpr kit::Region B = A.then(STAGES * B_BYTES);
  static constexpr kit::Region FULL = B.then(8 * STAGES, 8);
  static constexpr kit::Region EMPTY = FULL.then(8 * STAGES, 8);
  static constexpr int SMEM = int(EMPTY.end()) + kit::kSmemAlignSlack;

  static_assert(BM == 32 || BM == 64 || BM == 128, "bm must be 32, 64 or 128");
  static_assert(B_K || BW == 32 || BW == 64, "row-major B comes in 32- or 64-wide chunks");
  static_assert(STAGES >= 3, "the ring needs at least 3 stages to overlap load and math");
  static_assert(SMEM <= kit::kSmemPerBlock, "shared memory per block on sm_90 is 227 KB");
};

// Work item: x = block row of C, y = first stored block, z = blocks in the group.
struct Params {
  const int4* items;     // [total items], grouped by CTA
  const int* cta_items;  // [grid + 1]
  const int* col_idx;    // C's block columns
  void* c;               // C's values [nnzb][bm][bk]
  int bk;                // C's block width
  int kstages;           // ceil(K / KS)
  int c_pairs;           // 1: two adjacent elements of a block row are one aligned access
  int out_bf16;          // bf16 (else f16) C when TOut is 16-bit
  float alpha, beta;
};

template <int I>
using ConfigAt = Config<config_at(I).bm, config_at(I).bf16, std::conditional_t<config_at(I).out_bytes == 4, float, uint16_t>,
                        config_at(I).a_mn, config_at(I).b_k, config_at(I).bw>;

// ---- host side of the kernels (kernel.cu) ----
// What a launch needs of the plan (prepare() builds it; device pointers).
struct LaunchState {
  int64_t mb = 0, nnzb = 0, k = 0;  // what the schedule was built for (run() checks it)
  int bm = 0, bk = 0;
  int grid = 0;
  int4* items = nullptr;
  int* cta_items = nullptr;
};
struct Kernel {
  Key key;
  kit::KernelInfo info;
  void (*launch)(const GemmArgs& g, const LaunchState& st, cudaStream_t stream) = nullptr;
};
// The built kernel for key, or null.
const Kernel* find_kernel(const Key& key);

}  // namespace sparsek::sdd_sm90
