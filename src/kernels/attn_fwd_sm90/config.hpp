// Hopper attention forward: what is built (the config table), each configuration's compile-time
// constants and shared-memory layout, and the parameters and work items the host and the kernel
// share. docs/design/attn_fwd_sm90.md says how the kernel works.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/sm90/kit/launch.hpp"
#include "kernels/sm90/kit/smem.cuh"
#include "kernels/sm90/kit/tile.cuh"
#include "kernels/sm90/kit/tma.hpp"
#include "sparsek/attention.hpp"

namespace sparsek::attn_fwd_sm90 {

// ---- the config table: every (D, block, dtype) that is built ----
struct Key {
  int d;      // head dimension
  int block;  // block_q = block_kv
  bool bf16;  // bf16 (else f16) q, k, v, o
  constexpr bool operator==(const Key& o) const { return d == o.d && block == o.block && bf16 == o.bf16; }
};
inline constexpr Key kConfigs[] = {{64, 64, false},  {64, 64, true},  {64, 128, false},  {64, 128, true},
                                   {128, 64, false}, {128, 64, true}, {128, 128, false}, {128, 128, true}};
inline constexpr int kNumConfigs = int(sizeof(kConfigs) / sizeof(kConfigs[0]));

template <int D_, int BLOCK_, bool BF16_>
struct Config {
  static constexpr int D = D_;
  static constexpr int BM = BLOCK_;       // query rows of an item (= block_q)
  static constexpr int BN = BLOCK_;       // keys of a key block (= block_kv)
  static constexpr bool BF16 = BF16_;
  static constexpr int NWG = BM / 64;     // consumer warpgroups, 64 query rows each
  static constexpr int THREADS = 128 * (NWG + 1);
  static constexpr int CTAS_PER_SM = NWG == 2 ? 1 : 2;
  // Tiles, each [D / 64 chunks][rows][64] as a TMA box of a [B, H, S, D] tensor writes it.
  using QTile = kit::TileLayout<BM, D, true>;   // S = Q K^T: A, K-major
  using KTile = kit::TileLayout<BN, D, true>;   //            B, K-major
  using VTile = kit::TileLayout<D, BN, false>;  // O += P V:  B, MN-major (keys are the reduction)
  static constexpr int Q_BYTES = QTile::BYTES;
  static constexpr int KV_BYTES = KTile::BYTES;      // K and V alike
  static constexpr int O_BYTES = 64 * D * 2;         // per consumer: [D / 64][64 rows][64]
  static constexpr int FIXED = Q_BYTES + NWG * O_BYTES + 1024 /* barriers, infos */ + kit::kSmemAlignSlack;
  static constexpr int BUDGET = kit::smem_budget(CTAS_PER_SM);
  static constexpr int STAGES = std::min(4, (BUDGET - FIXED) / (2 * KV_BYTES));
  static constexpr int S_REGS = BN / 2;   // fp32 scores per thread (m64 x BN accumulator)
  static constexpr int O_REGS = D / 2;    // fp32 output per thread (m64 x D accumulator)
  // Register budgets after setmaxnreg (whole warpgroups): the producer needs few.
  static constexpr int PRODUCER_REGS = 40;
  static constexpr int CONSUMER_REGS = NWG == 2 ? 232 : 216;

  // Shared memory: tiles, then the barriers (K and V rings: full and empty per stage) and the info
  // words the producer writes beside each load.
  static constexpr kit::Region Q = kit::first_region(Q_BYTES);
  static constexpr kit::Region O = Q.then(NWG * O_BYTES);
  static constexpr kit::Region K = O.then(STAGES * KV_BYTES);
  static constexpr kit::Region V = K.then(STAGES * KV_BYTES);
  static constexpr kit::Region Q_FULL = V.then(8, 8);
  static constexpr kit::Region Q_EMPTY = Q_FULL.then(8, 8);
  static constexpr kit::Region K_FULL = Q_EMPTY.then(8 * STAGES, 8);
  static constexpr kit::Region K_EMPTY = K_FULL.then(8 * STAGES, 8);
  static constexpr kit::Region V_FULL = K_EMPTY.then(8 * STAGES, 8);
  static constexpr kit::Region V_EMPTY = V_FULL.then(8 * STAGES, 8);
  static constexpr kit::Region Q_INFO = V_EMPTY.then(8, 8);       // int2 {item id, blocks}
  static constexpr kit::Region K_INFO = Q_INFO.then(8 * STAGES, 8);  // int2 per K stage {block, flags}
  // Packed sequences: the keys {lo, hi} the item's rows may attend (hi = INT32_MIN: its rows span
  // sequences), one slot per item parity, so that the next item's write never meets a read of the
  // last one's (consumers read it in the item's softmax, after they released the Q slot).
  static constexpr kit::Region SEQ_RANGE = K_INFO.then(16, 8);
  static constexpr int SMEM = int(SEQ_RANGE.end()) + kit::kSmemAlignSlack;

  static_assert(D == 64 || D == 128, "D must be 64 or 128");
  static_assert(BM == 64 || BM == 128, "blocks are 64x64 or 128x128");
  static_assert(O_BYTES % 1024 == 0, "swizzled tiles must start 1024-byte aligned (descriptor base offset 0)");
  static_assert(STAGES >= 2, "K and V need two stages each to load ahead of the math");
  static_assert(SMEM <= BUDGET, "shared memory per CTA exceeds the budget");
  // A CTA holds THREADS x (its launch-bound register count) registers, never more: the budgets
  // must add up within that (168 x 384 = 64512 for two consumers; 128 x 256 for one).
  static constexpr int CTA_REGS = (65536 / CTAS_PER_SM / THREADS) / 8 * 8 * THREADS;
  static_assert(128 * PRODUCER_REGS + 128 * NWG * CONSUMER_REGS <= CTA_REGS,
                "setmaxnreg budgets exceed the CTA's registers");
};
template <int I>
using ConfigAt = Config<kConfigs[I].d, kConfigs[I].block, kConfigs[I].bf16>;

// A CTA's shared memory (Config's regions) as shared-window addresses.
template <class Cfg>
struct Smem {
  kit::SmemBase base;
  __device__ uint32_t q() const { return base.at(Cfg::Q.offset); }
  __device__ uint32_t o(int wg) const { return base.at(Cfg::O.offset, wg * Cfg::O_BYTES); }
  __device__ uint8_t* o_ptr(int wg) const { return base.ptr_at<uint8_t>(Cfg::O.offset, wg * Cfg::O_BYTES); }
  __device__ uint32_t k(uint32_t s) const { return base.at(Cfg::K.offset, s * Cfg::KV_BYTES); }
  __device__ uint32_t v(uint32_t s) const { return base.at(Cfg::V.offset, s * Cfg::KV_BYTES); }
  __device__ uint32_t q_full() const { return base.at(Cfg::Q_FULL.offset); }
  __device__ uint32_t q_empty() const { return base.at(Cfg::Q_EMPTY.offset); }
  __device__ uint32_t k_full(uint32_t s) const { return base.at(Cfg::K_FULL.offset, 8 * s); }
  __device__ uint32_t k_empty(uint32_t s) const { return base.at(Cfg::K_EMPTY.offset, 8 * s); }
  __device__ uint32_t v_full(uint32_t s) const { return base.at(Cfg::V_FULL.offset, 8 * s); }
  __device__ uint32_t v_empty(uint32_t s) const { return base.at(Cfg::V_EMPTY.offset, 8 * s); }
  __device__ uint32_t q_info() const { return base.at(Cfg::Q_INFO.offset); }
  __device__ uint32_t k_info(uint32_t s) const { return base.at(Cfg::K_INFO.offset, 8 * s); }
  __device__ uint32_t seq_range(uint32_t parity) const { return base.at(Cfg::SEQ_RANGE.offset, 8 * parity); }
};

// One consumer warpgroup's state for an item: 64 query rows x D of output, and the running max
// and (per-thread partial) sum of its two rows (fragment rows g and g + 8 of its warp).
template <class Cfg>
struct RowState {
  float o[Cfg::O_REGS];
  float m[2], l[2];
};

// Element masks a key block needs (the stage info's flags). kMaskSequence: packed sequences, and
// the block's keys are not all in the one sequence that holds every row of the query block.
enum : int { kMaskCausal = 1, kMaskTail = 2, kMaskAll = 4, kMaskSequence = 8 };

struct Params {
  const int* order;         // [items]: item ids, longest first
  int items;
  int hq, hkv, group;       // query heads, key/value heads, hq / hkv
  int mq;                   // query blocks per head
  int sq, skv, nkb;         // sequence lengths; key blocks = ceil(skv / BN)
  // layout: rows [lb][lh][mq]; head index of a row: 0 (lh == 1), the query head, or the kv head
  const int* kv_num;
  const int* kv_idx;
  const int* full_num;      // null when there are no full blocks
  const int* full_idx;
  int lb, lh, lh_is_kv;
  int kmax, full_kmax;
  int causal;
  float scale_log2;         // scale * log2(e)
  float* lse;               // [B, Hq, Sq] or null
  const int* cu_seqlens;    // packed sequences [nseq + 1] (B = 1), or null
  int nseq;
};

// item id = ((b * Hkv + kv head) * Mq + query block) * group + head within the group: the query
// heads that share a key/value head are neighbours, so equal-length items that run together read
// the same K and V (from L2).
struct Item {
  int b, hq, hkv, qb;
};
__host__ __device__ __forceinline__ Item decode(int id, const Params& p) {
  Item it;
  const int g = id % p.group;
  id /= p.group;
  it.qb = id % p.mq;
  id /= p.mq;
  it.hkv = id % p.hkv;
  it.b = id / p.hkv;
  it.hq = it.hkv * p.group + g;
  return it;
}
__host__ __device__ __forceinline__ int64_t layout_row(const Item& it, const Params& p) {
  const int lb = p.lb == 1 ? 0 : it.b;
  const int lh = p.lh == 1 ? 0 : p.lh_is_kv ? it.hkv : it.hq;
  return (int64_t(lb) * p.lh + lh) * p.mq + it.qb;
}

// Blocks of an item, each count clamped to [0, kmax].
__device__ __forceinline__ void item_counts(const Item& it, const Params& p, int64_t& row, int& np, int& nf) {
  row = layout_row(it, p);
  np = p.nkb > 0 ? min(max(p.kv_num[row], 0), p.kmax) : 0;
  nf = p.nkb > 0 && p.full_num ? min(max(p.full_num[row], 0), p.full_kmax) : 0;
}

// ---- host side of the kernels (kernel.cu) ----
// Each configuration is built twice: without packed sequences (info) and with them (packed_info),
// so that the sequence masks cost the unpacked kernels nothing, not even registers.
struct Kernel {
  Key key;
  kit::KernelInfo info, packed_info;
  void (*launch)(const AttentionArgs& a, const Params& p, int grid, cudaStream_t stream);
};
// The built kernel for key, or null.
const Kernel* find_kernel(const Key& key);
// Sort keys of the item order: every item's block count (into lengths, on stream).
void launch_item_lengths(const Params& p, unsigned* lengths, cudaStream_t stream);

}  // namespace sparsek::attn_fwd_sm90
